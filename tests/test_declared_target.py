"""``load_draft(path, target=model)`` compares what a draft checkpoint declares (its config.json, its weight files'
headers) with the target before any tensor of the draft is allocated: for every draft kind that takes a target, a
checkpoint made for another target is refused as a DraftLoadError naming the file, the config field and both values,
and transformers' ``from_pretrained`` (where weights are allocated and read) is never reached. The same rule
refuses the same draft at ``generate`` when it was loaded without a target."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
import transformers

import hf_specmm
from hf_specmm import IncompatibleDraftError, _compat, testing
from hf_specmm.errors import DraftLoadError, DraftTargetError

from conftest import batch_inputs, target


class Allocated(Exception):
    """Raised where transformers would allocate and read the draft's weights."""


@pytest.fixture
def no_allocation(monkeypatch):
    """``PreTrainedModel.from_pretrained`` (every class load_draft loads through ends there) raises
    :class:`Allocated`; the meta-device layout of the checkpoint (``cls(config)`` under ``torch.device("meta")``)
    is not affected."""
    def refuse(cls, *args, **kwargs):
        raise Allocated(cls.__name__)

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))


def _text_only(tmp_path):
    """A causal LM of 100 ids: it does not cover the 124 text ids of the LLaVA target."""
    model = target("llava")
    testing.random_text_draft(model, vocab_size=100).save_pretrained(tmp_path)
    return model, ["vocab_size", "100", "128"]


def _image_adapter(tmp_path):
    """An adapter made for a LLaVA target of 256 ids (its image placeholder id is another one)."""
    wide = testing.tiny_target("llava", vocab_size=256)
    lm = testing.random_text_draft(wide)
    hf_specmm.ImageAdapterDraft.for_target(wide, lm).save_pretrained(tmp_path)
    model = target("llava")
    ours, theirs = wide.config.image_token_id, model.config.image_token_id
    assert ours != theirs
    return model, ["image_token_id", str(ours), str(theirs)]


def _vlm(tmp_path):
    """A LLaVA model of 256 ids as the draft of a LLaVA target of 128: other placeholder ids."""
    testing.tiny_target("llava", vocab_size=256).save_pretrained(tmp_path)
    return target("llava"), ["placeholder ids", "[252]", "[124]"]


def _feature_head(tmp_path):
    """An EAGLE-1 head made for a target of 256 ids: the embedding its fingerprint records is [256, 64]."""
    hf_specmm.FeatureHeadDraft.for_target(testing.tiny_target("llava", vocab_size=256)).save_pretrained(tmp_path)
    return target("llava"), ["target_fingerprint", "[128, ", "[256, "]


def _eagle3(tmp_path):
    """An EAGLE-3 head made for a target of 256 ids."""
    wide = testing.tiny_target("llava", vocab_size=256)
    hf_specmm.FeatureHeadDraft.for_target(wide, variant="eagle3", aux_layers=[0, 1, 2]).save_pretrained(tmp_path)
    return target("llava"), ["layer_config.vocab_size", "256", "128"]


def _dflash(tmp_path):
    """A DFlash drafter reading layers [0, 2] of a three-layer target, for a two-layer one."""
    from hf_specmm.drafts.dflash import dflash_draft_for

    dflash_draft_for(target("muse_glimmer"), block_size=4, target_layer_ids=[0, 2]).save_pretrained(tmp_path)
    model = target("llava")
    assert model.config.get_text_config().num_hidden_layers == 2
    return model, ["target_layer_ids", "[0, 2]", "2 decoder layers"]


def _mtp(tmp_path):
    """An MTP layer (saved in hf_specmm's layout) made for a target of 256 ids."""
    testing.mtp_from_target(testing.tiny_target("llava", vocab_size=256)).save_pretrained(tmp_path)
    return target("llava"), ["target_fingerprint", "[128, ", "[256, "]


def _gemma4_assistant(tmp_path):
    """A Gemma 4 assistant whose own vocabulary is twice its target's (its headers say so too)."""
    if not _compat.GEMMA4_SUPPORTED:
        pytest.skip("Gemma 4 assistants need transformers >= 5.24")
    from hf_specmm.drafts.gemma4_assistant import tiny_assistant

    model = target("gemma4")
    made = tiny_assistant(model)
    config = copy.deepcopy(made.config)
    vocab = model.config.get_text_config().vocab_size
    config.text_config.vocab_size = 2 * vocab
    type(made)._from_config(config).save_pretrained(tmp_path)
    return model, ["text_config.vocab_size", str(2 * vocab), str(vocab)]


CASES = {"text_only": _text_only, "image_adapter": _image_adapter, "vlm": _vlm, "feature_head": _feature_head,
         "eagle3": _eagle3, "dflash": _dflash, "mtp": _mtp, "gemma4_assistant": _gemma4_assistant}


@pytest.mark.parametrize("kind", CASES)
def test_a_draft_for_another_target_is_refused_before_any_tensor_is_allocated(tmp_path, no_allocation, kind):
    folder = tmp_path / kind
    model, named = CASES[kind](folder)
    with pytest.raises(Allocated):  # the sentinel holds: without a target the load reaches from_pretrained
        hf_specmm.load_draft(folder)
    with pytest.raises(DraftLoadError) as info:
        hf_specmm.load_draft(folder, target=model)
    message = str(info.value)
    assert isinstance(info.value, DraftTargetError) and isinstance(info.value, IncompatibleDraftError)
    for needle in [str(folder / "config.json"), *named, "before any of its tensors was allocated"]:
        assert needle in message, (needle, message)


@pytest.mark.parametrize("kind", ["text_only", "vlm", "dflash", "eagle3"])
def test_generate_applies_the_same_rule_to_a_draft_loaded_without_a_target(tmp_path, kind):
    """One rule for both: the draft loaded without a target is refused by ``generate`` with the load's reason."""
    folder = tmp_path / kind
    model, named = CASES[kind](folder)
    with pytest.raises(DraftLoadError) as at_load:
        hf_specmm.load_draft(folder, target=model)
    draft = hf_specmm.load_draft(folder)
    hf_specmm.enable(model)
    try:
        with pytest.raises(IncompatibleDraftError) as at_generate:
            model.generate(**batch_inputs("llava", 1), assistant_model=draft, max_new_tokens=2)
    finally:
        hf_specmm.disable(model)
    assert not isinstance(at_generate.value, DraftLoadError)
    reason = str(at_generate.value)
    assert reason in str(at_load.value)
    for needle in named:
        assert needle in reason, (needle, reason)


def test_a_matching_draft_still_loads_and_is_checked_once_loaded(tmp_path):
    """The draft made for the target loads (the pre-allocation check lets it through); a loaded EAGLE-3 head's
    vocabulary maps are checked on their values."""
    model = target("llava")
    hf_specmm.FeatureHeadDraft.for_target(model, variant="eagle3", aux_layers=[0, 1, 2],
                                          draft_vocab_size=24).save_pretrained(tmp_path / "head")
    head = hf_specmm.load_draft(tmp_path / "head", target=model)
    assert hf_specmm.kind_of(head).name == "eagle3" and not head.d2t.is_meta
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "head" / "model.safetensors"))
    tensors["d2t"] = torch.full_like(tensors["d2t"], 10_000)  # maps draft ids past the target's vocabulary
    save_file(tensors, str(tmp_path / "head" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(DraftLoadError, match=re.escape("d2t maps draft ids to target ids")):
        hf_specmm.load_draft(tmp_path / "head", target=model)


def test_imported_layouts_are_checked_against_the_target_before_their_weights_are_read(tmp_path, monkeypatch):
    """speculators' DFlash and EAGLE-3 layouts (read by hf_specmm's importers, not from_pretrained): refused as a
    DraftTargetError naming the folder's config.json, before a weight is read."""
    from hf_specmm.drafts.dflash import dflash_draft_for, formats, save_speculators_dflash

    glimmer = target("muse_glimmer")
    dflash = save_speculators_dflash(dflash_draft_for(glimmer, block_size=4, target_layer_ids=[0, 1]),
                                     tmp_path / "dflash", glimmer, verifier="org/tiny-muse-glimmer")
    wide = testing.tiny_target("llava", vocab_size=256)
    eagle3 = tmp_path / "eagle3"
    hf_specmm.FeatureHeadDraft.for_target(wide, variant="eagle3", aux_layers=[0, 1, 2]).save_pretrained(
        eagle3, format="speculators")

    def read(*args, **kwargs):
        raise Allocated("load_file")

    monkeypatch.setattr(formats, "load_file", read)
    with pytest.raises(Allocated):  # the sentinel holds: its own target passes the check
        hf_specmm.load_draft(dflash, target=glimmer)
    config = json.loads((dflash / "config.json").read_text())
    (dflash / "config.json").write_text(json.dumps({**config, "mask_token_id": 10_000}))  # past the target's table
    for folder, needle in ((dflash, "mask_token_id (10000)"), (eagle3, "target vocabulary of 256 ids")):
        with pytest.raises(DraftTargetError) as info:
            hf_specmm.load_draft(folder, target=glimmer if folder == dflash else target("llava"))
        assert str(folder / "config.json") in str(info.value) and needle in str(info.value), str(info.value)
