"""``attr-compute export``: a store's token table (and per-example metrics) as Parquet or CSV for pandas, R, DuckDB...

The tables are the store's own (``Store.token_table`` / ``Store.metric_table``, store/table.py), read ``chunk``
examples at a time and appended to the file chunk by chunk, so memory does not grow with the store. Each file is
written under a temporary name beside the target and renamed at the end: an interrupted or failed export leaves
no half-written file (and an existing file of that name untouched). With ``--metrics`` the per-example metrics go
to a second file named after the first: ``FILE.parquet`` -> ``FILE.metrics.parquet``.
"""

from __future__ import annotations

import csv
import os
import re
import socket
import tempfile
from collections.abc import Iterable, Iterator

from store.text import spreadsheet_cell

from . import interrupts
from .errors import AttrscopeError, UsageError
from .outdir import check_output_dir
from .run.progress import Progress, bar

FORMATS = (".parquet", ".csv")
# Token rows per chunk when --chunk-size is not given (the chunk's examples follow from the store's mean length and
# the number of methods): about 150 MB of peak memory for Parquet and less for CSV, whatever the store's size.
CHUNK_ROWS = 131_072
CSV_BLOCK = 16_384  # rows formatted as text at a time


def metrics_path(output: str) -> str:
    """Where ``--metrics`` writes: FILE.parquet -> FILE.metrics.parquet, FILE.csv -> FILE.metrics.csv."""
    stem, ext = os.path.splitext(output)
    return f"{stem}.metrics{ext}"


def export_store(store_path: str, output: str, methods: list[str] | None = None, *, layers: bool = False,
                 metrics: bool = False, chunk: int | None = None, progress: Progress | None = None) -> dict:
    """Write the token table of ``store_path`` (one row per example x method x token, ordered example -> method
    -> position; a generation store's per example x step x method x token before the step's, with ``step`` and
    ``target``) to ``output`` (.parquet or .csv), and with ``metrics`` the metric table (one row per example x
    method) to :func:`metrics_path`. ``chunk``: examples per chunk [default: about CHUNK_ROWS token rows].
    ``progress``: the bar of the examples written, per file.
    Returns {"files": {path: rows}, "examples": N, "complete": bool}.
    Raises AttrscopeError / UsageError / StoreError with one line naming the problem and the fix."""
    from store import open_store

    ext = os.path.splitext(output)[1].lower()
    if ext not in FORMATS:
        raise UsageError(f"cannot tell the format of '{output}': name the output FILE.parquet or FILE.csv")
    if chunk is not None and chunk < 1:
        raise UsageError("--chunk-size must be at least 1")
    write = _parquet_writer() if ext == ".parquet" else _write_csv
    targets = [output] + ([metrics_path(output)] if metrics else [])
    for path in targets:
        _check_output(path)
    if not os.path.exists(store_path):
        raise AttrscopeError(f"store '{store_path}' not found: check the path")
    if os.path.abspath(store_path) in map(os.path.abspath, targets):
        raise UsageError(f"the output '{output}' is the store itself: name another file")
    with open_store(store_path) as s:
        chosen = _methods(s, store_path, methods)
        chunk = chunk or _examples_per_chunk(s, len(chosen))
        if layers and not any(int(s.method_info(m)["n_layer_views"]) for m in chosen):
            raise AttrscopeError(f"--layers: {', '.join(chosen)} in store '{store_path}' ha"
                                 f"{'s' if len(chosen) == 1 else 've'} no layer views: leave out --layers, or pass "
                                 f"--methods with methods that have them (attr-compute methods lists them)")
        jobs = [(output, lambda: s.iter_token_tables(chosen, layers=layers, chunk=chunk),
                 lambda: s.token_table(chosen, layers=layers, hi=0))]
        if metrics:
            with_metrics = [m for m in chosen if m in s.metric_methods]
            if not with_metrics:
                raise AttrscopeError(f"--metrics: store '{store_path}' has no metrics for {', '.join(chosen)}: add "
                                     f"them with attr-compute eval {store_path} --metrics LIST, or leave out --metrics")
            jobs.append((metrics_path(output), lambda: s.iter_metric_tables(with_metrics, chunk=chunk),
                         lambda: s.metric_table(with_metrics, hi=0)))
        written: dict[str, int] = {}
        temps: list[tuple[str, str]] = []
        for path in targets:  # a SIGKILLed export's .part files (no handler saw that signal)
            _remove_stale_parts(path)
        # Ctrl-C / SIGTERM stop at the next chunk, and the temporary files go
        progress = progress or Progress()
        with interrupts.on_signals():
            try:
                with bar(progress, len(s) * len(jobs), "exporting"):
                    for path, chunks, empty in jobs:
                        tmp = _temp_beside(path)
                        temps.append((tmp, path))
                        progress.stage(os.path.basename(path))
                        written[path] = write(tmp, _never_empty(_counted(chunks(), chunk, len(s), progress), empty))
                for tmp, path in temps:  # only once every file is complete
                    os.replace(tmp, path)
            except interrupts.Interrupted:
                raise interrupts.Interrupted(f"interrupted: nothing was written ('{output}' is as it was); run the "
                                             "same command again") from None
            except OSError as err:  # a full disk, a file-size limit: the temporary files go, the targets stay
                raise AttrscopeError(f"cannot write '{temps[-1][1] if temps else output}': "
                                     f"{err.strerror or err}: nothing was written ('{output}' is as it was); free "
                                     "space and export again") from None
            finally:
                for tmp, _ in temps:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
        return {"files": written, "examples": len(s), "complete": s.complete}


def _methods(s, store_path: str, methods: list[str] | None) -> list[str]:
    if not s.methods:
        raise AttrscopeError(f"store '{store_path}' holds no attribution methods: nothing to export; compute some "
                             "with attr-compute DATASET --methods LIST")
    if not methods:
        return list(s.methods)
    for m in methods:
        if m not in s.methods:
            raise UsageError(f"method '{m}' is not in store '{store_path}': it holds {', '.join(s.methods)}")
    return list(dict.fromkeys(methods))


def _examples_per_chunk(s, n_methods: int) -> int:
    """Examples that make about CHUNK_ROWS token rows, at the store's mean length."""
    n = len(s)
    if not n:
        return 1
    last = s.index_rows(n - 1, n)[0]
    tokens = int(last["tok_off"]) + int(last["n_tokens"])
    if s.generation:  # a row per step and token before it: at most n per step
        tokens = max(int(last["grid_off"]) + int(last["n_steps"]) * int(last["n_tokens"]), 1)
    return max(1, CHUNK_ROWS * n // max(tokens * n_methods, 1))


def _check_output(path: str) -> None:
    if os.path.isdir(path):
        raise AttrscopeError(f"output '{path}' is a directory: name a file, e.g. {os.path.join(path, 'store.parquet')}")
    check_output_dir(path, "-o")


def _part_prefix(path: str) -> str:
    """The start of the names of ``path``'s part files: .NAME.HOST- (the writer's pid and a random tail follow)."""
    return f".{os.path.basename(path)}.{socket.gethostname()}-"


def _temp_beside(path: str) -> str:
    """A new empty file in the target's directory (so the final rename stays on one file system), with the
    permissions an ordinary new file gets (mkstemp makes it private). Its name holds the host and pid of its writer,
    so that a later export can tell a SIGKILLed export's part (_remove_stale_parts)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix=f"{_part_prefix(path)}{os.getpid()}.", suffix=".part")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    return tmp


def _remove_stale_parts(path: str) -> None:
    """Remove the part files of ``path`` whose writer, on this host, is gone (an export killed with SIGKILL, which
    no handler sees). Parts of a live export, of another host or of another target stay."""
    folder = os.path.dirname(os.path.abspath(path))
    mine = re.compile(re.escape(_part_prefix(path)) + r"(\d+)\.[a-z0-9_]+\.part")
    for name in os.listdir(folder):
        m = mine.fullmatch(name)
        if m and not _alive(int(m.group(1))):
            try:
                os.unlink(os.path.join(folder, name))
            except FileNotFoundError:  # another export removed it first
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _counted(chunks: Iterable[dict], chunk: int, n: int, progress: Progress) -> Iterator[dict]:
    """The chunks (``chunk`` examples each, of ``n``), each counted on the progress bar once written."""
    for k, c in enumerate(chunks):
        yield c
        progress.advance(max(0, min(chunk, n - k * chunk)))


def _never_empty(chunks: Iterable[dict], empty) -> Iterator[dict]:
    """The chunks, or for a store without examples one empty chunk (a file with the header / schema)."""
    any_chunk = False
    for c in chunks:
        interrupts.check()
        any_chunk = True
        yield c
    if not any_chunk:
        yield empty()


def _parquet_writer():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise AttrscopeError("writing Parquet needs pyarrow: pip install 'attrscope[parquet]' (or export to .csv)"
                             ) from None

    def arrow_type(col):
        return pa.string() if col.dtype == object else pa.from_numpy_dtype(col.dtype)

    def write(path: str, chunks: Iterable[dict]) -> int:
        rows, writer = 0, None
        try:
            for cols in chunks:
                table = pa.table({k: pa.array(v, type=arrow_type(v)) for k, v in cols.items()})
                if writer is None:
                    writer = pq.ParquetWriter(path, table.schema)
                writer.write_table(table)  # one row group per chunk
                rows += table.num_rows
        finally:
            if writer is not None:
                writer.close()
        return rows

    return write


def _write_csv(path: str, chunks: Iterable[dict]) -> int:
    """RFC 4180 CSV with a header row; floats in their shortest exact form, NaN as an empty cell; text cells that a
    spreadsheet would run as a formula start with ' and control characters are escaped (Parquet keeps them exact)."""
    rows = 0
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        header = False
        for cols in chunks:
            if not header:
                out.writerow(list(cols))
                header = True
            n = len(next(iter(cols.values()), ()))
            for r0 in range(0, n, CSV_BLOCK):  # text is larger than the numbers: format a block at a time
                out.writerows(zip(*(_csv_cells(v[r0:r0 + CSV_BLOCK]) for v in cols.values())))
            rows += n
    return rows


def _csv_cells(col):
    import numpy as np

    if col.dtype == object:
        # tokens and ids repeat row after row: each distinct string made safe once
        cells = col.tolist()
        safe = {c: spreadsheet_cell(c) for c in set(cells)}
        return [safe[c] for c in cells]
    if col.dtype.kind == "f":  # float32 -> its shortest round-trip digits (the bulk of the CSV's time)
        return np.where(np.isnan(col), "", col.astype(str)).tolist()
    return col.tolist()
