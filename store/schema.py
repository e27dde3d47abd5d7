"""The on-disk layout of an attrscope store (HDF5), shared by the writer and the reader.

Layout (format 1.x, 1.1 added /head_masks, 1.2 /metrics; README "Store schema" documents it for users):

    /                      attrs: encoding-type, encoding-version, model and library provenance, n_layers, n_heads,
                           labels (JSON), methods (JSON list), complete (bool), summary (JSON, once complete)
    /provenance            uint8   full run configuration as UTF-8 JSON (attributes are limited to 64 KiB)
    /examples/index        compound rows, one per committed example (INDEX_FIELDS); appending them is the commit
    /examples/strings      uint8   ids, texts and pair texts, UTF-8, addressed by (offset, length) in the index row
    /tokens/ids            int32   [T]     token ids of all committed examples, concatenated
    /tokens/spans          int32   [T, 2]  character span of each token in its segment's text, (-1, -1) for specials
    /tokens/segment        int8    [T]     0 = text, 1 = pair, -1 = special token
    /tokens/str_off        int64   [T]     offset of each token string in /tokens/strings
    /tokens/str_len        int32   [T]
    /tokens/strings        uint8           token strings (tokenizer's convert_ids_to_tokens), UTF-8
    /tokens/evidence       uint8   [T]     1 on evidence / answer tokens (only in stores made with --evidence-column)
    /methods/<name>/scores        float32 [T]            final attribution, aligned with the tokens
    /methods/<name>/layer_scores  float32 [T * V]        per example a [V, n] block (V = n_layer_views)
    /methods/<name>/matrices      --store-dtype          per example [L, n, n] ("all") or [L, 1, n] ("cls")
    /methods/<name>/class_scores  float32 [T * C]        per example a [C, n] block (--target all)
    /methods/<name>/example_values/<key>  float32 [N]   one scalar per example (integrated gradients: "ig_delta")
    /head_masks/<name>/mask       [L, H]                 Mask-LRP head masks ("positional", "syntactic", "mask_lrp");
    /head_masks/<name>/<stat>                            the statistics they came from; settings JSON in attrs
    /metrics/<method>/<name>/values   float32 [N]        faithfulness metric per example (format 1.2); curves,
                                                          levels [N, K]; settings and summary JSON in attrs

Every ragged array is flat with offsets derived from the index row (tok_off, n_tokens, sq_off), so every dataset has a
fixed dtype and only grows by appends, which is what HDF5's single-writer/multiple-reader (SWMR) mode allows.
"""

from __future__ import annotations

import numpy as np

ENCODING_TYPE = "attrscope-store"
ENCODING_VERSION = "1.2.0"  # 1.1: /head_masks, 1.2: /metrics
METHOD_ENCODING_TYPE = "attrscope-method"
HEAD_MASK_ENCODING_TYPE = "attrscope-head-mask"
METRIC_ENCODING_TYPE = "attrscope-metric"

FLAG_TRUNCATED = 1

# Chunk sizes (elements) of the flat datasets: large enough for gzip to work well, small enough that reading one
# example decompresses little.
CHUNK_FLAT = 1 << 15
CHUNK_MATRIX = 1 << 17
CHUNK_ROWS = 256


def index_dtype(num_labels: int) -> np.dtype:
    """Row of /examples/index. Offsets are int64 so stores may exceed 2**31 tokens or matrix entries."""
    return np.dtype(
        [
            ("row", "<i8"),  # row number in the source dataset
            ("id_off", "<i8"),
            ("id_len", "<i4"),
            ("text_off", "<i8"),
            ("text_len", "<i4"),
            ("pair_off", "<i8"),
            ("pair_len", "<i4"),  # -1: no pair text
            ("tok_off", "<i8"),  # first token in /tokens/*
            ("n_tokens", "<i4"),
            ("sq_off", "<i8"),  # sum of n_tokens**2 over earlier examples: offset of full matrices / L
            ("label", "<i4"),  # -1: unlabelled
            ("pred", "<i4"),
            ("target", "<i4"),  # class explained by the class-specific methods
            ("explain_pos", "<i4"),  # token position whose row the methods explain ([CLS] for classifiers)
            ("n_orig_tokens", "<i4"),  # tokens before truncation at --max-length
            ("flags", "u1"),
            ("probs", "<f4", (num_labels,)),
        ]
    )


MATRIX_MODES = ("none", "cls", "all")
STORE_DTYPES = ("float16", "float32")
