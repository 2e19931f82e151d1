#!/usr/bin/env bash
# lmms-eval on the shipped miniature world, offline: the world target evaluated plain and with each shipped
# draft on captioning and VQA; per-sample outputs and scores must be identical (the comparison exits 1
# otherwise); lmms-eval's wall time, the time in generate, new tokens / s and τ side by side.
#
#   bash examples/lmms_eval_world.sh [OUT_DIR]        # PER_TASK=32 BATCH_SIZE=8 PYTHON=python by default
#
# Needs hf_specmm with lmms-eval: pip install "hf_specmm[lmms]", or the CPU recipe in docs/lmms-eval.md.
set -euo pipefail
out=${1:-lmms_world_out}
py=${PYTHON:-python}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1  # everything is local: the task folder and the checkpoints
ckpt=$("$py" -c "from hf_specmm.world.shipped import CHECKPOINTS; print(CHECKPOINTS)")
"$py" -m hf_specmm.cli world-task "$out/task" --per-task "${PER_TASK:-32}"
rm -rf "$out/runs"  # one lmms-eval run per folder: the comparison reads each folder's single result
# float32: on a CPU the world target is exact there (bfloat16, the default, also gives identical outputs here)
base="pretrained=$ckpt/world-target,batch_size=${BATCH_SIZE:-8},dtype=float32"
runs=()
for run in plain text-only image-adapter feature-head eagle3-head; do
  args=$base
  [ "$run" = plain ] || args="$base,draft=$ckpt/$run-draft"
  echo "=== $run: --model_args $args"
  "$py" -m lmms_eval --include_path "$out/task" --tasks hf_specmm_world --model hf_specmm --model_args "$args" \
    --output_path "$out/runs/$run" --log_samples --verbosity WARNING
  runs+=("$run=$out/runs/$run")
done
"$py" -m hf_specmm.integrations.lmms_eval.compare "${runs[@]}" | tee "$out/comparison.md"
