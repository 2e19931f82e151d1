"""Draft-kind and target-family registries: every kind is one folder + one registration, nothing
outside a kind's folder tests draft classes, and a kind registered from outside runs through
``generate`` without touching any other module."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch

import hf_specmm
from hf_specmm import testing
from hf_specmm.drafter import Drafter
from hf_specmm.drafts import registry
from hf_specmm.drafts.text_only import TextOnlyDrafter
from hf_specmm.targets import ROPE_1D, SUPPORTED_TARGETS
from conftest import batch_inputs, target

PACKAGE = Path(hf_specmm.__file__).parent


VARIANTS = {"eagle3": "feature_head"}  # a variant kind is registered in its parent kind's folder


def test_every_kind_is_one_folder_with_one_registration():
    assert set(hf_specmm.draft_kinds()) == {"text_only", "image_adapter", "vlm", "feature_head", "eagle3", "dflash",
                                            "gemma4_assistant", "mtp"}
    for name in hf_specmm.draft_kinds():
        folder = VARIANTS.get(name, name)
        init = PACKAGE / "drafts" / folder / "__init__.py"
        assert init.is_file(), f"draft kind {name} must live in drafts/{folder}/"
        variants = [v for v, parent in VARIANTS.items() if parent == folder]
        assert init.read_text().count("register_draft_kind(") == 1 + len(variants)
        assert f'name="{name}"' in init.read_text()
        kind = hf_specmm.get_kind(name)
        assert issubclass(kind.drafter, Drafter) and not inspect.isabstract(kind.drafter)
        assert kind.stages and kind.stages[0] == 1


def test_nothing_outside_a_kinds_folder_tests_draft_classes():
    """api, checks, hub, train, world, bench look kinds up; only drafts/<kind>/ knows its classes."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("drafts/"):
            continue
        text = path.read_text()
        if re.search(r"isinstance\([^)]*(ImageAdapterDraft|TextOnly|VLMDrafter|FeatureHeadDraft)\b", text):
            offenders.append(rel)
        if re.search(r"(kind|draft_kind)\s*==\s*\"(text_only|vlm)\"", text):
            offenders.append(rel)
    assert not offenders, offenders


def test_the_drafter_interface_is_abstract_and_documented():
    with pytest.raises(TypeError):
        Drafter(None, None)  # type: ignore[abstract]
    for method in ("prefill", "propose", "accept", "observe_prefill", "observe_verification", "check", "watch"):
        assert getattr(Drafter, method).__doc__, method


def test_kind_of_picks_the_right_kind():
    model = target("llava")
    assert hf_specmm.kind_of(testing.random_text_draft(model)).name == "text_only"
    assert hf_specmm.kind_of(model).name == "vlm"
    assert hf_specmm.kind_of(hf_specmm.TextOnly(model)).name == "text_only"
    adapter = hf_specmm.ImageAdapterDraft.for_target(model, testing.random_text_draft(model))
    assert hf_specmm.kind_of(adapter).name == "image_adapter"


def test_training_options_come_from_the_registry():
    import argparse

    from hf_specmm.train.cli import add_arguments
    from hf_specmm.train.config import TrainConfig, TrainingInputError

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    action = next(a for a in parser._actions if "--draft-kind" in a.option_strings)
    assert tuple(action.choices) == hf_specmm.draft_kinds()
    with pytest.raises(TrainingInputError, match="vlm"):
        TrainConfig(target="t", data="d", output_dir="o", draft_config="tiny", draft_kind="nope").validate()


class _CountingDrafter(TextOnlyDrafter):
    proposals = 0

    def propose(self, budget, select, cur):
        type(self).proposals += 1
        return super().propose(budget, select, cur)


class _Marked(torch.nn.Module):
    """A draft class only the plugin kind below claims."""


def test_a_kind_registered_from_outside_runs_through_generate():
    model = target("llava")
    draft = testing.text_draft_from_target(model)
    draft.__class__ = type("MarkedLlamaForCausalLM", (_Marked, type(draft)), {})
    kind = registry.DraftKind(name="counting", title="counting", drafter=_CountingDrafter,
                              claims=lambda d: isinstance(d, _Marked), priority=50, loads=lambda config: None,
                              training_view=lambda d, vocab, stage: _CountingDrafter(d, vocab),
                              param_groups=lambda d, stage, cfg: [{"params": list(d.parameters()), "lr": cfg.lr}])
    hf_specmm.register_draft_kind(kind)
    hf_specmm.enable(model)
    try:
        inputs = batch_inputs("llava", 3)
        plain = hf_specmm.disable(model).generate(**inputs, max_new_tokens=12, do_sample=False)
        hf_specmm.enable(model)
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False, assistant_model=draft)
        assert torch.equal(out, plain)
        assert _CountingDrafter.proposals > 0
        assert hf_specmm.kind_of(draft) is kind
    finally:
        registry.unregister_draft_kind("counting")
        hf_specmm.disable(model)
    assert "counting" not in hf_specmm.draft_kinds()


def test_every_supported_target_family_is_in_the_fixtures_and_registered_once():
    assert {f.name for f in SUPPORTED_TARGETS.values()} == set(testing.FIXTURES)
    family = next(iter(SUPPORTED_TARGETS.values()))
    with pytest.raises(ValueError, match="already registered"):
        hf_specmm.register_target_family(dataclasses.replace(family, name="other"))


def test_one_position_rule_for_generate_inference_and_training():
    """Valid slots are numbered as generate numbers a left-padded prompt; a block after k valid slots
    continues from k, holes taking the next valid token's position."""
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 0, 1, 1]])
    positions = ROPE_1D.prompt_positions(mask)
    generate_style = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    assert torch.equal(positions * mask, generate_style * mask)
    block = ROPE_1D.block_positions(torch.tensor([3, 5]), torch.tensor([[1, 0, 1], [1, 1, 1]]), 3)
    assert block.tolist() == [[3, 4, 4], [5, 6, 7]]


def test_a_saved_vlm_draft_loads_as_the_vlm_kind_with_a_card(tmp_path):
    draft = testing.tiny_target("llava", seed=1)
    hf_specmm.save_draft(draft, tmp_path / "vlm", target="llava-hf/llava-1.5-7b-hf")
    loaded = hf_specmm.load_draft(str(tmp_path / "vlm"))
    assert type(loaded) is type(draft) and hf_specmm.kind_of(loaded).name == "vlm"
    card = (tmp_path / "vlm" / "README.md").read_text()
    assert "vlm-draft" in card and "| vision |" in card
    assert hf_specmm.draft_metadata(loaded)["draft_kind"] == "vlm"
