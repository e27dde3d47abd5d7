"""How much of the explained logit AttnLRP's relevance keeps (docs/methods.md 7.3): sum_j R_j / F per example on
tiny seeded random models of the families (2 layers, hidden 32, float64, sequence classifiers), the predicted class,
a padded batch of 4 examples of 3-9 tokens. Prints the median and the range over the examples per family.

    python benchmarks/attnlrp_conservation.py
    python benchmarks/attnlrp_conservation.py --families llama,qwen2 --examples 16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import torch  # noqa: E402
from conftest import random_batch, tiny_model  # noqa: E402
from families import FAMILIES, family_model  # noqa: E402

from compute.adapters import adapter_for  # noqa: E402
from compute.errors import AttrscopeError  # noqa: E402
from compute.methods import get_method  # noqa: E402

DEFAULT = "llama,gpt2,qwen2,qwen3,mistral,gemma,gemma2,gemma3,phi3,olmo2,gpt_neox,mixtral,qwen2_moe,bert"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=DEFAULT)
    ap.add_argument("--examples", type=int, default=4)
    args = ap.parse_args()
    lengths = [3 + (2 * k) % 7 for k in range(args.examples)]
    print(f"{'family':12s} {'median':>8s} {'min':>8s} {'max':>8s}   sum_j R_j / F over {args.examples} examples")
    for family in args.families.split(","):
        model = tiny_model(family, layers=2) if family in ("llama", "gpt2", "bert") else family_model(family)
        ad = adapter_for(model)
        method = get_method("attnlrp")
        try:
            method.check_architecture(ad)
        except AttrscopeError as err:
            print(f"{family:12s} refused: {err}")
            continue
        batch = random_batch("bert" if family == "bert" else "llama", lengths)
        with torch.no_grad():
            cap = ad.capture(batch, frozenset())
        res = method.compute(cap, ad, cap.pred)
        ratio = res.scores.sum(-1) / cap.logits[torch.arange(len(lengths)), cap.pred]
        print(f"{family:12s} {float(ratio.median()):8.3f} {float(ratio.min()):8.3f} {float(ratio.max()):8.3f}")


if __name__ == "__main__":
    main()
