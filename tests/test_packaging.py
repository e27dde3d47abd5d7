"""The distribution ships every package of the source tree (pyproject lists them by hand: a new sub-package left
out of the list works in an editable install and is missing from a wheel, as compute.run was)."""

from __future__ import annotations

import tomllib

from conftest import REPO


def test_every_package_is_in_the_distribution():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for top in ("compute", "store", "tui")
             for p in (REPO / top).rglob("__init__.py")}
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - found == {"attrscope_examples"} and config["package-dir"]["attrscope_examples"] == "examples"
