"""The README's family x method table says what the registry says: for a tiny sequence classifier of every described
family, each method's cell is Y or the short form of the one-line reason it is refused (compute.applicability)."""

from __future__ import annotations

from pathlib import Path

from families import MATRIX_FAMILIES, family_matrix

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_matrix() -> dict[str, dict[str, str]]:
    lines = README.read_text().splitlines()
    start = lines.index("### Families: which methods run")
    header = next(line for line in lines[start:] if line.startswith("| method |"))
    families = [c.strip() for c in header.strip().strip("|").split("|")][1:]
    assert tuple(families) == MATRIX_FAMILIES
    rows = {}
    for line in lines[lines.index(header) + 2:]:
        if not line.startswith("| `"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = dict(zip(families, cells[1:]))
    return rows


def test_readme_family_matrix_is_the_registry():
    assert readme_matrix() == family_matrix()
