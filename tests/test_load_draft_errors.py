"""``load_draft`` says what it looked for: a missing local path, an unknown Hub id (offline), a corrupt
weight file (named), a pickle-only checkpoint (refused, with how to convert it)."""

from __future__ import annotations

import pytest

import hf_specmm
from hf_specmm import testing
from hf_specmm.errors import DraftLoadError
from conftest import target


@pytest.fixture()
def saved(tmp_path):
    draft = testing.random_text_draft(target("llava"))
    hf_specmm.save_draft(draft, tmp_path / "draft")
    return tmp_path / "draft"


@pytest.mark.parametrize("name", ["./does-not-exist", "/nowhere/at/all", "a/b/c"])
def test_missing_local_path_says_so(name):
    with pytest.raises(DraftLoadError, match="No draft at local path") as err:
        hf_specmm.load_draft(name)
    assert "config.json" in str(err.value)


def test_unknown_hub_id_offline_names_both_places(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DraftLoadError, match="'does/not-exist-locally' as a local folder .* nor on the Hub"):
        hf_specmm.load_draft("does/not-exist-locally")


def test_folder_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DraftLoadError, match="has no config.json"):
        hf_specmm.load_draft(str(tmp_path / "empty"))


def test_truncated_safetensors_names_the_file(saved):
    weights = saved / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(DraftLoadError, match=r"model\.safetensors is corrupt or truncated"):
        hf_specmm.load_draft(str(saved))


def test_pickle_only_draft_is_refused_with_a_conversion_hint(saved):
    import torch
    from safetensors.torch import load_file

    state = load_file(saved / "model.safetensors")
    (saved / "model.safetensors").unlink()
    torch.save(state, saved / "pytorch_model.bin")
    with pytest.raises(DraftLoadError, match=r"no \.safetensors weights \(pytorch_model\.bin\).*save_pretrained"):
        hf_specmm.load_draft(str(saved))


def test_a_good_draft_still_loads(saved):
    assert hf_specmm.kind_of(hf_specmm.load_draft(str(saved))).name == "text_only"
