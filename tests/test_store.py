"""Tests for the store package alone (numpy + h5py): round trip, versions, bad files, import weight, the SWMR commit
protocol, refresh and resuming a store whose writer died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from store import resume as resume_store
from store import ENCODING_VERSION, ExampleData, MethodLayout, StoreError, StoreWriter, open_store
from synthetic import make_store

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

# --- a deterministic example generator (also imported by the writer subprocess) ------------------------------------

L = 3
LABELS = {0: "negative", 1: "positive"}
WORDS = ["the", "tédious", "🎬", "日本語", "film", "naïve", "[bold]", "ok", "ß", "long"]


def layouts() -> list[MethodLayout]:
    return [
        MethodLayout("rollout", signed=False, n_layer_views=L, matrices="all", n_matrix_layers=L,
                     description="rollout", params={"store_dtype": "float32"}),
        MethodLayout("logat", signed=True, n_layer_views=L, matrices="cls", n_matrix_layers=L, class_scores=True,
                     description="logat", params={"store_dtype": "float16"}),
        MethodLayout("norm", signed=False, description="norm", example_values=("delta", "steps")),
    ]


def example(i: int) -> ExampleData:
    """Example number ``i``: the same data every time it is asked for (unicode, pairs, unlabelled, truncated)."""
    rng = np.random.default_rng(1000 + i)
    n = 3 + (i * 5) % 9
    body = [WORDS[int(j)] for j in rng.integers(0, len(WORDS), n - 2)]
    tokens = ["[CLS]", *body, "[SEP]"]
    res = {
        "rollout": {"scores": rng.random(n), "layer_scores": rng.random((L, n)), "matrices": rng.random((L, n, n))},
        "logat": {"scores": rng.normal(size=n), "layer_scores": rng.normal(size=(L, n)),
                  "matrices": rng.random((L, 1, n)), "class_scores": rng.normal(size=(2, n))},
        "norm": {"scores": rng.random(n), "example_values": {"delta": float(rng.normal()), "steps": float(i)}},
    }
    spans = np.stack([np.arange(n), np.arange(n) + 1], axis=1)
    spans[0] = spans[-1] = -1
    segment = np.zeros(n, dtype=np.int8)
    segment[0] = segment[-1] = -1
    pred = int(rng.integers(0, 2))
    truncated = i % 4 == 3
    return ExampleData(
        row=i, id=f"ex-{i}-é", text=" ".join(body) + f" ✓{i}", pair=None if i % 2 == 0 else f"paire {i} ü",
        token_ids=np.arange(n) + i, tokens=tokens, spans=spans, segment=segment,
        label=-1 if i % 5 == 4 else int(rng.integers(0, 2)), pred=pred, probs=np.array([0.25, 0.75]),
        target=pred, explain_pos=0, n_orig_tokens=n + 7 if truncated else n, truncated=truncated, results=res)


def create(path: Path, **extra) -> StoreWriter:
    return StoreWriter.create(str(path), n_layers=L, n_heads=4, labels=LABELS, methods=layouts(),
                              provenance={"config": {"methods": ["rollout", "logat", "norm"]}},
                              attrs={"model_id": "synthetic-é"}, **extra)


def assert_example(got, exp: ExampleData) -> None:
    """A stored example equals the ExampleData it was written from."""
    n = len(exp.token_ids)
    assert got.n_tokens == n
    assert got.row == exp.row and got.id == exp.id and got.text == exp.text and got.pair == exp.pair
    assert got.tokens == exp.tokens
    np.testing.assert_array_equal(got.token_ids, exp.token_ids)
    np.testing.assert_array_equal(got.spans, exp.spans)
    np.testing.assert_array_equal(got.segment, exp.segment)
    assert got.label == (None if exp.label < 0 else exp.label)
    assert got.pred == exp.pred and got.target == exp.target and got.explain_pos == exp.explain_pos
    assert got.truncated == exp.truncated and got.n_orig_tokens == exp.n_orig_tokens
    np.testing.assert_allclose(got.probs, exp.probs, rtol=1e-6)
    for name, res in exp.results.items():
        np.testing.assert_allclose(got.scores(name), res["scores"], rtol=1e-6)
        if "layer_scores" in res:
            np.testing.assert_allclose(got.layer_scores(name), res["layer_scores"], rtol=1e-6)
        else:
            assert got.layer_scores(name) is None
        if "matrices" in res:
            m = got.matrices(name)
            assert m.dtype == np.float32 and m.shape == res["matrices"].shape
            np.testing.assert_allclose(m, res["matrices"], atol=1e-3)  # float16 storage for some
        else:
            assert got.matrices(name) is None
        if "class_scores" in res:
            np.testing.assert_allclose(got.class_scores(name), res["class_scores"], rtol=1e-6)
        else:
            assert got.class_scores(name) is None
        values = got.example_values(name)
        assert values.keys() == res.get("example_values", {}).keys()
        for key, v in values.items():
            np.testing.assert_allclose(v, res["example_values"][key], rtol=1e-6)


def one_line(message: str) -> str:
    assert message and "\n" not in message, repr(message)
    return message


# --- round trip -----------------------------------------------------------------------------------------------------


def test_make_store_round_trip(tmp_path):
    path = tmp_path / "syn.h5"
    exs = make_store(str(path))
    with open_store(path) as s:
        assert len(s) == len(exs) == 12
        assert s.complete is True and s.summary == {"examples": 12}
        assert s.methods == ["rollout", "normxlogit", "norm"]
        assert s.labels == {0: "negative", 1: "positive"} and s.num_labels == 2
        assert s.n_layers == 3 and s.n_heads == 4
        assert s.model_info["model_id"] == "synthetic"
        assert s.config == {"model": "synthetic"}
        assert s.ids() == [f"ex{i}" for i in range(12)]
        for i, exp in enumerate(exs):
            e = s[i]
            assert e.index == i and e.row == i and e.id == f"ex{i}"
            assert e.text == exp.text and e.tokens == exp.tokens
            np.testing.assert_allclose(e.scores("normxlogit"), exp.results["normxlogit"]["scores"], rtol=1e-6)
            np.testing.assert_allclose(e.scores("rollout"), exp.results["rollout"]["scores"], rtol=1e-6)
            np.testing.assert_allclose(e.matrices("rollout"), exp.results["rollout"]["matrices"], atol=1e-3)
            np.testing.assert_allclose(e.class_scores("normxlogit"), exp.results["normxlogit"]["class_scores"],
                                       rtol=1e-6)
            assert e.matrices("norm") is None and e.layer_scores("norm") is None
        # unicode made it through (make_store's words include an accent and an emoji)
        all_tokens = {t for e in s for t in e.tokens}
        assert {"tédious", "🎬"} <= all_tokens
        assert any("🎬" in e.text or "tédious" in e.text for e in s)
        # negative indices, by_id, errors
        assert s[-1].id == "ex11" and s[-12].id == "ex0"
        assert s.by_id("ex7").index == 7
        with pytest.raises(IndexError):
            s[12]
        with pytest.raises(IndexError):
            s[-13]
        with pytest.raises(KeyError, match="ex99"):
            s.by_id("ex99")
        with pytest.raises(KeyError) as info:
            s[0].scores("nope")
        msg = str(info.value)
        assert "nope" in msg and all(m in msg for m in ("rollout", "normxlogit", "norm"))
        with pytest.raises(KeyError):
            s.method_info("nope")
        assert s.is_signed("normxlogit") and not s.is_signed("rollout")


def test_round_trip_all_fields(tmp_path):
    path = tmp_path / "rt.h5"
    exs = [example(i) for i in range(9)]
    w = create(path)
    w.append(exs[:4])
    w.append(exs[4:])
    assert w.n_committed == 9
    w.close(complete=True, summary={"examples": 9, "method_seconds": {"norm": 0.5}})
    with open_store(path) as s:
        assert len(s) == 9 and s.complete
        assert s.model_info["model_id"] == "synthetic-é"
        assert s.method_info("norm")["seconds"] == 0.5
        info = s.method_info("logat")
        assert info["matrices"] == "cls" and info["class_scores"] and info["n_layer_views"] == L
        for i, exp in enumerate(exs):
            assert_example(s[i], exp)
        assert [e.id for e in s] == [ex.id for ex in exs]
        assert s.by_id("ex-5-é").pair == "paire 5 ü"
        assert s[4].label is None and s[4].correct is None
        assert s[3].truncated and s[3].n_orig_tokens > s[3].n_tokens
        np.testing.assert_array_equal(s.index["row"], np.arange(9))
        with pytest.raises(TypeError):
            s["ex-0-é"]


def test_empty_store(tmp_path):
    path = tmp_path / "empty.h5"
    create(path).close(complete=True)
    with open_store(path) as s:
        assert len(s) == 0 and s.ids() == [] and list(s) == []
        with pytest.raises(IndexError):
            s[0]
        with pytest.raises(IndexError):
            s[-1]


def test_writer_refuses_existing_path_and_bad_shapes(tmp_path):
    path = tmp_path / "x.h5"
    w = create(path)
    bad = example(0)
    bad.results["rollout"]["scores"] = np.zeros(len(bad.token_ids) + 1)
    with pytest.raises(ValueError, match="rollout"):
        w.append([bad])
    w.close()
    with pytest.raises(StoreError):
        create(path)


def test_writer_names_the_example_whose_array_has_the_wrong_shape_in_a_batch(tmp_path):
    """The writer joins each key's arrays of a batch at once; a wrong shape is still named per example, also where
    two wrong lengths add up to the batch's tokens or only a leading dimension is wrong. Lists are taken as arrays."""
    def attempt(change):
        exs = [example(i) for i in range(6)]
        change(exs)
        path = tmp_path / f"bad{len(list(tmp_path.iterdir()))}.h5"
        w = create(path)
        try:
            w.append(exs)
        finally:
            w.close()

    def longer_and_shorter(exs):  # the batch's total length is right
        for i, d in ((2, 1), (4, -1)):
            a = exs[i].results["logat"]["layer_scores"]
            exs[i].results["logat"]["layer_scores"] = np.zeros((a.shape[0], a.shape[1] + d))

    with pytest.raises(ValueError, match=r"method 'logat', example ex-2\S*: layer_scores has shape \(3, \d+\)"):
        attempt(longer_and_shorter)

    def one_view_more(exs):
        a = exs[3].results["rollout"]["layer_scores"]
        exs[3].results["rollout"]["layer_scores"] = np.zeros((a.shape[0] + 1, a.shape[1]))

    with pytest.raises(ValueError, match=r"method 'rollout', example ex-3\S*: layer_scores has shape \(4, "):
        attempt(one_view_more)

    def square_cut(exs):
        exs[5].results["rollout"]["matrices"] = exs[5].results["rollout"]["matrices"][:, :-1]

    with pytest.raises(ValueError, match=r"method 'rollout', example ex-5\S*: matrices has shape"):
        attempt(square_cut)

    def as_lists(exs):
        for ex in exs:
            ex.results["logat"]["scores"] = ex.results["logat"]["scores"].tolist()
            ex.results["logat"]["layer_scores"] = ex.results["logat"]["layer_scores"].tolist()

    attempt(as_lists)
    with open_store(tmp_path / "bad3.h5") as s:
        for i in range(6):
            assert_example(s[i], example(i))


# --- versions and bad files -----------------------------------------------------------------------------------------


def _set_version(path: Path, version: str) -> None:
    with h5py.File(path, "r+") as f:
        f.attrs["encoding-version"] = version


def test_newer_minor_version_warns(tmp_path):
    path = tmp_path / "minor.h5"
    make_store(str(path))
    major, minor, _ = ENCODING_VERSION.split(".")
    newer = f"{major}.{int(minor) + 1}.0"
    _set_version(path, newer)
    with pytest.warns(UserWarning, match=newer):
        s = open_store(path)
    with s:
        assert len(s) == 12


@pytest.mark.parametrize("version", ["3.0.0", "0.9.1"])
def test_other_major_version_raises(tmp_path, version):
    path = tmp_path / "major.h5"
    make_store(str(path))
    _set_version(path, version)
    with pytest.raises(StoreError) as info:
        open_store(path)
    msg = one_line(str(info.value))
    assert version in msg and "reads formats 1.x to 2.x" in msg and "\n" not in str(info.value)


def test_not_hdf5_raises(tmp_path):
    path = tmp_path / "text.h5"
    path.write_text("this is not HDF5\n")
    with pytest.raises(StoreError) as info:
        open_store(path)
    assert "not a readable HDF5 file" in one_line(str(info.value))


def test_hdf5_but_not_a_store_raises(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(StoreError) as info:
        open_store(path)
    assert "not an attrscope store" in one_line(str(info.value))


def test_missing_file_raises(tmp_path):
    with pytest.raises(StoreError) as info:
        open_store(tmp_path / "nope.h5")
    assert "not found" in one_line(str(info.value))


# --- import weight --------------------------------------------------------------------------------------------------


def test_import_store_is_light(tmp_path):
    path = tmp_path / "light.h5"
    make_store(str(path))
    code = textwrap.dedent(f"""
        import json, sys
        import store
        s = store.open_store({str(path)!r})
        e = s[0]
        e.scores("rollout"); e.matrices("rollout"); e.tokens
        print(json.dumps(sorted(m for m in ("torch", "transformers", "textual", "compute", "tui") if m in sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


# --- a writer in another process ------------------------------------------------------------------------------------

WRITER_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, sys.argv[2])
    import store.writer as W
    from test_store import create, example

    gate = False
    _orig_append = W.append

    def _gated_append(ds, values):
        # Stop right before the index rows are appended: the data of the batch is written and flushed.
        if gate and ds.name == "/examples/index":
            print("data-flushed", flush=True)
            if sys.stdin.readline().strip() == "exit":  # die before the commit
                os._exit(0)
        _orig_append(ds, values)

    W.append = _gated_append
    w = create(sys.argv[1])
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "append":
            a, b = int(args[0]), int(args[1])
            w.append([example(i) for i in range(a, b)])
        elif cmd == "gate":
            gate = True
        elif cmd == "exit":  # die without closing the file
            os._exit(0)
        elif cmd == "hang":
            print("ok", flush=True)
            time.sleep(120)
        elif cmd == "close":
            w.close(complete=True)
        print("ok", flush=True)
""")


class Writer:
    """A StoreWriter driven line by line in a subprocess (a reader and a writer of one file in one process is not
    what SWMR is for)."""

    def __init__(self, path: Path, tmp_path: Path):
        script = tmp_path / "writer_proc.py"
        script.write_text(WRITER_SCRIPT)
        self.p = subprocess.Popen([sys.executable, str(script), str(path), str(TESTS)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        self.expect("ready")

    def expect(self, word: str) -> None:
        line = self.p.stdout.readline().strip()
        if line != word:
            self.p.kill()
            raise AssertionError(f"writer said {line!r}, expected {word!r}; stderr: {self.p.stderr.read()}")

    def send(self, line: str, reply: str | None = "ok") -> None:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        if reply:
            self.expect(reply)

    def finish(self) -> int:
        try:
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        return self.p.wait(timeout=30)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=30)


@pytest.fixture
def writer_factory(tmp_path):
    made = []

    def make(path):
        w = Writer(path, tmp_path)
        made.append(w)
        return w

    yield make
    for w in made:
        w.kill()


def test_reader_sees_new_examples_after_refresh(tmp_path, writer_factory):
    path = tmp_path / "live.h5"
    w = writer_factory(path)
    w.send("append 0 3")
    with open_store(path) as s:
        assert len(s) == 3 and not s.complete
        w.send("append 3 7")
        assert len(s) == 3  # not before refresh
        assert s.refresh() == 7 and len(s) == 7
        for i in range(7):
            assert_example(s[i], example(i))
        assert s.by_id("ex-6-é").index == 6
        w.send("append 7 8")
        assert s.refresh() == 8
        assert_example(s[-1], example(7))
    w.send("close")
    assert w.finish() == 0
    with open_store(path) as s:
        assert len(s) == 8 and s.complete


def test_uncommitted_data_is_invisible(tmp_path, writer_factory):
    path = tmp_path / "protocol.h5"
    w = writer_factory(path)
    w.send("append 0 2")
    w.send("gate")
    w.send("append 2 5", reply="data-flushed")  # the data of 2..4 is written and flushed, its rows are not
    committed_tokens = sum(len(example(i).token_ids) for i in range(2))
    with open_store(path) as s:
        s.refresh()
        assert len(s) == 2
        # the data is really there, past the last committed row
        assert s._f["tokens/ids"].shape[0] == committed_tokens + sum(len(example(i).token_ids) for i in range(2, 5))
        assert [e.id for e in s] == ["ex-0-é", "ex-1-é"]
        for i in range(2):
            assert_example(s[i], example(i))
        with pytest.raises(IndexError):
            s[2]
        w.send("go")  # release the gate: the rows are appended (the commit)
        assert s.refresh() == 5
        for i in range(5):
            assert_example(s[i], example(i))
    w.send("exit", reply=None)
    w.finish()


@pytest.mark.parametrize("death", ["exit", "sigkill"])
def test_resume_after_writer_died(tmp_path, writer_factory, death):
    path = tmp_path / "died.h5"
    w = writer_factory(path)
    w.send("append 0 3")
    w.send("append 3 6")
    w.send("gate")
    w.send("append 6 9", reply="data-flushed")  # uncommitted data of 6..8 is left in the file
    if death == "exit":
        w.send("exit", reply=None)
        w.finish()
    else:
        os.kill(w.p.pid, signal.SIGKILL)
        assert w.p.wait(timeout=30) == -signal.SIGKILL

    with open_store(path) as s:  # a killed SWMR writer's file opens and shows the committed prefix
        assert len(s) == 6 and not s.complete
        for i in range(6):
            assert_example(s[i], example(i))

    rw = resume_store(str(path))
    assert rw.n_committed == 6
    n_tok = sum(len(example(i).token_ids) for i in range(6))
    sq = sum(len(example(i).token_ids) ** 2 for i in range(6))
    f = rw._f
    # exactly the committed prefix was copied: the uncommitted tail is gone
    assert f["examples/index"].shape[0] == 6
    assert f["tokens/ids"].shape[0] == n_tok and f["tokens/spans"].shape == (n_tok, 2)
    assert f["methods/rollout/scores"].shape[0] == n_tok
    assert f["methods/rollout/layer_scores"].shape[0] == n_tok * L
    assert f["methods/rollout/matrices"].shape[0] == sq * L
    assert f["methods/logat/matrices"].shape[0] == n_tok * L
    assert f["methods/logat/class_scores"].shape[0] == n_tok * 2
    assert f["methods/norm/example_values/delta"].shape[0] == 6
    n_str = sum(len(t.encode()) for i in range(6) for t in example(i).tokens)
    assert f["tokens/strings"].shape[0] == n_str
    assert not os.path.exists(str(path) + ".resume-tmp")
    rw.append([example(i) for i in range(6, 8)])
    rw.append([example(8)])
    rw.close(complete=True)

    with open_store(path) as s:
        assert len(s) == 9 and s.complete
        assert s.model_info["model_id"] == "synthetic-é"
        np.testing.assert_array_equal(s.index["row"], np.arange(9))
        for i in range(9):
            assert_example(s[i], example(i))


def test_resume_of_a_closed_store_appends(tmp_path):
    path = tmp_path / "closed.h5"
    w = create(path)
    w.append([example(i) for i in range(4)])
    w.close(complete=True, summary={"examples": 4})
    rw = resume_store(str(path))
    assert rw.n_committed == 4
    rw.append([example(4), example(5)])
    rw.close()
    with open_store(path) as s:
        assert len(s) == 6 and not s.complete
        for i in range(6):
            assert_example(s[i], example(i))


def test_resume_of_a_non_store_raises(tmp_path):
    path = tmp_path / "junk.h5"
    path.write_bytes(b"\0junk" * 10)
    with pytest.raises(StoreError) as info:
        resume_store(str(path))
    one_line(str(info.value))


def test_close_while_a_reader_is_open(tmp_path, writer_factory):
    """Stamping the store complete (a non-SWMR reopen) works while a reader, e.g. attr-tui, has it open."""
    path = tmp_path / "watched.h5"
    w = writer_factory(path)
    w.send("append 0 3")
    with open_store(path) as s:
        assert len(s) == 3 and not s.complete
        w.send("close")  # the writer finishes while the store is being watched
        assert s.refresh() == 3 and s.complete  # ... and the open reader sees it finished
    assert w.finish() == 0
    with open_store(path) as s:
        assert len(s) == 3 and s.complete


def test_refresh_across_index_chunks(tmp_path, writer_factory):
    """A reader that stays open and refreshes reads correct rows past the first chunk of the index (256 rows)."""
    path = tmp_path / "many.h5"
    w = writer_factory(path)
    w.send("append 0 40")
    with open_store(path) as s:
        for start in range(40, 320, 40):
            w.send(f"append {start} {start + 40}")
            n = s.refresh()
            assert n == start + 40
            np.testing.assert_array_equal(s.index["row"], np.arange(n))
            assert s.ids()[-1] == f"ex-{n - 1}-é"
        for i in (0, 255, 256, 257, 300, 319):
            assert_example(s[i], example(i))
    w.send("exit", reply=None)
    w.finish()
    with open_store(path) as s:
        assert len(s) == 320
        np.testing.assert_array_equal(s.index["row"], np.arange(320))


# --- format 1.2 stores (written before checksums, separate ids and scale statistics) ----------------------------------

FIXTURE_1_2 = TESTS / "fixtures" / "store-1.2.h5"  # written by the format-1.2 writer (commit 5adfd87), see README there
FIXTURE_1_3 = TESTS / "fixtures" / "store-1.3.h5"  # the same content by the format-1.3 writer (make_store_1_3.py)
FIXTURE_1_6 = TESTS / "fixtures" / "store-1.6.h5"  # and by the format-1.6 writer (commit b3bbb1a), with digests


def _fixture_example(i: int) -> ExampleData:
    ex = example(i)
    ex.evidence = np.arange(len(ex.token_ids)) % 3 == i % 3
    return ex


@pytest.mark.parametrize("fixture, version", [(FIXTURE_1_2, "1.2.0"), (FIXTURE_1_3, "1.3.0"), (FIXTURE_1_6, "1.6.0")])
def test_reads_a_format_1_2_or_1_3_store(fixture, version):
    """Stores written by earlier writers (checked in) read as they were written."""
    with open_store(fixture) as s:
        assert s.format_version == version and len(s) == 10 and s.complete and s.has_evidence
        assert s.ids() == [f"ex-{i}-é" for i in range(10)] and s.find_id("ex-7-é") == 7
        for i in range(10):
            exp = _fixture_example(i)
            assert_example(s[i], exp)
            np.testing.assert_array_equal(s[i].evidence, exp.evidence)
        assert s.ids_range(3, 5) == ["ex-3-é", "ex-4-é"]
        assert s.texts_range(8, 10) == [example(8).text, example(9).text]
        np.testing.assert_array_equal(s.index_column("n_tokens"), [len(example(i).token_ids) for i in range(10)])
        hm = s.head_mask("positional")
        np.testing.assert_array_equal(hm, np.eye(3, 4))
        np.testing.assert_allclose(hm.stats["freq_max"], np.linspace(0, 1, 12).reshape(3, 4))
        assert hm.attrs == {"threshold": 0.8}
        np.testing.assert_allclose(s.metric_values("rollout", "aopc@attcat"), np.linspace(-0.5, 0.5, 10), rtol=1e-6)
        assert s.metric_info("rollout", "aopc@attcat")["curves"].shape == (10, 3)
        stored = s.scale_stats("rollout")
        assert (stored is None) == (version == "1.2.0")  # a 1.2 store has none stored; they are computed on request
        got = s.scale_stats("rollout", compute=True)
        scores = np.concatenate([example(i).results["rollout"]["scores"] for i in range(10)]).astype(np.float32)
        assert got["final"].count == scores.size
        np.testing.assert_allclose(got["final"].max_abs, np.abs(scores).max(), rtol=1e-7)
        if stored is not None:
            assert stored["final"].count == scores.size and stored["final"].max_abs == got["final"].max_abs
            assert s.metric_info("rollout", "aopc@attcat")["settings"] == {"levels": "ninths"}
            np.testing.assert_array_equal(s.metric_info("rollout", "aopc@attcat")["levels"][4], [1, 2, 3])


def test_resume_rewrites_a_format_1_2_store_in_the_current_format(tmp_path):
    path = tmp_path / "old.h5"
    path.write_bytes(FIXTURE_1_2.read_bytes())
    w = resume_store(str(path))
    w.append([_fixture_example(10), _fixture_example(11)])
    w.close(complete=True)
    with open_store(path) as s:
        assert s.format_version == ENCODING_VERSION == "2.1.0" and len(s) == 12
        for i in range(12):
            assert_example(s[i], _fixture_example(i))
            np.testing.assert_array_equal(s[i].evidence, _fixture_example(i).evidence)
        assert s.head_mask("positional").attrs == {"threshold": 0.8}
        assert s.metric_methods == []  # the metrics covered 10 of the 12 examples: a resumed run drops them
    assert b"GCOL" not in path.read_bytes()  # no global heap left (see test_no_variable_length_strings)


# --- lazy index, ids, scale statistics ------------------------------------------------------------------------------


def test_index_is_read_in_checked_blocks(tmp_path):
    import store.reader as R

    path = tmp_path / "blocks.h5"
    w = create(path)
    for a in range(0, 2600, 400):
        w.append([example(i) for i in range(a, min(a + 400, 2600))])
    w.close(complete=True)
    with open_store(path) as s:
        assert len(s._blocks) == 0  # opening read no index block
        assert s.ids_range(1023, 1026) == [f"ex-{i}-é" for i in range(1023, 1026)]
        assert sorted(s._blocks) == [0, 1]
        rows = s.index_rows(1000, 2100)
        np.testing.assert_array_equal(rows["row"], np.arange(1000, 2100))
        np.testing.assert_array_equal(s.index_column("n_tokens", 2590), [len(example(i).token_ids)
                                                                          for i in range(2590, 2600)])
        assert s.texts_range(2598, 2600) == [example(2598).text, example(2599).text]
        assert s.find_id("ex-2599-é") == 2599 and s.find_id("nope") is None
        assert_example(s[2047], example(2047))
        assert len(s._blocks) <= R._BLOCKS_KEPT


def test_scale_statistics_match_the_stored_values(tmp_path):
    path = tmp_path / "scale.h5"
    w = create(path)
    exs = [example(i) for i in range(30)]
    w.append(exs[:17])
    w.append(exs[17:])
    w.close(complete=True)
    with open_store(path) as s:
        for m in ("rollout", "logat", "norm"):
            stored = s.scale_stats(m)
            views = list(stored)
            # the same numbers as a direct computation from what the reader returns
            for k, view in enumerate(views):
                if view == "final":
                    vals = np.concatenate([s[i].scores(m) for i in range(30)])
                elif view.startswith("layer"):
                    vals = np.concatenate([s[i].layer_scores(m)[k - 1] for i in range(30)])
                else:
                    li = int(view.split()[1]) - 1
                    vals = np.concatenate([s[i].matrices(m)[li].ravel() for i in range(30)])
                st = stored[view]
                assert st.count == vals.size
                np.testing.assert_allclose([st.min, st.max, st.max_abs, st.mean],
                                           [vals.min(), vals.max(), np.abs(vals).max(), vals.astype(np.float64).mean()],
                                           rtol=1e-9)
                q = st.quantile_abs(0.9)
                assert np.quantile(np.abs(vals), 0.9) <= q * (1 + 1e-12) <= np.abs(vals).max() * (1 + 1e-12)
        assert [v for v in s.scale_stats("rollout")] == ["final", "layer 1", "layer 2", "layer 3", "matrix 1",
                                                         "matrix 2", "matrix 3"]


def test_scale_statistics_of_a_batch_equal_those_of_its_examples_one_by_one_bitwise():
    """The writer adds a whole batch per view in one vectorised pass; the reader (a store without statistics) adds
    one example at a time: the same numbers, bit for bit, non-finite values left out, however the batch is cut."""
    from store.scale import ScaleAccumulator

    rng = np.random.default_rng(0)
    layout = {"n_layer_views": 2, "matrices": "cls", "n_matrix_layers": 3}
    views = ["final", "layer 1", "layer 2", "matrix 1", "matrix 2", "matrix 3"]
    results = []
    for i in range(23):
        n = int(rng.integers(1, 40))
        r = {"scores": rng.normal(0, 10.0 ** rng.integers(-6, 3), n).astype(np.float32),
             "layer_scores": rng.normal(size=(2, n)).astype(np.float32),
             "matrices": rng.random((3, 1, n)).astype(np.float16)}
        if i % 5 == 1:
            r["scores"][0], r["layer_scores"][1, -1] = np.nan, np.inf
        results.append(r)
    one = ScaleAccumulator(views)
    for r in results:
        one.add_example(layout, r)
    for cuts in ([0, 23], [0, 7, 8, 23], [0, 1, 2, 3, 22, 23]):
        batched = ScaleAccumulator(views)
        for a, b in zip(cuts, cuts[1:]):
            batched.add_batch(layout, {k: [r[k] for r in results[a:b]] for k in results[0]})
        assert batched.summary.tobytes() == one.summary.tobytes() and np.array_equal(batched.hist, one.hist)
    assert one.summary[0, 0] == sum(len(r["scores"]) for r in results) - 5  # five NaN left out


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN payloads and overflows cast on purpose
def test_histogram_bins_looked_up_equal_the_formula_on_adversarial_values():
    """hist_bins looks bins up in a table built from the formula (floor of 8 log10|x|): the same bin for every
    float16, for every float32 and float64 within 4096 steps of a bin edge (and of a table range's ends), for zeros,
    subnormals, infinities, NaNs of both signs and random bit patterns (benchmarks/hist_bins_exhaustive.py checks
    all 2**32 float32 values)."""
    from store import schema
    from store.scale import _bin_tables, _bins_by_formula, hist_bins

    def same(x):
        x = np.asarray(x, dtype=np.float64)
        got, want = hist_bins(x), _bins_by_formula(x)
        assert got.shape == x.shape and got.dtype == np.int64
        bad = np.flatnonzero(got.ravel() != want.ravel())
        assert not bad.size, f"{x.ravel()[bad[0]]!r}: {got.ravel()[bad[0]]} != {want.ravel()[bad[0]]}"

    same(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16))  # every float16
    edge, _ = _bin_tables()
    near = np.arange(-4096, 4097)
    steps = edge[edge & 0xFFFF_FFFF_FFFF != 0xFFFF_FFFF_FFFF]  # where a range's bin changes: the bin edges
    assert len(steps) == schema.SCALE_N_BINS  # 145 edges from 1e-12 to 1e6, and inf to NaN
    starts = np.arange(1 << 15, dtype=np.int64) << 48  # each table range's first, second and last value
    ends = np.concatenate([starts, starts + 1, starts + (1 << 48) - 1])
    bits64 = np.concatenate([(steps[:, None] + near).ravel(), ends]).clip(0)
    same(np.concatenate([bits64, bits64 | np.int64(-(1 << 63))]).view(np.float64))  # both signs
    f32 = steps.view(np.float64).astype(np.float32)  # the float32 nearest each edge, and its neighbourhood
    bits32 = (f32[np.isfinite(f32)].view(np.int32).astype(np.int64)[:, None] + near).ravel()
    same(bits32[(bits32 >= 0) & (bits32 < 1 << 31)].astype(np.uint32).view(np.float32))
    rng = np.random.default_rng(0)
    same(rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32))
    same(rng.integers(-(1 << 63), (1 << 63) - 1, 1 << 20, dtype=np.int64).view(np.float64))
    same(np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 5e-324, 2.2250738585072014e-308, 1e-12, 1e6,
                   np.nextafter(1e-12, 0), np.nextafter(1e6, 0), np.finfo(np.float64).max]))
    same(rng.normal(size=(3, 5, 7)) * 10.0 ** rng.integers(-14, 8, size=(3, 5, 7)))  # any shape


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN payloads and overflows cast on purpose
def test_scale_statistics_of_clean_and_non_finite_views_equal_a_direct_computation_bitwise():
    """add_views takes a shortcut for views without NaN or inf (their bounds are finite): each statistic equals the
    direct one, bit for bit: the count, the finite values' min, max and max |x| (+0.0 for zeros), each example's
    float64 sum and sum of squares added in example order, and the histogram of the formula's bins. (The sign of a
    zero minimum or maximum is numpy's: its reductions pick either of -0.0 and 0.0, as they did before the shortcut.)"""
    from store import schema
    from store.scale import ScaleAccumulator, _bins_by_formula

    rng = np.random.default_rng(1)
    for case in range(40):
        k, sizes = int(rng.integers(1, 4)), rng.integers(1, 200, int(rng.integers(1, 12)))
        if case % 5 == 3:  # examples without values (a generation that stopped at once): first, inside, last
            sizes = np.concatenate([[0], sizes, [0, 0]])
            sizes[len(sizes) // 2] = 0 if len(sizes) > 4 else sizes[len(sizes) // 2]
        x = rng.normal(size=(k, int(sizes.sum()))) * 10.0 ** rng.integers(-14, 8, size=(k, 1))
        if case % 4 == 1:
            x[rng.random(x.shape) < 0.3] = 0.0
            x[rng.random(x.shape) < 0.1] = -0.0
        if case % 4 == 2:
            x[rng.random(x.shape) < 0.05] = rng.choice([np.nan, np.inf, -np.inf])
        x = x.astype(rng.choice([np.float16, np.float32, np.float64]))
        acc = ScaleAccumulator([f"v{i}" for i in range(k)])
        acc.add_views(0, x, sizes)
        for row, values in enumerate(x.astype(np.float64)):
            ok = values[np.isfinite(values)]
            total = total_sq = 0.0
            for part in np.split(np.where(np.isfinite(values), values, 0.0), np.cumsum(sizes)[:-1]):
                if part.size:
                    total += np.add.reduceat(part, [0])[0]  # the example's sum (reduceat's order of additions)
                    total_sq += np.add.reduceat(part * part, [0])[0]
            want = np.array([ok.size, ok.min(), ok.max(), np.abs(ok).max(), total, total_sq])
            got = acc.summary[row]
            assert got[[0, 3, 4, 5]].tobytes() == want[[0, 3, 4, 5]].tobytes(), (case, row, got, want)
            assert np.array_equal(got[1:3], want[1:3]), (case, row, got, want)  # a zero's sign is numpy's choice
            assert np.array_equal(acc.hist[row], np.bincount(_bins_by_formula(ok), minlength=schema.SCALE_N_BINS))


def test_scale_statistics_are_computed_incrementally_for_a_growing_store(tmp_path):
    path = tmp_path / "grow.h5"
    w = create(path)
    w.append([example(i) for i in range(5)])
    with open_store(path) as s:
        assert s.scale_stats("norm") is None
        first = s.scale_stats("norm", compute=True)["final"]
        assert first.count == sum(len(example(i).token_ids) for i in range(5))
        w.append([example(i) for i in range(5, 9)])
        s.refresh()
        seen = []
        later = s.scale_stats("norm", compute=True, progress=lambda done, total: seen.append((done, total)))["final"]
        assert later.count == sum(len(example(i).token_ids) for i in range(9))
        assert seen == [(9, 9)]  # only the new examples were read
    w.close(complete=True)


def test_no_variable_length_strings(tmp_path):
    """Text attributes are fixed-length (inside the checksummed object header): HDF5's global heap, where h5py puts
    variable-length strings, has no checksum and a damaged one made HDF5 loop forever."""
    path = tmp_path / "fixed.h5"
    from store_fuzz import make_target

    make_target(str(path))
    assert b"GCOL" not in path.read_bytes()
    with h5py.File(path, "r") as f:
        assert isinstance(f.attrs["methods"], bytes)


# --- damaged and truncated files ------------------------------------------------------------------------------------


def _timed_open(path) -> tuple[str, float]:
    import time

    t0 = time.monotonic()
    from store_fuzz import read_everything

    with pytest.raises(StoreError) as info:
        read_everything(str(path))
    return one_line(str(info.value)), time.monotonic() - t0


@pytest.mark.parametrize("complete", [True, False], ids=["closed", "killed-writer"])
def test_truncated_copy_fails_fast_and_says_its_size(tmp_path, complete):
    from store_fuzz import make_target

    src = tmp_path / "whole.h5"
    make_target(str(src), complete=complete)
    data = src.read_bytes()
    for cut in (0, 5, 47, 100, 1000, len(data) // 3, len(data) - 1):
        bad = tmp_path / f"cut{cut}.h5"
        bad.write_bytes(data[:cut])
        msg, took = _timed_open(bad)
        assert took < 2.0, (cut, took)
        assert str(bad) in msg
        if cut == 0:
            assert "empty" in msg
        elif cut < 48:
            assert "incomplete" in msg and f"{cut:,} bytes" in msg
        else:
            assert "incomplete" in msg and f"{cut:,} bytes of the {len(data):,}" in msg, msg


def _chunk_offset(path, name: str) -> tuple[int, int]:
    with h5py.File(path, "r") as f:
        info = f[name].id.get_chunk_info(0)
        return info.byte_offset, info.size


@pytest.mark.parametrize("name", ["examples/index", "methods/rollout/scores", "tokens/strings", "examples/ids"])
def test_a_flipped_byte_in_data_is_reported_not_read(tmp_path, name):
    from store_fuzz import make_target

    path = tmp_path / "flip.h5"
    make_target(str(path))
    off, size = _chunk_offset(path, name)
    data = bytearray(path.read_bytes())
    data[off + size // 2] ^= 0x10
    path.write_bytes(bytes(data))
    msg, took = _timed_open(path)
    assert took < 2.0 and "damaged" in msg and f"/{name}" in msg and str(path) in msg, msg


def test_a_zeroed_block_is_reported(tmp_path):
    from store_fuzz import make_target

    path = tmp_path / "zero.h5"
    make_target(str(path))
    off, size = _chunk_offset(path, "methods/logat/layer_scores")
    data = bytearray(path.read_bytes())
    data[off:off + size] = bytes(size)
    path.write_bytes(bytes(data))
    with open_store(path) as s:  # the header and index are intact: the store opens ...
        assert len(s) == 12
        with pytest.raises(StoreError, match="damaged.*logat/layer_scores"):
            s[0].layer_scores("logat")  # ... and the damaged data is refused, not shown as numbers
        np.testing.assert_allclose(s[0].scores("logat"), example(0).results["logat"]["scores"], rtol=1e-6)


def test_an_index_that_contradicts_itself_is_refused(tmp_path):
    """A store without checksums (format 1.2) whose index rows were damaged: caught by the row checks."""
    path = tmp_path / "old.h5"
    path.write_bytes(FIXTURE_1_2.read_bytes())
    with h5py.File(path, "r+") as f:
        idx = f["examples/index"][:]
        idx[4]["n_tokens"] = 0
        f["examples/index"][4] = idx[4]
    with open_store(path) as s:  # opening checks the last row only, which is fine ...
        assert len(s) == 10
        with pytest.raises(StoreError, match="damaged.*examples/index"):
            s[4]  # ... the block holding row 4 is refused as a whole


# --- metrics written in place ---------------------------------------------------------------------------------------


def _metric(method, name, n, seed, k=3):
    rng = np.random.default_rng(seed)
    from store import MetricData

    return MetricData(method, name, rng.normal(size=n), {"seed": seed}, {"mean": float(seed)}, seed % 2 == 0,
                      f"metric {seed}", rng.random((n, k)), rng.integers(-1, 50, (n, k)))


def _assert_metric(s, m):
    np.testing.assert_array_equal(s.metric_values(m.method, m.name), m.values.astype(np.float32))
    info = s.metric_info(m.method, m.name)
    assert info["settings"] == m.settings and info["summary"] == m.summary
    assert info["higher_is_better"] == m.higher_is_better and info["description"] == m.description
    np.testing.assert_array_equal(info["curves"], m.curves.astype(np.float32))
    np.testing.assert_array_equal(info["levels"], m.levels)
    assert s.metric_summaries(m.method)[m.name]["settings"] == m.settings


def test_metrics_are_added_in_place_and_replace_their_namesakes(tmp_path):
    from store import add_metrics

    path = tmp_path / "m.h5"
    w = create(path)
    w.append([example(i) for i in range(7)])
    w.close(complete=True)
    a, b = _metric("rollout", "comprehensiveness", 7, 1), _metric("norm", "aopc@attcat", 7, 2)
    inode = os.stat(path).st_ino
    add_metrics(str(path), [a, b])
    a2 = _metric("rollout", "comprehensiveness", 7, 4)
    add_metrics(str(path), [a2])
    assert os.stat(path).st_ino == inode  # written in place, not through a copy
    with open_store(path) as s:
        assert s.complete and s.metric_methods == ["norm", "rollout"]
        assert s.metric_names("rollout") == ["comprehensiveness"]
        _assert_metric(s, a2)
        _assert_metric(s, b)
        np.testing.assert_array_equal(s.metric_values("norm", "aopc@attcat", 2, 5), b.values[2:5].astype(np.float32))
        assert s.metrics("rollout").keys() == {"comprehensiveness"}
        with pytest.raises(KeyError, match="logat"):
            s.metric_names("logat")
        with pytest.raises(KeyError, match="nope"):
            s.metric_values("norm", "nope")
    with pytest.raises(StoreError, match="values for 7"):
        add_metrics(str(path), [_metric("norm", "x", 6, 5)])


def test_adding_metrics_to_a_format_1_2_store_keeps_its_metrics(tmp_path):
    from store import add_metrics

    path = tmp_path / "old.h5"
    path.write_bytes(FIXTURE_1_2.read_bytes())
    new = _metric("logat", "sufficiency", 10, 3)
    add_metrics(str(path), [new])
    with open_store(path) as s:
        assert s.format_version == ENCODING_VERSION == "2.1.0" and s.complete and len(s) == 10
        _assert_metric(s, new)
        np.testing.assert_allclose(s.metric_values("rollout", "aopc@attcat"), np.linspace(-0.5, 0.5, 10), rtol=1e-6)
        for i in range(10):
            assert_example(s[i], _fixture_example(i))


KILL_SCRIPT = textwrap.dedent("""
    import os, sys
    sys.path[:0] = [sys.argv[2], sys.argv[3]]
    import store
    import store.h5 as W
    from test_store import _metric
    stage = sys.argv[4]
    orig = W.append

    def gated(ds, values):
        if ds.name == "/metric_records/rows" and stage == "before-rows":
            os.kill(os.getpid(), 9)
        orig(ds, values)
        if ds.name == "/metric_records/numbers" and stage == "mid-numbers":
            os.kill(os.getpid(), 9)

    W.append = gated
    store.add_metrics(sys.argv[1], [_metric("logat", "comprehensiveness", 7, 9), _metric("rollout", "kendall", 7, 8)])
    if stage == "after":
        os.kill(os.getpid(), 9)
""")


@pytest.mark.parametrize("stage", ["mid-numbers", "before-rows", "after"])
def test_a_run_killed_while_adding_metrics_leaves_earlier_metrics_readable(tmp_path, stage):
    from store import add_metrics

    path = tmp_path / "k.h5"
    w = create(path)
    w.append([example(i) for i in range(7)])
    w.close(complete=True)
    first = _metric("rollout", "comprehensiveness", 7, 1)
    add_metrics(str(path), [first])
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    p = subprocess.run([sys.executable, str(script), str(path), str(REPO), str(TESTS), stage], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr
    with open_store(path) as s:
        assert len(s) == 7 and s.complete
        _assert_metric(s, first)
        names = {(m, n) for m in s.metric_methods for n in s.metric_names(m)}
        both = {("logat", "comprehensiveness"), ("rollout", "kendall")}
        assert names - {("rollout", "comprehensiveness")} == (both if stage == "after" else set())
        for i in range(7):
            assert_example(s[i], example(i))
    again = _metric("norm", "aopc", 7, 6)
    add_metrics(str(path), [again])  # the store takes metrics again (rewritten once if left open for write)
    with open_store(path) as s:
        _assert_metric(s, first)
        _assert_metric(s, again)


# --- tables ---------------------------------------------------------------------------------------------------------


def test_token_table_has_one_row_per_example_token_and_method(tmp_path):
    path = tmp_path / "t.h5"
    w = create(path)
    exs = [example(i) for i in range(9)]
    w.append(exs[:4])
    w.append(exs[4:])
    w.close(complete=True)
    with open_store(path) as s:
        t = s.token_table(["norm", "rollout"], layers=True, lo=2, hi=7)
        rows = [(m, i, p) for i in range(2, 7) for m in ("norm", "rollout") for p in range(len(exs[i].token_ids))]
        assert len(t["score"]) == len(rows)
        assert list(zip(t["method"], t["example"], t["position"])) == rows  # example -> method -> position
        k = 0
        for m, i, p in rows:
            ex = exs[i]
            assert t["id"][k] == ex.id and t["token"][k] == ex.tokens[p]
            assert t["label"][k] == ex.label and t["pred"][k] == ex.pred
            np.testing.assert_allclose(t["score"][k], ex.results[m]["scores"][p], rtol=1e-6)
            for v in range(L):
                want = ex.results[m]["layer_scores"][v, p] if m == "rollout" else np.nan
                np.testing.assert_allclose(t[f"layer_{v + 1}"][k], want, rtol=1e-6)
            k += 1
        chunks = list(s.iter_token_tables(["logat", "norm"], layers=True, chunk=4))
        assert [len(np.unique(c["example"])) for c in chunks] == [4, 4, 1]
        whole = s.token_table(["logat", "norm"], layers=True)
        for key in whole:  # two methods: chunks in method-major order would not concatenate to the whole
            np.testing.assert_array_equal(np.concatenate([c[key] for c in chunks]), whole[key])
            assert np.concatenate([c[key] for c in chunks]).dtype == whole[key].dtype
        assert "layer_1" not in s.token_table(["logat"])
        pd = pytest.importorskip("pandas")
        df = s.to_pandas(["rollout"], layers=True)
        assert list(df.columns[:8]) == ["example", "id", "position", "token", "label", "pred", "method", "score"]
        assert len(df) == sum(len(e.token_ids) for e in exs) and isinstance(df, pd.DataFrame)


def test_metric_table_has_one_row_per_example_and_method(tmp_path):
    from store import add_metrics

    path = tmp_path / "mt.h5"
    w = create(path)
    w.append([example(i) for i in range(5)])
    w.close(complete=True)
    a, b, c = _metric("rollout", "aopc", 5, 1), _metric("rollout", "lodds", 5, 2), _metric("norm", "aopc", 5, 3)
    add_metrics(str(path), [a, b, c])
    with open_store(path) as s:
        t = s.metric_table()
        assert list(t) == ["example", "id", "method", "aopc", "lodds"]
        assert list(t["method"]) == ["rollout", "norm"] * 5 and list(t["example"]) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
        np.testing.assert_array_equal(t["aopc"], np.stack([a.values, c.values], 1).reshape(-1).astype(np.float32))
        np.testing.assert_array_equal(t["lodds"][::2], b.values.astype(np.float32))
        assert np.isnan(t["lodds"][1::2]).all() and list(t["id"][:3]) == ["ex-0-é", "ex-0-é", "ex-1-é"]
        chunks = list(s.iter_metric_tables(chunk=2))
        assert [len(c["example"]) for c in chunks] == [4, 4, 2]
        for key in t:
            np.testing.assert_array_equal(np.concatenate([c[key] for c in chunks]), t[key])


# --- merging shard stores --------------------------------------------------------------------------------------------


def _shard(path, rows, **extra):
    w = create(path, **extra)
    half = (rows.start + rows.stop) // 2
    w.append([example(i) for i in range(rows.start, half)])
    w.append([example(i) for i in range(half, rows.stop)])
    w.close(complete=True)


def test_merge_joins_shards_in_dataset_order(tmp_path):
    from store import merge

    parts = [range(0, 5), range(5, 6), range(6, 13)]
    paths = [tmp_path / f"s{k}.h5" for k in range(3)]
    for p, r in zip(paths, parts):
        _shard(p, r)
    out = tmp_path / "merged.h5"
    merge(str(out), [str(p) for p in paths], {"merged": True}, attrs={"world_size": 3}, summary={"examples": 13})
    with open_store(out) as s:
        assert len(s) == 13 and s.complete and s.config == {"merged": True} and s.summary == {"examples": 13}
        assert s.model_info["world_size"] == 3 and s.model_info["model_id"] == "synthetic-é"
        for i in range(13):
            assert_example(s[i], example(i))
        # the scale statistics cover every shard
        assert s.scale_stats("norm")["final"].count == sum(len(example(i).token_ids) for i in range(13))
    # a single-store run of the same examples gives the same datasets, bit for bit
    whole = tmp_path / "whole.h5"
    _shard(whole, range(0, 13))
    with h5py.File(out, "r") as a, h5py.File(whole, "r") as b:
        def same(name, obj):
            if isinstance(obj, h5py.Dataset) and name != "provenance":
                x, y = obj[()], b[name][()]  # as bytes: the index's NaN fields (output, gold_value) equal themselves
                assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
        a.visititems(same)


def test_merge_refuses_mismatched_overlapping_or_incomplete_shards(tmp_path):
    from store import merge

    _shard(tmp_path / "a.h5", range(0, 4))
    _shard(tmp_path / "b.h5", range(3, 6))  # overlaps a
    _shard(tmp_path / "c.h5", range(4, 8))
    w = create(tmp_path / "d.h5")
    w.append([example(8)])
    w.close()  # not complete
    other = tmp_path / "e.h5"
    StoreWriter.create(str(other), n_layers=L, n_heads=4, labels={0: "neg", 1: "pos"}, methods=layouts(),
                       provenance={}).close(complete=True)
    out = str(tmp_path / "out.h5")
    cases = [(["a.h5", "b.h5"], "overlap"), (["c.h5", "a.h5"], "out of order"), (["a.h5", "d.h5"], "not complete"),
             (["a.h5", "e.h5"], "labels")]
    for names, words in cases:
        with pytest.raises(StoreError, match=words) as info:
            merge(out, [str(tmp_path / n) for n in names], {})
        one_line(str(info.value))
        assert not os.path.exists(out) and not os.path.exists(out + ".merge-tmp")


@pytest.mark.parametrize("chunk", [1, 5, 8192])
def test_metric_mean_curve_in_chunks_equals_the_full_mean(tmp_path, chunk):
    """Store.metric_mean_curve reads the curves a chunk of examples at a time; its means (finite points, levels
    >= 0) equal those of the whole arrays, in today's layout and in a format 1.2 store's metric group."""
    import os
    import shutil
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from test_tui_metrics import make_metrics_store

    from store import open_store

    path = tmp_path / "m.h5"
    make_metrics_store(path)
    old = tmp_path / "old.h5"
    shutil.copy(os.path.join(os.path.dirname(__file__), "fixtures", "store-1.2.h5"), old)
    checked = 0
    for p in (path, old):
        with open_store(p) as s:
            for m in s.metric_methods:
                for name in s.metric_names(m):
                    info = s.metric_info(m, name)
                    curve, levels = s.metric_mean_curve(m, name, chunk=chunk)
                    if info["curves"] is None:
                        assert curve is None and levels is None
                        continue
                    c = np.asarray(info["curves"], np.float64)
                    ok = np.isfinite(c)
                    want = np.where(ok.any(0), np.where(ok, c, 0).sum(0) / np.maximum(ok.sum(0), 1), np.nan)
                    np.testing.assert_allclose(curve, want, rtol=1e-12, equal_nan=True)
                    lv = np.asarray(info["levels"], np.float64)
                    okl = lv >= 0
                    np.testing.assert_allclose(levels, np.where(okl.any(0), np.where(okl, lv, 0).sum(0) /
                                                                np.maximum(okl.sum(0), 1), np.nan), rtol=1e-12)
                    checked += 1
    assert checked >= 4  # three methods' aopc@attcat and the old store's


def test_a_method_in_a_newer_layout_is_left_out_and_the_rest_read(tmp_path):
    """Each method group carries its layout version: a reader that does not know one method's version names it in a
    warning and reads every other method as written."""
    import h5py

    from store import schema

    path = tmp_path / "layouts.h5"
    w = create(path)
    w.append([example(i) for i in range(4)])
    w.close(complete=True)
    with h5py.File(path, "r") as f:
        assert {m: int(f[schema.method_group(m)].attrs["layout-version"]) for m in ("rollout", "logat", "norm")} == {
            "rollout": schema.METHOD_LAYOUT_VERSION, "logat": schema.METHOD_LAYOUT_VERSION,
            "norm": schema.METHOD_LAYOUT_VERSION}
    with h5py.File(path, "r+") as f:
        f[schema.method_group("logat")].attrs["layout-version"] = schema.METHOD_LAYOUT_VERSION + 1
    with pytest.warns(UserWarning, match="method 'logat' is stored in layout version 2"):
        s = open_store(path)
    with s:
        assert s.methods == ["rollout", "norm"] and len(s) == 4
        assert any("upgrade attrscope" in note for note in s.warnings)
        for i in range(4):
            exp = example(i)
            np.testing.assert_allclose(s[i].scores("rollout"), exp.results["rollout"]["scores"], rtol=1e-6)
            np.testing.assert_allclose(s[i].layer_scores("rollout"), exp.results["rollout"]["layer_scores"], rtol=1e-6)
            np.testing.assert_allclose(s[i].scores("norm"), exp.results["norm"]["scores"], rtol=1e-6)
            assert s[i].example_values("norm") == pytest.approx(exp.results["norm"]["example_values"], rel=1e-6)


def test_sequential_reads_give_the_same_arrays_in_a_few_large_reads(tmp_path, monkeypatch):
    """Store.sequential() (the merge's and copy's pass over every example) serves each example's arrays from
    read-ahead windows: the same values as one read per array, and far fewer reads of the file."""
    import h5py

    path = tmp_path / "s.h5"
    make_store(path, n_examples=40, L=3, with_values=True)

    def every_array(s):
        out = []
        for e in s:
            out += [e.token_ids, e.spans, e.segment, np.array(e.tokens)]
            for m in s.methods:
                out += [e.scores(m), e.layer_scores(m), e.matrices(m), e.class_scores(m)]
        return out

    reads = []
    real = h5py.Dataset.__getitem__
    monkeypatch.setattr(h5py.Dataset, "__getitem__", lambda ds, sel: (reads.append(ds.name), real(ds, sel))[1])
    with open_store(path) as s:
        plain = every_array(s)
        n_plain = len(reads)
        reads.clear()
        with s.sequential(rows=64):  # small windows: several refills per dataset
            ahead = every_array(s)
        reads.clear()
        with s.sequential():
            assert all(np.array_equal(a, b) for a, b in zip(every_array(s), plain) if a is not None)
        n_ahead = len(reads)
        assert s._ahead is None  # the windows are dropped on the way out
    assert len(plain) == len(ahead)
    for a, b in zip(plain, ahead):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(a, b)
    assert n_ahead * 5 < n_plain, (n_ahead, n_plain)


# --- a complete store whose index was shortened ---------------------------------------------------------------------


def _complete_with_metric(path: Path, n: int) -> None:
    from store import add_metrics

    w = create(path)
    w.append([example(i) for i in range(n)])
    w.close(complete=True, summary={"examples": n})
    if n == 10:
        add_metrics(str(path), [_metric("rollout", "aopc", n, seed=1)])


def _flat_lengths(path: Path) -> dict[str, int]:
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj.shape[0]) if isinstance(obj, h5py.Dataset)
                     and obj.maxshape[0] is None and not name.startswith(("metric", "examples/index")) else None)
    return out


@pytest.mark.parametrize("rows", [4, 0])
def test_a_complete_store_whose_index_was_shortened_is_refused(tmp_path, rows):
    """Rows cut off the index of a complete store (still marked complete): the examples past it are not silently
    left out (an export of fewer rows, 4 examples reported beside 10-example metrics); the store is refused."""
    path = tmp_path / "cut.h5"
    _complete_with_metric(path, 10)
    with h5py.File(path, "r+", locking=False) as f:
        f["examples/index"].resize((rows,))
    with pytest.raises(StoreError) as err:
        open_store(path)
    assert "cut.h5' is damaged" in one_line(str(err.value)) and f"the {rows} committed examples" in str(err.value)


def test_a_complete_store_whose_metrics_outnumber_its_examples_is_refused(tmp_path):
    """Index and every example dataset cut consistently to 5 examples: the 10-example metric still gives it away."""
    path, five = tmp_path / "cut.h5", tmp_path / "five.h5"
    _complete_with_metric(path, 10)
    _complete_with_metric(five, 5)
    lengths = _flat_lengths(five)
    with h5py.File(path, "r+", locking=False) as f:
        f["examples/index"].resize((5,))
        for name, n in lengths.items():
            f[name].resize((n,) + f[name].shape[1:])
    with pytest.raises(StoreError) as err:
        open_store(path)
    assert one_line(str(err.value)).startswith(f"store '{path}' is damaged: metric 'aopc' of 'rollout'")
    assert "10 values for the 5 examples" in str(err.value)
    with open_store(five) as s:  # the same cut without the metric is a store of 5 examples
        assert len(s) == 5 and s.complete
