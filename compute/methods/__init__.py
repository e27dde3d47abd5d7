"""Attribution methods, looked up by their canonical name (DESIGN.md section 4)."""

from __future__ import annotations

from ..errors import UsageError
from .alti import Alti
from .alti_l2 import AltiL2
from .alti_logit import AltiLogit
from .attcat import AttCat
from .attnlrp import AttnLRP
from .attgrads import AttGrads
from ._internals.base import Method, MethodResult
from .cat import Cat
from .decompx import DecompX
from .decompx_nohead import DecompXNoHead
from .gae import GAE
from .globenc import GlobEnc
from .grad_l2 import GradL2
from .grads import Grads
from .gxi_l2 import GxIL2
from .gxi_mean import GxIMean
from .ig_l2 import IGL2
from .ig_mean import IGMean
from .logat import LogAt
from .lrp import LRP
from .mask_lrp import MaskLRP
from .norm import Norm
from .norm_fixedres import NormFixedRes
from .norm_n import NormN
from .norm_res import NormRes
from .norm_resln import NormResLN
from .partial_lrp import PartialLRP
from .normxlogit import NormXLogit
from .raw_attention import RawAttention
from .rollout import Rollout
from .transatt import TransAtt
from .w_fixedres import WFixedRes
from .value_zeroing import ValueZeroing
from .w_res import WRes

# Canonical order (DESIGN.md section 4).
REGISTRY: dict[str, type[Method]] = {m.name: m for m in (
    RawAttention, Rollout, NormN, NormFixedRes, NormRes, NormResLN, GlobEnc, WFixedRes, WRes, Alti, AltiL2, AltiLogit,
    GradL2, GxIL2, GxIMean, IGL2, IGMean, Cat, AttCat, Grads, AttGrads,
    LRP, PartialLRP, TransAtt, GAE, MaskLRP, AttnLRP,
    Norm, LogAt, NormXLogit, ValueZeroing, DecompX, DecompXNoHead)}

# --methods default (the option's default, the bare run's): the methods of the mission's five papers. Like 'all', what the
# model or the machine cannot run (mask_lrp without a dependency parser) is left out, but silently: nobody named it.
DEFAULT_METHODS = ("alti", "globenc", "attcat", "mask_lrp", "normxlogit")


def parse_methods(spec: str) -> list[str]:
    """'all', 'default' (DEFAULT_METHODS) or a comma-separated list of canonical names, in the order given, without
    duplicates."""
    if spec.strip() == "all":
        return list(REGISTRY)
    if spec.strip() == "default":
        return list(DEFAULT_METHODS)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise UsageError("--methods is empty: pass 'all', 'default' or names such as rollout,norm")
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise UsageError(f"unknown method '{unknown[0]}': choose from {', '.join(REGISTRY)} (or 'all', 'default')")
    return list(dict.fromkeys(names))


def get_method(name: str, **params) -> Method:
    return REGISTRY[name](**params)


__all__ = ["Method", "MethodResult", "REGISTRY", "DEFAULT_METHODS", "parse_methods", "get_method"]
