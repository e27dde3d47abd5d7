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


def test_every_bundled_example_file_is_package_data():
    """A data file under examples/ that no package-data glob names is missing from a wheel (the task examples
    live in examples/tasks/, which the top-level "*.jsonl" does not reach)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    examples = REPO / config["package-dir"]["attrscope_examples"]
    shipped = {p for pattern in config["package-data"]["attrscope_examples"] for p in examples.glob(pattern)
               if p.is_file()}
    data_files = {p for p in examples.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")}
    assert data_files - shipped == set(), "add a glob for these to [tool.setuptools.package-data] in pyproject.toml"
    assert any(p.parent.name == "tasks" for p in shipped)
