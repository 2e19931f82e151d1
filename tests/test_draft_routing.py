"""Which kind reads what: ``load_draft(path)`` routes another library's layout (speculators ``dflash``) to the
kind that imports it, as data; a drafter class no registered kind claims (a base model with no LM head,
transformers' Gemma 4 assistant, which reads its target's shared KV states) is refused before any forward,
naming the kinds that exist, as ``assistant_model=`` and through ``load_draft`` (the Gemma 4 assistant with its own
kind unregistered); a kind registered for such a class claims it."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import BertConfig, BertModel, Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig

import hf_specmm
from hf_specmm.drafts import registry
from hf_specmm.drafts.gemma4_assistant.modeling import ASSISTANT_CLASSES
from hf_specmm.drafts.text_only import TextOnlyDrafter
from hf_specmm.errors import DraftLoadError, IncompatibleDraftError
from conftest import batch_inputs, target
from test_dflash import dflash
from test_train import count_forwards

import contextlib


def kinds_line() -> str:
    return f"the registered kinds are {', '.join(registry.draft_kinds())}"


@contextlib.contextmanager
def without_kind(name: str):
    """The registry as it was before ``name``'s kind existed (a class nothing claims yet)."""
    kind = registry.get_kind(name)
    registry.unregister_draft_kind(name)
    try:
        yield
    finally:
        hf_specmm.register_draft_kind(kind)


def _bert(model):
    text = model.config.get_text_config()
    return BertModel(BertConfig(vocab_size=text.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=64))


def _gemma4_assistant(model):
    text = model.config.get_text_config()
    layers = Gemma4TextConfig(vocab_size=text.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16,
                              hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, num_kv_shared_layers=2,
                              layer_types=["sliding_attention", "full_attention"], enable_moe_block=False,
                              use_double_wide_mlp=False)
    return Gemma4AssistantForCausalLM(Gemma4AssistantConfig(text_config=layers, backbone_hidden_size=text.hidden_size))


@pytest.mark.parametrize("make, wrap", [(_bert, False), (_gemma4_assistant, False), (_gemma4_assistant, True)],
                         ids=["BertModel", "Gemma4AssistantForCausalLM", "TextOnly(Gemma4AssistantForCausalLM)"])
def test_an_unclaimed_drafter_is_refused_before_any_forward_naming_the_kinds(make, wrap):
    model = target("llava")
    draft = make(model)
    name = type(draft).__name__
    inputs = batch_inputs("llava", 2)
    hf_specmm.enable(model)
    try:
        with without_kind("gemma4_assistant"):
            kinds = kinds_line()
            match = f"{name} is not" if wrap else f"no hf_specmm draft kind takes a {name} as assistant_model; {kinds}"
            with count_forwards() as calls, pytest.raises(IncompatibleDraftError, match=match) as err:
                model.generate(**inputs, max_new_tokens=4, do_sample=False,
                               assistant_model=hf_specmm.TextOnly(draft) if wrap else draft)
    finally:
        hf_specmm.disable(model)
    assert calls["n"] == 0
    assert "dflash, mtp, eagle3, feature_head, image_adapter, vlm, text_only" in str(err.value)


def test_a_kind_registered_for_the_class_claims_it():
    """Claiming a class is one registration (the Gemma 4 assistant's own kind would do this)."""
    draft = _gemma4_assistant(target("llava"))
    kind = registry.DraftKind(name="assistant_probe", title="assistant", drafter=TextOnlyDrafter,
                              claims=lambda d: isinstance(d, Gemma4AssistantForCausalLM), priority=30,
                              loads=lambda config: None, training_view=lambda d, vocab, stage: None,
                              param_groups=lambda d, stage, cfg: [])
    with without_kind("gemma4_assistant"):
        hf_specmm.register_draft_kind(kind)
        try:
            assert hf_specmm.kind_of(draft) is kind
        finally:
            registry.unregister_draft_kind("assistant_probe")
        with pytest.raises(IncompatibleDraftError, match="no hf_specmm draft kind takes"):
            hf_specmm.kind_of(draft)
    if ASSISTANT_CLASSES:  # transformers >= 5.24: the gemma4_assistant kind claims it
        assert hf_specmm.kind_of(draft).name == "gemma4_assistant"


def test_load_draft_refuses_an_unclaimed_class_before_reading_weights(tmp_path):
    model = target("llava")
    _gemma4_assistant(model).save_pretrained(tmp_path / "assistant")
    with without_kind("gemma4_assistant"), count_forwards() as calls, pytest.raises(
            DraftLoadError, match=f"no hf_specmm draft kind loads a Gemma4AssistantConfig \\(model_type "
                                  f"'gemma4_assistant'\\); {kinds_line()}"):
        hf_specmm.load_draft(tmp_path / "assistant", target=model)
    assert calls["n"] == 0


def test_a_speculators_type_no_kind_imports_is_refused_naming_the_readers(tmp_path):
    folder = tmp_path / "peagle"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"speculators_model_type": "peagle", "architectures": ["PEagle"],
                                                    "auto_map": {"AutoModel": "code.Model"}}))
    (folder / "code.py").write_text("raise RuntimeError('checkpoint code was executed')\n")
    with pytest.raises(DraftLoadError, match="speculators 'peagle' checkpoint, which no hf_specmm draft kind imports "
                                             r"\(the kinds that read other libraries' layouts: dflash, mtp, eagle3;"):
        hf_specmm.load_draft(folder)


def test_load_draft_reads_the_speculators_dflash_layout_as_data(tmp_path):
    """``load_draft(path)`` routes a speculators ``dflash`` folder to its importer (no checkpoint code runs, an
    ``auto_map`` to a module that raises is never followed); mismatches are refused before any forward."""
    from hf_specmm.drafts.dflash import save_speculators_dflash

    model = target("muse_glimmer")
    draft = dflash(model, target_layer_ids=[0, 1])
    folder = save_speculators_dflash(draft, tmp_path / "spec", model, verifier="org/tiny-muse-glimmer")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "code.Model"}}))
    (folder / "code.py").write_text("raise RuntimeError('checkpoint code was executed')\n")
    loaded = hf_specmm.load_draft(folder, target=model)
    assert hf_specmm.kind_of(loaded).name == "dflash"
    assert all(torch.equal(a, b) for a, b in zip(draft.state_dict().values(), loaded.state_dict().values()))
    assert hf_specmm.kind_of(hf_specmm.load_draft(folder)).name == "dflash"  # its target is optional here
    (folder / "config.json").write_text(json.dumps({**config, "sample_from_anchor": True}))
    with count_forwards() as calls, pytest.raises(IncompatibleDraftError, match="sample_from_anchor"):
        hf_specmm.load_draft(folder, target=model)
    assert calls["n"] == 0


def test_a_drafts_own_forward_is_read_each_call_and_not_kept():
    """The text-only kind reads a draft's forward signature: the class's forward once per class; an instance's own
    forward (accelerate's hooks, a compiled forward, which hold their module) each call and never kept, so a draft
    whose forward stops reading input_ids is no longer claimed, and a dropped draft is freed."""
    import gc
    import weakref

    from hf_specmm.drafts.text_only.drafter import runs_alone

    from hf_specmm import testing

    small = testing.random_text_draft(target("llava"))  # its own: the shared drafts are not changed
    assert runs_alone(small)
    inner = small.forward
    small.forward = lambda input_ids=None, **kwargs: inner(input_ids=input_ids, **kwargs)  # holds the module
    assert runs_alone(small)
    small.forward = lambda pixel_values=None: None  # an instance forward without input_ids: not a text-only draft
    assert not runs_alone(small)
    del small.forward
    assert runs_alone(small)
    def own_forward(module):  # a forward holding its module, as accelerate's hooks do
        return lambda input_ids=None, **kwargs: type(module).forward(module, input_ids=input_ids, **kwargs)

    other = type(small)(small.config)
    other.forward = own_forward(other)
    assert runs_alone(other)
    dropped = weakref.ref(other)
    del other
    gc.collect()
    assert dropped() is None


def test_the_vocabulary_map_is_built_once_per_target_draft_and_device():
    """resolve_plan's VocabMap comes from vocab_map: one object per (target spec, draft vocabulary, device), equal
    to a fresh one; another draft vocabulary gets its own."""
    from hf_specmm.targets import target_spec
    from hf_specmm.vocab import VocabMap, vocab_map

    spec, cpu = target_spec(target("llava")), torch.device("cpu")
    first = vocab_map(spec, 100, cpu)
    assert vocab_map(spec, 100, cpu) is first and vocab_map(spec, 90, cpu) is not first
    fresh = VocabMap(spec, 100, cpu)
    assert torch.equal(first.proposable, fresh.proposable) and torch.equal(first.draft_visible, fresh.draft_visible)
    assert (first.stand_in, first.unverified) == (fresh.stand_in, fresh.unverified)
