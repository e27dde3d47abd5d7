"""The README's methods table says what the registry says (issue 15): the same names in the same order as
compute.methods.REGISTRY (and `attr-compute methods`, tests/test_cli.py), and each row's sign, layer-view and matrix
columns agree with the class's declarations."""

from __future__ import annotations

from pathlib import Path

import pytest

from compute.methods import REGISTRY

README = Path(__file__).resolve().parents[1] / "README.md"


def methods_table() -> dict[str, list[str]]:
    """name -> cells of the table under '## Methods' (header and separator rows left out)."""
    lines = README.read_text().splitlines()
    start = lines.index("## Methods")
    rows, in_table = {}, False
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            in_table = True
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if cells[0].startswith("`") and cells[0].endswith("`"):
                rows[cells[0].strip("`")] = cells
        elif in_table:
            break  # the first table of the section only
    return rows


def test_readme_lists_the_registry_in_order():
    assert list(methods_table()) == list(REGISTRY)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_readme_row_agrees_with_the_class(name):
    cls = REGISTRY[name]
    _, _what, sign, views, matrices, _ref = methods_table()[name]
    assert (sign == "signed") == cls.signed, sign
    assert (views != "—") == cls.has_layer_views, views
    assert (matrices != "—") == cls.has_matrices, matrices
