"""DFlash drafters on Gemma 4 and Gemma 4 Unified targets (per-layer head shapes; KV-shared layers that run on the
last positions only): built by the builder, run lossless, benchmarked and trained."""

from __future__ import annotations

import json

import pytest
import torch

import hf_specmm
from hf_specmm import _compat, testing
from hf_specmm.drafts.dflash import dflash_config_for, dflash_draft_for

from conftest import batch_inputs, target

pytestmark = pytest.mark.skipif(not _compat.GEMMA4_SUPPORTED, reason="Gemma 4 needs transformers >= 5.24")
FAMILIES = ("gemma4", "gemma4_unified")


@pytest.mark.parametrize("family", FAMILIES)
def test_builder_reads_the_first_layers_shapes(family):
    model = target(family)
    text = model.config.get_text_config()
    config = dflash_config_for(model, block_size=4)
    first = text.per_layer_config[0]
    assert (config.hidden_size, config.num_attention_heads) == (text.hidden_size, text.num_attention_heads)
    assert (config.num_key_value_heads, config.head_dim) == (first.num_key_value_heads, first.head_dim)
    assert config.rope_parameters["rope_theta"] == text.rope_parameters[text.layer_types[0]]["rope_theta"]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_parity_at_batch_3(family):
    model, inputs = target(family), batch_inputs(family, 3)
    hf_specmm.disable(model)
    plain = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    hf_specmm.enable(model)
    try:
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False,
                             assistant_model=dflash_draft_for(model, block_size=4))
        assert torch.equal(out, plain)
        assert hf_specmm.last_stats(model).drafted_tokens > 0
    finally:
        hf_specmm.disable(model)


def test_the_context_holds_every_prompt_positions_features():
    """Gemma 4 runs its KV-shared layers on the prefill's last position only unless asked for every position: the
    captured context has the prompt's width, equal to ``output_hidden_states``' layers."""
    from hf_specmm.drafts.dflash import DFlashDrafter
    from hf_specmm.targets import target_spec
    from hf_specmm.vocab import vocab_map

    model, inputs = target("gemma4"), batch_inputs("gemma4", 1)
    draft = dflash_draft_for(model, block_size=4, target_layer_ids=[0, 2])
    rows = model.get_output_embeddings().weight.shape[0]
    drafter = DFlashDrafter(draft, vocab_map(target_spec(model), rows, torch.device("cpu")))
    with torch.no_grad(), drafter.watch(model):
        out = model(**inputs, output_hidden_states=True, logits_to_keep=1)
    captured = drafter._take()
    want = torch.cat([out.hidden_states[i + 1] for i in (0, 2)], -1)
    assert captured.shape == want.shape
    torch.testing.assert_close(captured, want)


def test_bench_runs_dflash_on_tiny_gemma4():
    from hf_specmm.bench import BenchConfig, run_benchmark

    result = run_benchmark(BenchConfig(preset="tiny-gemma4", draft_kinds=["dflash"], gammas=[3], batch_sizes=[1],
                                       max_new_tokens=6, repeats=1, warmup=0, stock=False), progress=False)
    (row,) = result["rows"]
    assert row["lossless"] is True


def test_train_builds_and_trains_a_dflash_drafter_for_gemma4(tmp_path, monkeypatch):
    """``hf-specmm train --draft-kind dflash`` on a Gemma 4 target (loaded in memory: the tiny processor has no
    video processor to save)."""
    import hf_specmm.train.run as run
    from hf_specmm.train import TrainConfig, train_draft

    model, processor = testing.tiny_target("gemma4", eos_bias=-30.0), testing.tiny_processor("gemma4")
    monkeypatch.setattr(run, "load_target", lambda *args, **kwargs: (model, processor))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"image": None, "prompt": p}) + "\n"
                            for p in ["describe the image", "hi there", "what color is the sky"] * 4))
    (tmp_path / "target").mkdir()
    result = train_draft(TrainConfig(target=str(tmp_path / "target"), data=str(data), output_dir=str(tmp_path / "run"),
                                     draft_kind="dflash", draft_config="tiny", steps=2, max_new_tokens=6, batch_size=4,
                                     block_size=4, progress=False, eval_fraction=0.25, eval_gamma=3))
    assert result.completed and result.global_step == 2
    loaded = hf_specmm.load_draft(result.draft_dir, target=model)
    assert loaded.config.block_size == 4
