"""``hf-specmm bench --draft-kind mtp`` on the tiny presets (LLaVA-, Step3.7- and Qwen3.5-shaped): a random MTP
layer of the target's shape, on the same controlled acceptance pattern as the feature head (the same rounds, τ and
acceptance), lossless at batch 1 and 2 (left padding); ``--mtp-layers 3`` as Step3.7 checkpoints carry them."""

from __future__ import annotations

import pytest

from hf_specmm.bench import BenchConfig, run_benchmark
from hf_specmm.bench.presets import PRESETS
from test_cli_edges import _refused, no_work  # noqa: F401 - a pytest fixture


@pytest.mark.parametrize("preset, layers", (("tiny", 1), ("tiny-step3.7", 1), ("tiny-step3.7", 3), ("tiny-qwen3.5", 1)))
def test_bench_runs_the_mtp_kind_on_the_preset(preset, layers):
    if preset not in PRESETS:
        pytest.skip(f"{preset} needs a transformers with its model family")
    result = run_benchmark(BenchConfig(preset=preset, gammas=[3], batch_sizes=[1, 2], acceptance=0.7,
                                       max_new_tokens=40, repeats=1, warmup=0, stock=False,
                                       draft_kinds=["feature_head", "mtp"], mtp_layers=layers), progress=False)
    assert result["env"]["config"]["mtp_layers"] == layers
    rows = {(r["draft_kind"], r["batch"]): r for r in result["rows"]}
    for batch in (1, 2):
        head, mtp = rows["feature_head", batch], rows["mtp", batch]
        assert mtp["lossless"] is True and 1.0 < mtp["tau"] < 4.0
        assert (mtp["tau"], mtp["rounds"], mtp["acceptance"]) == (head["tau"], head["rounds"], head["acceptance"])


def test_mtp_layers_without_the_mtp_kind_is_refused_before_any_work(capsys, no_work):  # noqa: F811
    assert "add mtp to --draft-kind" in _refused(["bench", "--preset", "tiny", "--draft-kind", "feature_head",
                                                  "--mtp-layers", "2"], capsys)
    assert "--mtp-layers" in _refused(["bench", "--preset", "tiny", "--draft-kind", "mtp", "--mtp-layers", "0"], capsys)
    with pytest.raises(ValueError, match="mtp_layers=2"):
        BenchConfig(preset="tiny", draft_kinds=["feature_head"], mtp_layers=2).validate()
