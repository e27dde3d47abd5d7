"""qa: extractive question answering (BertForQuestionAnswering-style start/end heads, SQuAD). Two explained outputs,
the start logit at the answer's first token and the end logit at its last; each method runs once per output and the
two maps are added (AttCAT's and Mask-LRP's start map + end map, METHODS.md 8.5). The span is the model's best one
(default) or the gold answer's (--target label); the gold span is stored as the evidence tokens Precision@K reads."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import AttrscopeError
from .base import Outcome, Part, Task, TaskRows, long_tensor
from .readout import Readout

START, END = Readout(field="start_logits"), Readout(field="end_logits")
MAX_ANSWER_TOKENS = 30  # the longest predicted span (SQuAD evaluation scripts' usual limit)


class QuestionAnswering(Task):
    name = "qa"
    description = "extractive QA: start logit + end logit of the answer span"
    auto_class = "AutoModelForQuestionAnswering"
    class_suffixes = ("ForQuestionAnswering",)

    def labels(self, id2label):
        return {0: "start", 1: "end"}

    def prepare(self, lm, records, tok):
        rows = TaskRows.plain([-1] * len(records))
        for i, r in enumerate(records):
            seg = np.asarray(tok.segments[i])
            ctx = np.nonzero(seg == 1)[0]
            if r.pair is None or ctx.size == 0:
                raise AttrscopeError(f"example '{r.id}' has no context tokens: qa needs a question and a context "
                                     "(a context truncated away entirely: raise --max-length)")
            rows.context[i] = (int(ctx[0]), int(ctx[-1]))
            if r.evidence and tok.offsets is not None:
                off = np.asarray(tok.offsets[i])
                _, start, end = r.evidence[0]
                inside = (seg == 1) & (off[:, 0] < end) & (start < off[:, 1])
                hit = np.nonzero(inside)[0]
                if hit.size:
                    rows.gold_span[i] = (int(hit[0]), int(hit[-1]))
            if getattr(r, "answer", None) is not None:
                rows.info[i] = {"answer": r.answer}
        return rows

    def check_rows(self, rows, records, target_mode):
        if target_mode == "label":
            missing = next((r for r, s in zip(records, rows.gold_span) if s[0] < 0), None)
            if missing is not None:
                raise AttrscopeError(f"--target label needs the gold answer span, but example '{missing.id}' has "
                                     "none (no answers, or truncated away): use --target predicted")

    def parts(self, cap, rows, target_mode):
        if target_mode == "label":
            span = long_tensor(rows.gold_span, cap.input_ids.device)
        else:
            span = best_spans(START(cap.output, None), END(cap.output, None), rows.context)
        s, e = span[:, 0], span[:, 1]
        return [Part(explain_pos=s, readout=START, target=s), Part(explain_pos=e, readout=END, target=e)]

    def outcome(self, cap, parts, rows):
        start, end = parts
        real = cap.mask
        b = torch.arange(real.shape[0], device=real.device)
        start_logits, end_logits = START(cap.output, None).float(), END(cap.output, None).float()
        p_start = _masked_softmax(start_logits, real)[b, start.target]
        p_end = _masked_softmax(end_logits, real)[b, end.target]
        pred = best_spans(start_logits, end_logits, rows.context)
        zeros = np.zeros(real.shape[0], dtype=np.int64)
        none = np.full(real.shape[0], -1, dtype=np.int64)
        return Outcome(pred=pred[:, 0], probs=torch.stack([p_start, p_end], 1),
                       target=zeros, explain_pos=start.target,
                       output=(start_logits[b, start.target] + end_logits[b, end.target]),
                       target_token=none, foil_token=none, span_end=end.target,
                       pred_end=pred[:, 1])


def _masked_softmax(logits: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Softmax over the real tokens only (a QA head gives pad positions logits too: counting them would make the
    probability depend on the batch's padding)."""
    return torch.softmax(logits.masked_fill(~real, float("-inf")), -1)


def best_spans(start: torch.Tensor, end: torch.Tensor, context: list[tuple[int, int]]) -> torch.Tensor:
    """[B, 2]: the (s, e) maximising start[s] + end[e] with s <= e < s + MAX_ANSWER_TOKENS inside the context."""
    B, n = start.shape
    pos = torch.arange(n, device=start.device)
    ctx = long_tensor(context, start.device)  # [B, 2]
    inside = (pos[None] >= ctx[:, :1]) & (pos[None] <= ctx[:, 1:])  # [B, n]
    gap = pos[None, :] - pos[:, None]  # e - s
    ok = inside[:, :, None] & inside[:, None, :] & (gap >= 0) & (gap < MAX_ANSWER_TOKENS)
    total = (start.float()[:, :, None] + end.float()[:, None, :]).masked_fill(~ok, float("-inf"))
    flat = total.view(B, -1).argmax(-1)
    return torch.stack([flat // n, flat % n], 1)
