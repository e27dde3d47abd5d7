"""Hugging Face hub splits (``name[/config]:split``) read into a ``Table``, lazily, through the datasets package."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from compute.errors import AttrscopeError, UsageError

from .sources import SUPPORTED, SUPPORTED_TEXT, Table, first_line

# Suffixes that mean "this was meant to be a file", so a missing one is reported as a missing file
# rather than being looked up on the hub.
_FILE_LIKE = SUPPORTED + (".json", ".txt", ".gz", ".zip", ".xlsx", ".xls", ".arrow")
# name[/config][:split]; a third segment allows namespaced ids (owner/name/config).
_HUB_SPEC = re.compile(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+){0,2}(:[\w.\-\[\]%:+]+)?")


def looks_like_hub(spec: str) -> bool:
    name = spec.partition(":")[0]
    return _HUB_SPEC.fullmatch(spec) is not None and Path(name).suffix.lower() not in _FILE_LIKE


def read_hub(spec: str, split: str | None, limit: int | None) -> Table:
    name_part, _, spec_split = spec.partition(":")
    if spec_split and split is not None and spec_split != split:
        raise UsageError(f"'{spec}' names split '{spec_split}' but --split is '{split}': give the split once")
    split = spec_split or split
    if not split:
        raise AttrscopeError(
            f"'{spec}' is not a local file, and loading it from the Hugging Face hub needs a split: "
            f"use '{spec}:validation' (or --split), or pass {SUPPORTED_TEXT}"
        )
    parts = name_part.split("/")
    if len(parts) == 1:
        name, config = parts[0], None
    elif len(parts) == 2:
        name, config = parts  # "glue/sst2": dataset glue, config sst2
    else:
        name, config = "/".join(parts[:2]), parts[2]  # "owner/name/config"

    try:
        import datasets
    except ImportError:
        raise AttrscopeError(
            f"loading '{spec}' from the Hugging Face hub needs the datasets package: "
            f"pip install 'attrscope[hub]', or pass {SUPPORTED_TEXT}"
        ) from None
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # datasets raises many kinds; all become one line
        if _is_offline(e):
            raise AttrscopeError(
                f"could not reach the Hugging Face hub to load '{spec}' (offline or no network): "
                f"connect to the network, or pass {SUPPORTED_TEXT}"
            ) from None
        raise AttrscopeError(
            f"could not load '{spec}' from the Hugging Face hub ({first_line(e)}): "
            f"check the name, config and split, or pass {SUPPORTED_TEXT}"
        ) from None

    def rows() -> Iterator[tuple[str, dict]]:
        # Lazily, so --limit 10 on a large split does not convert every row.
        for i, row in enumerate(ds):
            if limit is not None and i >= limit:
                return
            yield f"row {i} of '{spec}'", row

    return Table(kind="hub", columns=list(ds.column_names), rows=rows(), n_rows=len(ds), sha256=None)


def _is_offline(exc: BaseException) -> bool:
    """Whether a load failure (or anything in its cause chain) is a network/offline problem."""
    names = ("connection", "offline", "timeout", "localentrynotfound", "maxretry", "nameresolution")
    phrases = ("offline", "couldn't reach", "could not reach", "connection", "network", "name resolution")
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return True
        if any(n in cls.__name__.lower() for cls in type(exc).__mro__ for n in names):
            return True
        if any(p in str(exc).lower() for p in phrases):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
