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
if [[ "${HF_SPECMM_TRANSFORMERS:-}" == "transformers==5.25"* ]]; then
  # lmms-eval for tests/test_lmms_eval.py on the newest tested transformers (lmms-eval 0.7.3 imports and runs
  # with 5.25; the [lmms] extra, elsewhere that test skips), without its dependency
  # set: `pip install lmms-eval` pulls torchvision, whose index wheel needs CUDA torch (with it torch 2.14.1+cu130
  # and the CUDA libraries). Only what lmms-eval's CLI, evaluator, metrics and huggingface model import;
  # nothing there imports torchvision. filelock < 4: lmms-eval's evaluator imports filelock._api.
  "$py" -m pip install -q --no-deps lmms-eval==0.7.3 filelock==3.32.7 loguru==0.7.3 sacrebleu==2.6.0 \
    portalocker==4.4.2 tabulate==0.10.0 colorama==0.4.6 lxml==6.1.3 evaluate==0.4.6 datasets==5.2.0 \
    multiprocess==0.70.19 dill==0.4.1 xxhash==4.1.0 pandas==3.1.1 pyarrow==26.0.1 pytz==2026.6 \
    python-dateutil==2.9.0.post0 six==1.17.0 requests==2.34.2 urllib3==2.8.0 certifi==2026.10.19.post1 \
    charset-normalizer==3.4.4 tenacity==9.2.1 aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 \
    frozenlist==1.8.0 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4 attrs==26.1.0 pytablewriter==1.2.1 \
    DataProperty==1.1.1 mbstrdecoder==1.1.5 pathvalidate==3.3.1 tabledata==1.3.5 tcolorpy==0.1.7 \
    typepy==1.3.5 chardet==6.0.0.post1
fi
"$py" -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
# Two worker processes (pytest-xdist), whole files per worker so each file's cached fixtures are built once:
# tests run single-threaded (conftest), so a 2-core CI machine runs two at a time.
# HF_SPECMM_TEST_WORKERS=0 runs them in this process.
"$py" -m pytest -q -p no:cacheprovider -n "${HF_SPECMM_TEST_WORKERS:-2}" --dist loadfile tests "$@"
