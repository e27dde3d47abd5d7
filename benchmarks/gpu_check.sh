#!/usr/bin/env bash
# Issue 26's measurements on one GPU machine, under 8 minutes, needing nothing outside the project but ASSETS:
# ASSETS/tokenizer (a BERT-base-uncased-vocabulary tokenizer, e.g. the shared MiniLM's tokenizer files) and
# ASSETS/dev.tsv (SST-2 dev). Writes OUT/summary.md (and a log per step); see benchmarks/gpu_check.py.
#
#   benchmarks/gpu_check.sh ASSETS OUT            # on the GPU machine, from the repository root
#   benchmarks/gpu_check.sh ASSETS OUT --dry-run  # a rehearsal on the CPU with a 2-layer model
#
# Preparing ASSETS here (an ignored folder that travels with the work tree):
#   mkdir -p .gpu_assets/tokenizer && cp ../shared/data/sst2/dev.tsv .gpu_assets/ &&
#   cp ../shared/models/minilm-sst2/{vocab.txt,tokenizer.json,tokenizer_config.json,special_tokens_map.json} \
#      .gpu_assets/tokenizer/
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
    echo "usage: benchmarks/gpu_check.sh ASSETS OUT [--dry-run]" >&2
    exit 2
fi
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" benchmarks/gpu_check.py "$@"
