"""speculators' own ``DFlashDraftModel`` (its classes, its ``save_pretrained``) against the ``dflash`` kind: every flag
of its layout that hf_specmm serves (the embedding output as an auxiliary layer, ``attention_bias``, sliding layers
causal or not inside the block, a reduced draft vocabulary with ``d2t``) is imported, proposes the same block as
speculators' forward on the same features (fp32), keeps greedy parity, and exports back to a checkpoint speculators'
class loads with the same tensors. CI installs speculators (without its heavy dependencies) in the transformers 5.17
leg (scripts/test.sh); elsewhere this module skips."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

pytestmark = pytest.mark.skipif(not hasattr(transformers, "MuseGlimmerAssistantModel"),
                                reason="this transformers has no DFlash drafter class")

try:
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
except Exception as err:  # noqa: BLE001 - any import failure means: not installed here
    pytest.skip(f"the speculators package is not importable here ({type(err).__name__}: {err}); CI installs it "
                "in the transformers 5.17 leg (scripts/test.sh)", allow_module_level=True)

import hf_specmm  # noqa: E402
from conftest import batch_inputs, target  # noqa: E402

BLOCK = 4
FAMILY = "muse_glimmer"  # 3 decoder layers: speculators' aux ids 0 (the embedding output), 1, 2
#: (aux ids, attention_bias, layer types, sliding_window_non_causal, draft vocabulary or None: the target's)
CASES = {
    "embeddings-bias-vocab": ([0, 2], True, ["full_attention", "full_attention"], False, 48),
    "sliding-causal": ([0, 1, 2], False, ["sliding_attention", "full_attention"], False, None),
    "sliding-non-causal-bias": ([1, 2], True, ["sliding_attention", "sliding_attention"], True, None),
}
WINDOW = 4  # shorter than the prompts: the window cuts the context


def speculators_draft(model, aux, bias, layer_types, non_causal, draft_vocab, seed=0):
    """A random ``DFlashDraftModel`` built by speculators' classes for ``model`` (its embedding and, for a full
    vocabulary, its LM head filled in, as speculators' load_verifier_weights does; a reduced one: the ids with the
    largest LM-head norms, in order)."""
    text = model.config.get_text_config()
    layer = transformers.Qwen3Config(
        vocab_size=text.vocab_size, hidden_size=text.hidden_size, intermediate_size=2 * text.hidden_size,
        num_hidden_layers=len(layer_types), num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        attention_bias=bias, layer_types=layer_types, sliding_window=WINDOW, use_sliding_window=True,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6)
    layer._attn_implementation = "sdpa"
    config = DFlashSpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=draft_vocab or text.vocab_size, block_size=BLOCK,
        aux_hidden_state_layer_ids=aux, mask_token_id=5, sliding_window_non_causal=non_causal,
        speculators_config=SpeculatorsConfig(
            algorithm="dflash", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=BLOCK - 1)],
            default_proposal_method="greedy", verifier=VerifierConfig(name_or_path=None, architectures=["Tiny"])))
    torch.manual_seed(seed)
    draft = DFlashDraftModel(config).eval()
    head = model.get_output_embeddings().weight.detach()
    with torch.no_grad():
        for name, p in draft.named_parameters():  # speculators leaves its verifier-owned weights NaN until loaded
            if "lm_head" not in name and "embed_tokens" not in name:
                p.copy_(torch.randn_like(p) * (0.02 if p.dim() > 1 else 0.2) + (1.0 if p.dim() == 1 and "norm" in name
                                                                                     else 0.0))
        draft.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
        if draft_vocab is None:
            draft.lm_head.weight.copy_(head)
        else:
            ids = head.norm(dim=-1).argsort(descending=True)[:draft_vocab].sort().values
            t2d = torch.zeros(text.vocab_size, dtype=torch.bool)
            t2d[ids] = True
            draft.load_vocab_mappings(t2d, ids - torch.arange(draft_vocab))
            draft.lm_head.weight.copy_(torch.randn_like(draft.lm_head.weight) * 0.5)
    return draft


def first_block(model, draft, inputs):
    """(the dflash kind's first-round block logits [1, BLOCK - 1, V], the context features it read [1, P, k·H])."""
    from hf_specmm.drafts.dflash import DFlashDrafter

    seen = {}
    real_prefill, real_block = DFlashDrafter.prefill, DFlashDrafter.block_logits

    def prefill(self, prompt, first_tokens, new_cache):
        seen.setdefault("features", self.prompt_features.clone())
        seen.setdefault("first", first_tokens.clone())
        return real_prefill(self, prompt, first_tokens, new_cache)

    def block_logits(self, anchor):
        logits = real_block(self, anchor)
        seen.setdefault("block", logits.clone())
        return logits

    hf_specmm.enable(model)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(DFlashDrafter, "prefill", prefill)
            patch.setattr(DFlashDrafter, "block_logits", block_logits)
            out = model.generate(**inputs, max_new_tokens=12, do_sample=False, assistant_model=draft,
                                 num_assistant_tokens=BLOCK - 1)
    finally:
        hf_specmm.disable(model)
    return out, seen


def their_block(theirs, features, first_token):
    """speculators' forward with one anchor, at the prompt's end (the first token there), on ``features``."""
    prompt, width = features.shape[1], features.shape[2]
    total = prompt + 1 + BLOCK  # its anchors come from the positions before the last block_size
    hidden = torch.cat([features, features.new_zeros(1, total - prompt, width)], 1)
    ids = torch.zeros(1, total, dtype=torch.long)
    ids[0, prompt] = first_token
    loss_mask = torch.zeros(1, total, dtype=torch.long)
    loss_mask[0, prompt] = 1
    verifier = torch.zeros(1, total, theirs.config.transformer_layer_config.hidden_size)
    with torch.no_grad():
        _, logits, *_ = theirs._backbone_forward(hidden, ids, loss_mask, verifier, torch.zeros(1, total, dtype=torch.long),
                                                 max_anchors=1)
    return logits[:, 1:]  # block positions 1.. (the anchor's own is not a proposal)


@pytest.mark.parametrize("case", sorted(CASES))
def test_speculators_checkpoint_proposes_what_speculators_computes(tmp_path, case):
    aux, bias, layer_types, non_causal, draft_vocab = CASES[case]
    model = target(FAMILY)
    theirs = speculators_draft(model, aux, bias, layer_types, non_causal, draft_vocab)
    theirs.save_pretrained(tmp_path / "theirs")
    ours = hf_specmm.load_draft(tmp_path / "theirs", target=model)
    assert list(ours.config.target_layer_ids) == [i - 1 for i in aux]
    inputs = batch_inputs(FAMILY, 1, with_images=False)
    plain = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    out, seen = first_block(model, ours, inputs)
    assert torch.equal(out, plain)
    with torch.no_grad():  # the context is what speculators reads: hidden_states[aux]
        states = model(**inputs, output_hidden_states=True).hidden_states
    assert torch.allclose(seen["features"], torch.cat([states[i] for i in aux], -1), atol=1e-5)
    assert seen["features"].shape[1] > WINDOW + 2
    expected = their_block(theirs, seen["features"], int(seen["first"][0]))
    if draft_vocab is not None:  # ours are target-vocabulary logits: the draft ids at d + d2t[d], -inf elsewhere
        full = expected.new_full((*expected.shape[:-1], model.config.get_text_config().vocab_size), float("-inf"))
        expected = full.index_copy(-1, torch.arange(draft_vocab) + theirs.d2t, expected)
    got = seen["block"]
    finite = torch.isfinite(got)
    assert finite.any(-1).all() and bool((finite <= torch.isfinite(expected)).all())  # ours only masks ids out
    assert torch.allclose(got[finite], expected[finite], atol=1e-4), (got[finite] - expected[finite]).abs().max()
    assert torch.equal(got.argmax(-1), expected.masked_fill(~finite, float("-inf")).argmax(-1))


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_loads_in_speculators_with_the_same_tensors(tmp_path, case):
    from safetensors.torch import load_file

    from hf_specmm.drafts.dflash import save_speculators_dflash

    aux, bias, layer_types, non_causal, draft_vocab = CASES[case]
    model = target(FAMILY)
    theirs = speculators_draft(model, aux, bias, layer_types, non_causal, draft_vocab, seed=1)
    theirs.save_pretrained(tmp_path / "theirs")
    ours = hf_specmm.load_draft(tmp_path / "theirs", target=model)
    model.save_pretrained(tmp_path / "target")  # the verifier speculators reads its embedding (and full head) from
    folder = save_speculators_dflash(ours, tmp_path / "ours", model, verifier=str(tmp_path / "target"))
    config = json.loads((folder / "config.json").read_text())
    assert config["aux_hidden_state_layer_ids"] == aux
    assert config["transformer_layer_config"]["attention_bias"] == bias
    assert config["sliding_window_non_causal"] == (non_causal if "sliding_attention" in layer_types else True)
    assert config["draft_vocab_size"] == (draft_vocab or model.config.get_text_config().vocab_size)
    again = DFlashDraftModel.from_pretrained(folder, config=DFlashSpeculatorConfig.from_pretrained(folder)).eval()
    written = load_file(folder / "model.safetensors")
    mine, original = again.state_dict(), theirs.state_dict()
    for key, tensor in written.items():
        assert torch.equal(mine[key], tensor), key
        assert torch.equal(original[key], tensor), key
    reread = hf_specmm.load_draft(folder, target=model)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), reread.state_dict().values()))


def test_saved_natively_and_loaded_back(tmp_path):
    """A drafter with speculators' biases and reduced vocabulary saves with ``save_pretrained`` and loads back with
    ``hf_specmm.load_draft`` (strict), proposing the same."""
    model = target(FAMILY)
    theirs = speculators_draft(model, *CASES["embeddings-bias-vocab"])
    theirs.save_pretrained(tmp_path / "theirs")
    ours = hf_specmm.load_draft(tmp_path / "theirs", target=model)
    ours.save_pretrained(tmp_path / "native")
    back = hf_specmm.load_draft(tmp_path / "native", target=model)
    assert type(back) is type(ours)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), back.state_dict().values()))
    inputs = batch_inputs(FAMILY, 1, with_images=False)
    assert torch.equal(first_block(model, back, inputs)[1]["block"], first_block(model, ours, inputs)[1]["block"])


def test_training_refuses_what_its_loss_does_not_reproduce(tmp_path):
    """hf-specmm train's DFlash loss uses transformers' masks and the target's LM head: a drafter with speculators'
    window, causal sliding layers or a reduced vocabulary is refused by the kind's training view (before any
    forward); one with only biases and the embedding output as a layer trains."""
    from hf_specmm.drafts.registry import get_kind
    from hf_specmm.errors import IncompatibleDraftError

    model = target(FAMILY)
    kind = get_kind("dflash")
    for case, match in (("embeddings-bias-vocab", "draft_vocab_size=48"), ("sliding-causal", "window_from_anchor")):
        theirs = speculators_draft(model, *CASES[case])
        theirs.save_pretrained(tmp_path / case)
        with pytest.raises(IncompatibleDraftError, match=match):
            kind.training_view(hf_specmm.load_draft(tmp_path / case, target=model), None, 1)
    aux, bias, _, _, _ = CASES["embeddings-bias-vocab"]
    theirs = speculators_draft(model, aux, bias, ["full_attention"], False, None)
    theirs.save_pretrained(tmp_path / "trainable")
    assert kind.training_view(hf_specmm.load_draft(tmp_path / "trainable", target=model), None, 1) is not None
