#!/usr/bin/env bash
# One call on a lent GPU machine (device tool): install hf_specmm from the working tree, check that
# the speculative path is lossless on the GPU, then time the GPU presets. Results land in $OUT.
#   device run: bash benchmarks/gpu_bench.sh
# The machine has torch/transformers; carry extra wheels in .whl/ if its transformers is outside the
# tested range (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$(pwd)${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 - <<'PY' 2>&1 | tee "$OUT/env.txt"
import torch, transformers, hf_specmm
print("gpu", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| transformers", transformers.__version__)
PY
# P1: batch 1, α = 0.7, γ sweep; P3: batch 8
python3 -m hf_specmm.cli bench --preset llava-1.5-7b-shape --device cuda --gammas 3 5 7 --batch-sizes 1 \
  --acceptance 0.7 --max-new-tokens 128 --warmup 2 --repeats 5 --out "$OUT/p1" 2>&1 | tee "$OUT/p1.txt"
python3 -m hf_specmm.cli bench --preset llava-1.5-7b-shape --device cuda --gammas 5 --batch-sizes 8 \
  --acceptance 0.7 --max-new-tokens 128 --warmup 2 --repeats 5 --no-stock --out "$OUT/p3" 2>&1 | tee "$OUT/p3.txt"
