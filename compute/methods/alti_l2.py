"""ALTI-l2 (the reference's "ours_l2"; METHODS.md 2.2): ALTI with L2 distances and ||y_i||_2."""

from __future__ import annotations

from .alti import Alti


class AltiL2(Alti):
    name = "alti_l2"
    description = "ALTI with L2 distances (ALTI-l2)"
    reference = "Ferrando et al. (2022), Table 4-5; METHODS.md 2.2"
    ord = 2
