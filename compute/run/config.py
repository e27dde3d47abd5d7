"""The run's settings, derived from the option declarations (compute.options and every method's ``run_options``).

:func:`declared_options` lists every option of ``attr-compute run`` in the order of its ``--help``: the run-level
options, then each method's (in the registry's order, the first declaration of a shared option kept), then the
rest of the run-level ones. :class:`RunConfig` takes exactly these names; the CLI, the plan, the resume identity and
the provenance all read the same list, so a method registered later (a plugin, a test) is part of all of them.
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass

from ..options import RUN_OPTIONS, RUN_OPTIONS_AFTER_METHODS, Option


def method_options(name: str) -> tuple[Option, ...]:
    """The options method ``name`` reads (its class's ``run_options``)."""
    from ..methods import REGISTRY

    return tuple(getattr(REGISTRY[name], "run_options", ()))


def declared_options() -> tuple[Option, ...]:
    from ..methods import REGISTRY

    seen: dict[str, Option] = {}
    for opt in (*RUN_OPTIONS, *(o for name in REGISTRY for o in method_options(name)), *RUN_OPTIONS_AFTER_METHODS):
        if opt.name in seen and seen[opt.name] != opt:
            raise TypeError(f"option '{opt.name}' is declared twice, differently")
        seen.setdefault(opt.name, opt)
    return tuple(seen.values())


def resume_identity() -> tuple[str, ...]:
    """The settings that must match for --resume to continue a store (``Option.resume``)."""
    return tuple(o.name for o in declared_options() if o.resume)


class RunConfig:
    """What ``attr-compute run`` was asked: the dataset, one attribute per declared option, and what the CLI adds
    (``eval``: the metrics' EvalConfig; ``argv``: the command line, for the resume hint and the provenance)."""

    def __init__(self, dataset: str | None = None, *, eval=None, argv: list[str] | None = None, **values):
        options = {o.name: o for o in declared_options()}
        unknown = sorted(set(values) - set(options))
        if unknown:
            raise TypeError(f"RunConfig got an unknown option '{unknown[0]}'")
        self.dataset = dataset  # None: the bundled example dataset
        for name, opt in options.items():
            setattr(self, name, values.get(name, opt.default))
        self.eval = eval
        self.argv = list(argv or [])

    def as_dict(self) -> dict:
        """Every setting by name (the provenance's "config"), the metrics' EvalConfig as a dict."""
        out = {k: v for k, v in vars(self).items() if k not in ("eval", "argv")}
        out["eval"] = asdict(self.eval) if is_dataclass(self.eval) else self.eval
        out["argv"] = list(self.argv)
        return out

    def __repr__(self) -> str:
        return f"RunConfig({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RunConfig) and vars(self) == vars(other)
