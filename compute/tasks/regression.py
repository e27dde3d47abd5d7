"""regression: a one-output sequence head (STS-B-style similarity, a score); the explained output is the value
itself. NormXLogit's regression form (METHODS.md 7.1, 14.18) reads the option ``regression_rank``."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import AttrscopeError
from .base import Outcome, Part, Task, TaskRows, none_like
from .readout import Readout


class Regression(Task):
    name = "regression"
    description = "a one-output sequence head: the output value"
    auto_class = "AutoModelForSequenceClassification"
    class_suffixes = ("ForSequenceClassification",)
    target_modes = ("predicted",)

    def check_model(self, model):
        super().check_model(model)
        if int(model.config.num_labels) != 1:
            raise AttrscopeError(f"--task regression needs a head with one output, this one has "
                                 f"{model.config.num_labels}: use --task classification")

    def labels(self, id2label):
        return {0: "value"}

    def prepare(self, lm, records, tok):
        rows = TaskRows.plain([-1] * len(records))
        rows.gold_value = [float("nan") if getattr(r, "value", None) is None else float(r.value) for r in records]
        return rows

    def parts(self, cap, rows, target_mode):
        zeros = torch.zeros(cap.explain_pos.shape[0], dtype=torch.long, device=cap.explain_pos.device)
        return [Part(explain_pos=cap.explain_pos, readout=Readout(), target=zeros)]

    def outcome(self, cap, parts, rows):
        (part,) = parts
        value = part.readout(cap.output, part.explain_pos).float()[:, 0]
        zeros = np.zeros(value.shape[0], dtype=np.int64)
        return Outcome(pred=zeros, probs=value[:, None], target=zeros,
                       explain_pos=part.explain_pos, output=value,
                       target_token=none_like(value), foil_token=none_like(value), span_end=none_like(value),
                       pred_end=none_like(value))
