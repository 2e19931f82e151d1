#!/usr/bin/env bash
# Fresh virtualenv + CPU torch + hf_specmm (with matplotlib for the plot), then the offline demo:
# the shipped miniature-world target answering held-out scenes, plain vs speculative (no downloads,
# nothing trained). Extra arguments go to `hf-specmm demo` (e.g. --per-task 16 --gamma 3).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${HF_SPECMM_VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q "torch==2.13.0"  # CPU wheel; an unpinned torch pulls GBs of CUDA packages
"$py" -m pip install -q -e ".[bench]"
"$venv/bin/hf-specmm" demo "$@"
