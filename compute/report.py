"""``attr-compute report STORE``: every method x metric of a store in one table, the papers' numbers beside ours
where the setting is comparable (METHODS.md section 12, SST-2 columns), and each paper's claimed ranking checked
against ours.

Comparable means the same metric variant (the preset a paper's evaluation uses) on SST-2; the papers used
BERT-base checkpoints, so absolute numbers differ with the model: the orderings are what can be compared.
"""

from __future__ import annotations

import csv
import io
import math

from store import open_store
from store.text import printable_text

from .errors import AttrscopeError
from .papers import REPORT_TABLES  # the papers' SST-2 tables (compute/papers.py)

def _metric_key(preset: str | None, metric: str) -> str:
    return metric if preset is None else f"{metric}@{preset}"


def _find(summaries: dict, table: dict) -> str | None:
    """The stored metric that is a paper table's variant: 'aopc@attcat', or 'aopc' computed with that preset, with
    the settings the table names (a setting the store does not record is the default, which they name)."""
    for name, info in summaries.items():
        st = info.get("settings", {})
        if st.get("metric", name.partition("@")[0]) != table["metric"]:
            continue
        if (st.get("preset") or None) == table["preset"] and all(
                st.get(k, v) == v for k, v in table.get("settings", {}).items()):
            return name
    return None


def _metric_order(name: str):
    from .metrics import REGISTRY

    base, _, preset = name.partition("@")
    names = list(REGISTRY)
    return (names.index(base) if base in names else len(names), preset)


def _fmt(x, digits=3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def make_report(path: str, fmt: str = "markdown") -> str:
    s = open_store(path)
    with s:
        if not s.metric_methods:
            raise AttrscopeError(f"store '{path}' has no metrics: add them with attr-compute eval {path} --metrics ...")
        # the store's method order (canonical), metrics in the registry's order, then by preset
        summ = {m: s.metric_summaries(m) for m in s.methods if m in s.metric_methods}
        metrics = sorted(dict.fromkeys(k for m in summ.values() for k in m), key=_metric_order)
        info = {"store": path, "model": s.model_info.get("model_id"), "dataset": s.model_info.get("dataset"),
                "examples": len(s), "command": " ".join(s.config.get("command", []))}
    if fmt == "csv":
        return _csv(summ, metrics)
    return printable_text(_markdown(summ, metrics, info))  # names from the store and the user: no escape sequences


def _csv(summ, metrics) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["method", "metric", "mean", "std", "n", "higher_is_better", "paper", "paper_value"])
    for method, ms in summ.items():
        for name in metrics:
            if name not in ms:
                continue
            sm = ms[name]["summary"]
            paper, value = "", ""
            for p in REPORT_TABLES:
                if _find(ms, p) == name and method in p["values"]:
                    paper, value = p["paper"], p["values"][method]
            w.writerow([printable_text(method), printable_text(name), sm.get("mean"), sm.get("std"), sm.get("n"),
                        ms[name]["higher_is_better"], paper, value])
    return buf.getvalue()


def _markdown(summ, metrics, info) -> str:
    out = [f"# Faithfulness report: {info['store']}", "",
           f"Model `{info['model']}`, dataset `{info['dataset']}`, {info['examples']} examples.", ""]
    if info["command"]:
        out += [f"Attributions made with: `{info['command']}`", ""]
    arrows = {}
    for ms in summ.values():
        for k, v in ms.items():
            arrows[k] = "↑" if v["higher_is_better"] else "↓"
    out += ["## All methods x metrics (mean over examples)", "",
            "| method | " + " | ".join(f"{k} {arrows[k]}" for k in metrics) + " |",
            "|---|" + "---|" * len(metrics)]
    for method, ms in summ.items():
        out.append(f"| `{method}` | " + " | ".join(_fmt(ms[k]["summary"].get("mean")) if k in ms else "—"
                                                  for k in metrics) + " |")
    out += ["", "## Beside the papers (SST-2; the papers used BERT-base checkpoints, so compare orderings)", ""]
    verdicts = []
    for p in REPORT_TABLES:
        rows = []
        for method, paper_value in p["values"].items():
            name = _find(summ.get(method, {}), p)
            if name is None:
                continue
            rows.append((method, summ[method][name]["summary"].get("mean"), paper_value,
                         summ[method][name]["higher_is_better"]))
        if len(rows) < 2:
            continue
        higher = rows[0][3]
        out += [f"### {p['paper']}", "", f"metric `{_metric_key(p['preset'], p['metric'])}` "
                f"({'higher' if higher else 'lower'} is better)" + (f"; {p['note']}" if p.get("note") else ""), "",
                "| method | ours | paper | our rank | paper rank |", "|---|---|---|---|---|"]
        ours_rank = _ranks([r[1] for r in rows], higher)
        paper_rank = _ranks([r[2] for r in rows], higher)
        for (method, ours, paper_value, _), ro, rp in zip(rows, ours_rank, paper_rank):
            out.append(f"| `{method}` | {_fmt(ours)} | {_fmt(paper_value)} | {ro} | {rp} |")
        tau = _kendall([r[1] for r in rows], [r[2] for r in rows])
        claim = p["claim"]
        if claim in [r[0] for r in rows]:
            best = [r[0] for r, rk in zip(rows, ours_rank) if rk == 1]
            holds = claim in best
            verdict = (f"{p['paper']} ({_metric_key(p['preset'], p['metric'])}): the paper ranks `{claim}` first; "
                       f"here {'it is first too' if holds else 'first is ' + ', '.join(f'`{b}`' for b in best)}")
            verdicts.append(("holds" if holds else "does not hold", verdict, tau))
        out += ["", f"Kendall tau between our ordering and the paper's over these {len(rows)} methods: {_fmt(tau, 2)}.",
                ""]
    if verdicts:
        out += ["## The papers' claimed orderings, checked", ""]
        for status, text, tau in verdicts:
            out.append(f"- **{status}** — {text} (ordering agreement tau {_fmt(tau, 2)}).")
        out.append("")
    return "\n".join(out)


def _ranks(values, higher: bool) -> list[int]:
    """1 = best; NaN last."""
    key = [(-v if higher else v) if v is not None and not math.isnan(v) else math.inf for v in values]
    order = sorted(range(len(values)), key=lambda i: key[i])
    ranks = [0] * len(values)
    for r, i in enumerate(order, 1):
        ranks[i] = r
    return ranks


def _kendall(a, b) -> float:
    """Kendall tau-a between two score lists (pairs with a NaN skipped)."""
    num = den = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            x, y = a[i] - a[j], b[i] - b[j]
            if any(v is None or math.isnan(v) for v in (a[i], a[j])):
                continue
            den += 1
            num += (x > 0) - (x < 0) if y > 0 else ((x < 0) - (x > 0) if y < 0 else 0)
    return num / den if den else float("nan")
