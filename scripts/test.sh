#!/usr/bin/env bash
# Install hf_specmm with its test extras into the active Python and run the test suite.
# HF_SPECMM_TRANSFORMERS pins transformers (CI runs the lowest and newest tested versions).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "torch==2.13.0"  # CPU wheel; an unpinned torch pulls GBs of CUDA packages
python -m pip install -q ${HF_SPECMM_TRANSFORMERS:+"$HF_SPECMM_TRANSFORMERS"} -e ".[test]"
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python -m pytest -q -p no:cacheprovider tests
