#!/usr/bin/env bash
# Fresh virtualenv + CPU torch + hf_specmm, then the offline quickstart (no downloads).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${HF_SPECMM_VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q "torch==2.13.0"
"$py" -m pip install -q -e .
"$py" examples/offline_quickstart.py
