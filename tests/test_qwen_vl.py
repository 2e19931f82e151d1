"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL targets: 3-D M-RoPE positions after rollback and across left-padded
rows with different numbers and sizes of images (and videos), text-only drafts that read the
conversation without vision spans and never propose a placeholder or marker, the draft kinds, and what
stock transformers does with the same pair. (The shared matrices over ``testing.FAMILIES`` cover
these families too: parity, self-drafts, VLM and adapter drafts, bad input.)"""

from __future__ import annotations

import copy

import pytest
import torch

import hf_specmm
from hf_specmm import testing
from hf_specmm.testing import qwen_vl as qwen
from hf_specmm.drafts.text_only.drafter import text_only_view
from hf_specmm.targets import positions as positions_module
from hf_specmm.targets import target_spec
from hf_specmm.vocab import VocabMap, draft_vocab_size
from hf_specmm.caches import DynamicBackend
from conftest import PROMPTS, processor, target

FAMILIES = qwen.QWEN_FAMILIES


def mixed_inputs(family: str, batch: int = 3):
    """Row 0: two images of different sizes; row 1: text only; row 2: a video and an image."""
    images = [[testing.tiny_image(0, (64, 32)), testing.tiny_image(1)], None, [testing.tiny_image(2, (32, 64))]]
    videos = [None, None, (4, (32, 32), 5)]
    return testing.make_inputs(family, processor(family), PROMPTS[:batch], images[:batch], videos=videos[:batch])


def noised_text_copy(model, scale: float = 0.5):
    return testing.perturb_head(testing.text_draft_from_target(model), scale)


def _plain(model, inputs, **kw):
    hf_specmm.disable(model)
    return model.generate(**inputs, max_new_tokens=20, do_sample=False, **kw)


@pytest.mark.parametrize("family", FAMILIES)
def test_several_images_and_videos_per_row_greedy_parity(family):
    model = target(family)
    inputs = mixed_inputs(family)
    assert int((inputs["image_grid_thw"]).shape[0]) == 3 and inputs["video_grid_thw"].shape[0] == 1
    plain = _plain(model, inputs)
    drafts = {"random": testing.random_text_draft(model), "self": testing.text_draft_from_target(model),
              "noised": noised_text_copy(model), "vlm": copy.deepcopy(model)}
    hf_specmm.enable(model)
    try:
        for name, d in drafts.items():
            for gamma in (1, 3, 5):
                out = model.generate(**inputs, max_new_tokens=20, do_sample=False, assistant_model=d,
                                     num_assistant_tokens=gamma)
                assert torch.equal(out, plain), f"{family} {name} γ={gamma}\n{out}\n{plain}"
                stats = hf_specmm.last_stats(model)
                if name == "vlm":  # the exact copy sees the images and the video: everything accepted
                    assert stats.acceptance_rate == 1.0, stats.tokens_per_round
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_wrong_positions_would_be_caught(family, monkeypatch):
    """Strictness: with M-RoPE treated as 1-D after the prompt (the deltas dropped), the same parity check
    fails, so the tests above do exercise the position rule after rollbacks and holes."""
    model = target(family)
    inputs = mixed_inputs(family)
    plain = _plain(model, inputs)
    init = positions_module.BoundMRope.__init__

    def no_deltas(self, prompt, attention_mask=None):
        init(self, prompt, attention_mask)
        self.deltas = torch.zeros_like(self.deltas)

    monkeypatch.setattr(positions_module.BoundMRope, "__init__", no_deltas)
    hf_specmm.enable(model)
    try:
        out = model.generate(**inputs, max_new_tokens=20, do_sample=False,
                             assistant_model=testing.random_text_draft(model), num_assistant_tokens=3)
    finally:
        hf_specmm.disable(model)
    assert not torch.equal(out, plain)


@pytest.mark.parametrize("family", FAMILIES)
def test_bound_rule_numbers_answers_as_the_model_numbers_the_whole_sequence(family):
    """[prompt | answer] positions from the rule == the model's own get_rope_index over the whole sequence
    (what training feeds the target), for left-padded rows with images and a video."""
    model = target(family)
    inputs = mixed_inputs(family)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    answer = torch.randint(3, 90, (3, 6))
    answer_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0]])
    full_ids, full_mask = torch.cat([ids, answer], 1), torch.cat([mask, answer_mask], 1)
    mm = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(answer)], 1)
    expected, _ = model.model.get_rope_index(full_ids, mm_token_type_ids=mm, image_grid_thw=inputs["image_grid_thw"],
                                             video_grid_thw=inputs["video_grid_thw"], attention_mask=full_mask)
    rule = hf_specmm.targets.MROPE.bind(model, ids, mask, dict(inputs))
    got = rule.prompt_positions(full_mask)
    valid = full_mask.bool()
    assert torch.equal(got[1:][:, valid], expected[:, valid])
    assert torch.equal(got[0][valid], (full_mask.cumsum(-1) - 1)[valid])  # the text row (attention mask)
    assert (rule.deltas != 0).all(dim=0)[[0, 2]].all()  # rows with images/video run off the text row


@pytest.mark.parametrize("family", FAMILIES)
def test_text_only_draft_never_sees_or_proposes_vision_ids(family):
    model = target(family)
    spec = target_spec(model)
    marks = {qwen.IMAGE_ID, qwen.VIDEO_ID, qwen.VISION_START_ID, qwen.VISION_END_ID}
    assert spec.dropped_ids == marks and marks <= spec.reserved_ids
    assert spec.vocab_size == qwen.TARGET_VOCAB[family]  # 136 (152064) or 128 (151936) rows
    draft = testing.random_text_draft(model)
    assert draft_vocab_size(draft) == qwen.DRAFT_VOCAB and max(marks) < qwen.DRAFT_VOCAB  # inside the draft's vocab
    vocab = VocabMap(spec, draft_vocab_size(draft), model.device)
    assert not vocab.proposable[sorted(marks)].any()
    assert not vocab.proposable[qwen.DRAFT_VOCAB:].any() and vocab.proposable[: qwen.IMAGE_ID - 3].all()
    mapped = vocab.to_target(torch.zeros(2, qwen.DRAFT_VOCAB))  # even a draft preferring them cannot pick them
    assert torch.isinf(mapped[:, sorted(marks)]).all()
    inputs = mixed_inputs(family)
    ids, valid = text_only_view(vocab, inputs["input_ids"], inputs["attention_mask"])
    assert not torch.isin(ids[valid], torch.tensor(sorted(marks))).any()
    for row in range(3):  # the same text, in order, with the spans removed
        keep = inputs["attention_mask"][row].bool() & ~torch.isin(inputs["input_ids"][row], torch.tensor(sorted(marks)))
        assert ids[row][valid[row]].tolist() == inputs["input_ids"][row][keep].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_stock_refuses_the_text_draft_hf_specmm_runs_it(family):
    """Stock 5.23 assisted generation hands the target's mm_token_type_ids to the text draft and raises."""
    model = target(family)
    inputs = mixed_inputs(family, batch=1)
    draft = testing.text_draft_from_target(model)
    hf_specmm.disable(model)
    with pytest.raises(ValueError) as info:
        model.generate(**inputs, max_new_tokens=8, do_sample=False, assistant_model=draft)
    assert "mm_token_type_ids" in str(info.value) and not isinstance(info.value, hf_specmm.SpecMMError)
    plain = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    hf_specmm.enable(model)
    try:
        assert torch.equal(model.generate(**inputs, max_new_tokens=8, do_sample=False, assistant_model=draft), plain)
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_adapter_draft_reads_the_targets_own_image_embeddings(family):
    """The capture hook on target.get_decoder() sees inputs_embeds: at the placeholder slots they are the
    target's merged vision features (images, then the video), and the adapter draft stays lossless."""
    model = testing.tiny_target(family, eos_bias=-30.0)
    inputs = mixed_inputs(family)
    draft = hf_specmm.ImageAdapterDraft.for_target(model, testing.text_draft_from_target(model), copy_projector=True)
    drafter = hf_specmm.kind_of(draft).drafter(draft, VocabMap(target_spec(model), draft_vocab_size(draft),
                                                                model.device))
    with torch.no_grad(), drafter.watch(model):
        model(**inputs)
        images = torch.cat(model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output)
        video = torch.cat(model.get_video_features(inputs["pixel_values_videos"],
                                                   inputs["video_grid_thw"]).pooler_output)
    captured = drafter.target_embeds
    assert captured is not None
    ids = inputs["input_ids"]
    torch.testing.assert_close(captured[ids == qwen.IMAGE_ID], images)
    torch.testing.assert_close(captured[ids == qwen.VIDEO_ID], video)
    plain = _plain(model, inputs)
    hf_specmm.enable(model)
    try:
        for gamma in (1, 3, 5):
            out = model.generate(**inputs, max_new_tokens=20, do_sample=False, assistant_model=draft,
                                 num_assistant_tokens=gamma)
            assert torch.equal(out, plain), f"{family} γ={gamma}"
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_exact_text_copy_accepts_everything_on_text_prompts(family):
    model = testing.tiny_target(family, eos_bias=-30.0)
    inputs = testing.make_inputs(family, processor(family), PROMPTS, [None] * 3)
    plain = model.generate(**inputs, max_new_tokens=19, do_sample=False)
    hf_specmm.enable(model)
    for gamma in (1, 3, 5):
        out = model.generate(**inputs, max_new_tokens=19, do_sample=False,
                             assistant_model=testing.text_draft_from_target(model), num_assistant_tokens=gamma)
        assert torch.equal(out, plain)
        stats = hf_specmm.last_stats(model)
        assert stats.acceptance_rate == 1.0 and stats.generated_tokens == 57
        assert all(r == [gamma + 1] * 3 for r in stats.tokens_per_round[:-1]), stats.tokens_per_round


def test_speculative_sampling_matches_plain_on_qwen2_5_vl():
    """One χ² case (see tests/test_sampling.py): a noised copy of the LM as text draft, prompts with an image,
    600 rows per method; every generated position's token distribution equals plain sampling's."""
    from test_sampling import ALPHA, NEW, _samples, chi2_homogeneity_pvalue, noisy_copy

    family = "qwen2_5_vl"
    model = testing.tiny_target(family, seed=0, eos_bias=-30.0)
    plain = _samples(model, family, seed=1)
    hf_specmm.enable(model)
    try:
        spec = _samples(model, family, noisy_copy(model, scale=0.3), seed=2)
        stats = hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)
    assert 0.0 < stats.acceptance_rate < 0.9, stats.acceptance_rate
    for pos in range(NEW):
        p, stat, dof = chi2_homogeneity_pvalue(plain[:, pos], spec[:, pos], model.config.text_config.vocab_size)
        print(f"{family} pos {pos}: chi2={stat:.1f} dof={dof} p={p:.3g} acceptance={stats.acceptance_rate:.2f}")
        assert p > ALPHA, f"position {pos}: χ²={stat:.1f} (dof {dof}), p={p:.2g} < {ALPHA}"


def test_bench_tiny_qwen_preset_runs_losslessly():
    """The tiny version of the qwen2.5-vl-7b-shape preset (same builder path, fixture-sized) runs every mode."""
    from hf_specmm.bench import BenchConfig, run_benchmark
    from hf_specmm.bench.presets import PRESETS, build_preset, synthetic_inputs

    assert "qwen2.5-vl-7b-shape" in PRESETS
    preset = build_preset("tiny-qwen2.5-vl")
    inputs = synthetic_inputs(preset, 2, 12)
    assert (inputs["input_ids"] == qwen.IMAGE_ID).sum() == 2 * 16 and inputs["image_grid_thw"].shape == (2, 3)
    result = run_benchmark(BenchConfig(preset="tiny-qwen2.5-vl", gammas=[3], batch_sizes=[2], acceptance=1.0,
                                       max_new_tokens=16, repeats=1, warmup=0), progress=False)
    (row,) = result["rows"]
    # α = 1: every draft is right except where the reference holds an id past the draft's vocabulary (the
    # target's extra rows), a miss for every method. Rounds replayed here from the reference alone:
    reference = preset.target.generate(**inputs, max_new_tokens=16, do_sample=False)[:, inputs["input_ids"].shape[1]:]
    readable = (reference < draft_vocab_size(preset.draft)).tolist()
    per_row = []  # tokens kept per round, per row (after the prefill's token 0)
    for ok in readable:
        kept, k = [], 0
        while k < 15:
            n = 0
            while n < 3 and k + n + 1 < 16 and ok[k + n + 1]:
                n += 1
            kept.append(min(n + 1, 15 - k))
            k += kept[-1]
        per_row.append(kept)
    rounds = [n for kept in per_row for n in kept]
    steady = [n for kept in per_row for n in kept[:-1]]
    assert row["lossless"] is True and row["rounds"] == max(len(kept) for kept in per_row)
    assert row["tau"] == pytest.approx(sum(rounds) / len(rounds))
    assert row["tau_steady"] == pytest.approx(sum(steady) / len(steady))
    assert (row["acceptance"] == 1.0) == all(all(ok[1:]) for ok in readable)


def test_bench_qwen2_5_vl_7b_shape_configs():
    """The 7B preset's configs without allocating 8B parameters: built on the meta device."""
    from hf_specmm.bench.presets_qwen import _draft_0_5b, _target_7b

    target, draft = _target_7b(torch.bfloat16, "meta"), _draft_0_5b(torch.bfloat16, "meta")
    assert type(target).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert target.config.text_config.vocab_size == 152064 and draft.config.vocab_size == 151936
    n_target = sum(p.numel() for p in target.parameters())
    n_draft = sum(p.numel() for p in draft.parameters())
    assert 8.0e9 < n_target < 8.5e9 and 0.45e9 < n_draft < 0.5e9, (n_target, n_draft)
    spec = target_spec(target)
    assert spec.reserved_ids == {151652, 151653, 151655, 151656} and spec.text_vocab_end == 151655


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_pipeline_image_text_to_text_with_a_text_draft(family):
    """pipeline("image-text-to-text") with chat messages (images in them), batch 3, a Qwen2/Qwen3 text draft."""
    from transformers import pipeline

    model = testing.tiny_target(family)
    pipe = pipeline("image-text-to-text", model=model, processor=testing.tiny_processor(family))
    images = [testing.tiny_image(0), testing.tiny_image(1, (64, 32)), testing.tiny_image(2, (32, 64))]
    chats = [[{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": p}]}]
             for img, p in zip(images, PROMPTS)]

    def call(extra):
        return pipe(text=chats, batch_size=3, generate_kwargs={"max_new_tokens": 12, "do_sample": False, **extra})

    plain = call({})
    replies = [r[0]["generated_text"][-1]["content"] if isinstance(r, list) else r["generated_text"][-1]["content"]
               for r in plain]
    assert all(replies) and len(set(replies)) > 1, replies
    hf_specmm.enable(pipe.model)
    try:
        for d in (testing.text_draft_from_target(model), testing.random_text_draft(model)):
            assert call({"assistant_model": d}) == plain
            assert hf_specmm.last_stats(pipe.model).batch_size == 3
    finally:
        hf_specmm.disable(pipe.model)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_train_cli_with_a_saved_qwen_target(family, tmp_path, monkeypatch):
    """`hf-specmm train --target <saved tiny Qwen-VL>`: a fresh Qwen2/Qwen3 draft of the target's text family
    is distilled (M-RoPE positions for the target's teacher forward) and then drafts losslessly.
    The Qwen processors' AutoProcessor load needs torchvision (their video processor), which this test
    environment lacks: the processor load alone is replaced by the tiny processor saved beside the model."""
    import json

    import hf_specmm.train.models as train_models
    from hf_specmm.cli import main

    folder = tmp_path / f"tiny-{family}"
    model, proc = testing.tiny_target(family, eos_bias=-30.0), testing.tiny_processor(family)
    model.save_pretrained(folder)
    proc.tokenizer.save_pretrained(folder)
    proc.image_processor.save_pretrained(folder)

    class _Processors:
        @staticmethod
        def from_pretrained(name, *args, **kwargs):
            assert str(name) == str(folder), name
            return testing.tiny_processor(family)

    monkeypatch.setattr(train_models, "AutoProcessor", _Processors)
    (tmp_path / "imgs").mkdir()
    lines = []
    for i in range(12):
        image = None
        if i % 2:
            image = f"im{i}.png"
            testing.tiny_image(i, (32, 64) if i % 4 == 1 else (32, 32)).save(tmp_path / "imgs" / image)
        lines.append({"image": image, "prompt": PROMPTS[i % 3]})
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = tmp_path / "run"
    assert main(["train", "--target", str(folder), "--data", str(data), "--images", str(tmp_path / "imgs"),
                 "--output-dir", str(out), "--steps", "6", "--draft-config", "tiny", "--max-new-tokens", "6",
                 "--gamma", "3", "--eval-fraction", "0.25", "--batch-size", "4", "--no-progress"]) == 0
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["tau_after"]["prompts"] == 3
    draft = hf_specmm.load_draft(str(out / "draft"))
    assert type(draft).__name__ == ("Qwen3ForCausalLM" if family == "qwen3_vl" else "Qwen2ForCausalLM")
    inputs = testing.make_inputs(family, proc, PROMPTS, [testing.tiny_image(0), None, testing.tiny_image(1)])
    plain = model.generate(**inputs, max_new_tokens=10, do_sample=False)
    hf_specmm.enable(model)
    assert torch.equal(model.generate(**inputs, max_new_tokens=10, do_sample=False, assistant_model=draft), plain)


@pytest.mark.parametrize("family,kind", [("qwen2_5_vl", "vlm"), ("qwen3_vl", "image_adapter"),
                                         ("qwen2_vl", "text_only")])
def test_training_view_equals_the_inference_path(family, kind, tmp_path):
    """As tests/test_train.py's test of the same name, for M-RoPE targets: column r of a padded, mixed
    training batch equals a single-row forward over prompt + r answer tokens (positions by the model's own
    get_rope_index), and the first answer position of the draft's training view equals its inference prefill."""
    from hf_specmm.drafter import Prompt
    from hf_specmm.train import TrainConfig
    from hf_specmm.train.data import Example, encode_prompts, make_batch
    from hf_specmm.train.trainer import Trainer

    target, proc = testing.tiny_target(family, eos_bias=-30.0), testing.tiny_processor(family)
    testing.tiny_image(0).save(tmp_path / "a.png")
    testing.tiny_image(1, (64, 32)).save(tmp_path / "b.png")
    examples = [Example(1, "t", "describe the image", image=tmp_path / "a.png", response_ids=[5, 6, 7]),
                Example(2, "t", "what color is the circle ?", response_ids=[8, 9]),
                Example(3, "t", "how many dog", image=tmp_path / "b.png", response_ids=[10, 11, 12, 13])]
    draft = {"vlm": lambda: testing.tiny_target(family, seed=1),
             "image_adapter": lambda: hf_specmm.ImageAdapterDraft.for_target(target, testing.random_text_draft(target)),
             "text_only": lambda: testing.random_text_draft(target)}[kind]()
    assert hf_specmm.kind_of(draft).name == kind
    vocab = VocabMap(target_spec(target), draft_vocab_size(draft), target.device)
    trainer = Trainer(TrainConfig(target="t", data="d", output_dir=str(tmp_path), draft_config="tiny"), target,
                      proc, draft, vocab, examples, {"global_step": 0, "stage": 0, "stage_step": 0})
    batch = make_batch(proc, examples, "auto", qwen.PAD_ID, "cpu")
    stage = hf_specmm.get_kind(kind).stages[-1]
    with torch.no_grad():
        view = trainer.view(stage)
        t_logits = trainer._target_logits(batch, view)
        trained = trainer._draft_logits(batch, view)[:, 0]
        for i, e in enumerate(examples):
            single = encode_prompts(proc, [e], "auto", "cpu")
            for r in range(len(e.response_ids)):
                answer = torch.tensor([e.response_ids[:r]], dtype=torch.long)
                ids = torch.cat([single["input_ids"], answer], 1)
                rest = {k: v for k, v in single.items() if k not in ("input_ids", "attention_mask")}
                rest["mm_token_type_ids"] = torch.cat([rest["mm_token_type_ids"], torch.zeros_like(answer)], 1)
                plain = target(input_ids=ids, attention_mask=torch.ones_like(ids), **rest).logits[0, -1]
                torch.testing.assert_close(plain, t_logits[i, r], atol=1e-5, rtol=1e-5)
    inputs = encode_prompts(proc, examples, "auto", "cpu")
    images = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    drafter = trainer.view(stage)
    seen = []
    forward = drafter.forward
    drafter.forward = lambda *a, **k: seen.append(forward(*a, **k)) or seen[-1]
    with torch.no_grad():
        with drafter.watch(target):
            target(**inputs)
        drafter.prefill(Prompt(inputs["input_ids"], inputs["attention_mask"], images), torch.zeros(3, dtype=torch.long),
                            DynamicBackend().new)
    n = min(trained.shape[-1], seen[0].shape[-1])  # a text draft's own 128 rows vs the target's 136
    cols = vocab.proposable[:n]
    torch.testing.assert_close(seen[0][:, :n][:, cols], trained[:, :n][:, cols], atol=1e-5, rtol=1e-5)
