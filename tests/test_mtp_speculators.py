"""Our speculators ``mtp`` export read by the ``speculators`` package's own classes (CI installs it, without its heavy
dependencies, in the transformers 5.17 leg): its ``MTPDraftModel`` loads the export and computes, step by step, the
logits our MTP layer computes on the same target hidden states (fp32)."""

from __future__ import annotations

import pytest
import torch

from hf_specmm import testing

try:
    from speculators.models.mtp import MTPDraftModel
except Exception as err:  # noqa: BLE001 - any import failure means: not installed here
    pytest.skip(f"the speculators package is not importable here ({type(err).__name__}: {err}); CI installs it "
                "in the transformers 5.17 leg (scripts/test.sh)", allow_module_level=True)

if not testing.HYBRID_FAMILIES:
    pytest.skip("this transformers has no Qwen3.5", allow_module_level=True)


def test_speculators_loads_our_export_and_computes_the_same(tmp_path):
    from hf_specmm.drafts.mtp import MtpDraft

    target = testing.tiny_target("qwen3_5")
    target.save_pretrained(tmp_path / "target")  # the verifier speculators reads the embedding and LM head from
    draft = MtpDraft.for_target(target, target_name=str(tmp_path / "target"))
    with torch.no_grad():  # non-trivial weights and norms
        gen = torch.Generator().manual_seed(0)
        for p in draft.parameters():
            p.add_((0.3 if p.dim() == 1 else 0.05) * torch.randn(p.shape, generator=gen))
    draft.save_pretrained(tmp_path / "spec", format="speculators")
    theirs = MTPDraftModel.from_pretrained(tmp_path / "spec").float().eval()
    ids = torch.randint(3, 90, (1, 14), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden = target.model.language_model(input_ids=ids).last_hidden_state
        logits, _, _ = theirs(input_ids=ids, hidden_states=hidden)
        steps, valid = len(logits), logits[0].shape[1]
        assert steps == 3
        positions = torch.arange(valid).view(1, 1, -1).expand(3, 1, -1)  # a pair at its hidden state's position
        feature = hidden[:, :valid]
        for step in range(steps):
            out = draft(features=feature, input_ids=ids[:, step + 1: step + 1 + valid], position_ids=positions)
            ours = draft.lm_logits(out.hidden_states)
            torch.testing.assert_close(ours, logits[step], rtol=1e-4, atol=1e-4)
            feature = out.hidden_states
    # and back: what speculators' own class saves is read as the same layer
    import hf_specmm

    theirs.save_pretrained(tmp_path / "theirs")
    back = hf_specmm.load_draft(str(tmp_path / "theirs"), target=target)
    assert isinstance(back, MtpDraft)
    for name, tensor in draft.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
