"""The bench's ``gemma4_assistant`` rows (tiny-gemma4): under controlled acceptance the assistant sees the text-only
draft's accept/reject pattern (same τ, rounds and acceptance at batch 1 and 2, lossless), and the kind is refused
before any model is built on presets whose target it cannot read. Timing numbers are not asserted."""

from __future__ import annotations

import pytest

from hf_specmm import _compat
from hf_specmm.bench import BenchConfig, run_benchmark

pytestmark = pytest.mark.skipif(not _compat.GEMMA4_SUPPORTED, reason="Gemma 4 assistants need transformers >= 5.24")


@pytest.mark.parametrize("batch", (1, 2))
def test_assistant_row_sees_the_text_only_rows_pattern(batch):
    result = run_benchmark(BenchConfig(preset="tiny-gemma4", gammas=[3], batch_sizes=[batch], acceptance=0.7,
                                       max_new_tokens=30, repeats=1, warmup=0,
                                       draft_kinds=["text_only", "gemma4_assistant"]), progress=False)
    text, assistant = result["rows"]
    assert (text["draft_kind"], assistant["draft_kind"]) == ("text_only", "gemma4_assistant")
    assert 1.0 < text["tau"] < 4.0 and 0.0 < text["acceptance"] < 1.0  # some drafts rejected, some accepted
    assert (assistant["tau"], assistant["rounds"], assistant["acceptance"]) == \
        (text["tau"], text["rounds"], text["acceptance"])
    assert text["lossless"] is True and assistant["lossless"] is True
    assert assistant["Td_ms"] > 0 and assistant["Tpd_ms"] == 0  # no prompt of its own
    if batch == 1:  # stock's cell is marked, not left blank
        assert assistant["stock_speedup"] is None and "not run" in assistant["stock_error"]


def test_rank_aware_profile_and_trees_match_the_text_only_rows():
    """Rank-aware control reads each round's root from the assistant's first step (a chain and a tree row)."""
    result = run_benchmark(BenchConfig(preset="tiny-gemma4", gammas=[3], batch_sizes=[2], trees=[[2, 3, 8]],
                                       acceptance_profile=[[0.5, 0.3], [0.5, 0.3], [0.5, 0.3]], max_new_tokens=30,
                                       repeats=1, warmup=0, stock=False, draft_kinds=["text_only", "gemma4_assistant"]),
                           progress=False)
    assert [(row["draft_kind"], row.get("tree")) for row in result["rows"]] == [
        ("text_only", None), ("gemma4_assistant", None), ("text_only", "2,3,8"), ("gemma4_assistant", "2,3,8")]
    text_chain, assistant_chain, text_tree, assistant_tree = result["rows"]
    for text, assistant in ((text_chain, assistant_chain), (text_tree, assistant_tree)):
        assert (assistant["tau"], assistant["rounds"], assistant["acceptance"]) == \
            (text["tau"], text["rounds"], text["acceptance"])
        assert assistant["lossless"] is True
    assert text_tree["tau"] > text_chain["tau"]  # the tree's other children are hits as the profile says


@pytest.mark.parametrize("alpha,gamma", [(1.0, 3), (0.0, 2)])
def test_assistant_row_at_the_extremes(alpha, gamma):
    result = run_benchmark(BenchConfig(preset="tiny-gemma4", gammas=[gamma], batch_sizes=[2], acceptance=alpha,
                                       max_new_tokens=21, repeats=1, warmup=0, stock=False,
                                       draft_kinds=["gemma4_assistant"]), progress=False)
    (row,) = result["rows"]
    assert row["tau"] == (gamma + 1 if alpha == 1.0 else 1.0) and row["acceptance"] == alpha
    assert row["lossless"] is True


@pytest.mark.parametrize("preset", ["tiny", "gemma4-e2b-shape"])
def test_assistant_kind_is_refused_before_any_model_is_built(preset, monkeypatch):
    from hf_specmm.bench import runner

    def must_not_build(*args, **kwargs):
        raise AssertionError("a model was built before the refusal")

    monkeypatch.setattr(runner, "build_preset", must_not_build)
    with pytest.raises(ValueError, match=f"gemma4_assistant on preset '{preset}'"):
        run_benchmark(BenchConfig(preset=preset, draft_kinds=["text_only", "gemma4_assistant"]), progress=False)


def test_world_step_costs_refuse_an_assistant_before_any_forward():
    from types import SimpleNamespace

    from hf_specmm import IncompatibleDraftError, testing
    from hf_specmm.drafts.gemma4_assistant import tiny_assistant
    from hf_specmm.world.step_cost import step_costs

    draft = tiny_assistant(testing.tiny_target("gemma4"))
    world = SimpleNamespace(target=testing.tiny_target("llava"), drafts={"assistant": draft}, processor=None)
    with pytest.raises(IncompatibleDraftError, match="'assistant' is a Gemma 4 assistant.*LlavaForConditional"):
        step_costs(world, example=None)
