"""Gemma 4 / Gemma 4 Unified specifics (transformers >= 5.24; skipped before): what is refused before any work
(audio and video inputs), the prefill's bidirectional image attention that a ``vlm`` draft must reproduce,
and EAGLE-1 / EAGLE-3 heads: their layers, the watched prefill that keeps every prompt position, batch-3 and
static parity, χ² sampling and training. The shared matrices over ``testing.FAMILIES`` cover the rest."""

from __future__ import annotations

import math

import pytest
import torch
import hf_specmm
from hf_specmm import _compat
from hf_specmm import testing
from hf_specmm.errors import IncompatibleDraftError, UnsupportedGenerationError
from conftest import batch_inputs, target
from test_bad_inputs import count_forwards as count_forwards_of

pytestmark = pytest.mark.skipif(not _compat.GEMMA4_SUPPORTED, reason="Gemma 4 targets need transformers >= 5.24")
FAMILIES = ("gemma4", "gemma4_unified")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["input_features", "pixel_values_videos"])
def test_audio_and_video_inputs_are_refused_before_any_forward(family, name):
    model = target(family)
    inputs = dict(batch_inputs(family, 1))
    inputs[name] = torch.zeros(1, 4, 8)
    hf_specmm.enable(model)
    try:
        with count_forwards_of(model) as calls, pytest.raises(UnsupportedGenerationError, match=name):
            model.generate(**inputs, max_new_tokens=4, assistant_model=testing.text_draft_from_target(model))
        assert calls["n"] == 0
    finally:
        hf_specmm.disable(model)


def _drafter(model, head):
    """The drafter that runs ``head`` in generate (watching the target's forwards)."""
    from hf_specmm.targets import target_spec
    from hf_specmm.vocab import VocabMap, draft_vocab_size

    return hf_specmm.kind_of(head).drafter(head, VocabMap(target_spec(model), draft_vocab_size(head), model.device))


@pytest.mark.parametrize("family", FAMILIES)
def test_heads_leave_out_what_only_the_target_stack_runs(family):
    """A head's Gemma 4 layers have no per-layer inputs and no KV sharing, and take the types and shapes of the
    target's last layers (a 1-layer head: a full-attention layer with the global head size); an EAGLE-3 head
    runs its Llama layers in a Llama body. A head made for another target is refused before any forward."""
    model = target(family)
    text = model.config.get_text_config()
    assert text.num_kv_shared_layers > 0 and not testing.feature_head_is_exact(model)
    for layers in (1, 3):
        head = hf_specmm.FeatureHeadDraft.for_target(model, num_layers=layers)
        config = head.config.text_config
        assert not getattr(config, "hidden_size_per_layer_input", 0) and config.num_kv_shared_layers == 0
        assert config.layer_types == text.layer_types[-layers:]
        names = {name for name, _ in head.named_parameters()}
        assert not any("per_layer" in name for name in names)
        assert all(layer.self_attn.k_proj is not None for layer in head.body.layers)  # no layer reuses K/V
        last = head.body.layers[-1].self_attn
        assert last.head_dim == text.per_layer_config["full_attention"].head_dim
    eagle3 = hf_specmm.FeatureHeadDraft.for_target(model, variant="eagle3")
    assert type(eagle3.body).__name__ == "LlamaModel" and len(eagle3.body.layers) == 1
    assert eagle3.config.layer_config.head_dim == text.per_layer_config["full_attention"].head_dim
    other = testing.feature_head_from_target(target("gemma3"))
    hf_specmm.enable(model)
    try:
        for assistant in (other, hf_specmm.Tree(other, top_k=2, depth=2, nodes=4)):
            with count_forwards_of(model) as calls, pytest.raises(IncompatibleDraftError, match="made for"):
                model.generate(**batch_inputs(family, 1), max_new_tokens=4, assistant_model=assistant)
            assert calls["n"] == 0
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_watched_prefill_computes_every_prompt_position(family):
    """Plain generate's prefill (``logits_to_keep=1``) runs the KV-shared layers on the last position only; while
    a head watches, the decoder computes every position: the EAGLE-1 feature (last hidden state) and the EAGLE-3
    features (inputs of the aux layers, the last ones KV-shared) of the whole prompt equal those of a full
    forward, and the kept logits are plain's."""
    model = target(family)
    inputs = batch_inputs(family, 3)
    width = inputs["input_ids"].shape[1]
    depth = model.config.get_text_config().num_hidden_layers
    seen = []
    hook = model.get_decoder().register_forward_hook(lambda mod, args, out: seen.append(out[0].shape[1]))
    with torch.no_grad():
        plain = model(**inputs, logits_to_keep=1)
        hook.remove()
        assert seen == [1]  # the slicing this test is about
        full = model(**inputs, output_hidden_states=True)  # every position, every layer's input
        last = model.model(**inputs).last_hidden_state  # the decoder's output (after its final norm), every position
        # EAGLE-3: the inputs of layers 1, 2, 3 (layers 2 and 3 are KV-shared: 3's input is 2's output)
        for variant, aux in (("eagle1", None), ("eagle3", [1, depth - 2, depth - 1])):
            head = hf_specmm.FeatureHeadDraft.for_target(model, variant=variant, aux_layers=aux)
            drafter = _drafter(model, head)
            with drafter.watch(model):
                watched = model(**inputs, logits_to_keep=1)
            expected = last if aux is None else torch.cat([full.hidden_states[k] for k in aux], -1)
            assert drafter.captured[1].shape[1] == width
            torch.testing.assert_close(drafter.captured[1], expected, atol=1e-5, rtol=1e-5)
            assert watched.logits.shape == plain.logits.shape
            torch.testing.assert_close(watched.logits, plain.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_image_attention_is_bidirectional_and_a_vlm_copy_is_exact(family):
    """Dropping mm_token_type_ids changes the prefill (what stock assisted generation would need to do to
    run); the vlm copy gets them in its prefill and is accepted 100 % with images, batched."""
    model = target(family)
    inputs = batch_inputs(family, 3)
    with torch.no_grad():
        full = model(**inputs).logits[:, -1]
        causal = model(**{k: v for k, v in inputs.items() if k != "mm_token_type_ids"}).logits[:, -1]
    assert (full - causal).abs().max() > 1e-3
    plain = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    hf_specmm.enable(model)
    try:
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False, assistant_model=model,
                             num_assistant_tokens=4)
        assert torch.equal(out, plain)
        assert hf_specmm.last_stats(model).acceptance_rate == 1.0
    finally:
        hf_specmm.disable(model)


def test_bench_tiny_gemma4_preset_runs_losslessly_with_margins():
    """The tiny version of the gemma4-e2b-shape preset (same input builder, fixture-sized): image blocks as the
    processor writes them, every mode lossless, greedy margins far above bf16 rounding (the margin rule holds
    on Gemma 4's post-norm, per-layer-embedding layers)."""
    from hf_specmm.bench import BenchConfig, run_benchmark
    from hf_specmm.bench.margins import MIN_MARGIN_ULPS, greedy_margins
    from hf_specmm.bench.presets import PRESETS, build_preset, synthetic_inputs

    assert {"gemma4-e2b-shape", "tiny-gemma4"} <= set(PRESETS)
    preset = build_preset("tiny-gemma4")
    inputs = synthetic_inputs(preset, 2, 12)
    config = preset.target.config
    assert (inputs["input_ids"] == config.image_token_id).sum() == 2 * 4
    assert torch.equal(inputs["mm_token_type_ids"], (inputs["input_ids"] == config.image_token_id).long())
    assert greedy_margins(preset.target, inputs, max_new_tokens=8)["min_margin_ulps"] >= MIN_MARGIN_ULPS
    result = run_benchmark(BenchConfig(preset="tiny-gemma4", gammas=[3], batch_sizes=[2], acceptance=1.0,
                                       max_new_tokens=12, repeats=1, warmup=0), progress=False)
    (row,) = result["rows"]
    assert row["lossless"] is True and row["tau"] > 1.0


def test_bench_gemma4_e2b_shape_configs():
    """The E2B-shaped preset's configs without allocating its parameters: built on the meta device."""
    from hf_specmm.bench.presets_gemma4 import draft_270m, target_e2b
    from hf_specmm.targets import target_spec

    target, draft = target_e2b(torch.bfloat16, "meta"), draft_270m(torch.bfloat16, "meta")
    text = target.config.text_config
    assert type(target).__name__ == "Gemma4ForConditionalGeneration" and text.hidden_size_per_layer_input == 256
    assert text.vocab_size == draft.config.vocab_size == 262144
    n_target = sum(p.numel() for p in target.parameters())
    n_draft = sum(p.numel() for p in draft.parameters())
    print(f"gemma4-e2b-shape: target {n_target / 1e9:.2f}B parameters, draft {n_draft / 1e6:.0f}M")
    assert 0.25e9 < n_draft < 0.3e9, n_draft
    spec = target_spec(target)
    assert spec.text_vocab_end == 258880 and {255999, 256000, 258880, 258881, 258882, 258883, 258884} == spec.dropped_ids


def test_speculative_sampling_matches_plain_on_gemma4():
    """χ² homogeneity per generated position (as tests/test_sampling.py, at its level): rows with an image,
    sampled plainly and speculatively with a text-only noisy copy of the target's LM."""
    from test_sampling import ALPHA, NEW, SAMPLING, chi2_homogeneity_pvalue, noisy_copy

    model = testing.tiny_target("gemma4", seed=0, eos_bias=-30.0)
    rows = 300  # half of test_sampling's N: the Gemma 4 vision tower reads a padded 280-patch budget per image
    inputs = testing.make_inputs("gemma4", testing.tiny_processor("gemma4"), ["what color is the circle ?"] * rows,
                                 [testing.tiny_image(0)] * rows)
    torch.manual_seed(1)
    plain = model.generate(**inputs, **SAMPLING)[:, inputs["input_ids"].shape[1]:]
    hf_specmm.enable(model)
    try:
        torch.manual_seed(2)
        spec = model.generate(**inputs, **SAMPLING, assistant_model=noisy_copy(model), num_assistant_tokens=3)
        spec = spec[:, inputs["input_ids"].shape[1]:]
        stats = hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)
    assert 0.0 < stats.acceptance_rate < 0.95, stats.acceptance_rate
    for pos in range(NEW):
        p, stat, dof = chi2_homogeneity_pvalue(plain[:, pos], spec[:, pos], model.config.text_config.vocab_size)
        assert p > ALPHA, f"position {pos}: χ²={stat:.1f} (dof {dof}), p={p:.2g}"


@pytest.mark.parametrize("family", FAMILIES)
def test_head_parity_at_batch_3_with_static_caches_and_trees(family):
    """Left-padded batch of 3 with a row without an image: an EAGLE-3 head that agrees in part (chain, static
    cache, tree) and the EAGLE-1 copy of the target's layers (static cache, tree) give plain's tokens; the copy
    leaves out the per-layer inputs and KV sharing, so it is accepted in part (rollbacks at different offsets)."""
    from eagle3_fixtures import lagged_head

    model = target(family)
    inputs = batch_inputs(family, 3)
    plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    static = model.generate(**inputs, max_new_tokens=16, do_sample=False, cache_implementation="static")
    heads = {"eagle3": lagged_head(model), "eagle1": testing.feature_head_from_target(model)}
    hf_specmm.enable(model)
    try:
        for name, head in heads.items():
            runs = {"static": (dict(assistant_model=head, num_assistant_tokens=3, cache_implementation="static"),
                               static),
                    "tree": (dict(assistant_model=hf_specmm.Tree(head, top_k=2, depth=3, nodes=6)), plain)}
            if name == "eagle3":  # the EAGLE-1 chain at batch 3: test_feature_head's lean cell
                runs["chain"] = (dict(assistant_model=head, num_assistant_tokens=3), plain)
            for how, (kwargs, expected) in runs.items():
                out = model.generate(**inputs, max_new_tokens=16, do_sample=False, **kwargs)
                assert torch.equal(out, expected), f"{family} {name} {how}:\n{out}\n!=\n{expected}"
                stats = hf_specmm.last_stats(model)
                assert stats.drafted_tokens > 0
                if name == "eagle1":
                    assert 0.0 < stats.acceptance_rate < 1.0, (how, stats.acceptance_rate)
    finally:
        hf_specmm.disable(model)


def test_sampling_with_a_head_matches_plain():
    """χ² per position (tests/test_sampling.py's test): the EAGLE-1 copy of Gemma 4 Unified's layers (accepted
    in part) drafting for a sampled call leaves the target's distribution unchanged."""
    from test_sampling import ALPHA, NEW, _samples, chi2_homogeneity_pvalue

    family = "gemma4_unified"
    model = testing.tiny_target(family, seed=0, eos_bias=-30.0)
    plain = _samples(model, family, seed=1)
    hf_specmm.enable(model)
    try:
        spec = _samples(model, family, testing.feature_head_from_target(model), seed=2)
        stats = hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)
    assert 0.0 < stats.acceptance_rate < 0.9, stats.acceptance_rate
    vocab = model.get_input_embeddings().weight.shape[0]
    for pos in range(NEW):
        p, stat, dof = chi2_homogeneity_pvalue(plain[:, pos], spec[:, pos], vocab)
        assert p > ALPHA, f"position {pos}: χ²={stat:.1f} (dof {dof}), p={p:.2g} < {ALPHA}"


@pytest.mark.parametrize("family,variant", [("gemma4", "eagle1"), ("gemma4_unified", "eagle3")])
def test_training_a_head_lowers_its_loss_and_the_trained_head_is_lossless(family, variant, tmp_path):
    """The trainer's own stages (target forward watched by the head's view, the kind's loss) on the target's
    greedy answers: the loss falls, the saved head loads and drafts losslessly. (The CLI reads the target from a
    folder; the tiny Gemma 4 processors do not load back without torchvision, so the run is built here.)"""
    from hf_specmm.targets import target_spec
    from hf_specmm.train import TrainConfig
    from hf_specmm.train.data import Example
    from hf_specmm.train.trainer import Trainer
    from hf_specmm.vocab import VocabMap, draft_vocab_size

    model, proc = testing.tiny_target(family, eos_bias=-30.0), testing.tiny_processor(family)
    prompts = ["what color is the circle ?", "describe the image", "how many dog are there"]
    examples = []
    for i in range(6):
        image = testing.tiny_image(i, (32, 32) if i % 2 else (64, 32)) if i % 3 else None
        if image is not None:
            image.save(tmp_path / f"{i}.png")
        x = testing.make_inputs(family, proc, [prompts[i % 3]], [image])
        answer = model.generate(**x, max_new_tokens=6, do_sample=False)[0, x["input_ids"].shape[1]:].tolist()
        examples.append(Example(i, "t", prompts[i % 3], image=None if image is None else tmp_path / f"{i}.png",
                                response_ids=answer))
    torch.manual_seed(0)
    head = hf_specmm.FeatureHeadDraft.for_target(model, variant=variant).train()
    cfg = TrainConfig(target="t", data="d", output_dir=str(tmp_path / "run"), draft_kind=hf_specmm.kind_of(head).name,
                      steps=12, stage2_steps=12, batch_size=3, lr=3e-3, progress=False)
    vocab = VocabMap(target_spec(model), draft_vocab_size(head), model.device)
    trainer = Trainer(cfg, model, proc, head, vocab, examples, {"global_step": 0, "stage": 0, "stage_step": 0})
    assert trainer.run(hf_specmm.get_kind(hf_specmm.kind_of(head).name).stages, None)
    losses = trainer.losses
    print(f"{family} {variant}: loss {losses[:3]} -> {losses[-3:]}")
    assert len(losses) == 24 and all(map(math.isfinite, losses))
    assert sum(losses[-3:]) < sum(losses[:3]), losses
    head.eval().save_pretrained(tmp_path / "head")
    loaded = hf_specmm.load_draft(tmp_path / "head").attach(model)
    inputs = batch_inputs(family, 3)
    plain = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    hf_specmm.enable(model)
    try:
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False, assistant_model=loaded,
                             num_assistant_tokens=3)
    finally:
        hf_specmm.disable(model)
    assert torch.equal(out, plain)


def test_a_copy_of_a_target_without_kv_sharing_is_accepted_whole():
    """Gemma 4 layers in a head do reproduce a Gemma 4 stack that has neither KV sharing nor per-layer inputs
    (the tiny Unified target with its shared layers given their producers' K/V weights): the copy is accepted
    100 % on text rows (sliding windows, keys = values, the target's positions), batch 3 with left padding;
    with images lossless (the prefill attends both ways inside an image, a causal head cannot)."""
    from hf_specmm.testing.gemma4 import without_kv_sharing

    model = without_kv_sharing(target("gemma4_unified"))
    assert testing.feature_head_is_exact(model)
    head = testing.feature_head_from_target(model)
    for with_images in (False, True):
        inputs = batch_inputs("gemma4_unified", 3, with_images=with_images)
        plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
        hf_specmm.enable(model)
        try:
            out = model.generate(**inputs, max_new_tokens=16, do_sample=False, assistant_model=head,
                                 num_assistant_tokens=4)
            stats = hf_specmm.last_stats(model)
        finally:
            hf_specmm.disable(model)
        assert torch.equal(out, plain), f"images={with_images}:\n{out}\n!=\n{plain}"
        if not with_images:
            assert stats.drafted_tokens > 0 and stats.acceptance_rate == 1.0, stats
