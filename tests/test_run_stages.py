"""The runner's stages (compute/run/) import only the stages before them, never the runner or a later stage, and
every option of ``attr-compute run`` is declared once."""

from __future__ import annotations

import ast
from pathlib import Path

RUN = Path(__file__).resolve().parents[1] / "compute" / "run"
# in the order of a run; config and progress are shared by all of them
ORDER = ("config", "progress", "plan", "load", "head_masks", "batches", "parts", "steps", "generate", "transfer",
         "dispatch", "auto_batch", "write", "metrics")


def relative_imports(path: Path) -> set[str]:
    """Modules a file imports relatively: '.plan' -> 'plan' (a stage), '..runner' -> '..runner'."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            out.add(("" if node.level == 1 else "." * node.level) + (node.module or ""))
    return out


def test_stages_import_only_earlier_stages():
    assert sorted(p.stem for p in RUN.glob("*.py") if p.stem != "__init__") == sorted(ORDER)
    for i, stage in enumerate(ORDER):
        imports = relative_imports(RUN / f"{stage}.py")
        assert "..runner" not in imports and "..cli" not in imports, stage
        later = {s for s in ORDER[i + 1:]} & imports
        assert not later, f"compute/run/{stage}.py imports the later stage(s) {sorted(later)}"


def test_the_checker_sees_an_import_back_up(tmp_path):
    bad = tmp_path / "plan.py"
    bad.write_text("from ..runner import run\nfrom .write import layouts\n")
    assert relative_imports(bad) == {"..runner", "write"}


def test_every_option_is_declared_once_and_the_cli_has_each():
    from click.testing import CliRunner

    from compute.cli import main
    from compute.run.config import declared_options

    options = declared_options()
    assert len({o.name for o in options}) == len(options)
    help_text = CliRunner().invoke(main, ["run", "--help"]).output
    for opt in options:
        if opt.cli:
            assert opt.flag in help_text, opt.name
