"""Options are honoured or refused (never ignored), refusals blame what the caller passed,
tree statistics say what was drafted and verified consistently, and CLI mistakes are one line, exit code 2."""

from __future__ import annotations

import pytest
import torch

import hf_specmm
from hf_specmm import FeatureHeadDraft, UnsupportedGenerationError, testing
from hf_specmm.cli import main
from hf_specmm.train.config import TrainConfig, TrainingInputError
from conftest import batch_inputs, draft, target
from eagle3_fixtures import lagged_head
from test_train import count_forwards


# ---- 5. options silently ignored -------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["speculators", "sglang", "no-such-format"])
def test_save_formats_an_eagle1_head_has_not_are_refused(tmp_path, fmt):
    head = testing.feature_head_from_target(target("llava"))
    with pytest.raises(ValueError, match=f"format='{fmt}'.*'hf_specmm'"):
        head.save_pretrained(tmp_path / "x", format=fmt)
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="format='no-such-format'"):
        lagged_head(target("llava")).save_pretrained(tmp_path / "y", format="no-such-format")


def test_a_tree_on_a_model_without_hf_specmm_is_refused_before_any_decoding():
    """Stock generate reads the assistant's generation config before its first decoder forward (after encoding
    the image in its input preparation): refused there, no token decoded."""
    model = target("llava")
    hf_specmm.disable(model)
    tree, inputs = hf_specmm.Tree(draft("llava", "self"), 2, 2, 4), batch_inputs("llava", 1)
    calls = []
    handles = [m.register_forward_pre_hook(lambda *a: calls.append(1)) for m in (model.get_decoder(), tree.draft)]
    try:
        with pytest.raises(UnsupportedGenerationError, match="hf_specmm.enable"):
            model.generate(**inputs, max_new_tokens=4, assistant_model=tree)
    finally:
        for handle in handles:
            handle.remove()
    assert not calls


@pytest.mark.parametrize("fields, match", [
    ({"draft_kind": "text_only", "variant": "eagle3"}, "variant='eagle3' builds an EAGLE-3 head"),
    ({"draft_kind": "text_only", "ttt_steps": 3}, "ttt_steps: for EAGLE-3 heads only"),
    ({"draft_kind": "feature_head", "ttt_decay": 1.0}, "ttt_decay: for EAGLE-3 heads only"),
    ({"variant": "eagle3", "draft_vocab_size": 2.5}, r"draft_vocab_size=2\.5 \(an integer"),
])
def test_training_options_of_another_kind_are_refused(tmp_path, fields, match):
    cfg = TrainConfig(target="org/t", data=str(tmp_path / "d.jsonl"), output_dir=str(tmp_path), draft_config="tiny",
                      **fields)
    with pytest.raises(TrainingInputError, match=match):
        cfg.validate()


def test_train_cli_refuses_eagle3_flags_for_a_text_draft(tmp_path, capsys):
    code = main(["train", "--target", "org/t", "--data", str(tmp_path / "d.jsonl"), "--output-dir", str(tmp_path),
                 "--draft-config", "tiny", "--draft-kind", "text_only", "--variant", "eagle3", "--ttt-steps", "3"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "variant='eagle3'" in err and "ttt_steps" in err


@pytest.mark.parametrize("size", [2.5, True, "8"])
def test_draft_vocab_size_is_an_integer(size):
    with pytest.raises(ValueError, match="draft_vocab_size"):
        FeatureHeadDraft.for_target(target("llava"), variant="eagle3", draft_vocab_size=size)


# ---- 6. refusals that blame the wrong thing ----------------------------------------------------------------
def test_a_heuristic_gamma_written_back_is_not_blamed_on_the_caller():
    model = target("llava")
    text = testing.text_draft_from_target(model)
    inputs = batch_inputs("llava", 1)
    hf_specmm.enable(model)
    try:
        model.generate(**inputs, max_new_tokens=12, assistant_model=text, num_assistant_tokens=5,
                       num_assistant_tokens_schedule="heuristic")
        assert text.generation_config.num_assistant_tokens not in (None, 3)  # written back, as stock does
        tree = model.generate(**inputs, max_new_tokens=8, assistant_model=hf_specmm.Tree(text, 1, 3, 3))
        hf_specmm.disable(model)
        assert torch.equal(tree, model.generate(**inputs, max_new_tokens=8))
        hf_specmm.enable(model)
        with pytest.raises(UnsupportedGenerationError, match=r"num_assistant_tokens=11 \(from generate\(num_assist"):
            model.generate(**inputs, max_new_tokens=8, assistant_model=hf_specmm.Tree(text, 1, 3, 3),
                           num_assistant_tokens=11)
        # a γ in the draft's own generation config is its chain default (a checkpoint's, as Gemma 4 assistants
        # ship one): a Tree's depth and Auto's choice replace it; the target's generation config is the caller's
        text.generation_config.num_assistant_tokens = 7
        for wrapper in (hf_specmm.Tree(text, 1, 3, 3), hf_specmm.Auto(text)):
            out = model.generate(**inputs, max_new_tokens=8, assistant_model=wrapper)
            assert torch.equal(out, tree)
        model.generation_config.num_assistant_tokens = 7
        with pytest.raises(UnsupportedGenerationError, match=r"num_assistant_tokens=7 \(from the target's gen"):
            model.generate(**inputs, max_new_tokens=8, assistant_model=hf_specmm.Tree(text, 1, 3, 3))
    finally:
        model.generation_config.num_assistant_tokens = None
        text.generation_config.num_assistant_tokens = None
        hf_specmm.disable(model)


@pytest.mark.parametrize("variant", ["eagle4", "EAGLE3", None])
def test_unknown_variants_are_named(variant):
    with pytest.raises(ValueError, match=f"variant={variant!r}: choose 'eagle1'"):
        FeatureHeadDraft.for_target(target("llava"), variant=variant)


def test_a_tree_wider_than_the_vocabulary_is_refused_before_any_forward():
    model = target("llava")
    tree, inputs = hf_specmm.Tree(draft("llava", "self"), 200, 2, 300), batch_inputs("llava", 1)
    hf_specmm.enable(model)
    try:
        with count_forwards() as calls, pytest.raises(UnsupportedGenerationError, match="top_k=200: more children"):
            model.generate(**inputs, max_new_tokens=4, assistant_model=tree)
        assert calls["n"] == 0
    finally:
        hf_specmm.disable(model)


# ---- 7. tree statistics near max_new_tokens ------------------------------------------------------------------
@pytest.mark.parametrize("new", [4, 40])
def test_tree_statistics_count_every_verified_node(new):
    model = target("llava")
    hf_specmm.enable(model)
    try:
        model.generate(**batch_inputs("llava", 1), max_new_tokens=new,
                       assistant_model=hf_specmm.Tree(draft("llava", "self"), 8, 2, 16))
        stats = hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)
    assert stats.drafted_tokens == sum(map(sum, stats.nodes_per_round)) > 0
    assert stats.accepted_tokens == sum(map(sum, stats.depths_per_round))
    assert stats.acceptance_rate <= 2 / 16 + 1e-9  # at most the depth (2) of 16 verified nodes per round


# ---- 8. CLI mistakes: one line naming the argument, exit code 2, before any work -----------------------------
@pytest.mark.parametrize("argv, argument", [
    (["train", "--target", "/nonexistent", "--data", "d", "--output-dir", "o", "--draft-config", "tiny"], "--target"),
    (["train", "--target", "org/t", "--draft", "/nonexistent", "--data", "d", "--output-dir", "o"], "--draft"),
    (["train", "--target", "org/t", "--draft-config", "{bad json", "--data", "d", "--output-dir", "o"], "--draft-config"),
    (["train", "--target", "org/t", "--draft-config", "tiny", "--data", "d", "--output-dir", "o",
      "--draft-vocab-size", "2.5"], "--draft-vocab-size"),
    (["bench", "--device", "foo"], "--device"),
    (["demo", "--checkpoints", "/nonexistent"], "--checkpoints"),
    (["world-tau", "--checkpoints", "/nonexistent"], "--checkpoints"),
])
def test_cli_mistakes_are_one_line(argv, argument, capsys):
    with count_forwards() as calls, pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and calls["n"] == 0
    assert "\n" not in err and f"argument {argument}" in err and "Traceback" not in err


def test_bench_tree_wider_than_the_vocabulary_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--preset", "tiny", "--max-new-tokens", "2", "--repeats", "1", "--warmup", "0", "--no-stock",
              "--tree", "200,2,300", "--out", str(tmp_path)])
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar: the one error line
    assert exit_info.value.code == 2 and last.startswith("hf-specmm bench: error: ") and "top_k=200" in last
