"""AttnLRP by the peer, lxt 2.1 (Achtibat et al., ICML 2024; its efficient implementation, a monkey-patched
gradient), on tiny random checkpoints: the numbers tests/test_attnlrp_lxt.py holds attrscope's ``attnlrp`` to.

lxt 2.1 imports only under transformers 4.x, so this script runs in an environment of its own, never the project's:

    python -m venv /work/venv-lxt
    /work/venv-lxt/bin/pip install torch==2.13.0 transformers==4.57.6 lxt==2.1 pytest
    /work/venv-lxt/bin/python benchmarks/lxt_reference.py --write-checkpoints

(pytest only because tests/conftest.py, whose tiny configs and weight spreading this script reuses, imports it.)

With --write-checkpoints it first saves the tiny seeded checkpoints (tests/families.py's configs, conftest's spread
weights, 2 layers, float32 safetensors) under tests/fixtures/lxt/<family>/, so that both environments load the very
same weights; without it, it reads them. It then runs lxt's AttnLRP the documented way on every fixed prompt, one
prompt at a time (no padding), in float64 and float32:

    monkey_patch(modeling_<family>); emb = model.get_input_embeddings()(ids).requires_grad_()
    model(inputs_embeds=emb).logits[0, -1, target].backward(); relevance = (emb * emb.grad).sum(-1)

and writes tests/fixtures/lxt/attnlrp_lxt.json: per family the prompts, the explained target (the argmax of the
float64 model's logits at the last position) and foil (the second), and per dtype the model's logits at the last
position, the relevance of the target logit and of target minus foil at inputs_embeds and at every layer's input,
with the versions and this command line.

lxt 2.1 has no patch map for Mixtral (its models: llama, qwen2, qwen3, gemma3, bert, gpt2, vit); Mixtral's map below
is assembled from lxt 2.1's own patches and rules as lxt's later qwen3_moe map does (the gated expert MLP as lxt's
gated MLP, the product of each expert's output with its routing weight under the uniform rule, the router itself a
plain gradient). BERT runs lxt's own copy of modeling_bert (lxt.efficient.models.bert).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
from functools import partial
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "lxt"
sys.path.insert(0, str(REPO / "tests"))

# Keeps the torchvision stub's operator schemas registered (a Library is deregistered when collected).
_TORCHVISION_STUB = None


def stub_torchvision_ops() -> str | None:
    """transformers 4.57 imports torchvision (image_utils) on the way to any model; the torchvision wheel PyPI serves
    for torch 2.13 (0.28.0+cu130) links CUDA libraries the CPU torch lacks, so its _C.so does not load,
    torchvision::nms is never defined and torchvision/_meta_registrations.py stops the import at
    register_fake("torchvision::nms"). When _C.so does not load, define the two schemas it registers fakes for
    (nms, qnms) so that the import goes through; nothing here calls them. Returns what was done (for the notes)."""
    global _TORCHVISION_STUB
    spec = importlib.util.find_spec("torchvision")
    if spec is None:
        return None
    try:
        torch.ops.load_library(str(Path(spec.origin).parent / "_C.so"))
        return None
    except OSError as err:
        _TORCHVISION_STUB = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            _TORCHVISION_STUB.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        return (f"torchvision's _C.so does not load under the CPU torch ({err}); the schemas torchvision::nms and "
                f"torchvision::qnms were defined (unimplemented) so that transformers' import of torchvision goes "
                f"through")


TORCHVISION_NOTE = stub_torchvision_ops()

import transformers  # noqa: E402 - after the stub

# family -> (task, the checkpoint's builder's arguments): tests/families.py's and conftest's tiny configs, 2 layers.
FAMILIES = {
    "llama": ("next-token", {}),
    "qwen2": ("next-token", {}),
    "gemma3": ("next-token", {}),  # families.py's config: final_logit_softcapping=5.0
    "gemma3_nocap": ("next-token", {"final_logit_softcapping": None}),  # as the released Gemma 3 checkpoints
    "mixtral": ("next-token", {}),
    "bert": ("classification", {}),
}
LENGTHS = (7, 4, 9, 5)
SEED = 0
LAYERS = 2


def prompts(family: str) -> list[list[int]]:
    """Fixed random token ids (ids 5..119; BERT's [CLS] = 2 and [SEP] = 3 at the ends, as conftest's batches)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for k in LENGTHS:
        ids = torch.randint(5, 120, (k,), generator=g).tolist()
        if family == "bert":
            ids[0], ids[-1] = 2, 3
        out.append(ids)
    return out


def build(family: str) -> torch.nn.Module:
    """The seeded tiny model of ``family`` (float32), from the test suite's own configs and weight spreading."""
    from conftest import tiny_model, tiny_task_model
    from families import family_config, family_model

    task, override = FAMILIES[family]
    base = family.removesuffix("_nocap")
    if base == "bert":
        return tiny_model("bert", seed=SEED, dtype=torch.float32, layers=LAYERS)
    if base == "llama":
        return tiny_task_model("llama", task, seed=SEED, dtype=torch.float32, layers=LAYERS)
    if override:  # a variant of a tests/families.py config, declared for this build only
        import families

        name, extra, decoder = families.ALL_FAMILIES[base]
        families.ALL_FAMILIES[family] = (name, {**extra, **override}, decoder)
        assert all(getattr(family_config(family), k) == v for k, v in override.items())
    return family_model(family, task, seed=SEED, dtype=torch.float32, layers=LAYERS)


def write_checkpoints() -> None:
    for family in FAMILIES:
        build(family).save_pretrained(FIXTURES / family)


def auto_class(family: str):
    return transformers.AutoModelForSequenceClassification if FAMILIES[family][0] == "classification" else \
        transformers.AutoModelForCausalLM


def load(family: str, dtype: torch.dtype, cls=None) -> torch.nn.Module:
    cls = cls or auto_class(family)
    return cls.from_pretrained(FIXTURES / family, dtype=dtype, attn_implementation="eager").eval()


# ---------------------------------------------------------------------------------------------------- lxt's maps
def patch_maps() -> dict:
    """family -> (the modeling module lxt patches, its patch map, where the map comes from)."""
    from lxt.efficient.models import bert, gemma3, llama, qwen2
    from lxt.efficient.patches import dropout_forward, patch_attention, patch_method, rms_norm_forward
    from lxt.efficient.rules import divide_gradient, identity_rule_implicit
    from transformers.models.mixtral import modeling_mixtral as mm

    def expert_forward(self, x):  # lxt's gated_mlp_forward with Mixtral's names (w1 gate, w3 up, w2 down)
        gate = identity_rule_implicit(self.act_fn, self.w1(x))
        return self.w2(divide_gradient(gate * self.w3(x), 2))

    def moe_forward(self, hidden_states):
        """transformers 4.57.6's MixtralSparseMoeBlock.forward (eval), the expert output x routing weight product
        under the uniform rule (divide_gradient by 2), as lxt's later qwen3_moe experts_forward."""
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_dim)
        router_logits = self.gate(hidden_states)
        routing_weights = torch.nn.functional.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        final = torch.zeros((batch_size * sequence_length, hidden_dim), dtype=hidden_states.dtype,
                            device=hidden_states.device)
        expert_mask = torch.nn.functional.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        for expert_idx in torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero():
            idx, top_x = torch.where(expert_mask[expert_idx].squeeze(0))
            out = self.experts[expert_idx](hidden_states[None, top_x].reshape(-1, hidden_dim))
            out = divide_gradient(out * routing_weights[top_x, idx, None], 2)
            final.index_add_(0, top_x, out.to(hidden_states.dtype))
        return final.reshape(batch_size, sequence_length, hidden_dim), router_logits

    mixtral = {
        mm.MixtralBlockSparseTop2MLP: partial(patch_method, expert_forward),
        mm.MixtralSparseMoeBlock: partial(patch_method, moe_forward),
        mm.MixtralRMSNorm: partial(patch_method, rms_norm_forward),
        torch.nn.Dropout: partial(patch_method, dropout_forward),
        mm: patch_attention,
    }
    return {
        "llama": (llama.modeling_llama, llama.attnLRP, "lxt.efficient.models.llama.attnLRP"),
        "qwen2": (qwen2.modeling_qwen2, qwen2.attnLRP, "lxt.efficient.models.qwen2.attnLRP"),
        "gemma3": (gemma3.modeling_gemma3, gemma3.attnLRP, "lxt.efficient.models.gemma3.attnLRP"),
        "gemma3_nocap": (gemma3.modeling_gemma3, gemma3.attnLRP, "lxt.efficient.models.gemma3.attnLRP"),
        "mixtral": (mm, mixtral, "this script's map from lxt 2.1's patches and rules (lxt 2.1 has none for Mixtral)"),
        "bert": (bert.modeling_bert, bert.attnLRP, "lxt.efficient.models.bert.attnLRP (lxt's copy of modeling_bert)"),
    }


def explained(logits: torch.Tensor) -> torch.Tensor:
    """The explained output's row of logits: a causal LM's at the last position, a classifier's own."""
    return logits[0, -1] if logits.dim() == 3 else logits[0]


def layers(model) -> list[torch.nn.Module]:
    return list(model.bert.encoder.layer if hasattr(model, "bert") else model.model.layers)


def relevance(model, ids: list[int], target: int, foil: int | None) -> dict[str, list]:
    """lxt's documented use: relevance = (inputs_embeds * grad).sum(-1) of the explained logit (less the foil's);
    lxt's "relevance at any layer" (activation x grad) at each layer's input (layer 0's: the embedding layer's output,
    for BERT after its position embeddings and LayerNorm)."""
    emb = model.get_input_embeddings()(torch.tensor([ids])).detach().requires_grad_()
    inputs = []

    def keep(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        x.retain_grad()
        inputs.append(x)

    hooks = [layer.register_forward_pre_hook(keep, with_kwargs=True) for layer in layers(model)]
    try:
        row = explained(model(inputs_embeds=emb).logits)
    finally:
        for h in hooks:
            h.remove()
    (row[target] - (row[foil] if foil is not None else 0)).backward()
    return {"": (emb * emb.grad).sum(-1)[0].tolist(),
            "_layers": [(x * x.grad).sum(-1)[0].tolist() for x in inputs]}


def run(family: str, module, patch_map) -> dict:
    from lxt.efficient import monkey_patch

    task = FAMILIES[family][0]
    ps = prompts(family)
    out = {"task": task, "checkpoint": f"tests/fixtures/lxt/{family}", "prompts": ps}
    plain = {}
    with torch.no_grad():  # the unpatched model's logits, float64 and float32
        for dtype in (torch.float64, torch.float32):
            model = load(family, dtype)
            plain[dtype] = [explained(model(input_ids=torch.tensor([ids])).logits) for ids in ps]
    top2 = [row.topk(2).indices.tolist() for row in plain[torch.float64]]
    out["target"] = [t for t, _ in top2]
    out["foil"] = [f for _, f in top2]
    if not getattr(module, "_attrscope_lxt_patched", False):  # lxt patches classes; once per module
        monkey_patch(module, patch_map)
        module._attrscope_lxt_patched = True
    for dtype in (torch.float64, torch.float32):
        name = str(dtype).removeprefix("torch.")
        # BERT: lxt replaced modeling_bert's attributes, so the class is looked up again
        cls = getattr(module, type(load(family, dtype)).__name__)
        model = load(family, dtype, cls)
        res = {"logits": [row.tolist() for row in plain[dtype]], "output": [], "output_contrast": []}
        res.update({f"relevance{key}{at}": [] for key in ("", "_contrast") for at in ("", "_layers")})
        worst = 0.0
        for ids, t, f, want in zip(ps, out["target"], out["foil"], plain[dtype]):
            with torch.no_grad():
                got = explained(model(input_ids=torch.tensor([ids])).logits)
            worst = max(worst, float((got - want).abs().max()))
            for key, foil in (("", None), ("_contrast", f)):
                for at, rel in relevance(model, ids, t, foil).items():
                    res[f"relevance{key}{at}"].append(rel)
                res["output" + key].append(float(want[t] - (want[f] if foil is not None else 0)))
        res["patched_forward_max_abs_logit_change"] = worst  # lxt's patches change the backward only
        out[name] = res
    return out


def versions() -> dict:
    import lxt  # noqa: F401
    from importlib.metadata import version

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "lxt": version("lxt"), "torchvision": version("torchvision")}


NOTES = [
    "lxt 2.1's efficient AttnLRP is gradient x input with patched backward rules: RMSNorm and LayerNorm divide by a "
    "detached scale (identity rule); LayerNorm's mean subtraction stays in the gradient (the centring is linear and "
    "is not detached); Gemma 3's RMSNorm (q_norm and k_norm included) the same; the activation of a gated MLP by the "
    "identity rule (backward multiplies by act(x) / (x + 1e-10): an epsilon of 1e-10 added, not sign-aware), the "
    "product gate x up by the uniform rule (gradient / 2); in attention the query and key get gradient / 4, the value "
    "gradient / 2 (uniform rules of the two matrix products; the softmax is a plain gradient).",
    "Biases (Qwen2's q/k/v, BERT's) and BERT's position and token-type embeddings absorb relevance: nothing "
    "redistributes them, so the relevance at the input sums to less than the explained logit.",
    "Gemma 3's final_logit_softcapping (tanh) is not patched: its plain gradient 1 - tanh^2 scales the relevance; "
    "gemma3 keeps tests/families.py's cap 5.0, gemma3_nocap has none (as the released Gemma 3).",
    "Gemma 3's embedding scale (sqrt(hidden)) lies inside get_input_embeddings(); gradient x input is the same before "
    "or after a constant scale.",
    "transformers computes RMSNorm (and lxt's patched rms_norm_forward) and the attention softmax in float32 even in "
    "a float64 model, and Mixtral's routing softmax too: float64 numbers are float32-exact there.",
    "Mixtral: lxt 2.1 ships no map; this script's map follows lxt's later qwen3_moe map (expert output x routing "
    "weight under the uniform rule; the router's softmax, top-k and renormalisation a plain gradient).",
    "BERT: lxt replaces modeling_bert by its own copy (eager attention: the scores and the context get gradient / 2 "
    "each, so query and key / 4 and value / 2 as above; the pooler's tanh and the GELU by the identity rule); "
    "relevance is given at inputs_embeds (the word embeddings, lxt's documented use); relevance_layers[l] is the "
    "relevance at layer l's input (activation x grad, lxt's relevance at any layer), so relevance_layers[0] is at the "
    "embedding layer's output (for BERT after position and token-type embeddings and LayerNorm; for the rotary "
    "decoders the same tensor as inputs_embeds).",
    "Each prompt runs alone (batch of one, no padding); target = argmax of the float64 model's explained logits, "
    "foil = the second; the float32 run explains the same target and foil.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write-checkpoints", action="store_true",
                    help="build and save the tiny checkpoints under tests/fixtures/lxt/ first")
    ap.add_argument("--out", type=Path, default=FIXTURES / "attnlrp_lxt.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.write_checkpoints:
        write_checkpoints()
    maps = patch_maps()
    models = {}
    for family in FAMILIES:  # BERT last: lxt's LayerNorm patch is on torch.nn.LayerNorm itself
        module, patch_map, source = maps[family]
        models[family] = {"patch_map": source, **run(family, module, patch_map)}
        print(family, "done", flush=True)
    notes = NOTES + ([TORCHVISION_NOTE] if TORCHVISION_NOTE else [])
    doc = {"made_by": "benchmarks/lxt_reference.py", "command": " ".join(["python", *sys.argv]),
           "versions": versions(), "seed": SEED, "layers": LAYERS, "notes": notes, "models": models}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
