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
if [[ "${HF_SPECMM_TRANSFORMERS:-}" == "transformers==5.17"* ]]; then
  # vLLM's speculators package (it pins transformers <= 5.19) without its heavy dependency set (torchvision,
  # torchaudio, ...): only what importing its EAGLE-3 model classes needs. tests/test_eagle3_speculators.py
  # loads our speculators export with them; elsewhere that test skips.
  "$py" -m pip install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0 loguru==0.7.3 openai==3.57.0 \
    httpx2==2.16.2 sniffio==1.3.1 datasets==5.2.0 multiprocess==0.70.19 dill==0.4.1 xxhash==4.1.0 \
    pandas==3.1.1 pyarrow==26.0.1
fi
"$py" -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
"$py" -m pytest -q -p no:cacheprovider tests "$@"
