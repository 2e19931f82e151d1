"""Our ``speculators`` export read by the ``speculators`` package's own classes (CI installs it, without its
heavy dependencies, in the transformers 5.17 leg; it pins transformers <= 5.19): same tensors, and its
modules compute what our head computes on the same inputs (fp32, atol 1e-5)."""

from __future__ import annotations

import pytest
import torch

from conftest import target

try:
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
except Exception as err:  # noqa: BLE001 - any import failure means: not installed here
    pytest.skip(f"the speculators package is not importable here ({type(err).__name__}: {err}); CI installs it "
                "in the transformers 5.17 leg (scripts/test.sh)", allow_module_level=True)


@pytest.mark.parametrize("layers", [1, 2])
def test_speculators_loads_our_export_and_computes_the_same(tmp_path, layers):
    model = target("llava")
    torch.manual_seed(0)
    import hf_specmm

    model.save_pretrained(tmp_path / "target")  # the verifier speculators reads the token embedding from
    head = hf_specmm.FeatureHeadDraft.for_target(model, num_layers=layers, variant="eagle3", draft_vocab_size=40,
                                                 target_name=str(tmp_path / "target"))
    counts = torch.arange(head.t2d.numel(), dtype=torch.float) % 7
    head.select_draft_vocab(counts)
    with torch.no_grad():  # non-trivial norms
        for p in head.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    head.save_pretrained(tmp_path / "spec", format="speculators")
    config = Eagle3SpeculatorConfig.from_pretrained(tmp_path / "spec")
    config.transformer_layer_config._attn_implementation = "sdpa"
    theirs = Eagle3DraftModel.from_pretrained(tmp_path / "spec", config=config).eval()
    assert theirs.config.eagle_aux_hidden_state_layer_ids == head.config.aux_layers
    assert torch.equal(theirs.d2t, head.d2t) and torch.equal(theirs.t2d, head.t2d)
    with torch.no_grad():
        # speculators fills embed_tokens from the verifier when it trains (load_verifier_weights), not on load
        theirs.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
        ids = torch.randint(0, 60, (1, 9))
        features = torch.randn(1, 9, 3 * head.fc.out_features)
        positions = torch.arange(9)[None]
        ours = head(features=features, input_ids=ids, position_ids=positions).hidden_states
        hidden = torch.cat([theirs.embed_tokens(ids), theirs.fc(features)], -1)
        rope = theirs.rotary_emb(hidden, positions)
        for layer in theirs.layers:
            hidden = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=rope)
        assert torch.allclose(hidden, ours, atol=1e-5), (hidden - ours).abs().max()
        their_logits = theirs.lm_head(theirs.norm(hidden))
        assert torch.allclose(their_logits, head.draft_logits(ours), atol=1e-5)
        # the draft ids map to the same target ids: speculators' d2t offsets
        assert torch.equal(their_logits.argmax(-1) + theirs.d2t[their_logits.argmax(-1)], head.lm_logits(ours).argmax(-1))


@pytest.mark.parametrize("flags", [(True, False, False), (False, True, False), (False, False, True), (False, True, True)])
def test_speculators_builds_the_norm_options_of_our_export_and_computes_the_same(tmp_path, flags):
    """``norm_before_fc`` / ``fc_norm`` / ``norm_output``: speculators' own class builds ``input_norm`` /
    ``fc_norm`` from our config.json, loads our tensors into them, and its forward's steps give our outputs."""
    from hf_specmm.drafts.feature_head.eagle3 import Eagle3FeatureHead

    model = target("llava")
    model.save_pretrained(tmp_path / "target")
    torch.manual_seed(0)
    before, per_layer, output = flags
    head = Eagle3FeatureHead.for_target(model, draft_vocab_size=40, target_name=str(tmp_path / "target"),
                                        norm_before_fc=before, fc_norm=per_layer, norm_output=output)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    head.save_pretrained(tmp_path / "spec", format="speculators")
    config = Eagle3SpeculatorConfig.from_pretrained(tmp_path / "spec")
    config.transformer_layer_config._attn_implementation = "sdpa"
    theirs = Eagle3DraftModel.from_pretrained(tmp_path / "spec", config=config).eval()
    assert (theirs.input_norm is not None, theirs.fc_norm is not None, theirs.config.norm_output) == flags
    if before:
        assert torch.equal(theirs.input_norm.weight, head.input_norm.weight)
    if per_layer:
        assert all(torch.equal(a.weight, b.weight) for a, b in zip(theirs.fc_norm, head.fc_norm))
    with torch.no_grad():
        theirs.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
        ids, features, positions = torch.randint(0, 60, (1, 9)), torch.randn(1, 9, 3 * head.fc.out_features), torch.arange(9)[None]
        ours = head(features=features, input_ids=ids, position_ids=positions).hidden_states
        fused = features if theirs.input_norm is None else theirs.input_norm(features)
        if theirs.fc_norm is not None:
            fused = torch.cat([norm(part) for norm, part in zip(theirs.fc_norm, fused.chunk(len(theirs.fc_norm), -1))], -1)
        hidden = torch.cat([theirs.embed_tokens(ids), theirs.fc(fused)], -1)
        rope = theirs.rotary_emb(hidden, positions)
        for layer in theirs.layers:
            hidden = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=rope)
        fed = theirs.norm(hidden) if theirs.config.norm_output else hidden  # what its next TTT step reads
        assert torch.allclose(fed, ours, atol=1e-5), (fed - ours).abs().max()
        assert torch.allclose(theirs.lm_head(theirs.norm(hidden)), head.draft_logits(ours), atol=1e-5)
