"""The ``feature_head`` draft kind (EAGLE-1 style head on the target's last hidden states): greedy parity
for every family × batch × γ, an exact copy of the target accepted 100 %, a perturbed copy accepted in
part (rollback with rows at different offsets), the wrong target refused before any forward, strict
save / load with its card, and training that raises held-out τ."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

import hf_specmm
from hf_specmm import IncompatibleDraftError, testing
from conftest import batch_inputs, target, skip_refused
from test_train import base_config, count_forwards, image_task, mixed_data, target_dir  # noqa: F401 - pytest fixtures

HEADS = ("random", "exact", "noisy")


def head(family: str, kind: str):
    model = target(family)
    if kind == "random":
        torch.manual_seed(1)
        return hf_specmm.FeatureHeadDraft.for_target(model)
    return testing.feature_head_from_target(model, noise=testing.fixture(family).head_noise if kind == "noisy" else 0.0)


@pytest.mark.parametrize("family", testing.FAMILIES)
@pytest.mark.parametrize("batch", (1, 3))
@pytest.mark.parametrize("kind", HEADS)
def test_greedy_parity(family, batch, kind):
    skip_refused(family, "feature_head")
    model = target(family)
    inputs = batch_inputs(family, batch)
    hf_specmm.disable(model)
    plain = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    draft = head(family, kind)
    hf_specmm.enable(model)
    try:
        accepted = []
        for gamma in range(1, 9):
            out = model.generate(**inputs, max_new_tokens=24, do_sample=False, assistant_model=draft,
                                 num_assistant_tokens=gamma)
            assert torch.equal(out, plain), f"{family} γ={gamma} batch={batch} {kind}:\n{out}\n!=\n{plain}"
            stats = hf_specmm.last_stats(model)
            assert stats.batch_size == batch and stats.drafted_tokens > 0
            # counted forwards: the prefill, then one target row-forward per live row per round
            assert stats.target_forwards == batch + sum(1 for r in stats.tokens_per_round for k in r if k)
            assert stats.generated_tokens == sum(map(sum, stats.tokens_per_round)) + batch
            accepted.append(stats.acceptance_rate)
            # the head IS the target: every draft accepted, every round γ + 1 tokens (Gemma 3 attends both ways
            # inside an image at prefill, which a causal head cannot reproduce; a Gemma 4 head leaves out the
            # per-layer inputs and KV sharing, testing.feature_head_is_exact: lossless, not 100 %)
            if kind == "exact" and family != "gemma3" and testing.feature_head_is_exact(model):
                assert stats.acceptance_rate == 1.0, (gamma, stats)
                # per row: every live round but its last (cut by max_new_tokens or its EOS) keeps γ + 1 tokens
                for per_row in zip(*stats.tokens_per_round):
                    live = [k for k in per_row if k]
                    assert all(k == gamma + 1 for k in live[:-1]), stats.tokens_per_round
        if kind == "noisy":  # partial acceptance: rollbacks, rows at different offsets (acceptance falls with γ:
            # deeper drafts read the head's own predicted features; Qwen2-VL at batch 3, γ = 8: 0.19)
            assert 0.1 < min(accepted) and max(accepted) < 0.95, accepted
    finally:
        hf_specmm.disable(model)


def test_wrong_target_is_refused_before_any_forward():
    model, other = target("llava"), testing.tiny_target("llava", seed=1)
    draft = hf_specmm.FeatureHeadDraft.for_target(other, target_name="org/other-llava")
    inputs = batch_inputs("llava", 1)
    hf_specmm.enable(model)
    try:
        with count_forwards() as calls, pytest.raises(IncompatibleDraftError, match="made for org/other-llava"):
            model.generate(**inputs, max_new_tokens=4, assistant_model=draft)
        assert calls["n"] == 0
        # another family (other width / vocabulary) is refused the same way
        other_family = hf_specmm.FeatureHeadDraft.for_target(target("llava_onevision"))  # built (forwards) first
        with count_forwards() as calls, pytest.raises(IncompatibleDraftError):
            model.generate(**inputs, max_new_tokens=4, assistant_model=other_family)
        assert calls["n"] == 0
    finally:
        hf_specmm.disable(model)


def test_save_load_round_trip_is_strict_and_stores_no_target_weights(tmp_path):
    model = target("llava_next")
    draft = testing.feature_head_from_target(model, noise=0.05)
    hf_specmm.annotate_draft(draft, target="org/tiny-llava-next", results={"caption": {"gamma": 5,
                             "block_efficiency": 2.5, "acceptance_rate": 0.6}})
    draft.save_pretrained(tmp_path / "head")
    with safe_open(str(tmp_path / "head" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert keys == set(draft.state_dict()) and not any("embed" in k or "lm_head" in k for k in keys), keys
    assert sum(p.numel() for p in draft.parameters()) < sum(p.numel() for p in model.parameters())
    card = (tmp_path / "head" / "README.md").read_text()
    assert "feature-head" in card and "base_model: org/tiny-llava-next" in card and "| feature head |" in card
    assert "uses that target's token embedding and LM head" in card
    loaded = hf_specmm.load_draft(tmp_path / "head")
    assert type(loaded) is hf_specmm.FeatureHeadDraft and hf_specmm.kind_of(loaded).name == "feature_head"
    for k, v in draft.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    from transformers import AutoModelForCausalLM

    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "head")) is hf_specmm.FeatureHeadDraft
    inputs = batch_inputs("llava_next", 3)
    hf_specmm.enable(model)
    try:
        outs = [model.generate(**inputs, max_new_tokens=12, assistant_model=d) for d in (draft, loaded)]
        assert torch.equal(outs[0], outs[1])
    finally:
        hf_specmm.disable(model)
    # a tampered checkpoint (a weight missing) is an error, not a partly random head
    from safetensors.torch import load_file, save_file

    state = load_file(tmp_path / "head" / "model.safetensors")
    state.pop("fc.bias")
    save_file(state, tmp_path / "head" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(hf_specmm.SpecMMError, match="fc.bias"):
        hf_specmm.load_draft(tmp_path / "head")


def test_training_raises_heldout_tau(target_dir, image_task):  # noqa: F811
    """Two stages of EAGLE's loss on the tiny target's answers: the held-out acceptance rises clearly
    above the untrained head's (which accepts almost nothing) and the loss falls."""
    from hf_specmm.train import train_draft

    root, train, heldout, classes = image_task
    result = train_draft(base_config(target_dir, root, output_dir=str(root / "head"), draft_kind="feature_head",
                                     data=train, eval_data=heldout, steps=60, stage2_steps=60, lr=3e-3,
                                     token_loss_weight=1.0))
    before, after = result.tau_before, result.tau_after
    print(f"feature head: τ {before['block_efficiency']:.3f} -> {after['block_efficiency']:.3f}, acceptance "
          f"{before['acceptance_rate']:.3f} -> {after['acceptance_rate']:.3f}; losses {result.losses[:3]} ... "
          f"{result.losses[-3:]}")
    assert isinstance(result.draft, hf_specmm.FeatureHeadDraft) and result.global_step == 120
    assert after["acceptance_rate"] >= before["acceptance_rate"] + 0.3, (before, after)
    assert after["block_efficiency"] >= before["block_efficiency"] + 0.8, (before, after)
    assert sum(result.losses[-5:]) < 0.5 * sum(result.losses[:5])
    loaded = hf_specmm.load_draft(result.draft_dir)
    meta = hf_specmm.draft_metadata(loaded)
    assert meta["draft_kind"] == "feature_head" and meta["results"]["held-out eval"]["block_efficiency"] == \
        after["block_efficiency"]
    summary = json.loads((root / "head" / "train_summary.json").read_text())
    assert summary["draft_kind"] == "feature_head"


def test_resume_mid_stage_2_gives_the_same_head(target_dir, mixed_data):  # noqa: F811
    """Checkpoints and resume as for the other kinds: 2N straight steps == N steps + resume + N steps, with the
    kind's own loss and loss weights (a changed weight is a different run: refused on resume)."""
    from hf_specmm.train import TrainingInputError, train_draft

    root, data = mixed_data
    kw = dict(data=data, draft_kind="feature_head", steps=2, stage2_steps=2, batch_size=4, checkpoint_every=1,
              eval_fraction=0.25, eval_before=False, token_loss_weight=0.5, response_cache=str(root / "head.jsonl"))
    straight = train_draft(base_config(target_dir, root, output_dir=str(root / "head-straight"), **kw))
    first = train_draft(base_config(target_dir, root, output_dir=str(root / "head-split"), stop_at_step=3, **kw))
    assert not first.completed and first.global_step == 3
    torch.manual_seed(1234)
    second = train_draft(base_config(target_dir, root, output_dir=str(root / "head-split"), resume="latest", **kw))
    assert second.completed and second.global_step == 4 and straight.losses[3:] == second.losses
    a, b = dict(straight.draft.named_parameters()), dict(second.draft.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(TrainingInputError, match="token_loss_weight"):
        train_draft(base_config(target_dir, root, output_dir=str(root / "head-split"), resume="latest",
                                **{**kw, "token_loss_weight": 0.1}))
