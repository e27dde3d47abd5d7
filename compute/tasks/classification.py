"""classification: a sequence classifier (single texts or pairs); the explained output is the target class's logit
at the position the head pools ([CLS] for encoders, the last real token for decoders)."""

from __future__ import annotations

import torch

from .base import Outcome, Part, Task, TaskRows, long_tensor, none_like
from .readout import Readout


class Classification(Task):
    name = "classification"
    description = "a sequence classifier: the target class's logit"
    auto_class = "AutoModelForSequenceClassification"
    class_suffixes = ("ForSequenceClassification",)
    target_modes = ("predicted", "label", "all")

    def labels(self, id2label):
        return dict(id2label)

    def parts(self, cap, rows: TaskRows, target_mode):
        logits = Readout()(cap.output, cap.explain_pos)
        if target_mode == "label":
            target = long_tensor(rows.label, logits.device)
        else:  # "predicted"; with "all" the final scores explain the predicted class
            target = logits.argmax(-1)
        return [Part(explain_pos=cap.explain_pos, readout=Readout(), target=target)]

    def outcome(self, cap, parts, rows):
        (part,) = parts
        logits = part.readout(cap.output, part.explain_pos).float()
        target = part.target
        return Outcome(pred=logits.argmax(-1), probs=torch.softmax(logits, -1),
                       target=target, explain_pos=part.explain_pos,
                       output=logits.gather(1, target[:, None])[:, 0],
                       target_token=none_like(target), foil_token=none_like(target), span_end=none_like(target),
                       pred_end=none_like(target))
