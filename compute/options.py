"""Options of ``attr-compute run``, each declared once.

An :class:`Option` says everything the run needs to know about one setting: its command-line form and help, its
default, the check of its value, whether a store made with another value may be resumed, and which method parameter
it sets. The CLI's options, :class:`compute.run.config.RunConfig`, the run plan's checks, the resume identity, the
methods' parameters and the store's provenance are all derived from these declarations (compute.run.config).

The run-level options are declared here; a method's options are declared on its class (``Method.options``) and
collected through ``compute.methods.REGISTRY``, so adding a method option touches the method's file only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import AttrscopeError, UsageError
from .papers import PRESET_NAMES
from .shards import check_shard


@dataclass(frozen=True)
class Option:
    name: str  # RunConfig attribute and provenance key
    default: Any = None
    help: str | None = None
    type: type = str  # str, int or bool (a flag)
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    flags: tuple[str, ...] = ()  # command-line declarations when not just --name-with-dashes
    path: bool = False  # a file path (click.Path(dir_okay=False))
    show_default: bool = False
    cli: bool = True  # False: a RunConfig setting without a command-line option
    resume: bool = False  # part of the resume identity: a store made with another value is not resumed
    param: str | None = None  # the method parameter it sets (declared on a method's class)
    passed: str = "always"  # when it is passed to the method: always | given (not None) | set (true)
    to_param: Callable[[Any], Any] | None = None  # the parameter's value from the option's (default: the same)
    param_default: Any = None  # not None: the parameter recorded with this value when neither option nor preset set it
    check: Callable[[str, Any], Exception | None] | None = None  # the error for a bad value (flag, value)
    parse: Callable[[str], Any] | None = None  # the value of its command-line text (a ValueError: a usage error)

    @property
    def flag(self) -> str:
        """How the user names the option in messages."""
        if not self.cli:
            return f"the {self.name} (RunConfig.{self.name})"
        long = [f for f in self.flags if f.startswith("--")]
        return long[0].split("/")[0] if long else "--" + self.name.replace("_", "-")

    def param_of(self, value: Any) -> tuple[bool, Any]:
        """(whether the method gets the parameter, its value) for the option's value."""
        if self.passed == "given" and value is None or self.passed == "set" and not value:
            return False, None
        return True, self.to_param(value) if self.to_param else value


# --- checks of one value --------------------------------------------------------------------------------------
def at_least(n: int, why: str = "") -> Callable[[str, Any], Exception | None]:
    def check(flag: str, value):
        if value is not None and value < n:
            return UsageError(f"{flag} must be at least {n}{why}")
        return None

    return check


def between(lo: float, hi: float) -> Callable[[str, Any], Exception | None]:
    def check(flag: str, value):
        if value is not None and not lo <= value <= hi:
            return UsageError(f"{flag} must be between {lo} and {hi}, not {value}")
        return None

    return check


def batch_size_value(text: str) -> int | str:
    """--batch-size N or auto."""
    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"'{text}' is not a number or auto") from None


def batch_size_check(flag: str, value) -> Exception | None:
    if value == "auto":
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        return UsageError(f"{flag} must be a number or auto, not {value!r}")
    return at_least(1)(flag, value)


def existing_file(flag: str, value) -> Exception | None:
    if value and not os.path.exists(value):
        return AttrscopeError(f"{flag}: file '{value}' not found: check the path")
    return None


# --- run-level options, in the order of ``attr-compute run --help`` ----------------------------------------------
# Before the methods' options: output, model, data, batching, what is stored. ``resume=True`` marks everything that
# changes the numbers (batch size, window, dtypes: how examples are batched and summed, hence float rounding), the
# data read, or what is stored. The head-statistics options are not part of it: a resumed run reads its masks from
# the store.
DEFAULT_BATCH_SIZE = 32  # --batch-size's default, and auto's on CPU (memory is not probed there)
DEFAULT_BATCH_TOKENS = 8192  # --batch-tokens' default: padded tokens per batch (examples x the longest)
DEFAULT_MAX_NEW_TOKENS = 20  # --max-new-tokens' default
GENERATE_OPTIONS = ("max_new_tokens", "do_sample", "seed", "continuation_column", "chat_template", "contrast",
                    "contrast_column")  # --task generate's own
UNKNOWN_SAMPLE = 256  # --max-unknown-share: the first examples whose tokens it counts (about the first batches)

RUN_OPTIONS: tuple[Option, ...] = (
    Option("output", flags=("-o", "--output"), metavar="STORE.h5",
           help="Store to write [default: <dataset name>.h5 here]."),
    Option("model", metavar="ID_OR_PATH",
           help="Hugging Face id or local directory [default: bundled demo classifier]."),
    Option("methods", "default", show_default=True, metavar="LIST|all|default",
           help="Comma-separated method names; all: every method the model runs; default: the mission's ALTI, "
                "GlobEnc, AttCAT, Mask-LRP (where a dependency parser is installed) and NormXLogit.", resume=True),
    Option("limit", type=int, metavar="N", help="Only the first N examples.", resume=True),
    Option("shard", metavar="K/N", resume=True, check=check_shard,
           help="Compute only shard K of N (from 0) of the examples, cut into N contiguous parts of about equal token "
                "counts, into <output>.shard-K-of-N.h5; join the N with attr-compute merge (Slurm job arrays)."),
    Option("batch_size", DEFAULT_BATCH_SIZE, type=int, show_default=True, metavar="N|auto", resume=True,
           parse=batch_size_value, check=batch_size_check,
           help="The most examples in a batch; auto: on CUDA the token budget (and the parts of the n^2 methods) "
                "that a memory model from trial batches says fit the GPU, recorded in the store; "
                f"{DEFAULT_BATCH_SIZE} on CPU. Under auto, a longest example that the methods' memory model "
                "(docs/scaling.md) says does not fit is refused before anything runs. A batch that runs out of GPU "
                "memory is halved and retried."),
    Option("batch_tokens", type=int, metavar="N", resume=True, check=at_least(1),
           help="The most padded tokens in a batch (examples x its longest example); a batch is also cut where "
                "padding would add more than 15% to its tokens (a length bucket) [default: "
                f"{DEFAULT_BATCH_TOKENS}; under --batch-size auto on CUDA, what fits the GPU, at most N]."),
    Option("batch_memory_mb", type=int, metavar="MB", check=at_least(1),
           help="--batch-size auto on the CPU: the largest batch whose peak memory (measured on the longest example) "
                f"stays within MB [default: not measured, {DEFAULT_BATCH_SIZE}]."),
    Option("device", "auto", show_default=True, metavar="auto|cpu|cuda[:k]"),
    Option("dtype", "float32", choices=("float32", "bfloat16", "float16"), show_default=True, resume=True,
           help="Model compute dtype (methods always compute in at least float32)."),
    Option("max_length", type=int, metavar="N", help="Truncate inputs to N tokens [default: the model's limit].",
           resume=True, check=at_least(2, " (room for the special tokens)")),
    Option("task", "auto", show_default=True, resume=True,
           choices=("auto", "classification", "regression", "masked-token", "next-token", "qa", "generate"),
           help="What the model predicts and the methods explain (compute.tasks); auto: read off the model's head "
                "(a 1-output classifier is regression, a masked LM masked-token, a causal LM next-token, a "
                "question-answering head qa); generate (never auto): a causal LM's continuation of each prompt, "
                "every generated token explained over the tokens before it."),
    Option("text_column", metavar="C", resume=True),
    Option("pair_column", metavar="C", resume=True),
    Option("label_column", metavar="C", resume=True),
    Option("id_column", metavar="C", resume=True),
    Option("target_column", metavar="C", resume=True,
           help="masked-token / next-token: column of the target word [default: target, if present; else the "
                "model's own prediction]."),
    Option("foil_column", metavar="C", resume=True,
           help="masked-token / next-token: column of a foil word; the methods then explain target minus foil."),
    # --task generate (compute/generation.py, compute/run/steps.py); the plan refuses them under another task
    Option("max_new_tokens", type=int, metavar="N", resume=True, check=at_least(1),
           help=f"generate: the most tokens generated per prompt, fewer where EOS comes first or the model's length "
                f"ends [default: {DEFAULT_MAX_NEW_TOKENS}]."),
    Option("do_sample", False, type=bool, resume=True,
           help="generate: sample each token from the model's distribution instead of greedy decoding (--seed)."),
    Option("seed", type=int, metavar="S", resume=True,
           help="generate --do-sample: the seed; each example draws from a generator of its own (S and its row), so "
                "its continuation depends neither on the batch nor on a resume [default: 0]."),
    Option("continuation_column", metavar="C", resume=True,
           help="generate: column of a continuation to explain instead of generating one (teacher forcing); it must "
                "tokenise as itself after the prompt."),
    Option("chat_template", False, type=bool, resume=True,
           help="generate: wrap each prompt in the tokenizer's chat template (a user turn, the assistant's opened)."),
    Option("contrast", choices=("top2",), resume=True,
           help="generate: explain each step against its runner-up, the most probable other token: "
                "logit(generated) - logit(runner-up)."),
    Option("contrast_column", metavar="C", resume=True,
           help="generate --continuation-column: column of a text whose tokens are the steps' foils, one per "
                "continuation token."),
    Option("word_index_column", metavar="C", resume=True,
           help="masked-token: column of the 0-based index of the word (text.split()) to mask, instead of a mask "
                "token in the text."),
    Option("answers_column", metavar="C", resume=True,
           help="qa: column of SQuAD-style answers {\"text\": [...], \"answer_start\": [...]} [default: answers]."),
    Option("split", metavar="NAME", help="Split of a Hugging Face dataset id.", resume=True),
    Option("target", choices=("predicted", "label", "all"), resume=True,
           help="Class explained by class-specific methods [default: predicted, or the preset's]."),
    Option("matrices", "cls", choices=("none", "cls", "all"), show_default=True, resume=True,
           help="Per-layer matrices to keep: none, the explained row only, or all n x n."),
    Option("store_dtype", "float16", choices=("float16", "float32"), show_default=True, resume=True,
           help="dtype of stored matrices (scores are always float32)."),
    Option("heads", False, type=bool, resume=True,
           help="Also store the model's attention probabilities of every head, as --matrices says: the explained "
                "row [L, H, n] (cls) or [L, H, n, n] (all), in --store-dtype (attr-tui's head grid, key a)."),
    Option("resume", False, type=bool, help="Finish an interrupted store."),
    Option("overwrite", False, type=bool, help="Replace an existing store."),
    Option("preset", choices=PRESET_NAMES, resume=True,
           help="Reference conventions of a paper (recorded in the store)."),
    Option("window", 8, type=int, cli=False, resume=True),  # batches per window (sort-by-length scope, commit unit)
    Option("commit_seconds", 60.0, type=float, show_default=True, metavar="S", check=at_least(0),
           help="Every S seconds of compute, also commit the rows of the window in progress that are finished in "
                "dataset order, not only whole windows. A window's batches run longest first, so its finished prefix "
                "often grows only near the window's end: a stop can lose up to one window (--batch-size x 8 rows). A "
                "resumed run continues mid-window with the same batches, so the same numbers."),
)

# After the methods' options.
RUN_OPTIONS_AFTER_METHODS: tuple[Option, ...] = (
    Option("evidence_column", metavar="C", resume=True,
           help="Column of evidence / answer character spans [[start, end], ...] (precision_at_k, dot_product, "
                "average_precision)."),
    Option("metrics", metavar="LIST",
           help="Faithfulness metrics computed after the run (name or name@preset, e.g. "
                "comprehensiveness,sufficiency,aopc@attcat); see attr-compute metrics."),
    # Not part of the resume identity: it changes no number, only whether the run is refused.
    Option("max_unknown_share", 0.5, type=float, show_default=True, metavar="S", check=between(0, 1),
           help=f"Refuse a run where more than this share of the tokens of the first {UNKNOWN_SAMPLE} examples' "
                "texts are the tokenizer's unknown token (a tokenizer that does not fit the model or the data, e.g. "
                "a model directory without its tokenizer files); 1: never refused. Tokenizers without an unknown "
                "token (byte-level BPE) are never refused."),
    Option("allow_random_head", False, type=bool,
           help="Run a checkpoint whose classification head is not trained (transformers initialises it at "
                "random; refused otherwise). For testing only; recorded in the store."),
)


def show_value(value) -> str:
    """An option's value as the user types it (None: the option was not given), for one-line messages."""
    if value is None:
        return "(not given)"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)
