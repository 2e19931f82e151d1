"""Loading: ``trust_remote_code`` reaches every loader and nothing from a checkpoint runs or prompts
unless the caller passed True; corrupt or stale checkpoints of every draft kind and format (native, speculators,
SGLang) are a ``DraftLoadError`` / ``IncompatibleDraftError`` naming the file and field, before any forward."""

from __future__ import annotations

import builtins
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import hf_specmm
from hf_specmm import ImageAdapterDraft, IncompatibleDraftError, testing
from hf_specmm.errors import DraftLoadError
from conftest import target
from eagle3_fixtures import lagged_head
from test_eagle3_formats import _fixture


@pytest.fixture()
def no_prompt(monkeypatch):
    """A library call must never read standard input: any ``input()`` fails the test."""
    asked = []

    def refuse(*args, **kwargs):
        asked.append(args)
        raise AssertionError("hf_specmm (or transformers under it) asked on the terminal")

    monkeypatch.setattr(builtins, "input", refuse)
    return asked


def _remote_code_folder(folder, marker, model_type="hardening_custom"):
    """A checkpoint whose config needs its own Python file, which writes ``marker`` if it is ever run."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": model_type,
        "auto_map": {"AutoConfig": "custom.CustomConfig", "AutoModelForCausalLM": "custom.CustomModel",
                     "AutoProcessor": "custom.CustomProcessor", "AutoTokenizer": ["custom.CustomTokenizer", None]}}))
    (folder / "custom.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                      "from transformers import PretrainedConfig\n"
                                      f"class CustomConfig(PretrainedConfig):\n    model_type = {model_type!r}\n")
    save_file({"w": torch.zeros(1)}, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("flag", [{"trust_remote_code": False}, {}])
def test_checkpoint_code_never_runs_nor_prompts_without_trust(tmp_path, no_prompt, flag):
    marker = tmp_path / "marker"
    folder = _remote_code_folder(tmp_path / "ckpt", marker)
    with pytest.raises(DraftLoadError, match=r"config\.json: model_type 'hardening_custom'.*trust_remote_code=True"):
        hf_specmm.load_draft(folder, **flag)
    assert not marker.exists() and not no_prompt


def test_trust_remote_code_true_reaches_the_loader(tmp_path, no_prompt):
    """The caller's True is passed on (transformers imports the checkpoint's module): what False guards is real."""
    marker = tmp_path / "marker"
    folder = _remote_code_folder(tmp_path / "ckpt", marker)
    with pytest.raises(Exception):  # the module defines no model class: loading fails after running it
        hf_specmm.load_draft(folder, trust_remote_code=True)
    assert marker.exists() and not no_prompt


def test_training_loaders_pass_the_flag(tmp_path, no_prompt):
    """``hf-specmm train``'s target loader (config, weights, processor) never runs or asks either."""
    from hf_specmm.train.config import TrainingInputError
    from hf_specmm.train.models import load_target

    marker = tmp_path / "marker"
    folder = _remote_code_folder(tmp_path / "ckpt", marker)
    with pytest.raises(TrainingInputError, match="trust_remote_code=True"):
        load_target(str(folder), "cpu", "fp32")
    assert not marker.exists() and not no_prompt
    with pytest.raises(TypeError, match="True or False"):
        hf_specmm.load_draft(folder, trust_remote_code="yes")
    with pytest.raises(TypeError, match="no use_safetensors"):
        hf_specmm.load_draft(folder, use_safetensors=False)


# ---- corrupt checkpoints, every kind and layout -----------------------------------------------------------
V = 128  # the tiny targets' vocabulary


def _native(kind, folder):
    model = target("llava")
    draft = {"text_only": lambda: testing.random_text_draft(model),
             "image_adapter": lambda: ImageAdapterDraft.for_target(model, testing.text_draft_from_target(model)),
             "feature_head": lambda: testing.feature_head_from_target(model),
             "eagle3": lambda: lagged_head(model, draft_vocab_size=24),
             "vlm": lambda: testing.tiny_target("llava", seed=5)}[kind]()
    draft.save_pretrained(folder)
    return folder


def _edit_config(change):
    def edit(folder):
        config = json.loads((folder / "config.json").read_text())
        change(config)
        (folder / "config.json").write_text(json.dumps(config))
    return edit


def _edit_tensors(change):
    def edit(folder):
        tensors = load_file(folder / "model.safetensors")
        change(tensors)
        save_file(tensors, str(folder / "model.safetensors"))
    return edit


def _bad_json(folder):
    (folder / "config.json").write_text('{"model_type": ')


def _stale_copy(folder):
    shutil.copy(folder / "model.safetensors", folder / "old-model.safetensors")


def _set(path, value):
    *parents, last = path.split(".")

    def change(config):
        node = config
        for p in parents:
            node = node[p]
        if value is _DROP:
            node.pop(last)
        else:
            node[last] = value
    return change


_DROP = object()
_SHIFT = _edit_tensors(lambda t: t.__setitem__("d2t", t["d2t"] + V))
_NEGATIVE = _edit_tensors(lambda t: t.__setitem__("d2t", t["d2t"] - 1000))

CORRUPTIONS = {  # (kind or layout, corruption) -> what the error names
    ("text_only", "bad json"): (_bad_json, r"config\.json is not valid JSON"),
    ("text_only", "stale copy"): (_stale_copy, r"old-model\.safetensors.*stale"),
    ("text_only", "vocab_size"): (_edit_config(_set("vocab_size", 99)), "Padding_idx must be within num_embeddings"),
    ("text_only", "intermediate_size"): (_edit_config(_set("intermediate_size", 40)), r"mis-shaped weights.*\[40, "),
    ("image_adapter", "bad json"): (_bad_json, r"config\.json is not valid JSON"),
    ("image_adapter", "stale copy"): (_stale_copy, "stale"),
    ("vlm", "bad json"): (_bad_json, r"config\.json is not valid JSON"),
    ("vlm", "stale copy"): (_stale_copy, "stale"),
    ("vlm", "hidden_size"): (_edit_config(_set("text_config.intermediate_size", 40)), "mis-shaped weights"),
    ("feature_head", "fingerprint string"): (_edit_config(_set("target_fingerprint", "abc")), "target_fingerprint"),
    ("feature_head", "no hidden_size"): (_edit_config(_set("text_config.hidden_size", _DROP)), r"text_config\.hidden_size is missing"),
    ("feature_head", "model_type llama"): (_edit_config(_set("model_type", "llama")), "model_type is 'llama'"),
    ("feature_head", "stale copy"): (_stale_copy, "stale"),
    ("eagle3", "d2t shifted"): (_SHIFT, r"d2t maps draft ids to target ids 1[23]\d\.\."),
    ("eagle3", "d2t negative"): (_NEGATIVE, "d2t maps draft ids to target ids -"),
    ("eagle3", "no aux_layers"): (_edit_config(_set("aux_layers", _DROP)), "aux_layers is missing"),
    ("eagle3", "aux_layers string"): (_edit_config(_set("aux_layers", "0,1,2")), "aux_layers must be a non-empty list"),
    ("eagle3", "draft_vocab_size"): (_edit_config(_set("draft_vocab_size", 30)), r"lm_head\.weight is \[24, 64\] in the file, \[30, 64\]"),
    ("eagle3", "draft_vocab_size float"): (_edit_config(_set("draft_vocab_size", 2.5)), "draft_vocab_size must be an integer"),
    ("eagle3", "no layer vocab"): (_edit_config(_set("layer_config.vocab_size", _DROP)), r"layer_config\.vocab_size is missing"),
    ("eagle3", "model_type llama"): (_edit_config(_set("model_type", "llama")), "model_type is 'llama'"),
    ("speculators", "d2t shifted"): (_SHIFT, "outside the target's 0..127"),
    ("speculators", "d2t negative"): (_NEGATIVE, "outside the target's 0..127"),
    ("speculators", "no hidden_size"): (_edit_config(_set("transformer_layer_config.hidden_size", _DROP)), r"transformer_layer_config\.hidden_size is missing"),
    ("speculators", "no vocab_size"): (_edit_config(_set("transformer_layer_config.vocab_size", _DROP)), r"transformer_layer_config\.vocab_size is missing"),
    ("speculators", "no layer config"): (_edit_config(_set("transformer_layer_config", _DROP)), "transformer_layer_config must be a JSON object"),
    ("speculators", "aux string"): (_edit_config(_set("eagle_aux_hidden_state_layer_ids", "0,1,2")), "eagle_aux_hidden_state_layer_ids must be"),
    ("speculators", "draft_vocab_size"): (_edit_config(_set("draft_vocab_size", 30)), r"d2t is \[24\] in model\.safetensors"),
    ("speculators", "bad json"): (_bad_json, r"config\.json is not valid JSON"),
    ("speculators", "stale copy"): (_stale_copy, r"\['old-model\.safetensors'\].*stale"),
    ("sglang", "d2t shifted"): (_SHIFT, "outside the target's 0..127"),
    ("sglang", "d2t negative"): (_NEGATIVE, "outside the target's 0..127"),
    ("sglang", "no hidden_size"): (_edit_config(_set("hidden_size", _DROP)), r"config\.json: hidden_size is missing"),
    ("sglang", "aux string"): (_edit_config(_set("eagle_config.eagle_aux_hidden_state_layer_ids", "1")), "eagle_aux_hidden_state_layer_ids must be"),
    ("sglang", "t2d inconsistent"): (_edit_tensors(lambda t: t.__setitem__("t2d", ~t["t2d"])), "t2d does not mark"),
    ("sglang", "stale copy"): (_stale_copy, "stale"),
}


@pytest.mark.parametrize("source, corruption", sorted(CORRUPTIONS))
def test_corrupt_checkpoints_are_named_before_any_forward(tmp_path, source, corruption):
    from test_train import count_forwards

    model = target("llava")
    if source in ("speculators", "sglang"):
        folder = _fixture(tmp_path / "ckpt", model, source)
    else:
        folder = _native(source, tmp_path / "ckpt")
    corrupt, match = CORRUPTIONS[source, corruption]
    corrupt(folder)
    with count_forwards() as calls, pytest.raises((DraftLoadError, IncompatibleDraftError), match=match):
        hf_specmm.load_draft(folder, target=model)
    assert calls["n"] == 0


def test_vocabulary_maps_are_checked_against_the_target_at_generate(tmp_path):
    """A head whose maps were corrupted in memory is refused before the prefill (it used to crash after it)."""
    model = target("llava")
    head = lagged_head(model, draft_vocab_size=24)
    with torch.no_grad():
        head.d2t += V
    with pytest.raises(IncompatibleDraftError, match="outside the target's 0..127"):
        hf_specmm.kind_of(head).drafter.check(model, head)
