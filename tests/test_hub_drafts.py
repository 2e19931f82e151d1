"""Drafts on the Hub through the real client code, offline: a pre-populated HF cache with
HF_HUB_OFFLINE=1 for ``from_pretrained("org/name")``, and a local fake Hub on 127.0.0.1 for
``push_to_hub``. Loading back by repo id gives identical speculative outputs and the right card."""

from __future__ import annotations

import json

import pytest
from fake_hub import populate_hf_cache, run_python
from fake_hub_fixtures import fake_hub  # noqa: F401 - pytest fixture
from huggingface_hub import ModelCard
from safetensors.torch import load_file, save_file

import hf_specmm
from hf_specmm import ImageAdapterDraft, testing
from conftest import batch_inputs

TARGET = "org/tiny-llava"
RESULTS = {"captioning": {"gamma": 5, "block_efficiency": 2.5, "acceptance_rate": 0.6}}

# child: load both drafts by repo id, run speculative generate on the tiny target, dump outputs
LOAD_AND_GENERATE = """
import json, torch, sys
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
import hf_specmm
from transformers import AutoModelForCausalLM
from hf_specmm import ImageAdapterDraft, testing
from conftest import batch_inputs
target = hf_specmm.enable(testing.tiny_target("llava", eos_bias=-30.0))
inputs = batch_inputs("llava", 3)
out = {{}}
for name, repo in {repos!r}.items():
    draft = hf_specmm.load_draft(repo)
    auto = AutoModelForCausalLM.from_pretrained(repo)
    assert type(auto).__name__ == type(draft).__name__, (type(auto), type(draft))
    if name == "adapter":
        assert isinstance(ImageAdapterDraft.from_pretrained(repo), ImageAdapterDraft)
    seq = target.generate(**inputs, max_new_tokens=12, do_sample=False, assistant_model=draft, num_assistant_tokens=3)
    out[name] = {{"sequences": seq.tolist(), "acceptance": hf_specmm.last_stats(target).acceptance_rate,
                 "meta": hf_specmm.draft_metadata(draft)}}
json.dump(out, open({out!r}, "w"))
"""


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    """Both draft kinds for the tiny llava target, saved through hf_specmm, with reference outputs."""
    root = tmp_path_factory.mktemp("drafts")
    target = hf_specmm.enable(testing.tiny_target("llava", eos_bias=-30.0))
    inputs = batch_inputs("llava", 3)
    made = {
        "text": testing.random_text_draft(target, vocab_size=target.config.text_config.vocab_size - 4),
        "adapter": ImageAdapterDraft.for_target(target, testing.text_draft_from_target(target), copy_projector=True),
    }
    reference = {}
    for name, draft in made.items():
        hf_specmm.annotate_draft(draft, results=RESULTS, training_data="synthetic test scenes")
        hf_specmm.save_draft(draft, root / name, target=TARGET)
        seq = target.generate(**inputs, max_new_tokens=12, do_sample=False, assistant_model=draft,
                              num_assistant_tokens=3)
        reference[name] = (seq.tolist(), hf_specmm.last_stats(target).acceptance_rate)
    return root, reference


def _check_card(text: str, kind: str) -> None:
    card = ModelCard(text)
    assert card.data.base_model == TARGET
    assert card.data.library_name == "hf_specmm"
    assert "speculative-decoding" in card.data.tags and f"{kind}-draft" in card.data.tags
    meta = card.data.to_dict()["hf_specmm"]
    assert meta["target"] == TARGET and meta["results"] == RESULTS
    assert 'hf_specmm.load_draft("' in card.text and "assistant_model=draft" in card.text
    assert "synthetic test scenes" in card.text and "| captioning | 5 | 2.50 | 0.60 |" in card.text


def _assert_same_outputs(tmp_path, reference, env, repos):
    out = tmp_path / "out.json"
    code = LOAD_AND_GENERATE.format(tests=str(__import__("pathlib").Path(__file__).parent), repos=repos, out=str(out))
    run_python(code, env)
    loaded = json.loads(out.read_text())
    for name in repos:
        assert loaded[name]["sequences"] == reference[name][0], name
        assert loaded[name]["acceptance"] == reference[name][1], name
        assert loaded[name]["meta"]["target"] == TARGET and loaded[name]["meta"]["results"] == RESULTS
    assert reference["adapter"][1] == 1.0  # the copied adapter draft still sees what the target sees


def test_saved_folders_carry_kind_target_and_card(drafts):
    root, _ = drafts
    for name, kind in (("text", "text-only"), ("adapter", "image-adapter")):
        files = {p.name for p in (root / name).iterdir()}
        assert {"config.json", "model.safetensors", "README.md"} <= files, files
        _check_card((root / name / "README.md").read_text(), kind)
    assert json.loads((root / "text" / "config.json").read_text())["hf_specmm"]["draft_kind"] == "text_only"
    assert json.loads((root / "adapter" / "config.json").read_text())["model_type"] == "hf_specmm_image_adapter_draft"


def test_from_pretrained_by_repo_id_from_offline_cache(drafts, tmp_path):
    root, reference = drafts
    cache = tmp_path / "hub"
    repos = {"text": "org/text-draft", "adapter": "org/adapter-draft"}
    for name, repo in repos.items():
        populate_hf_cache(cache, repo, root / name)
    _assert_same_outputs(tmp_path, reference, {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}, repos)


def test_push_to_hub_then_load_back(drafts, tmp_path, fake_hub):  # noqa: F811
    root, reference = drafts
    repos = {"text": "org/pushed-text-draft", "adapter": "org/pushed-adapter-draft"}
    env = {"HF_ENDPOINT": fake_hub.endpoint, "HF_HOME": str(tmp_path / "home"), "HF_TOKEN": "fake"}
    push = f"""
import torch, hf_specmm
from transformers import AutoModelForCausalLM
text = AutoModelForCausalLM.from_pretrained({str(root / 'text')!r})
hf_specmm.push_draft_to_hub(text, {repos['text']!r}, target={TARGET!r})
adapter = hf_specmm.load_draft({str(root / 'adapter')!r})
adapter.push_to_hub({repos['adapter']!r})
"""
    run_python(push, env)
    for name, kind in (("text", "text-only"), ("adapter", "image-adapter")):
        stored = fake_hub.repos[repos[name]]
        assert {"config.json", "model.safetensors", "README.md"} <= set(stored), set(stored)
        _check_card(stored["README.md"].decode(), kind)
        assert f"# {repos[name]}" in stored["README.md"].decode()
    env["HF_HOME"] = str(tmp_path / "fresh-home")  # nothing cached: everything comes from the fake Hub
    _assert_same_outputs(tmp_path, reference, env, repos)


def test_loads_are_strict(drafts, tmp_path):
    root, _ = drafts
    for name in ("text", "adapter"):
        folder = tmp_path / name
        folder.mkdir()
        for f in (root / name).iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        weights = load_file(folder / "model.safetensors")
        dropped = sorted(weights)[0]
        del weights[dropped]
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(ValueError, match="does not match its config"):
            hf_specmm.load_draft(folder)
    with pytest.raises(ValueError, match="missing weights"):
        ImageAdapterDraft.from_pretrained(tmp_path / "adapter")
