"""The ``eagle3`` variant of the feature head: greedy parity for every family × batch 1/3 × γ (a random head
and a head that agrees in part: rollbacks at different offsets per row), speculative sampling equal in
distribution (χ²), the draft vocabulary (d2t / t2d) mapping, the wrong target refused before any forward,
features captured from the target's own forwards only, and a strict save / load round trip."""

from __future__ import annotations

import pytest
import torch

import hf_specmm
from hf_specmm import IncompatibleDraftError, testing
from conftest import batch_inputs, target, skip_refused
from eagle3_fixtures import lagged_head
from test_sampling import assert_sampling_matches_plain
from test_train import count_forwards


def random_head(model, draft_vocab_size=None):
    torch.manual_seed(1)
    return hf_specmm.FeatureHeadDraft.for_target(model, variant="eagle3", draft_vocab_size=draft_vocab_size)


@pytest.mark.parametrize("family", testing.FAMILIES)
@pytest.mark.parametrize("batch", (1, 3))
def test_greedy_parity(family, batch):
    skip_refused(family, "eagle3")
    model = target(family)
    inputs = batch_inputs(family, batch)
    hf_specmm.disable(model)
    plain = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    vocab = model.get_input_embeddings().weight.shape[0]
    heads = {"random": random_head(model), "lagged": lagged_head(model), "small-vocab": lagged_head(model, vocab // 2)}
    hf_specmm.enable(model)
    try:
        accepted = {}
        for name, head in heads.items():
            assert hf_specmm.kind_of(head).name == "eagle3"
            for gamma in (1, 3, 6):
                out = model.generate(**inputs, max_new_tokens=20, do_sample=False, assistant_model=head,
                                     num_assistant_tokens=gamma)
                assert torch.equal(out, plain), f"{family} {name} γ={gamma} batch={batch}:\n{out}\n!=\n{plain}"
                stats = hf_specmm.last_stats(model)
                assert stats.batch_size == batch and stats.drafted_tokens > 0
                assert stats.target_forwards == batch + sum(1 for r in stats.tokens_per_round for k in r if k)
                accepted[name, gamma] = stats.acceptance_rate
        print(family, batch, accepted)
    finally:
        hf_specmm.disable(model)


def test_draft_vocabulary_maps_to_target_ids():
    model = target("llava")
    head = random_head(model, draft_vocab_size=5)
    counts = torch.zeros(head.t2d.numel())
    counts[[7, 3, 40, 11, 9, 2]] = torch.tensor([5.0, 9.0, 1.0, 5.0, 2.0, 0.5])
    chosen = head.select_draft_vocab(counts)  # the 5 most frequent; the tie 7 / 11 kept both, 2 dropped
    assert chosen.tolist() == [3, 7, 9, 11, 40]
    assert head.draft_ids.tolist() == [3, 7, 9, 11, 40] and head.d2t.tolist() == [3, 6, 7, 8, 36]
    assert head.t2d.nonzero().squeeze(-1).tolist() == [3, 7, 9, 11, 40]
    hidden = torch.randn(2, head.fc.out_features)
    small, full = head.draft_logits(hidden), head.lm_logits(hidden)
    assert torch.equal(full[:, head.draft_ids], small) and torch.isinf(full[:, ~head.t2d]).all()
    # drafting proposes draft-vocabulary ids only
    inputs = batch_inputs("llava", 3)
    hf_specmm.enable(model)
    try:
        seen = []
        drafter_cls = hf_specmm.kind_of(head).drafter
        original = drafter_cls.propose

        def spy(self, budget, select, cur):
            proposal = original(self, budget, select, cur)
            seen.append(proposal.tokens)
            return proposal

        drafter_cls.propose = spy
        try:
            model.generate(**inputs, max_new_tokens=8, assistant_model=head, num_assistant_tokens=3)
        finally:
            drafter_cls.propose = original
        assert seen and all(bool(head.t2d[t].all()) for t in seen)
    finally:
        hf_specmm.disable(model)
    with pytest.raises(ValueError, match="5 distinct ids"):
        head.set_draft_vocab(torch.tensor([1, 2, 2, 3, 4]))


def test_features_come_from_the_target_forwards_only():
    """One target forward per round (the hooks add none) and the captured features are the inputs of the
    head's aux layers: the same tensors ``output_hidden_states`` would give."""
    model = target("qwen2_5_vl")
    head = lagged_head(model)
    inputs = batch_inputs("qwen2_5_vl", 2)
    drafter = hf_specmm.kind_of(head).drafter(head, None)
    with drafter.watch(model), torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    embeds, features = drafter.captured
    depth = model.config.get_text_config().num_hidden_layers
    assert head.config.aux_layers[-1] == depth  # index L: the last layer's output, before the final norm
    chunks = features.chunk(3, -1)
    for k, chunk in zip(head.config.aux_layers[:-1], chunks):
        assert torch.equal(chunk, out.hidden_states[k])
    assert torch.allclose(model.get_decoder().norm(chunks[-1]), out.hidden_states[depth], atol=1e-6)
    assert torch.equal(embeds, out.hidden_states[0])
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    hf_specmm.enable(model)
    try:
        model.generate(**inputs, max_new_tokens=10, do_sample=False, assistant_model=head, num_assistant_tokens=4)
        stats = hf_specmm.last_stats(model)
        assert len(calls) == 1 + len(stats.tokens_per_round), (len(calls), stats.tokens_per_round)
    finally:
        hf_specmm.disable(model)
        handle.remove()


def test_wrong_target_is_refused_before_any_forward():
    model = target("llava")
    inputs = batch_inputs("llava", 1)
    deeper = hf_specmm.FeatureHeadDraft.for_target(model, variant="eagle3")
    deeper.config.target_fingerprint, deeper.config.aux_layers, deeper.config.target_num_layers = None, [2, 5, 9], 12
    heads = {"made for org/other": hf_specmm.FeatureHeadDraft.for_target(
                 testing.tiny_target("llava", seed=1), variant="eagle3", target_name="org/other"),
             "target has 2 decoder layers .*layers \\[2, 5, 9\\] of a 12-layer target": deeper}
    hf_specmm.enable(model)
    try:
        for match, head in heads.items():
            with count_forwards() as calls, pytest.raises(IncompatibleDraftError, match=match):
                model.generate(**inputs, max_new_tokens=4, assistant_model=head)
            assert calls["n"] == 0
    finally:
        hf_specmm.disable(model)
    with pytest.raises(ValueError, match="aux_layers"):
        hf_specmm.FeatureHeadDraft.for_target(model, variant="eagle3", aux_layers=[0, 1, 9])
    with pytest.raises(ValueError, match="draft_vocab_size"):
        hf_specmm.FeatureHeadDraft.for_target(model, variant="eagle3", draft_vocab_size=10 ** 7)


def test_save_load_round_trip(tmp_path):
    model = target("qwen2_vl")
    head = lagged_head(model, draft_vocab_size=100)
    head.save_pretrained(tmp_path / "head")
    card = (tmp_path / "head" / "README.md").read_text()
    assert "EAGLE-3 feature-head" in card and "| EAGLE-3 head |" in card
    loaded = hf_specmm.load_draft(tmp_path / "head")
    assert type(loaded) is type(head) and loaded.config.aux_layers == head.config.aux_layers
    state = head.state_dict()
    assert set(loaded.state_dict()) == set(state) and not any("embed" in k for k in state)
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in state.items())
    inputs = batch_inputs("qwen2_vl", 3)
    hf_specmm.enable(model)
    try:
        outs = [model.generate(**inputs, max_new_tokens=12, assistant_model=d, num_assistant_tokens=3) for d in (head, loaded)]
        assert torch.equal(outs[0], outs[1])
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])
def test_speculative_sampling_matches_plain(family):
    model = testing.tiny_target(family, seed=0, eos_bias=-30.0)
    assert_sampling_matches_plain(model, family, lagged_head(model), "eagle3")
