"""Qwen3.5 and Qwen3.5-MoE (hybrids: Gated DeltaNet linear-attention layers + full attention; transformers 5.17 to
5.25): the lean suite of families too slow on a CPU for every shared suite. Rollback of the linear states row by
row (target and hybrid drafts), greedy parity for every draft kind at batch 1 and 3 (left padding, images, rows
finishing at their own steps), static caches, returned outputs, pipelines, sampling (χ²) and what is refused."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import pipeline

import hf_specmm
from hf_specmm import _compat, testing
from hf_specmm.caches import DynamicBackend
from hf_specmm.errors import SpecMMError

if not testing.HYBRID_FAMILIES:
    pytest.skip("this transformers has no Qwen3.5", allow_module_level=True)

PROMPTS = ["describe the image", "what color is the sky and the tree ?", "hi"]


@pytest.fixture(scope="module", params=testing.HYBRID_FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="module")
def model(family):
    target = testing.tiny_target(family, eos_bias=-30.0)
    hf_specmm.enable(target)
    yield target
    hf_specmm.disable(target)


def inputs_for(model, batch: int, images: bool = True):
    family = testing.fixture_of(model).name
    images_ = [testing.tiny_image(i) if images and i != 1 else None for i in range(batch)]
    return testing.make_inputs(family, testing.tiny_processor(family), PROMPTS[:batch], images_)


def plain(model, inputs, **kwargs):
    return _compat.stock_generate(model, **inputs, **kwargs)


# ---- the rollback itself ---------------------------------------------------------------------------------

def _rounds(batch: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(3, 90, (batch, 4), generator=gen), torch.randint(0, 5, (batch,), generator=gen))
            for _ in range(4)]


def _roll(draft, ids, mask, rounds, linear: bool):
    """Prompt, then per round a block of 4 and a rollback keeping ``counts[b]`` of it; the probe's logits."""
    kv = DynamicBackend().new(draft, ids.shape[0], ids.device)
    if not linear:  # what a crop alone gives: the linear states keep every token of every block
        kv.linear.close()
        kv.linear = None
    pos = kv.positions.prompt_positions(mask)
    draft(input_ids=ids, **kv.append(mask.bool(), ids.shape[1], pos), **kv.forward_kwargs(), use_cache=True)
    for block, counts in rounds:
        start = kv.length
        draft(input_ids=block, **kv.append(None, block.shape[1]), **kv.forward_kwargs(), use_cache=True)
        kv.rollback(start, counts)
    probe = torch.full((ids.shape[0], 1), 7)
    logits = draft(input_ids=probe, **kv.append(None, 1), **kv.forward_kwargs(), use_cache=True).logits[:, -1]
    return logits, kv


@torch.no_grad()
def test_rollback_restores_each_rows_linear_states_as_single_steps_compute_them(model):
    """Rows keep different counts of each block (0 to all): each row's conv and recurrent states and its next
    logits equal a fresh run of that row alone, token by token (a hybrid Qwen3.5 text LM's cache)."""
    draft = testing.text_draft_from_target(model)
    inputs = inputs_for(model, 3, images=False)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    rounds = _rounds(3)
    logits, kv = _roll(draft, ids, mask, rounds, linear=True)
    cropped, _ = _roll(draft, ids, mask, rounds, linear=False)
    # the cache's length is its kept slots' (from 5.25 layer 0, a linear layer, reports its own token count)
    assert int(kv.cache.get_seq_length()) == kv.length
    for b in range(3):
        row = ids[b][mask[b].bool()][None]
        cache = _compat.new_dynamic_cache(draft)
        draft(input_ids=row, **_compat.cache_kwargs(cache), use_cache=True)
        kept = [block[b : b + 1, : int(counts[b])] for block, counts in rounds]
        steps = torch.cat([row, *kept, torch.tensor([[7]])], 1)
        for n in range(row.shape[1], steps.shape[1]):
            ref = draft(input_ids=steps[:, n : n + 1], position_ids=torch.tensor([[n]]), **_compat.cache_kwargs(cache),
                        use_cache=True)
        torch.testing.assert_close(logits[b], ref.logits[0, -1], atol=5e-5, rtol=0)
        assert (cropped[b] - ref.logits[0, -1]).abs().max() > 1e-2  # the check can fail: crop alone is wrong
        for index in _compat.gated_delta_modules(draft):
            mine, theirs = _compat.linear_states(kv.cache, index), _compat.linear_states(cache, index)
            torch.testing.assert_close(mine[0][b], theirs[0][0], atol=5e-5, rtol=0)  # conv
            torch.testing.assert_close(mine[1][b], theirs[1][0], atol=5e-5, rtol=0)  # recurrent


def test_hooks_come_off_after_the_call(model):
    inputs = inputs_for(model, 1)
    model.generate(**inputs, assistant_model=testing.text_draft_from_target(model), max_new_tokens=4)
    for module in _compat.gated_delta_modules(model).values():
        assert not module._forward_pre_hooks and not module._forward_hooks
        assert not module.in_proj_qkv._forward_hooks


# ---- greedy parity, every draft kind -------------------------------------------------------------------

def _drafts(model):
    return {
        "qwen3.5 text LM (hybrid, noisy)": testing.natural_text_draft(model, noise=0.1),
        "qwen3.5 text LM (random hybrid)": testing.random_text_draft(model),
        "qwen3 text LM (attention only)": testing.fixture("qwen3_vl").random_draft(model, 3, 128, None),
        "vlm (the target itself)": model,
        "vlm (noisy copy)": testing.perturb_head(copy.deepcopy(model), 0.3),
        "image adapter": hf_specmm.ImageAdapterDraft.for_target(model, testing.natural_text_draft(model, noise=0.1),
                                                                copy_projector=True),
        "eagle-1 (noisy)": testing.feature_head_from_target(model, noise=0.1),
        "eagle-3": hf_specmm.FeatureHeadDraft.for_target(model, variant="eagle3"),
    }


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_parity_every_draft_kind(model, batch):
    """Float32 greedy output token for token equal to plain generate: left padding, an image-less row among
    image rows, γ 1 and 4 (rows accepting different counts roll back to different offsets)."""
    inputs = inputs_for(model, batch)
    ref = plain(model, inputs, max_new_tokens=12, do_sample=False)
    for name, draft in _drafts(model).items():
        for gamma in (1, 4):
            out = model.generate(**inputs, assistant_model=draft, max_new_tokens=12, do_sample=False,
                                 num_assistant_tokens=gamma)
            assert torch.equal(out, ref), f"{name}, γ={gamma}, batch {batch}"
            assert hf_specmm.last_stats(model).drafted_tokens > 0


@pytest.mark.parametrize("kind", ["text", "vlm", "eagle-1"])
def test_exact_drafts_are_accepted_every_time(model, kind):
    """A draft that IS the target (its text LM on text prompts, itself, an EAGLE-1 copy of its layers): 100 %,
    which holds only if both sides' linear states come back exactly after every round."""
    inputs = inputs_for(model, 3, images=kind == "vlm")
    draft = {"text": testing.text_draft_from_target, "vlm": lambda m: m,
             "eagle-1": testing.feature_head_from_target}[kind](model)
    ref = plain(model, inputs, max_new_tokens=16, do_sample=False)
    out = model.generate(**inputs, assistant_model=draft, max_new_tokens=16, do_sample=False, num_assistant_tokens=3)
    assert torch.equal(out, ref)
    assert hf_specmm.last_stats(model).acceptance_rate == 1.0


def test_rows_finish_independently_and_leave_the_batch(family):
    """EOS at different steps: finished rows leave both caches (their linear states with them)."""
    target = hf_specmm.enable(testing.tiny_target(family, seed=2, eos_bias=2.0))
    inputs = inputs_for(target, 3)
    ref = plain(target, inputs, max_new_tokens=20, do_sample=False)
    eos = testing.family_ids(family)["eos"][0]
    new = ref[:, inputs["input_ids"].shape[1]:]
    ends = {int((row == eos).nonzero()[0]) if (row == eos).any() else -1 for row in new}
    assert len(ends) > 1, "rows should finish at different steps"
    for draft in (testing.natural_text_draft(target, noise=0.1), target):
        out = target.generate(**inputs, assistant_model=draft, max_new_tokens=20, do_sample=False)
        assert torch.equal(out, ref)
        assert hf_specmm.last_stats(target).batch_size == 3


def test_confidence_threshold_and_heuristic_schedule(model):
    """Rounds that end early (a stateful draft reads its last draft before the round stops) and a γ that moves."""
    inputs = inputs_for(model, 3)
    ref = plain(model, inputs, max_new_tokens=12, do_sample=False)
    draft = testing.natural_text_draft(model, noise=0.1)
    for extra in (dict(num_assistant_tokens=5, assistant_confidence_threshold=0.6),
                  dict(num_assistant_tokens=2, num_assistant_tokens_schedule="heuristic")):
        out = model.generate(**inputs, assistant_model=draft, max_new_tokens=12, do_sample=False, **extra)
        assert torch.equal(out, ref), extra


# ---- static caches, outputs, pipelines ------------------------------------------------------------------

def test_static_cache_parity(model):
    """Static caches: linear states written in place (static addresses), whole-buffer masks kept away from the
    linear layers (they read a 2-D mask's last block-width columns as the block's padding)."""
    inputs = inputs_for(model, 3)
    ref = plain(model, inputs, max_new_tokens=12, do_sample=False)
    for draft in (testing.natural_text_draft(model, noise=0.1), model):
        out = model.generate(**inputs, assistant_model=draft, max_new_tokens=12, do_sample=False,
                             cache_implementation="static", num_assistant_tokens=3)
        assert torch.equal(out, ref)


def test_return_dict_in_generate(model):
    flags = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)
    inputs = inputs_for(model, 3)
    ref = plain(model, inputs, max_new_tokens=8, do_sample=False, **flags)
    out = model.generate(**inputs, assistant_model=testing.natural_text_draft(model, noise=0.1), max_new_tokens=8,
                         do_sample=False, num_assistant_tokens=3, **flags)
    assert torch.equal(out.sequences, ref.sequences)
    for name in ("scores", "logits"):  # verification blocks run the chunked kernel, plain steps the recurrent one
        for a, b in zip(getattr(out, name), getattr(ref, name)):
            torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)
    layers, stock = out.past_key_values.layers, ref.past_key_values.layers
    assert [type(a) for a in layers] == [type(b) for b in stock]
    for a, b in zip(layers, stock):
        if _compat.is_linear_cache_layer(a):  # every row ran to max_new_tokens: its states are plain generate's
            torch.testing.assert_close(a.recurrent_states[0], b.recurrent_states[0], atol=1e-4, rtol=1e-3)
        else:
            torch.testing.assert_close(a.keys, b.keys, atol=1e-4, rtol=1e-3)


def test_pipeline_batch(family):
    pipe = pipeline("image-text-to-text", model=testing.tiny_target(family, eos_bias=-30.0),
                    processor=testing.tiny_processor(family))
    images = [testing.tiny_image(10 + i) for i in range(3)]
    texts = [f"<|vision_start|><|image_pad|><|vision_end|> {p}" for p in PROMPTS]

    def call(extra):
        return pipe(images=images, text=texts, batch_size=3, generate_kwargs={"max_new_tokens": 8, "do_sample": False,
                                                                              **extra})

    ref = call({})
    hf_specmm.enable(pipe.model)
    assert call({"assistant_model": testing.natural_text_draft(pipe.model, noise=0.1)}) == ref
    assert hf_specmm.last_stats(pipe.model).batch_size == 3


# ---- what is refused ------------------------------------------------------------------------------------

def test_trees_are_refused_before_any_work(model, monkeypatch):
    calls = []
    monkeypatch.setattr(type(model), "forward", lambda *a, **k: calls.append(1))
    inputs = inputs_for(model, 1)
    for draft in (testing.text_draft_from_target(model), testing.fixture("qwen3_vl").random_draft(model, 3, 128, None)):
        with pytest.raises(SpecMMError, match="linear-attention layers.*per|parent"):
            model.generate(**inputs, assistant_model=hf_specmm.Tree(draft, top_k=2, depth=2, nodes=4),
                           max_new_tokens=4)
    assert calls == []


# ---- sampling ------------------------------------------------------------------------------------------

def test_sampling_follows_the_targets_distribution(model, family):
    """χ² homogeneity, per position, of plain sampling vs speculative sampling with a disagreeing hybrid draft."""
    from test_sampling import ALPHA, chi2_homogeneity_pvalue

    n, new = 400, 3
    inputs = testing.make_inputs(family, testing.tiny_processor(family), ["what color is the circle ?"] * n,
                                 [testing.tiny_image(0)] * n)
    sampling = dict(do_sample=True, temperature=0.9, top_k=40, max_new_tokens=new)
    torch.manual_seed(1)
    ref = plain(model, inputs, **sampling)[:, -new:]
    torch.manual_seed(2)
    out = model.generate(**inputs, **sampling, assistant_model=testing.natural_text_draft(model, noise=0.6),
                         num_assistant_tokens=3)[:, -new:]
    assert 0.0 < hf_specmm.last_stats(model).acceptance_rate < 0.9
    for pos in range(new):
        p, stat, dof = chi2_homogeneity_pvalue(ref[:, pos], out[:, pos], model.config.text_config.vocab_size)
        assert p > ALPHA, f"position {pos}: χ²={stat:.1f} (dof {dof}), p={p:.2g}"


def test_other_stateful_layer_kinds_are_refused_before_any_work(model):
    """Only Gated DeltaNet layers are replayed: a draft declaring another stateful layer type is refused."""
    draft = testing.random_text_draft(model)
    draft.config.layer_types = ["conv", "full_attention"]
    with pytest.raises(SpecMMError, match="cannot roll back the draft.*'conv'"):
        model.generate(**inputs_for(model, 1), assistant_model=draft, max_new_tokens=4)


def test_auto_takes_chains_only_and_equals_plain(model):
    """hf_specmm.Auto on a hybrid target with a hybrid draft: chain rounds only (no trees; no plain steps that the
    draft's linear states would have to follow, but the loop's own last step), output equal to plain generate,
    whatever γ it picks per round."""
    inputs = inputs_for(model, 3)
    ref = plain(model, inputs, max_new_tokens=16, do_sample=False)
    draft = testing.natural_text_draft(model, noise=0.1)
    for call in range(2):  # the first call measures costs (chains only), the second chooses from them
        out = model.generate(**inputs, assistant_model=hf_specmm.Auto(draft), max_new_tokens=16, do_sample=False)
        assert torch.equal(out, ref)
        shapes = hf_specmm.last_stats(model).auto
        assert shapes is not None
        taken = shapes["shapes"]
        assert not any(name.startswith("tree") for name in taken), taken
        # the second call may run as plain generate where the measured costs say no chain pays (timing-dependent)
        assert any(name.startswith("chain") for name in taken) or (call and taken == ["plain generate"]), taken
