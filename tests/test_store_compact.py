"""A finished store holds no dead space: SWMR writing never reuses file space, so each commit's rewritten last chunks
stayed in the file (store/compact.py)."""

from __future__ import annotations

import os

import h5py
import numpy as np

import store.compact as compact_module
from store import open_store
from store.attrs import read_attrs
from store.compact import TMP_SUFFIX, live_bytes
from test_store import assert_example, create, example

N, WINDOW = 600, 6  # 100 commits of 6 examples: each rewrites every dataset's last chunk
METADATA_BYTES = 256 * 1024  # object headers, chunk indices, attributes: far less than this for the store below


def _write(path, complete=True):
    w = create(path)
    exs = [example(i) for i in range(N)]
    for k in range(0, N, WINDOW):
        w.append(exs[k:k + WINDOW])
    w.close(complete=complete)
    return exs


def _sizes(path):
    with h5py.File(path, "r", locking=False) as f:
        return os.path.getsize(path), live_bytes(f)


def _objects(path) -> dict:
    """Every dataset's values and storage settings and every object's attributes (the finish time aside)."""
    out = {}
    with h5py.File(path, "r", locking=False) as f:
        times = ("created", "finished")
        out["/"] = {k: (v, f.attrs.get_id(k).dtype) for k, v in read_attrs(f).items() if k not in times}

        def visit(name, obj):
            attrs = {k: (v, obj.attrs.get_id(k).dtype) for k, v in read_attrs(obj).items()}
            if isinstance(obj, h5py.Dataset):
                out[name] = (obj[()].tobytes(), obj.dtype, obj.shape, obj.maxshape, obj.chunks, obj.compression,
                             obj.compression_opts, obj.shuffle, obj.fletcher32, attrs)
            else:
                out[name] = attrs

        f.visititems(visit)
    return out


def test_a_store_committed_in_many_windows_is_compact_once_complete(tmp_path, monkeypatch):
    path = tmp_path / "s.h5"
    exs = _write(path)
    size, live = _sizes(path)
    assert size <= live + METADATA_BYTES, (size, live)
    with open_store(path) as s:
        assert s.complete and len(s) == N
        for i in (0, 1, 7, N // 2, N - 1):
            assert_example(s[i], exs[i])
    assert not os.path.exists(str(path) + TMP_SUFFIX)

    # the same store without compaction: dead space, and otherwise every object, value and attribute the same
    monkeypatch.setattr(compact_module, "MIN_DEAD_BYTES", 1 << 60)
    loose = tmp_path / "loose.h5"
    _write(loose)
    loose_size, loose_live = _sizes(loose)
    assert loose_live == live and loose_size > 2 * size, (loose_size, size)
    assert _objects(loose) == _objects(path)


def test_an_unfinished_store_is_left_as_written_for_resume(tmp_path):
    path = tmp_path / "s.h5"
    _write(path, complete=False)
    size, live = _sizes(path)
    assert size > live + METADATA_BYTES  # the dead space is still there: only a complete store is copied


def test_no_room_for_the_copy_leaves_the_store_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(compact_module, "free_bytes", lambda p: 1024)  # the copy would not fit
    path = tmp_path / "s.h5"
    stale = str(path) + TMP_SUFFIX
    with open(stale, "wb") as fh:  # what a process killed while compacting leaves
        fh.write(b"partial copy")
    exs = _write(path)
    size, live = _sizes(path)
    assert size > live + METADATA_BYTES and not os.path.exists(stale)
    with open_store(path) as s:
        assert s.complete and len(s) == N
        assert_example(s[N - 1], exs[N - 1])


def test_a_failed_copy_is_removed_and_the_store_kept(tmp_path, monkeypatch):
    def full_disk(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(compact_module, "_copy_attrs", full_disk)
    path = tmp_path / "s.h5"
    exs = _write(path)
    assert not os.path.exists(str(path) + TMP_SUFFIX)
    with open_store(path) as s:
        assert s.complete and len(s) == N
        assert_example(s[3], exs[3])
    np.testing.assert_array_less(0, _sizes(path))


def test_a_store_reached_through_a_symlink_is_resumed_and_compacted_where_it_lies(tmp_path):
    """Resume and compaction replace the file the link points to; the link stays a link."""
    from store import resume

    (tmp_path / "data").mkdir()
    target = tmp_path / "data" / "s.h5"
    link = tmp_path / "link.h5"
    link.symlink_to(target)
    exs = [example(i) for i in range(N)]
    w = create(target)
    for k in range(0, N // 2, WINDOW):
        w.append(exs[k:k + WINDOW])
    w.close()  # interrupted: resumed through the link
    w = resume(str(link))
    for k in range(N // 2, N, WINDOW):
        w.append(exs[k:k + WINDOW])
    w.close(complete=True)
    assert link.is_symlink() and os.path.samefile(link, target)
    size, live = _sizes(target)
    assert size <= live + METADATA_BYTES, (size, live)
    assert sorted(os.listdir(tmp_path / "data")) == ["s.h5"]
    with open_store(link) as s:
        assert s.complete and len(s) == N
        for i in (0, N // 2 - 1, N // 2, N - 1):
            assert_example(s[i], exs[i])


def test_a_directory_where_the_copy_cannot_be_made_leaves_the_store_whole(tmp_path, monkeypatch):
    """new_file fails before the copy exists (a read-only directory): nothing to remove, the store stays as it is."""
    def refused(path):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(compact_module, "new_file", refused)
    path = tmp_path / "s.h5"
    exs = _write(path)  # raised FileNotFoundError removing the copy that was never made
    size, live = _sizes(path)
    assert size > live + METADATA_BYTES and not os.path.exists(str(path) + TMP_SUFFIX)
    with open_store(path) as s:
        assert s.complete and len(s) == N
        assert_example(s[N - 1], exs[N - 1])


def test_the_compacted_store_keeps_its_permissions(tmp_path):
    from store import resume

    path = tmp_path / "s.h5"
    exs = [example(i) for i in range(N)]
    w = create(path)
    for k in range(0, N // 2, WINDOW):
        w.append(exs[k:k + WINDOW])
    w.close()
    os.chmod(path, 0o640)
    w = resume(str(path))  # resume's copy replaces the file
    assert os.stat(path).st_mode & 0o777 == 0o640
    for k in range(N // 2, N, WINDOW):
        w.append(exs[k:k + WINDOW])
    w.close(complete=True)  # and compaction's
    assert os.stat(path).st_mode & 0o777 == 0o640
    size, live = _sizes(path)
    assert size <= live + METADATA_BYTES, (size, live)
