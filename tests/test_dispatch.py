"""A target dispatched by accelerate (``from_pretrained(..., device_map=..., offload_folder=...)``): layers
offloaded to disk and CPU, weights on the meta device between forwards, accelerate's hooks moving them in.
Every draft kind must give exactly plain greedy ``generate`` on the same dispatched model, exact copies
accepted 100 % (the image adapter's capture hook and the caches' rollback work under the hooks), and the
draft may itself be dispatched (its weights offloaded, its inputs placed where its embeddings run)."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_specmm
from hf_specmm import testing
from hf_specmm.devices import execution_device
from conftest import batch_inputs

# the vision tower's first module on disk too: the model's first parameter (``model.device``) is then on meta
DEVICE_MAP = {"model.vision_tower.embeddings": "disk", "model.vision_tower.pre_layrnorm": "cpu",
              "model.vision_tower.encoder": "cpu", "model.vision_tower.post_layernorm": "cpu",
              "model.multi_modal_projector": "disk", "model.language_model.embed_tokens": "cpu",
              "model.language_model.layers.0": "disk", "model.language_model.layers.1": "cpu",
              "model.language_model.norm": "cpu", "model.language_model.rotary_emb": "cpu", "lm_head": "disk"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dispatch")
    target = testing.tiny_target("llava")
    target.save_pretrained(folder / "target")
    return target, folder


def dispatched(target, folder, name: str):
    model = type(target).from_pretrained(folder / "target", device_map=DEVICE_MAP, offload_folder=folder / name)
    model.generation_config = copy.deepcopy(target.generation_config)
    assert model.device.type == "meta" and model.lm_head.weight.device.type == "meta"  # really offloaded
    assert "disk" in model.hf_device_map.values() and execution_device(model) == torch.device("cpu")
    return model.eval()


def drafts(target, model, folder):
    text_self = testing.text_draft_from_target(target)
    return {
        "text_only/random": (testing.random_text_draft(target, vocab_size=124), False),
        "text_only/self": (text_self, False),  # never sees the image: not 100 % on image rows
        "image_adapter/self": (hf_specmm.ImageAdapterDraft.for_target(target, text_self, copy_projector=True), True),
        "image_adapter/random": (hf_specmm.ImageAdapterDraft.for_target(target, testing.random_text_draft(target)),
                                 False),
        "vlm/copy": (copy.deepcopy(target), True),
        "vlm/the dispatched target itself": (model, True),
        "vlm/dispatched copy": (dispatched(target, folder, "offload-draft"), True),  # a draft offloaded too
        "vlm/other": (testing.tiny_target("llava", seed=1), False),
    }


def test_every_draft_kind_on_a_disk_and_cpu_offloaded_target_equals_plain_generate(saved):
    target, folder = saved
    model = dispatched(target, folder, "offload")
    inputs = batch_inputs("llava", 3)  # left-padded rows, one without an image, images of two sizes
    plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    assert torch.equal(plain, target.generate(**inputs, max_new_tokens=16, do_sample=False))  # same model
    hf_specmm.enable(model)
    try:
        for name, (draft, exact) in drafts(target, model, folder).items():
            assert hf_specmm.kind_of(draft).name == name.split("/")[0]
            for gamma in (1, 4):
                out = model.generate(**inputs, max_new_tokens=16, do_sample=False, assistant_model=draft,
                                     num_assistant_tokens=gamma)
                stats = hf_specmm.last_stats(model)
                assert torch.equal(out, plain), f"{name} γ={gamma}:\n{out}\n!=\n{plain}"
                if exact:
                    assert stats.acceptance_rate == 1.0, (name, gamma, stats.acceptance_rate)
                assert stats.drafted_tokens > 0
    finally:
        hf_specmm.disable(model)
