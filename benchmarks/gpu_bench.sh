#!/usr/bin/env bash
# The GPU benchmarks, one section per name: hf_specmm runs from the working tree, checks that the speculative
# path is lossless on the GPU, then times the GPU presets. Results land in $OUT (default benchmarks/results/gpu).
#   bash benchmarks/gpu_bench.sh [p0] [p1] [p3] [q1] [g1] [q5] [t1] [c1] [auto] [a1] [ad]  (none named: all but a1, ad)
#   bash benchmarks/gpu_bench.sh --help
#   p0  tiny LLaVA, the draft's own proposals (no controlled acceptance), batch 1/3: lossless smoke test
#   p1  LLaVA-1.5-7B shape, batch 1, α 0.7, γ 3/5: plain vs stock vs ours, small LM vs feature head
#   p3  LLaVA-1.5-7B shape, γ 5, batch 1/4/8 (stock refuses batch > 1): small LM vs feature head
#   q1  Qwen2.5-VL-7B shape, batch 1/4, γ 5 (stock raises on Qwen-VL with a text draft)
#   g1  Gemma 4 E2B shape (transformers >= 5.24), Gemma 3 270M-shaped text draft, batch 1/4, γ 3/5, text-only
#       drafts (feature heads are refused for Gemma 4; stock raises on Gemma 4 with a text draft)
#   q5  Qwen3.5-9B shape (hybrid: Gated DeltaNet + attention), batch 1/4, γ 3/5, a hybrid Qwen3.5-0.8B-shaped text
#       draft and a feature head (stock refuses: "not supported with stateful models")
#   t1  LLaVA-1.5-7B shape, batch 1/4: chains (γ 5) beside draft trees (4,6,32 and 8,8,64 nodes), both drafts
#   c1  LLaVA-1.5-7B shape, batch 1/4/8, γ 5: eager beside compiled (static caches + torch.compile with CUDA
#       graphs, stock's compile_config) for plain generate and hf_specmm, both drafts
#   auto  LLaVA-1.5-7B and Qwen2.5-VL-7B shapes, batch 1/4, the world's text-only acceptance profile (rank-aware
#       controlled acceptance, docs/auto.md): hf_specmm.Auto beside chains γ 1/3/5/8 and trees (2,4,8),
#       (4,6,24), (8,6,48), (8,8,64), both drafts (the Qwen shape's 0.5B-shaped draft costs ~0.9 of a 7B step:
#       Auto should fall back to plain steps or plain generate there)
#   a1  the auto section in short parts, each (preset, batch) its own bench so an interrupted run keeps what
#       finished: Qwen2.5-VL-7B shape batch 1 (γ 1/3/5), LLaVA-1.5-7B shape batch 1 and 4 (γ 1/3/5/8, trees
#       (4,6,24) and (8,8,64)); 64 new tokens, Auto's best grid row re-timed in turns beside Auto and plain
#   ad  LLaVA-1.5-7B shape, batch 1, both drafts: fixed shapes timed and written as hf-specmm auto-sim profiles
#       (bench --write-profile; docs/auto.md), Auto beside them (2 untimed calls, 6 warm-up calls, its best grid
#       row re-timed beside it): bench.json's auto_calls are what hf-specmm auto-sim --json predicts for the profile
# The 7B presets time bf16 weights, as users run them (DTYPE=float32 for fp32): controlled acceptance
# replays the plain greedy run's tokens, which needs every method to produce them; the presets' margin rule
# (hf_specmm/bench/margins.py) keeps each greedy pick ahead of the runner-up by far more than bf16 rounding,
# so a (γ+1)-token verification and a 1-token step agree (without it: lossless False and τ 1.1-1.2 instead
# of 2.5-3.1 at α 0.7 on an H100, benchmarks/results/gpu-h100/llava-1.5-7b-batch1-bf16-before-margin-rule/). Each 7B section first prints the preset's greedy margins
# (margins.txt: min / median top-1 minus top-2 in bf16 spacings).
# The machine has torch/transformers; carry extra wheels in .whl/ if its transformers is outside the
# tested range (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
SECTIONS="p0 p1 p3 q1 g1 q5 t1 c1 auto a1 ad"
if [[ " $* " == *" --help "* || " $* " == *" -h "* ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0
fi
for s in "$@"; do  # every name checked before anything runs
  [[ " $SECTIONS " == *" $s "* ]] || { echo "gpu_bench.sh: unknown section '$s' (choose from: $SECTIONS)" >&2; exit 2; }
done
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$(pwd)${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
sections=${*:-p0 p1 p3 q1 g1 q5 t1 c1 auto}
python3 - <<'PY' 2>&1 | tee "$OUT/env.txt"
import torch, transformers, hf_specmm
print("gpu", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| transformers", transformers.__version__)
PY
bench() { local name=$1; shift; python3 -m hf_specmm.cli bench "$@" --out "$OUT/$name" 2>&1 | tee "$OUT/$name.txt"; }
kinds=(--draft-kind text_only feature_head)
big=(--dtype "${DTYPE:-bfloat16}" --acceptance 0.7 --max-new-tokens 128 --warmup 1 --repeats 3)
profile=(--dtype "${DTYPE:-bfloat16}" --acceptance-profile benchmarks/results/world-acceptance-profiles/world_profile_text-only-distilled.json
         --max-new-tokens 128 --warmup 1 --repeats 3 --no-stock --gammas 1 3 5 8 --tree 2,4,8 --tree 4,6,24
         --tree 8,6,48 --tree 8,8,64 --auto)
lean=(--dtype "${DTYPE:-bfloat16}" --acceptance-profile benchmarks/results/world-acceptance-profiles/world_profile_text-only-distilled.json
      --max-new-tokens 64 --warmup 1 --repeats 3 --no-stock --auto --auto-eval-repeats 3 "${kinds[@]}" --device cuda)
margins() {  # the margin check on the preset about to be timed (same seed, dtype, inputs as the bench's batch 1)
  python3 -c 'import sys; from hf_specmm.bench.margins import main; sys.exit(main(sys.argv[1:]))' "$1" --device cuda \
    --dtype "${DTYPE:-bfloat16}" 2>&1 | tee -a "$OUT/margins.txt"; }
for s in $sections; do
  case $s in
    p0) bench tiny-llava-lossless --preset tiny --device cuda "${kinds[@]}" --gammas 1 3 8 --batch-sizes 1 3 --max-new-tokens 32 \
          --warmup 1 --repeats 1 ;;
    p1) margins llava-1.5-7b-shape; bench llava-1.5-7b-batch1 --preset llava-1.5-7b-shape --device cuda "${kinds[@]}" --gammas 3 5 --batch-sizes 1 "${big[@]}" ;;
    p3) margins llava-1.5-7b-shape; bench llava-1.5-7b-batch-1-4-8 --preset llava-1.5-7b-shape --device cuda "${kinds[@]}" --gammas 5 --batch-sizes 1 4 8 "${big[@]}" --no-stock ;;
    q1) margins qwen2.5-vl-7b-shape; bench qwen2.5-vl-7b-batch-1-4 --preset qwen2.5-vl-7b-shape --device cuda "${kinds[@]}" --gammas 5 --batch-sizes 1 4 "${big[@]}" ;;
    g1) margins gemma4-e2b-shape; bench gemma4-e2b-batch-1-4 --preset gemma4-e2b-shape --device cuda --draft-kind text_only --gammas 3 5 \
          --batch-sizes 1 4 "${big[@]}" ;;
    q5) margins qwen3.5-9b-shape; bench qwen3.5-9b-batch-1-4 --preset qwen3.5-9b-shape --device cuda "${kinds[@]}" --gammas 3 5 --batch-sizes 1 4 "${big[@]}" ;;
    t1) margins llava-1.5-7b-shape; bench llava-1.5-7b-trees --preset llava-1.5-7b-shape --device cuda "${kinds[@]}" --gammas 5 --batch-sizes 1 4 \
          --tree 4,6,32 --tree 8,8,64 "${big[@]}" --no-stock ;;
    c1) margins llava-1.5-7b-shape; bench llava-1.5-7b-compile --preset llava-1.5-7b-shape --device cuda "${kinds[@]}" --gammas 5 --batch-sizes 1 4 8 \
          --compile "${big[@]}" --no-stock ;;
    auto) margins llava-1.5-7b-shape; bench llava-1.5-7b-auto --preset llava-1.5-7b-shape --device cuda "${kinds[@]}" \
          --batch-sizes 1 4 "${profile[@]}"
          margins qwen2.5-vl-7b-shape; bench qwen2.5-vl-7b-auto --preset qwen2.5-vl-7b-shape --device cuda "${kinds[@]}" \
          --batch-sizes 1 4 "${profile[@]}" ;;
    a1) bench qwen2.5-vl-7b-auto-batch1 --preset qwen2.5-vl-7b-shape --batch-sizes 1 --gammas 1 3 5 "${lean[@]}"
        for b in 1 4; do
          bench llava-1.5-7b-auto-batch$b --preset llava-1.5-7b-shape --batch-sizes $b --gammas 1 3 5 8 --tree 4,6,24 --tree 8,8,64 \
            "${lean[@]}"
        done ;;
    ad) for kind in text_only feature_head; do  # the profiles Auto's simulator replays (docs/auto.md)
          python3 -m hf_specmm.cli bench --preset llava-1.5-7b-shape --batch-sizes 1 --gammas 1 3 5 8 --tree 4,6,24 \
            --tree 8,8,64 --draft-kind $kind --dtype "${DTYPE:-bfloat16}" --max-new-tokens 64 --warmup 1 --repeats 3 \
            --acceptance-profile benchmarks/results/world-acceptance-profiles/world_profile_text-only-distilled.json --no-stock \
            --auto --auto-eval-repeats 3 --auto-warmup-calls 6 \
            --device cuda --out "$OUT/ad-$kind" --write-profile "$OUT/profile-llava-$kind.json"
        done ;;
  esac
done
