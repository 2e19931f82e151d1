#!/usr/bin/env bash
# Fresh virtualenv + CPU torch + hf_specmm[test], then the test suite.
# HF_SPECMM_VENV: where the venv goes (default .venv). HF_SPECMM_TRANSFORMERS: pin transformers
# (CI runs the lowest and the newest tested versions).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${HF_SPECMM_VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q "torch==2.13.0"  # CPU wheel; an unpinned torch pulls GBs of CUDA packages
"$py" -m pip install -q ${HF_SPECMM_TRANSFORMERS:+"$HF_SPECMM_TRANSFORMERS"} -e ".[test]"
"$py" -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
"$py" -m pytest -q -p no:cacheprovider tests "$@"
