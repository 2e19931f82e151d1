"""Half precision and the bench presets' margin rule.

A random head's greedy argmax is often a near-tie that a (γ+1)-token verification and a 1-token step round
differently in bf16/fp16, which breaks controlled acceptance's replayed reference (H100: τ 1.1 instead of
2.8). The presets' margin rule keeps top-1 minus top-2 far above bf16's spacing; these tests check the
margins it gives (and that the check tells a raw random head apart), and that the controlled benchmark then
runs in bf16/fp16 losslessly with the τ that α predicts."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_specmm import testing
from hf_specmm.bench import BenchConfig, build_preset, run_benchmark, synthetic_inputs
from hf_specmm.bench.margins import MIN_MARGIN_ULPS, apply_margin_rule, bf16_spacing, greedy_margins


def test_bf16_spacing_is_the_gap_between_adjacent_bf16_numbers():
    values = torch.tensor([1.0, 1.5, 20.0, -20.0, 255.0])
    spacing = bf16_spacing(values)
    assert spacing.tolist() == [2 ** -7, 2 ** -7, 2 ** -3, 2 ** -3, 2 ** 0]
    bf16 = values.to(torch.bfloat16)
    assert torch.equal((bf16.float() + spacing).to(torch.bfloat16).float(), bf16.float() + spacing)  # representable
    assert torch.equal((bf16.float() + spacing / 4).to(torch.bfloat16), bf16)  # a quarter step rounds back


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen2.5-vl"])
def test_presets_keep_greedy_margins_far_above_bf16_rounding(name):
    preset = build_preset(name, dtype="bfloat16")
    report = greedy_margins(preset.target, synthetic_inputs(preset, 3, 12), max_new_tokens=40)
    assert report["steps"] == 3 * 40 and report["dtype"] == "bfloat16"
    assert report["min_margin_ulps"] >= MIN_MARGIN_ULPS, report
    assert report["share_below_4_ulps"] == 0.0
    # the same fixture without the rule: near-ties within a few bf16 spacings (what broke the H100 bf16 run)
    raw = testing.tiny_target("llava" if name == "tiny" else "qwen2_5_vl", eos_bias=-30.0).to(torch.bfloat16)
    preset.target = raw
    report = greedy_margins(raw, synthetic_inputs(preset, 3, 12), max_new_tokens=40)
    assert report["min_margin_ulps"] < 4 and report["share_below_4_ulps"] > 0.02, report


@pytest.mark.parametrize("name,dtype", [("tiny", "bfloat16"), ("tiny-qwen2.5-vl", "float16")])
def test_controlled_benchmark_is_lossless_with_the_expected_tau_in_half_precision(name, dtype):
    """The fp32 test's setting (test_bench.py) in half precision, both draft kinds at batch 3."""
    result = run_benchmark(BenchConfig(preset=name, dtype=dtype, gammas=[3], batch_sizes=[3], acceptance=0.6,
                                       max_new_tokens=120, repeats=1, warmup=0, stock=False,
                                       draft_kinds=["text_only", "feature_head"]), progress=False)
    assert build_preset(name, dtype=dtype).target.dtype == getattr(torch, dtype)  # the tiny presets honour --dtype
    for row in result["rows"]:
        assert row["lossless"] is True
        assert row["expected_tau"] == pytest.approx((1 - 0.6 ** 4) / 0.4)
        assert abs(row["tau_steady"] - row["expected_tau"]) < 0.2, row


def test_stock_sees_the_same_rounds_in_bf16():
    """Batch 1, α = 1: every drafted token accepted by stock and by hf_specmm, output equal to plain bf16."""
    result = run_benchmark(BenchConfig(preset="tiny", dtype="bfloat16", gammas=[4], batch_sizes=[1], acceptance=1.0,
                                       max_new_tokens=31, repeats=1, warmup=0), progress=False)
    (row,) = result["rows"]
    assert row["lossless"] is True and row["tau"] == 5
    if row["stock_error"] is None:
        assert row["stock_tau"] == pytest.approx(row["tau"], rel=1e-9)
    else:  # transformers 5.17 hands the draft pixel_values
        assert "pixel_values" in row["stock_error"]


def test_margin_rule_refuses_a_tied_head_and_text_ids_outside_the_head():
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)
    with pytest.raises(ValueError, match="untied LM head"):
        apply_margin_rule(LlamaForCausalLM(config), text_vocab=60)
    config.tie_word_embeddings = False
    with pytest.raises(ValueError, match=r"text ids \[3, 65\)"):
        apply_margin_rule(LlamaForCausalLM(config), text_vocab=65)
