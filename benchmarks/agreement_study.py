"""Subject-verb agreement with a tiny masked LM: do ALTI, NormXLogit and the other methods point at the subject?

No pretrained masked LM is available offline, so this study makes its own: a synthetic English agreement corpus from
a small grammar, a tiny BertForMaskedLM trained on it on the CPU, and a held-out test file in the layout of the
Linzen et al. (2016) agreement file (plus foil and evidence columns). Then the same attr-compute command a user runs on
bert-base-uncased with the real file, and the figures read back from the store.

The grammar: "the [ADJ] SUBJ [MODIFIER] VERB REST ." with only "the" as determiner, so the subject noun is the one
cue to the verb's number; every noun phrase has an adjective half the time. Conditions (the modifier):
  none      "the key is on the table ."
  pp_same   "the key to the cabinet is ..."        (an intervening noun of the same number)
  pp_attr   "the key to the cabinets is ..."       (an attractor: the intervening noun has the other number)
  rc_same   "the key that the boy likes is ..."    (object relative clause, its noun of the same number)
  rc_attr   "the key that the boys like is ..."    (attractor, and the clause's verb agrees with it)
Training masks the main verb always plus 15% of the other words (80% [MASK], 10% random word, 10% kept); test
sentences never occur in training.

Outputs in --out: model/ (save_pretrained + tokenizer), train.json (loss, time), test.tsv, agreement.h5 (the store),
results.json and results.md (the tables). Figures:
  * agreement accuracy (the model prefers the target over the foil at the mask), overall, with and without an
    attractor, per condition;
  * per method: the subject's average precision (AP) with the mask position excluded from the ranking (METHODS.md
    8.7) and the store's own average_precision / dot_product metrics (which keep the mask position in the ranking);
  * per layer, for alti, normxlogit and logat: the same AP on each layer view (Example.layer_scores);
  * on attractor items: the fraction where the method scores the subject above the attractor noun.

    python benchmarks/agreement_study.py --out /tmp/agreement            # the report's run (a few minutes)
    python benchmarks/agreement_study.py --out /tmp/a --steps 30 --per-condition 4   # a smoke run
    python benchmarks/agreement_study.py --prepare-linzen agr_50_mostcommon_10K.tsv --tokenizer bert-base-uncased \
        --out agr_foil.tsv     # the real file with id, foil and evidence columns (docs/agreement-report.md)
    python benchmarks/agreement_study.py --analyse agr_bert.h5 --data agr_foil.tsv --out agr_bert_results
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

NOUNS = [("key", "keys"), ("author", "authors"), ("dog", "dogs"), ("teacher", "teachers"), ("cabinet", "cabinets"),
         ("letter", "letters"), ("boy", "boys"), ("girl", "girls"), ("book", "books"), ("painting", "paintings"),
         ("student", "students"), ("friend", "friends"), ("car", "cars"), ("house", "houses"),
         ("picture", "pictures"), ("farmer", "farmers"), ("pilot", "pilots"), ("lamp", "lamps"), ("box", "boxes"),
         ("window", "windows")]
ADJECTIVES = ["old", "small", "red", "big", "new"]
PREPOSITIONS = ["to", "of", "near", "behind", "with", "for"]
RC_VERBS = [("likes", "like"), ("sees", "see"), ("knows", "know"), ("paints", "paint")]
# Main verbs (singular, plural) and what may follow them.
MAIN_VERBS = [(("is", "are"), ["on the table", "here", "old", "near the door", "very small"]),
              (("was", "were"), ["on the table", "here", "old", "near the door", "very small"]),
              (("has", "have"), ["a problem", "a red door", "many friends"]),
              (("seems", "seem"), ["old", "small", "happy"]),
              (("remains", "remain"), ["here", "on the table", "small"])]
CONDITIONS = ("none", "pp_same", "pp_attr", "rc_same", "rc_attr")
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ANALYSED_LAYERS = ("alti", "normxlogit", "logat")
METHODS = "alti,normxlogit,logat,globenc,rollout,attcat,grad_l2,gxi_l2"


def vocabulary() -> list[str]:
    words = {"the", "that", "."} | set(PREPOSITIONS) | set(ADJECTIVES)
    for pair in NOUNS + RC_VERBS:
        words.update(pair)
    for pair, rests in MAIN_VERBS:
        words.update(pair)
        for rest in rests:
            words.update(rest.split())
    return SPECIALS + sorted(words)


def noun_phrase(rng: random.Random, noun: str) -> list[str]:
    """"the NOUN" or, half the time, "the ADJECTIVE NOUN" (so the subject is not always the second word)."""
    return ["the", noun] if rng.random() < 0.5 else ["the", rng.choice(ADJECTIVES), noun]


def sentence(rng: random.Random, condition: str) -> dict:
    """One sentence of ``condition``: its words, the 0-based indices of subject, attractor (or -1) and verb, the
    correct and the wrong verb form."""
    subj_i, other_i = rng.sample(range(len(NOUNS)), 2)
    plural = rng.random() < 0.5
    subj = NOUNS[subj_i][plural]
    same = condition.endswith("same")
    other_plural = plural if same else not plural
    other = NOUNS[other_i][other_plural]
    words = noun_phrase(rng, subj)
    subj_at = len(words) - 1
    attractor = -1
    if condition.startswith("pp"):
        words += [rng.choice(PREPOSITIONS)] + noun_phrase(rng, other)
        attractor = len(words) - 1 if not same else -1
    elif condition.startswith("rc"):
        words += ["that"] + noun_phrase(rng, other) + [rng.choice(RC_VERBS)[other_plural]]
        attractor = len(words) - 2 if not same else -1
    forms, rests = rng.choice(MAIN_VERBS)
    verb = len(words)
    words += [forms[plural]] + rng.choice(rests).split() + ["."]
    return {"words": words, "subj": subj_at, "attractor": attractor, "verb": verb,
            "target": forms[plural], "foil": forms[not plural], "condition": condition}


def test_items(rng: random.Random, per_condition: int) -> list[dict]:
    """``per_condition`` distinct sentences of every condition."""
    items, seen = [], set()
    for condition in CONDITIONS:
        made = 0
        while made < per_condition:
            s = sentence(rng, condition)
            key = " ".join(s["words"])
            if key in seen:
                continue
            seen.add(key)
            items.append(s)
            made += 1
    return items


def write_test_tsv(path: Path, items: list[dict]) -> None:
    """The Linzen et al. layout (1-based subj_index / verb_index, orig_sentence, subj, verb) plus a foil column, an
    evidence column (the subject's character span: attr-compute keeps the layout's own subject evidence only when
    --evidence-column is given, see docs/agreement-report.md) and this study's own columns (condition,
    attractor_index: 1-based, 0 = none), which attr-compute does not read."""
    cols = ["id", "sentence", "orig_sentence", "subj", "verb", "subj_index", "verb_index", "foil", "evidence",
            "condition", "attractor_index"]
    with path.open("w", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(cols)
        for i, it in enumerate(items):
            text = " ".join(it["words"])
            start = word_char(it["words"], it["subj"])
            span = json.dumps([[start, start + len(it["words"][it["subj"]])]])
            w.writerow([f"t{i:04d}", text, text, it["words"][it["subj"]], it["target"], it["subj"] + 1,
                        it["verb"] + 1, it["foil"], span, it["condition"], it["attractor"] + 1])


def read_test_tsv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


# Irregular present / past forms of the Linzen file's verbs; the other verbs are inflected by rule.
IRREGULAR = {"is": "are", "are": "is", "was": "were", "were": "was", "has": "have", "have": "has", "does": "do",
             "do": "does", "goes": "go", "go": "goes"}


def other_number(verb: str, pos: str) -> str:
    """The verb's other-number present form by the English spelling rules (VBZ "walks" -> "walk", VBP "walk" ->
    "walks"); a heuristic, so check the rows of rare verbs."""
    v = verb.lower()
    if v in IRREGULAR:
        return IRREGULAR[v]
    if pos == "VBZ":
        if v.endswith("ies") and len(v) > 4:
            return v[:-3] + "y"
        if v.endswith(("sses", "shes", "ches", "xes", "zes", "oes")):
            return v[:-2]
        return v[:-1] if v.endswith("s") else v
    if v.endswith("y") and len(v) > 1 and v[-2] not in "aeiou":
        return v[:-1] + "ies"
    if v.endswith(("s", "sh", "ch", "x", "z", "o")):
        return v + "es"
    return v + "s"


def prepare_linzen(source: Path, out: Path, tokenizer: str | None = None) -> tuple[int, int]:
    """Copy the Linzen et al. agreement file with three columns added: `id` (r + the 0-based row), `foil` (the verb's
    other number, from its verb_pos) and `evidence` (the subject's character span in orig_sentence, as JSON). With
    ``tokenizer``, rows whose verb or foil is not a single token of it are dropped (attr-compute refuses them).
    Returns the rows kept and dropped."""
    with source.open(newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        raise SystemExit(f"{source}: no rows")
    tok = None
    if tokenizer is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)

    def one_token(word: str) -> bool:  # a single known token ([UNK] is one token too, but not the word)
        return tok is None or [t != tok.unk_token for t in tok.tokenize(word)] == [True]
    kept = 0
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["id"] + list(rows[0]) + ["foil", "evidence"], delimiter="\t",
                           lineterminator="\n")
        w.writeheader()
        for i, r in enumerate(rows):
            foil = other_number(r["verb"], r["verb_pos"])
            if not (one_token(r["verb"]) and one_token(foil)):
                continue
            words = r["orig_sentence"].split()
            subj = int(r["subj_index"]) - 1
            start = word_char(words, subj)
            w.writerow({"id": f"r{i}", **r, "foil": foil, "evidence": json.dumps([[start, start + len(words[subj])]])})
            kept += 1
    return kept, len(rows) - kept


def build_model(vocab_size: int, args):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=vocab_size, hidden_size=args.hidden, num_hidden_layers=args.layers,
                        num_attention_heads=args.heads, intermediate_size=4 * args.hidden,
                        max_position_embeddings=32, type_vocab_size=2, pad_token_id=0,
                        initializer_range=args.init_range)
    return BertForMaskedLM(config)


def mlm_batch(rng: random.Random, vocab: dict, batch: int, held_out: set[str], mask_rate: float):
    """A padded training batch: the main verb always masked, every other word with probability ``mask_rate``
    (80% [MASK], 10% a random word, 10% kept); labels -100 where nothing is predicted."""
    n_special = len(SPECIALS)
    rows, labels = [], []
    while len(rows) < batch:
        s = sentence(rng, rng.choice(CONDITIONS))
        if " ".join(s["words"]) in held_out:
            continue
        ids = [vocab["[CLS]"]] + [vocab[w] for w in s["words"]] + [vocab["[SEP]"]]
        lab = [-100] * len(ids)
        for p in range(1, len(ids) - 1):
            if p == s["verb"] + 1 or rng.random() < mask_rate:
                lab[p] = ids[p]
                u = rng.random()
                if u < 0.8 or p == s["verb"] + 1:
                    ids[p] = vocab["[MASK]"]
                elif u < 0.9:
                    ids[p] = rng.randrange(n_special, len(vocab))
        rows.append(ids)
        labels.append(lab)
    n = max(len(r) for r in rows)
    input_ids = torch.zeros((batch, n), dtype=torch.long)
    attention = torch.zeros((batch, n), dtype=torch.long)
    y = torch.full((batch, n), -100, dtype=torch.long)
    for b, (r, lab) in enumerate(zip(rows, labels)):
        input_ids[b, :len(r)] = torch.tensor(r)
        attention[b, :len(r)] = 1
        y[b, :len(r)] = torch.tensor(lab)
    return input_ids, attention, y


def train(model, vocab: dict, held_out: set[str], args) -> dict:
    rng = random.Random(args.seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup, cooldown = max(1, args.steps // 20), max(1, args.steps // 5)  # constant between: a long plateau comes
    sched = torch.optim.lr_scheduler.LambdaLR(  # before the model learns to look at the subject
        opt, lambda step: min(1.0, (step + 1) / warmup, (args.steps - step) / cooldown))
    model.train()
    losses = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        ids, att, y = mlm_batch(rng, vocab, args.batch, held_out, args.mask_rate)
        loss = model(input_ids=ids, attention_mask=att, labels=y).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    model.eval()
    tail = losses[-max(1, len(losses) // 20):]
    return {"steps": args.steps, "batch": args.batch, "seconds": round(time.perf_counter() - t0, 1),
            "first_loss": losses[0], "final_loss": float(np.mean(tail))}


def save_model(model, vocab_list: list[str], path: Path) -> None:
    from transformers import BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab_list)}, do_lower_case=True).save_pretrained(path)
    model.save_pretrained(path)


def attr_compute_args(test: Path, model: Path, store: Path) -> list[str]:
    """The command of the report (the data file is in the Linzen layout; its evidence column holds the subject)."""
    return [str(test), "--model", str(model), "--task", "masked-token", "--methods", METHODS,
            "--metrics", "average_precision,dot_product", "--evidence-column", "evidence", "-o", str(store)]


def run_attr_compute(argv: list[str]) -> None:
    """attr-compute ARGV in this process (its torch thread setting included); a failure stops the study."""
    from compute.cli import main as attr_compute

    try:
        attr_compute.main(argv)
    except SystemExit as done:
        if done.code not in (0, None):
            raise SystemExit(f"attr-compute failed (exit {done.code}): attr-compute {' '.join(argv)}") from None


def ap_without_mask(scores: np.ndarray, evidence: np.ndarray, mask_pos: int) -> float:
    from compute.metrics.average_precision import average_precision

    keep = np.ones(scores.size, dtype=bool)
    keep[mask_pos] = False
    return average_precision(np.asarray(scores, dtype=np.float64)[keep], evidence[keep])


def token_at_char(ex, char: int) -> int:
    """The store token whose span starts at character ``char`` of the (masked) text."""
    hits = np.nonzero(np.asarray(ex.spans).reshape(-1, 2)[:, 0] == char)[0]
    hits = [h for h in hits if ex.tokens[h] not in SPECIALS]
    if len(hits) != 1:
        raise ValueError(f"example {ex.id}: no single token starts at character {char}")
    return int(hits[0])


def word_char(words: list[str], index: int) -> int:
    return sum(len(w) + 1 for w in words[:index])


def mean(xs) -> float:
    xs = [x for x in xs if np.isfinite(x)]
    return float(np.mean(xs)) if xs else float("nan")


def analyse(store_path: Path, rows: list[dict]) -> dict:
    """Every figure of the report, read back from the store and the test file."""
    from compute.metrics.average_precision import expected_random_ap
    from store import open_store

    by_id = {r["id"]: r for r in rows}
    out: dict = {"n": 0, "accuracy": {}, "methods": {}, "layers": {}}
    with open_store(store_path) as s:
        methods = list(s.methods)
        correct, attracted = [], []
        per_condition: dict[str, list[bool]] = {}
        ap = {m: [] for m in methods}
        subj_first = {m: [] for m in methods}
        layer_ap = {m: [] for m in ANALYSED_LAYERS if m in methods}
        layer_subj_first = {m: [] for m in layer_ap}
        random_ap = []
        norm_spread, same_ranking = [], []  # NormXLogit = embedding norm x LogAt: how much does the norm vary?
        for ex in s:
            row = by_id[ex.id]
            info = ex.task_info
            if info["target_word"] != row["verb"] or info["foil_word"] != row["foil"]:
                raise ValueError(f"example {ex.id}: the store explains {info['target_word']}/{info['foil_word']}")
            words = row["orig_sentence"].split()
            subj = token_at_char(ex, word_char(words, int(row["subj_index"]) - 1))
            evidence = np.asarray(ex.evidence, dtype=bool)
            if np.nonzero(evidence)[0][:1].tolist() != [subj]:  # a word piece or more, from the subject's first
                raise ValueError(f"example {ex.id}: the store's evidence is not the subject at token {subj}")
            a = int(row.get("attractor_index") or 0)  # only this study's file gives the attractor's position
            attractor = token_at_char(ex, word_char(words, a - 1)) if a > 0 else -1
            pos = ex.explain_pos
            ok = bool(info["prefers_target"])
            correct.append(ok)
            if "condition" in row:
                condition, has_attractor = row["condition"], attractor >= 0
            else:  # the Linzen et al. file: its count of intervening nouns of the other number
                n = int(row["n_diff_intervening"])
                condition, has_attractor = f"{n} attractor{'s' if n != 1 else ''}", n > 0
            attracted.append(has_attractor)
            per_condition.setdefault(condition, []).append(ok)
            random_ap.append(expected_random_ap(1, ex.n_tokens - 1))
            for m in methods:
                sc = ex.scores(m)
                ap[m].append(ap_without_mask(sc, evidence, pos))
                if attractor >= 0:
                    subj_first[m].append(float(sc[subj] > sc[attractor]))
            if {"normxlogit", "logat"} <= set(methods):
                nx, la = ex.scores("normxlogit"), ex.scores("logat")
                nonzero = np.abs(la) > 1e-12
                norm = nx[nonzero] / la[nonzero]  # the token's embedding norm
                norm_spread.append(float(norm.std() / norm.mean()))
                same_ranking.append(float((np.argsort(-nx, kind="stable") == np.argsort(-la, kind="stable")).all()))
            for m in layer_ap:
                views = ex.layer_scores(m)  # [V, n]
                layer_ap[m].append([ap_without_mask(v, evidence, pos) for v in views])
                if attractor >= 0:
                    layer_subj_first[m].append([float(v[subj] > v[attractor]) for v in views])
        correct_a, attracted_a = np.array(correct), np.array(attracted)
        out["n"] = len(correct)
        out["n_attractor"] = int(attracted_a.sum())
        out["accuracy"] = {"all": float(correct_a.mean()),
                           "with_attractor": mean(correct_a[attracted_a].astype(float)),
                           "without_attractor": mean(correct_a[~attracted_a].astype(float))}
        out["conditions"] = {c: {"n": len(v), "accuracy": float(np.mean(v))} for c, v in sorted(per_condition.items())}
        out["random_ap"] = mean(random_ap)
        for m in methods:
            out["methods"][m] = {"ap_mask_excluded": mean(ap[m]),
                                 "store_average_precision": mean(s.metric_values(m, "average_precision")),
                                 "store_dot_product": mean(s.metric_values(m, "dot_product")),
                                 "subject_above_attractor": mean(subj_first[m])}
        if norm_spread:
            out["normxlogit_vs_logat"] = {"norm_cv": mean(norm_spread), "same_ranking": mean(same_ranking)}
        for m in layer_ap:
            out["layers"][m] = {"ap_mask_excluded": np.nanmean(np.array(layer_ap[m]), axis=0).tolist(),
                                "subject_above_attractor": (np.mean(np.array(layer_subj_first[m]), axis=0).tolist()
                                                            if layer_subj_first[m] else [])}
    return out


def markdown(res: dict) -> str:
    acc = res["accuracy"]
    lines = [f"Test items: {res['n']} ({res['n_attractor']} with an attractor)."]
    if "train" in res:
        t = res["train"]
        lines[0] += (f" Model training: {t['steps']} steps of {t['batch']} sentences, {t['seconds']} s, MLM loss "
                     f"{t['first_loss']:.3f} -> {t['final_loss']:.3f}.")
    lines += ["",
             "| items | accuracy (target preferred over foil) |", "|---|---|",
             f"| all | {acc['all']:.3f} |", f"| without attractor | {acc['without_attractor']:.3f} |",
             f"| with attractor | {acc['with_attractor']:.3f} |"]
    lines += [f"| {c} ({v['n']}) | {v['accuracy']:.3f} |" for c, v in res["conditions"].items()]
    lines += ["", f"Random-ranking AP of the subject (mask excluded): {res['random_ap']:.3f}.", "",
              "| method | subject AP, mask excluded | store average_precision (mask kept) | store dot_product "
              "| subject > attractor |", "|---|---|---|---|---|"]
    for m, v in res["methods"].items():
        lines.append(f"| `{m}` | {v['ap_mask_excluded']:.3f} | {v['store_average_precision']:.3f} | "
                     f"{v['store_dot_product']:.3f} | {v['subject_above_attractor']:.3f} |")
    if "normxlogit_vs_logat" in res:
        v = res["normxlogit_vs_logat"]
        lines += ["", f"NormXLogit / LogAt: the embedding norm varies over an example's tokens by a coefficient of "
                      f"variation of {v['norm_cv']:.3f} on average; the two rank the tokens identically in "
                      f"{v['same_ranking']:.3f} of the examples."]
    if res["layers"]:
        n_views = max(len(v["ap_mask_excluded"]) for v in res["layers"].values())
        head = " | ".join(f"view {i + 1}" for i in range(n_views))
        for key, title in (("ap_mask_excluded", "subject AP per layer view (mask excluded)"),
                           ("subject_above_attractor", "subject > attractor per layer view (attractor items)")):
            if not any(v[key] for v in res["layers"].values()):
                continue
            lines += ["", f"| {title} | {head} |", "|---|" + "---|" * n_views]
            for m, v in res["layers"].items():
                lines.append(f"| `{m}` | " + " | ".join(f"{x:.3f}" for x in v[key]) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True,
                   help="output folder (model/, test.tsv, agreement.h5, results); with --prepare-linzen the tsv file")
    p.add_argument("--prepare-linzen", type=Path, metavar="AGR.tsv",
                   help="only add the id, foil and evidence columns to the Linzen et al. file (for a bert-base run)")
    p.add_argument("--tokenizer", metavar="NAME_OR_DIR",
                   help="with --prepare-linzen: drop the rows whose verb or foil is not one token of this tokenizer")
    p.add_argument("--analyse", type=Path, metavar="STORE.h5",
                   help="only compute the figures of an existing store (with --data) into --out")
    p.add_argument("--data", type=Path, metavar="TSV", help="with --analyse: the file the store was computed from")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=4000, help="training steps (2000 left 2 of 3 seeds on the plateau)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--mask-rate", type=float, default=0.15, help="masking rate of the words other than the verb")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--init-range", type=float, default=0.1,
                   help="std of the initial weights (BERT: 0.02, which left this model on its plateau far longer)")
    p.add_argument("--per-condition", type=int, default=100, help="test sentences per condition (5 conditions)")
    p.add_argument("--threads", type=int, default=1, help="torch threads, here and in attr-compute")
    args = p.parse_args(argv)
    if args.prepare_linzen:
        kept, dropped = prepare_linzen(args.prepare_linzen, args.out, args.tokenizer)
        print(f"{kept} rows -> {args.out}" + (f" ({dropped} dropped: verb or foil not one token)" if dropped else ""))
        return 0
    if args.analyse:
        if args.data is None:
            p.error("--analyse needs --data (the tsv the store was computed from)")
        args.out.mkdir(parents=True, exist_ok=True)
        res = analyse(args.analyse, read_test_tsv(args.data))
        (args.out / "results.json").write_text(json.dumps(res, indent=1))
        (args.out / "results.md").write_text(markdown(res))
        print(markdown(res))
        return 0

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    vocab_list = vocabulary()
    vocab = {w: i for i, w in enumerate(vocab_list)}

    items = test_items(random.Random(args.seed), args.per_condition)
    test = args.out / "test.tsv"
    write_test_tsv(test, items)
    held_out = {" ".join(it["words"]) for it in items}

    model = build_model(len(vocab_list), args)
    stats = train(model, vocab, held_out, args)
    model_dir = args.out / "model"
    save_model(model, vocab_list, model_dir)
    (args.out / "train.json").write_text(json.dumps({**stats, "args": {k: str(v) for k, v in vars(args).items()}},
                                                    indent=1))

    store = args.out / "agreement.h5"
    if store.exists():
        store.unlink()
    t0 = time.perf_counter()
    run_attr_compute(attr_compute_args(test, model_dir, store))
    compute_s = round(time.perf_counter() - t0, 1)

    res = analyse(store, read_test_tsv(test))
    res["train"] = stats
    res["attr_compute"] = {"command": "attr-compute " + " ".join(attr_compute_args(test, model_dir, store)),
                           "seconds": compute_s}
    (args.out / "results.json").write_text(json.dumps(res, indent=1))
    (args.out / "results.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
