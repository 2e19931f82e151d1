"""What a draft checkpoint declares is checked before anything is built from it: sizes against the weight files'
headers before any tensor is allocated, a bounded DFlash block size, shard names that stay in the checkpoint's
folder, and ill-typed or unknown config fields, each a DraftLoadError naming the file and the field."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import hf_specmm
from hf_specmm import IncompatibleDraftError, testing
from hf_specmm.drafts.dflash import MAX_BLOCK_SIZE, dflash_draft_for
from hf_specmm.errors import DraftLoadError

from conftest import batch_inputs


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A text draft and a DFlash drafter of the tiny LLaVA target, saved."""
    root = tmp_path_factory.mktemp("saved")
    model = testing.tiny_target("llava")
    testing.random_text_draft(model).save_pretrained(root / "text")
    dflash_draft_for(model, block_size=4).save_pretrained(root / "dflash")
    return root


def edited(saved, tmp_path, base: str, **fields):
    """A copy of ``base`` whose config.json has ``fields`` set (``...``: removed)."""
    folder = tmp_path / f"{base}-edited"
    shutil.copytree(saved / base, folder)
    config = json.loads((folder / "config.json").read_text())
    for name, value in fields.items():
        if value is ...:
            config.pop(name, None)
        else:
            config[name] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture()
def nothing_allocated(monkeypatch):
    """Fails the test if a draft class's ``from_pretrained`` (which allocates the declared tensors) is reached."""
    from hf_specmm import hub

    real = hub.loading_class

    def spied(config):
        cls = real(config)
        return type("Spied", (), {"from_config": staticmethod(getattr(cls, "from_config", None) or cls),
                                  "from_pretrained": staticmethod(_refuse)})

    def _refuse(*args, **kwargs):
        raise AssertionError("the declared tensors were allocated before the shapes were checked")

    monkeypatch.setattr(hub, "loading_class", spied)


# ---- declared sizes ---------------------------------------------------------------------------------------

def test_a_declared_vocabulary_the_weights_lack_is_refused_before_allocating(saved, tmp_path, nothing_allocated):
    folder = edited(saved, tmp_path, "text", vocab_size=4_000_000)
    with pytest.raises(DraftLoadError, match=r"mis-shaped weights.*\[128, 32\] in the file, "
                                             r"\[4000000, 32\] by config\.json.*config\.json's vocab_size"):
        hf_specmm.load_draft(folder)


def test_the_header_check_passes_a_good_checkpoint(saved, monkeypatch):
    from hf_specmm.drafts import declared

    seen = []
    real = declared.header_shapes
    monkeypatch.setattr(declared, "header_shapes", lambda files: seen.append(files) or real(files))
    draft = hf_specmm.load_draft(saved / "text")
    assert seen and draft.config.vocab_size == 128


@pytest.mark.parametrize("block", [1, MAX_BLOCK_SIZE + 1, 10**6])
def test_dflash_block_size_is_bounded_at_load(saved, tmp_path, block):
    folder = edited(saved, tmp_path, "dflash", block_size=block)
    with pytest.raises(DraftLoadError, match=rf"config\.json: block_size must be in 2\.\.{MAX_BLOCK_SIZE}, got {block}"):
        hf_specmm.load_draft(folder)


def test_dflash_block_size_is_bounded_at_generate():
    model = testing.tiny_target("llava")
    draft = dflash_draft_for(model, block_size=10**6)
    hf_specmm.enable(model)
    try:
        with pytest.raises(IncompatibleDraftError, match=rf"block_size is 1000000.*2\.\.{MAX_BLOCK_SIZE}"):
            model.generate(**batch_inputs("llava", 1), assistant_model=draft, max_new_tokens=4, do_sample=False)
    finally:
        hf_specmm.disable(model)


# ---- shard index paths ------------------------------------------------------------------------------------

def _sharded(saved, tmp_path, shard_name: str):
    """The text draft with an index naming ``shard_name`` for every tensor; a real shard sits where it points."""
    folder = tmp_path / "sharded"
    shutil.copytree(saved / "text", folder)
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(folder / "model.safetensors", other / "model.safetensors")
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    from safetensors import safe_open

    with safe_open(str(folder / "model-00001-of-00001.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    weight_map = {key: "model-00001-of-00001.safetensors" for key in keys}
    weight_map[keys[0]] = shard_name
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("shard", ["../other/model.safetensors", "..", "sub/model.safetensors",
                                   "sub\\model.safetensors", "/tmp/model.safetensors", "C:\\model.safetensors", 7])
def test_shard_names_outside_the_folder_are_refused(saved, tmp_path, shard):
    folder = _sharded(saved, tmp_path, shard)
    with pytest.raises(DraftLoadError, match=r"model\.safetensors\.index\.json: weight_map names"):
        hf_specmm.load_draft(folder)


def test_a_sharded_checkpoint_still_loads(saved, tmp_path):
    draft = hf_specmm.load_draft(saved / "text")
    draft.save_pretrained(tmp_path / "shards", max_shard_size="20KB")
    assert (tmp_path / "shards" / "model.safetensors.index.json").is_file()
    loaded = hf_specmm.load_draft(tmp_path / "shards")
    for name, tensor in draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


# ---- ill-typed and unknown config fields ------------------------------------------------------------------

@pytest.mark.parametrize("base,field,value,message", [
    ("text", "vocab_size", "128", r"vocab_size must be an integer >= 0, got '128'"),
    ("text", "hidden_size", 3.5, r"hidden_size must be an integer >= 0, got 3\.5"),
    ("dflash", "block_size", "4", r"block_size must be an integer, got '4'"),
    ("dflash", "mask_token_id", None, r"mask_token_id must be an integer, got None"),
    ("dflash", "mask_token_id", ..., r"mask_token_id must be an integer, got None"),
    ("dflash", "target_layer_ids", "ab", r"target_layer_ids must be a non-empty list of integers, got 'ab'"),
    ("dflash", "target_layer_ids", [0, "1"], r"target_layer_ids\[1\] must be an integer, got '1'"),
    ("text", "model_type", "nonesuch", r"model_type 'nonesuch' is not a model type transformers .* knows"),
    ("text", "model_type", ..., r"model_type is missing"),
    ("text", "model_type", 3, r"model_type must be a string, got 3"),
])
def test_ill_typed_fields_are_named_with_the_file(saved, tmp_path, base, field, value, message):
    folder = edited(saved, tmp_path, base, **{field: value})
    with pytest.raises(DraftLoadError, match=rf"{folder}/config\.json: {message}"):
        hf_specmm.load_draft(folder)


def test_nested_configs_are_checked_too(tmp_path):
    from hf_specmm.drafts.declared import check_declared_fields

    with pytest.raises(DraftLoadError, match=r"f\.json: text_config\.num_hidden_layers must be an integer >= 0, got -1"):
        check_declared_fields({"model_type": "x", "text_config": {"num_hidden_layers": -1}}, "f.json")
    check_declared_fields({"model_type": "x", "pad_token_id": None, "text_config": {"vocab_size": None}}, "f.json")
