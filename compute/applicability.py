"""Which methods run for a loaded checkpoint, and the one-line reason of each that does not (the methods' own
check_task and check_architecture): `attr-compute methods --model PATH` and the README's family x method matrix."""

from __future__ import annotations

from .errors import AttrscopeError

# The README matrix's short form of a refusal: the first phrase of these found in the one-line reason.
SHORT_REASONS = (
    ("--task", "task"),
    ("pre-LN", "pre-LN"),
    ("LRP rule set", "no LRP rules"),
    ("rebuilds the final state", "block"),
    ("declares no mlp_maps", "no MLP maps"),
    ("clip_qkv", "clip_qkv"),
    ("does not know the", "head unknown"),
    ("no block description", "no block"),
)


def applicability(adapter) -> dict[str, str | None]:
    """Every registered method -> None where it runs for ``adapter`` (its model and task), else its refusal."""
    from .methods import REGISTRY, get_method

    out = {}
    for name in REGISTRY:
        method = get_method(name)
        try:
            method.check_task(adapter.task)
            method.check_architecture(adapter)
            out[name] = None
        except AttrscopeError as err:
            out[name] = str(err)
    return out


def short_reason(reason: str | None) -> str:
    """"Y", or the README matrix's short form of a refusal."""
    if reason is None:
        return "Y"
    return next((short for key, short in SHORT_REASONS if key in reason), "refused")
