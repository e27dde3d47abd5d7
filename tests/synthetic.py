"""Write a small synthetic store (for TUI development and store tests)."""
import sys, numpy as np
from store import StoreWriter, MethodLayout, ExampleData, open_store
def make_store(path, n_examples=12, L=3, seed=0, with_values=False, signed_matrices=False, heads="none", H=4):
    """signed_matrices: normxlogit keeps matrices too (drawn from their own generator: the other values stay).
    heads: per-head attention kept ("cls": [L, H, n], "all": [L, H, n, n]), rows that sum to 1 from their own
    generator."""
    rng = np.random.default_rng(seed)
    extra = np.random.default_rng(seed + 1000)
    head_rng = np.random.default_rng(seed + 2000)
    methods = [MethodLayout("rollout", signed=False, n_layer_views=L, matrices="all", n_matrix_layers=L, description="attention rollout", params={"store_dtype": "float16"}),
               MethodLayout("normxlogit", signed=True, n_layer_views=L, class_scores=True, description="norm x logit",
                            **({"matrices": "all", "n_matrix_layers": L} if signed_matrices else {})),
               MethodLayout("norm", signed=False, example_values=("ig_delta",) if with_values else ())]
    w = StoreWriter.create(path, n_layers=L, n_heads=H, labels={0: "negative", 1: "positive"}, methods=methods, provenance={"model": "synthetic"}, attrs={"model_id": "synthetic"}, heads=heads)
    words = "the movie was [bold] great but tédious and 🎬 long".split()
    exs = []
    for i in range(n_examples):
        n = int(rng.integers(3, 12))
        toks = ["[CLS]"] + [words[j % len(words)] for j in rng.integers(0, len(words), n - 2)] + ["[SEP]"]
        text = " ".join(toks[1:-1])
        res = {"rollout": {"scores": rng.random(n), "layer_scores": rng.random((L, n)), "matrices": rng.random((L, n, n))},
               "normxlogit": {"scores": rng.normal(size=n), "layer_scores": rng.normal(size=(L, n)), "class_scores": rng.normal(size=(2, n))},
               "norm": {"scores": rng.random(n), "example_values": {"ig_delta": -0.0125 * (i + 1)} if with_values else {}}}
        if signed_matrices:
            res["normxlogit"]["matrices"] = extra.normal(size=(L, n, n))
        lab = int(rng.integers(0, 2)); pred = int(rng.integers(0, 2))
        att = None
        if heads != "none":
            att = head_rng.gamma(0.3, size=(L, H, n, n)) + 1e-3
            att = att / att.sum(-1, keepdims=True)
            att = att if heads == "all" else att[:, :, 0]
        exs.append(ExampleData(row=i, id=f"ex{i}", text=text, pair=None, token_ids=np.arange(n), tokens=toks, spans=np.full((n, 2), -1), segment=np.zeros(n), label=lab, pred=pred, probs=np.array([0.3, 0.7]), target=pred, explain_pos=0, n_orig_tokens=n, truncated=False, heads=att, results=res))
    w.append(exs[: n_examples // 2]); w.append(exs[n_examples // 2:])
    w.close(complete=True, summary={"examples": n_examples})
    return exs
if __name__ == "__main__":
    exs = make_store(sys.argv[1])
    s = open_store(sys.argv[1]); print(s, s.complete, s.summary)
    e = s[3]; print(e, e.tokens, e.text, e.scores("rollout"), e.matrices("rollout").shape, e.class_scores("normxlogit").shape, e.layer_scores("norm"))
    assert e.tokens == exs[3].tokens
    np.testing.assert_allclose(e.scores("normxlogit"), exs[3].results["normxlogit"]["scores"], rtol=1e-6)
    np.testing.assert_allclose(e.matrices("rollout"), exs[3].results["rollout"]["matrices"], atol=1e-3)
    print(s.by_id("ex7"))
