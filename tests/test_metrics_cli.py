"""Metrics in attr-compute: --metrics in a run, ``attr-compute eval STORE``, ``attr-compute report STORE``, the
metric store layout and API, and the one-line errors (tiny models from conftest)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

from cli_results import invoke, ok, one_line
from store import open_store

WORDS = "the movie was great but long and boring film good bad not very a plot story loved hated fun dull".split()


def write_data(path: Path, n: int = 10, evidence: bool = False) -> list[dict]:
    rows = []
    for i in range(n):
        words = [WORDS[(i * 5 + 3 * k) % len(WORDS)] for k in range(4 + i % 7)]
        text = " ".join(words)
        row = {"id": f"e{i}", "text": text, "label": i % 2}
        if evidence:  # the second word is the evidence
            a = len(words[0]) + 1
            row["evidence"] = [[a, a + len(words[1])]]
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows





METRICS = "comprehensiveness,sufficiency,aopc,aopc@attcat,lodds@attcat,aopc@masklrp,lodds@masklrp,aopc@normxlogit," \
          "accuracy@normxlogit,kendall,spearman"
METHODS = "raw_attention,rollout,gxi_l2,attcat,norm"


@pytest.fixture(scope="module")
def metric_store(tiny_model_dirs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics")
    rows = write_data(tmp / "d.jsonl")
    out = tmp / "m.h5"
    ok(invoke("run", tmp / "d.jsonl", "--model", tiny_model_dirs["bert"], "-o", out, "--device", "cpu",
              "--methods", METHODS, "--target", "all", "--metrics", METRICS, "-q"))
    return {"out": out, "rows": rows, "tmp": tmp, "model": tiny_model_dirs["bert"]}


def test_run_with_metrics_stores_every_metric(metric_store):
    with open_store(metric_store["out"]) as s:
        assert sorted(s.metric_methods) == sorted(METHODS.split(","))
        for method in METHODS.split(","):
            vals = s.metrics(method)
            assert set(vals) == set(METRICS.split(","))
            summ = s.metric_summaries(method)
            for name, v in vals.items():
                assert v.shape == (len(s),)
                finite = v[np.isfinite(v)]
                assert finite.size > 0, (method, name)
                np.testing.assert_allclose(summ[name]["summary"]["mean"], finite.mean(), rtol=1e-5)
            # the paper variants are recorded with their exact settings
            assert summ["aopc@attcat"]["settings"]["preset"] == "attcat"
            assert summ["aopc@attcat"]["settings"]["perturbation"] == "delete"
            assert summ["lodds@masklrp"]["settings"]["perturbation"] == "pad"
            assert summ["aopc@normxlogit"]["settings"]["perturbation"] == "mask"
            assert summ["spearman"]["settings"]["saliency"] == "gxi_l2"
            info = s.metric_info(method, "comprehensiveness")
            assert info["curves"].shape == (len(s), 6) and info["levels"][:, 0].tolist() == [0] * len(s)
        # a method correlated with itself: spearman 1; a class-independent method: kendall 1
        np.testing.assert_allclose(s.metrics("gxi_l2")["spearman"], 1.0, atol=1e-6)
        np.testing.assert_allclose(s.metrics("raw_attention")["kendall"], 1.0, atol=1e-6)


def test_eval_adds_metrics_to_an_existing_store(metric_store, tmp_path):
    out = tmp_path / "plain.h5"
    ok(invoke("run", metric_store["tmp"] / "d.jsonl", "--model", metric_store["model"], "-o", out, "--device", "cpu",
              "--methods", "rollout,norm", "-q"))
    with open_store(out) as s:
        assert s.metric_methods == []
    ok(invoke("eval", out, "--metrics", "comprehensiveness,aopc@masklrp", "--device", "cpu", "-q"))
    with open_store(out) as s, open_store(metric_store["out"]) as ref:
        assert sorted(s.metric_methods) == ["norm", "rollout"]
        for m in ("rollout", "norm"):
            for k in ("comprehensiveness", "aopc@masklrp"):
                np.testing.assert_allclose(s.metrics(m)[k], ref.metrics(m)[k], rtol=1e-5, atol=1e-6)
    # again with another variant under the same name: replaced, not duplicated
    ok(invoke("eval", out, "--metrics", "comprehensiveness", "--device", "cpu", "--methods", "rollout", "-q",
              "--model", metric_store["model"]))
    with open_store(out) as s:
        assert sorted(s.metrics("rollout")) == ["aopc@masklrp", "comprehensiveness"]


def test_report_markdown_and_csv(metric_store, tmp_path):
    res = ok(invoke("report", metric_store["out"]))
    text = res.stdout
    assert "| method |" in text and "`attcat`" in text
    assert "AttCAT (Qiang et al. 2022)" in text and "our rank" in text
    assert "claimed orderings, checked" in text
    res = ok(invoke("report", metric_store["out"], "--format", "csv", "-o", tmp_path / "r.csv"))
    rows = list(csv.DictReader(io.StringIO((tmp_path / "r.csv").read_text())))
    assert {r["method"] for r in rows} == set(METHODS.split(","))
    attcat_aopc = [r for r in rows if r["method"] == "attcat" and r["metric"] == "aopc@attcat"]
    assert attcat_aopc and float(attcat_aopc[0]["paper_value"]) == pytest.approx(0.371)


def test_evidence_metrics(tiny_model_dirs, tmp_path):
    write_data(tmp_path / "ev.jsonl", evidence=True)
    out = tmp_path / "ev.h5"
    ok(invoke("run", tmp_path / "ev.jsonl", "--model", tiny_model_dirs["bert"], "-o", out, "--device", "cpu",
              "--methods", "rollout,norm", "--evidence-column", "evidence", "-q",
              "--metrics", "precision_at_k,dot_product,average_precision", "--precision-k", "2"))
    with open_store(out) as s:
        for ex in s:
            assert ex.evidence.sum() == 1 and ex.evidence[2]  # [CLS] w0 w1: the second word is token 2
        ap = s.metrics("norm")["average_precision"]
        assert np.all((ap > 0) & (ap <= 1))


def test_errors_are_one_line(metric_store, tmp_path):
    out = metric_store["out"]
    assert "unknown metric" in one_line(invoke("eval", out, "--metrics", "nope"), 2)
    assert "not found" in one_line(invoke("eval", tmp_path / "missing.h5", "--metrics", "aopc"))
    plain = tmp_path / "p.h5"
    ok(invoke("run", metric_store["tmp"] / "d.jsonl", "--model", metric_store["model"], "-o", plain, "--device",
              "cpu", "--methods", "attcat,norm", "-q"))
    assert "--target all" in one_line(invoke("eval", plain, "--metrics", "kendall", "--device", "cpu"))
    assert "saliency" in one_line(invoke("eval", plain, "--metrics", "spearman", "--device", "cpu"))
    assert "--other" in one_line(invoke("eval", plain, "--metrics", "jaccard_25", "--device", "cpu"), 2)
    assert "no preset" in one_line(invoke("eval", plain, "--metrics", "aopc@alti", "--device", "cpu"), 2)
    assert "no metrics" in one_line(invoke("report", plain))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "a film", "label": 1, "evidence": "[[0, 99]]"}) + "\n")
    assert "evidence" in one_line(invoke("run", bad, "--model", metric_store["model"], "-o", tmp_path / "b.h5",
                                         "--evidence-column", "evidence"))


def test_jaccard_between_two_stores(metric_store, tmp_path):
    other = tmp_path / "o.h5"
    ok(invoke("run", metric_store["tmp"] / "d.jsonl", "--model", metric_store["model"], "-o", other, "--device",
              "cpu", "--methods", "rollout", "-q"))
    ok(invoke("eval", other, "--metrics", "jaccard_25,seed_spearman", "--other", metric_store["out"], "--device",
              "cpu", "-q"))
    with open_store(other) as s:
        m = s.metrics("rollout")
        np.testing.assert_allclose(m["jaccard_25"], 1.0)  # the same model: identical rankings
        np.testing.assert_allclose(m["seed_spearman"], 1.0)


def test_report_sets_decompx_beside_its_papers_tables(tiny_model_dirs, tmp_path):
    write_data(tmp_path / "d.jsonl", n=6)
    out = tmp_path / "dx.h5"
    ok(invoke("run", tmp_path / "d.jsonl", "--model", tiny_model_dirs["bert"], "-o", out, "--device", "cpu",
              "--methods", "decompx,decompx_nohead,gxi_l2,ig_l2,alti,normxlogit", "--preset", "decompx", "-q",
              "--metrics", "aopc@decompx,accuracy@decompx,aopc@normxlogit"))
    text = ok(invoke("report", out)).stdout
    with open_store(out) as s:
        summ = {m: s.metric_summaries(m) for m in ("decompx", "decompx_nohead", "gxi_l2")}
        assert summ["decompx"]["aopc@decompx"]["settings"]["levels"] == "ranked_tenths"
        ig, alti = s.method_info("ig_l2")["params"], s.method_info("alti")["params"]
        assert (ig["baseline"], ig["rule"], ig["steps"], ig["target"]) == ("zero", "riemann", 10, "predicted")
        assert alti["eps_quirk"] is True and alti["pairwise_eps"] == 1e-6
    paper = {"aopc": {"decompx": .627, "decompx_nohead": .288, "gxi_l2": .310},
             "accuracy": {"decompx": .408, "decompx_nohead": .6993, "gxi_l2": .6669}}
    for metric, heading in (("aopc", "Table 1, BERT-base SST-2 (AOPC, [MASK], most important)"),
                            ("accuracy", "Table 1, BERT-base SST-2 (Accuracy, [MASK], most important)")):
        section = text[text.index(f"### DecompX (Modarressi et al. 2023), {heading}"):]
        section = section[:section.index("Kendall tau")]
        assert f"metric `{metric}@decompx`" in section
        for method, value in paper[metric].items():
            ours = summ[method][f"{metric}@decompx"]["summary"]["mean"]
            assert f"| `{method}` | {ours:.3f} | {value:.3f} |" in section, (metric, method)
    # NormXLogit's Table 1 lists DecompX too (aopc@normxlogit); gxi_l2 is not one of its rows (its GI is gxi_mean)
    section = text[text.index("### NormXLogit (Abbasi et al.), Table 1"):]
    section = section[:section.index("Kendall tau")]
    assert f"| `decompx` | {summ['decompx']['aopc@normxlogit']['summary']['mean']:.3f} | 0.574 |" in section
    assert "| `normxlogit` |" in section and "0.423" in section
    assert "`gxi_l2`" not in section
    assert "DecompX (Modarressi et al. 2023), Table 1, BERT-base SST-2 (AOPC, [MASK], most important) " \
           "(aopc@decompx): the paper ranks `decompx` first" in text


def test_eval_refuses_a_damaged_store_before_the_model_loads(tiny_model_dirs, tmp_path):
    """A flipped byte in the stored metrics (read by nothing eval computes from): eval wrote its metrics into the
    damaged file and ended in 'internal error: OSError ... filter returned failure' (or hung in HDF5's write path);
    the store is now read whole first and refused in one line."""
    import h5py

    write_data(tmp_path / "d.jsonl", n=4)
    out = tmp_path / "s.h5"
    ok(invoke("run", tmp_path / "d.jsonl", "--model", tiny_model_dirs["bert"], "-o", out, "--device", "cpu",
              "--methods", "rollout", "--metrics", "comprehensiveness", "-q"))
    with h5py.File(out, "r") as f:
        info = f["metric_records/numbers"].id.get_chunk_info(0)
    data = bytearray(out.read_bytes())
    data[info.byte_offset + info.size // 2] ^= 0x10
    out.write_bytes(bytes(data))
    line = one_line(invoke("eval", out, "--metrics", "sufficiency", "--device", "cpu", "-q"))
    assert f"store '{out}' is damaged: /metric_records/numbers cannot be read" in line
