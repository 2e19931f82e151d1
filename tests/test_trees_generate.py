"""Draft trees in generate: ``assistant_model=hf_specmm.Tree(draft, top_k, depth, nodes)``.

Greedy outputs equal plain generate for every family and draft kind (batch 1 and 3, left padding, images,
rows finishing at EOS at different steps); exact copies are accepted along the full depth of every round;
``Tree(draft, 1, γ, γ)`` is the chain (outputs, target forwards, statistics); sampling keeps the target's
distribution (χ², three families); options with no tree meaning are refused before any forward.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import hf_specmm
from hf_specmm import testing
from hf_specmm.trees import TreeShape
from conftest import batch_inputs, draft, target, refused_kind
from test_sampling import ALPHA, chi2_homogeneity_pvalue, noisy_copy

SHAPES = ((2, 3, 5), (4, 3, 12))
NEW = 16


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


@functools.lru_cache(maxsize=None)
def sharp_target(family: str):
    """The tiny target with its logits scaled ×20: every argmax is far ahead, so an exact copy's greedy path
    is its most probable one and EAGLE-2's ranking keeps it whole (random tiny LMs are nearly flat)."""
    model = copy.deepcopy(target(family))
    head = model.get_output_embeddings()
    if model.get_input_embeddings().weight is head.weight:  # tied: untie, so only the logits sharpen
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
    head.weight.data.mul_(20.0)
    text = model.config.get_text_config()
    if getattr(text, "final_logit_softcapping", None):  # Muse Glimmer: the cap scaled too, or it flattens the top
        text.final_logit_softcapping *= 20.0
    return model


def exact_drafts(family: str, model) -> dict[str, object]:
    """Drafts of every kind that are exact copies of ``model`` on the rows they can read."""
    text = testing.text_draft_from_target(model)
    builders = {
        "text_only": lambda: text,
        "image_adapter": lambda: hf_specmm.ImageAdapterDraft.for_target(model, text, copy_projector=True),
        "vlm": lambda: copy.deepcopy(model),
        "feature_head": lambda: testing.feature_head_from_target(model),
    }
    return {kind: build() for kind, build in builders.items() if not refused_kind(family, kind)}


def generate(model, inputs, **kwargs):
    hf_specmm.enable(model)
    try:
        return model.generate(**inputs, do_sample=False, **kwargs), hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)


def assert_full_depth(stats, name: str) -> None:
    """Every row accepted each round's whole depth (γ of that round: the tree's depth, less near max_length),
    except in its last round (EOS may cut it)."""
    checked = 0
    for row in zip(*stats.tokens_per_round):
        live = [(kept, gamma) for kept, gamma in zip(row, stats.gammas) if kept > 0]
        for kept, gamma in live[:-1]:
            assert kept == gamma + 1, (name, stats.gammas, stats.tokens_per_round)
            checked += 1
    assert checked > 0 and stats.mean_accepted_depth > 1, (name, stats.tokens_per_round)


@pytest.mark.parametrize("family", testing.TREE_FAMILIES)
@pytest.mark.parametrize("batch", (1, 3))
def test_tree_greedy_parity_text_drafts(family, batch):
    model = target(family)
    inputs = batch_inputs(family, batch)
    plain = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    for kind in ("self", "random"):
        for shape in SHAPES:
            out, stats = generate(model, inputs, max_new_tokens=NEW, assistant_model=hf_specmm.Tree(draft(family, kind), *shape))
            assert torch.equal(out, plain), f"{family} batch={batch} {kind} {shape}:\n{out}\n!=\n{plain}"
            assert stats.drafted_tokens > 0 and stats.tree_nodes_per_round <= shape[2]
            if kind == "self":
                assert stats.target_forwards < stats.generated_tokens


@pytest.mark.parametrize("family", testing.TREE_FAMILIES)
def test_every_draft_kind_parity_and_exact_copies_accept_the_full_depth(family):
    """Batch of 3, left-padded, images of two sizes and a row without one. The vlm copy and the feature head
    copy read the images: they must accept every round's whole depth. Text-only copies on text prompts too."""
    model = sharp_target(family)
    inputs = batch_inputs(family, 3)
    text_inputs = batch_inputs(family, 3, with_images=False)
    plain = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    plain_text = model.generate(**text_inputs, max_new_tokens=NEW, do_sample=False)
    for name, d in exact_drafts(family, model).items():
        tree = hf_specmm.Tree(d, top_k=3, depth=4, nodes=10)
        out, stats = generate(model, inputs, max_new_tokens=NEW, assistant_model=tree)
        assert torch.equal(out, plain), f"{family} {name}:\n{out}\n!=\n{plain}"
        exact = name != "feature_head" or testing.feature_head_is_exact(model)  # Gemma 4 heads: in part
        if name in ("vlm", "feature_head") and exact:
            assert_full_depth(stats, f"{family} {name}")
        out, stats = generate(model, text_inputs, max_new_tokens=NEW, assistant_model=tree)
        assert torch.equal(out, plain_text), f"{family} {name} text:\n{out}\n!=\n{plain_text}"
        if exact:
            assert_full_depth(stats, f"{family} {name} text")


@pytest.mark.parametrize("family,seed,bias", (("llava", 3, 3.0), ("qwen2_5_vl", 4, 2.0), ("gemma3", 3, 3.0),
                                              ("internvl", 4, 2.0)))
def test_rows_finish_at_eos_at_different_steps(family, seed, bias):
    model = testing.tiny_target(family, seed=seed, eos_bias=bias)
    inputs = batch_inputs(family, 3)
    plain = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    eos = torch.tensor(model.generation_config.eos_token_id).flatten()
    new = plain[:, inputs["input_ids"].shape[1]:]
    ends = {int(torch.isin(row, eos).long().argmax()) if torch.isin(row, eos).any() else len(row) for row in new}
    assert len(ends) > 1, "rows must stop at different steps for this test to mean anything"
    for d in (testing.text_draft_from_target(model), testing.random_text_draft(model)):
        for shape in ((2, 4, 8), (1, 3, 3)):
            out, _ = generate(model, inputs, max_new_tokens=24, assistant_model=hf_specmm.Tree(d, *shape))
            assert torch.equal(out, plain), f"{family} {shape}:\n{out}\n!=\n{plain}"


@pytest.mark.parametrize("family", ("llava", "qwen2_vl", "gemma3", "internvl"))
def test_top1_tree_is_the_chain(family):
    """``Tree(draft, 1, γ, γ)``: same outputs, same target forwards, same statistics as the chain of γ."""
    model = target(family)
    inputs = batch_inputs(family, 3)
    for kind in ("self", "random"):
        for gamma in (1, 3, 5):
            chain, chain_stats = generate(model, inputs, max_new_tokens=NEW, assistant_model=draft(family, kind),
                                          num_assistant_tokens=gamma)
            tree, tree_stats = generate(model, inputs, max_new_tokens=NEW,
                                        assistant_model=hf_specmm.Tree(draft(family, kind), 1, gamma, gamma))
            assert torch.equal(tree, chain)
            a, b = chain_stats.as_dict(), tree_stats.as_dict()
            for key in ("wall_time_s", "tokens_per_s"):
                a.pop(key), b.pop(key)
            assert a == b, (family, kind, gamma)
            assert chain_stats.tokens_per_round == tree_stats.tokens_per_round


def test_return_dict_scores_and_logits_along_the_accepted_path():
    model = target("llava")
    inputs = batch_inputs("llava", 3)
    kwargs = dict(max_new_tokens=NEW, return_dict_in_generate=True, output_scores=True, output_logits=True)
    plain = model.generate(**inputs, do_sample=False, **kwargs)
    out, stats = generate(model, inputs, assistant_model=hf_specmm.Tree(draft("llava", "self"), 3, 3, 8), **kwargs)
    assert torch.equal(out.sequences, plain.sequences) and stats.target_forwards < stats.generated_tokens
    assert len(out.scores) == len(plain.scores) and len(out.logits) == len(plain.logits)
    for ours, theirs in zip(out.scores + out.logits, plain.scores + plain.logits):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_options_with_no_tree_meaning_are_refused_before_any_forward():
    model = target("llava")
    inputs = batch_inputs("llava", 2)
    tree = hf_specmm.Tree(draft("llava", "self"), top_k=2, depth=3, nodes=5)
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    hf_specmm.enable(model)
    try:
        for extra, named in ((dict(assistant_confidence_threshold=0.4), "assistant_confidence_threshold"),
                             (dict(num_assistant_tokens_schedule="heuristic"), "num_assistant_tokens_schedule"),
                             (dict(num_assistant_tokens=5), "num_assistant_tokens=5"),
                             (dict(return_dict_in_generate=True, output_hidden_states=True), "output_hidden_states"),
                             (dict(cache_implementation="static"), "cache_implementation='static'")):
            with pytest.raises(hf_specmm.UnsupportedGenerationError, match=named):
                model.generate(**inputs, max_new_tokens=4, assistant_model=tree, **extra)
        assert calls == []
        out = model.generate(**inputs, max_new_tokens=4, do_sample=False, assistant_model=tree, num_assistant_tokens=3)
        assert out.shape[1] == inputs["input_ids"].shape[1] + 4  # γ equal to the depth is its natural meaning
    finally:
        handle.remove()
        hf_specmm.disable(model)
    for bad in (dict(top_k=0), dict(depth=1.5), dict(top_k=2, depth=2, nodes=7)):
        with pytest.raises(ValueError, match="Tree"):
            hf_specmm.Tree(draft("llava", "self"), **{**dict(top_k=2, depth=3, nodes=4), **bad})
    with pytest.warns(FutureWarning, match="nodes="):  # the count's former name
        assert hf_specmm.Tree(draft("llava", "self"), 2, 3, tokens=6).shape == TreeShape(2, 3, 6)
    with pytest.raises(ValueError, match="once"):
        hf_specmm.Tree(draft("llava", "self"), 2, 3, nodes=6, tokens=6)


@pytest.mark.parametrize("family,kind", (("llava", "text_only"), ("qwen2_5_vl", "image_adapter"),
                                         ("gemma3", "feature_head")))
def test_tree_sampling_matches_plain_sampling(family, kind):
    """χ² homogeneity per position (as tests/test_sampling.py) between plain sampling and tree sampling."""
    rows, new = 600, 4
    model = testing.tiny_target(family, seed=0, eos_bias=-30.0)
    inputs = testing.make_inputs(family, testing.tiny_processor(family), ["what color is the circle ?"] * rows,
                                 [testing.tiny_image(0)] * rows)
    sampling = dict(do_sample=True, temperature=0.9, top_k=40, max_new_tokens=new)
    torch.manual_seed(1)
    plain = model.generate(**inputs, **sampling)[:, -new:]
    d = {"text_only": lambda: noisy_copy(model),
         "image_adapter": lambda: hf_specmm.ImageAdapterDraft.for_target(model, noisy_copy(model)),
         "feature_head": lambda: testing.feature_head_from_target(model, noise=0.3)}[kind]()
    hf_specmm.enable(model)
    try:
        torch.manual_seed(2)
        ours = model.generate(**inputs, **sampling, assistant_model=hf_specmm.Tree(d, top_k=3, depth=3, nodes=6))
        stats = hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)
    assert stats.accepted_tokens > 0 and stats.target_forwards < stats.generated_tokens
    vocab = model.config.get_text_config().vocab_size
    for position in range(new):
        p, stat, dof = chi2_homogeneity_pvalue(plain[:, position], ours[:, -new + position], vocab)
        assert p > ALPHA, f"{family} {kind} position {position}: χ²={stat:.1f} dof={dof} p={p:.2e}"


def test_tree_chi2_has_power_against_a_verifier_that_keeps_the_draft_path(monkeypatch):
    """The χ² test above flags a tree verifier that is not lossless (greedy acceptance under sampling)."""
    from hf_specmm import block
    from hf_specmm.trees import greedy_verify_tree

    monkeypatch.setattr(block, "sample_verify_tree", lambda tree, probs: greedy_verify_tree(tree, probs))
    with pytest.raises(AssertionError, match="χ²"):
        test_tree_sampling_matches_plain_sampling("llava", "text_only")


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl", "gemma3"])
def test_history_reading_processors_see_each_nodes_root_path(family):
    """Repetition penalty, n-gram bans and min_new_tokens read the token history: each tree node (draft side and
    target side) is processed with its row's history plus its own root path, so the output equals plain's."""
    model = testing.tiny_target(family, seed=3, eos_bias=2.0)
    inputs = batch_inputs(family, 3)
    kwargs = dict(max_new_tokens=20, do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=3)
    plain = model.generate(**inputs, **kwargs)
    hf_specmm.enable(model)
    try:
        for d in (testing.text_draft_from_target(model), testing.random_text_draft(model)):
            for shape in ((2, 3, 5), (3, 4, 10)):
                tree = hf_specmm.Tree(d, top_k=shape[0], depth=shape[1], nodes=shape[2])
                out = model.generate(**inputs, **kwargs, assistant_model=tree)
                assert torch.equal(out, plain), f"{family} {shape}"
                assert hf_specmm.last_stats(model).drafted_tokens > 0
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("family", ("llava", "qwen2_vl"))
def test_pipeline_generate_kwargs_take_a_tree(family):
    from transformers import pipeline

    model = testing.tiny_target(family)
    pipe = pipeline("image-text-to-text", model=model, processor=testing.tiny_processor(family))
    marker = testing.image_marker(family)
    images = [[testing.tiny_image(10 + i, s)] for i, s in enumerate([(32, 32), (64, 32)])]
    texts = [f"{marker} what color is the circle ?", f"{marker} describe the image"]

    def call(extra):
        return pipe(images=images, text=texts, batch_size=2,
                    generate_kwargs={"max_new_tokens": 12, "do_sample": False, **extra})

    plain = call({})
    hf_specmm.enable(pipe.model)
    try:
        tree = hf_specmm.Tree(testing.text_draft_from_target(pipe.model), top_k=3, depth=4, nodes=8)
        assert call({"assistant_model": tree}) == plain
        stats = hf_specmm.last_stats(pipe.model)
        assert stats.batch_size == 2 and max(max(r) for r in stats.nodes_per_round) == 8 and stats.accepted_tokens > 0
    finally:
        hf_specmm.disable(pipe.model)

