"""Inkling on static caches (``cache_implementation="static"``): each row's conv states and logits after rollbacks
on a static cache are those of a fresh run over the row's kept tokens, holes moved to each row's left end (its
relative position bias reads cache columns), query columns read as a dynamic cache gives them; greedy output equals
plain ``generate``'s for every chain draft at γ 1..4, batch 1 and 3; sampling keeps the target's distribution;
what stays refused is refused before any forward."""

from __future__ import annotations

import pytest
import torch

import hf_specmm
from hf_specmm import _compat, testing
from hf_specmm.caches import StaticSlottedCache
from hf_specmm.caches.short_conv import ShortConvStates
from hf_specmm.errors import SpecMMError
from hf_specmm.targets import target_family

if not _compat.INKLING_SUPPORTED:
    pytest.skip("Inkling needs transformers >= 5.25", allow_module_level=True)

from conftest import batch_inputs  # noqa: E402
from test_bad_inputs import count_forwards  # noqa: E402
from test_sampling import ALPHA, NEW, _samples, chi2_homogeneity_pvalue, noisy_copy  # noqa: E402

FAMILY = "inkling"
STATIC = dict(do_sample=False, cache_implementation="static")
WIDTH = 4
# block slots kept per row and round (0: none of the block): rows keep different counts, so holes are made every
# round, and a capacity short of the rounds' total makes the cache compact them away to fit a block
KEPT = [[4, 1, 2], [1, 4, 0], [2, 2, 4], [0, 1, 1], [4, 3, 1], [1, 4, 2], [3, 0, 4], [4, 4, 4]]


@pytest.fixture(scope="module")
def model():
    return testing.tiny_target(FAMILY, eos_bias=-30.0)


def _fresh(model, ids):
    """Logits [L, V] and the dynamic cache of one forward over ``ids`` (one row, no padding)."""
    cache = _compat.new_dynamic_cache(model)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), use_cache=True, **_compat.cache_kwargs(cache)).logits[0]
    return logits, cache


def test_rollback_on_a_static_cache_leaves_each_row_as_a_fresh_run_of_its_kept_tokens(model):
    """Batch of 3 left-padded text rows on a StaticCache; rounds of 4-token blocks, rows keeping 0-4 of each: every
    block's logits equal a fresh run over the row's kept tokens and the block, and after each rollback every
    layer's four conv states equal a fresh run over the row's kept tokens alone."""
    inputs = batch_inputs(FAMILY, 3, with_images=False)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    positions = target_family(model).positions.bind(model, ids, mask, dict(inputs))
    with torch.no_grad():
        kv = StaticSlottedCache.from_prefill(model, inputs, ids.shape[1] + 20, positions)
    assert isinstance(kv.linear, ShortConvStates) and kv.compact and _compat.is_static_cache(kv.cache)
    kept = [ids[b][mask[b].bool()].tolist() for b in range(3)]
    gen = torch.Generator().manual_seed(0)
    compactions = 0
    try:
        for step, counts in enumerate(KEPT):
            block = torch.randint(4, 100, (3, WIDTH), generator=gen)
            before = kv.length
            written = kv.append(None, WIDTH)
            compactions += kv.length < before + WIDTH
            with torch.no_grad():
                logits = model(input_ids=block, **kv.forward_kwargs(), use_cache=True, **written).logits
            kv.rollback(kv.length - WIDTH, torch.tensor(counts))
            for b in range(3):
                reference, _ = _fresh(model, kept[b] + block[b].tolist())
                torch.testing.assert_close(logits[b], reference[-WIDTH:], atol=3e-5, rtol=0,
                                           msg=lambda m, step=step, b=b: f"round {step} row {b}: {m}")
                kept[b] += block[b, : counts[b]].tolist()
                _, fresh = _fresh(model, kept[b])
                for key in kv.linear.modules:
                    torch.testing.assert_close(_compat.conv_state(kv.cache, *key)[b], _compat.conv_state(fresh, *key)[0],
                                               atol=2e-5, rtol=1e-4, msg=lambda m, key=key: f"round {step} {key}: {m}")
    finally:
        kv.close()
    assert compactions >= 1, "the capacity was meant to force a compaction"
    assert kv.mask.sum(-1).tolist() == [len(k) for k in kept]


def _drafts(model):
    return {"text copy": testing.text_draft_from_target(model), "noisy copy": noisy_copy(model, 0.3),
            "random": testing.random_text_draft(model), "vlm self": model,
            "head exact": testing.feature_head_from_target(model)}


def test_query_columns_are_read_before_the_cache_write(model):
    """Inkling's attention reads its query offset after writing the cache: on stock's StaticCache (a tensor write
    pointer, advanced in place) every query column is shifted by the forward's width, and the relative position bias
    with it; the loop's static cache gives a dynamic cache's logits."""
    ids, block = torch.tensor([[5, 17, 33, 41, 9, 12, 60, 70]]), torch.tensor([[11, 22, 33, 44]])
    from transformers import StaticCache

    logits = {}
    caches = {"dynamic": _compat.new_dynamic_cache(model), "ours": _compat.new_static_cache(model, 32, True),
              "stock": StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=32)}
    with torch.no_grad():
        for name, cache in caches.items():
            model(input_ids=ids, use_cache=True, **_compat.cache_kwargs(cache))
            logits[name] = model(input_ids=block, use_cache=True, **_compat.cache_kwargs(cache)).logits
    torch.testing.assert_close(logits["ours"], logits["dynamic"], atol=1e-5, rtol=0)
    assert (logits["stock"] - logits["dynamic"]).abs().max() > 1e-4


@pytest.mark.parametrize("batch", (1, 3))
def test_greedy_equals_plain_generate_for_every_chain_draft_and_gamma(model, batch):
    """Batch 3: left padding, images, an image-less row; every round of a draft that agrees in part leaves holes in
    the batch's rows. Plain generate is the dynamic-cache one (stock's static cache shifts Inkling's query columns:
    the test above)."""
    inputs = batch_inputs(FAMILY, batch)
    plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    hf_specmm.enable(model)
    try:
        for name, draft in _drafts(model).items():
            for gamma in (1, 2, 3, 4):
                out = model.generate(**inputs, max_new_tokens=16, **STATIC, assistant_model=draft,
                                     num_assistant_tokens=gamma)
                assert torch.equal(out, plain), f"{name} γ={gamma}:\n{out}\n!=\n{plain}"
                stats = hf_specmm.last_stats(model)
                assert set(stats.gammas) == {gamma}
                if name == "vlm self":
                    assert stats.acceptance_rate == 1.0
                if name == "noisy copy":
                    assert 0 < stats.acceptance_rate < 1, stats.acceptance_rate
    finally:
        hf_specmm.disable(model)


def test_sampling_with_a_static_cache_has_the_targets_distribution(model):
    plain = _samples(model, FAMILY, seed=1)
    hf_specmm.enable(model)
    try:
        spec = _samples(model, FAMILY, noisy_copy(model), seed=5, cache_implementation="static")
        stats = hf_specmm.last_stats(model)
    finally:
        hf_specmm.disable(model)
    assert 0.0 < stats.acceptance_rate < 0.9 and set(stats.gammas) == {3}
    vocab = model.config.text_config.vocab_size
    for pos in range(NEW):
        p, stat, dof = chi2_homogeneity_pvalue(plain[:, pos], spec[:, pos], vocab)
        assert p > ALPHA, f"position {pos}: χ²={stat:.1f} (dof {dof}), p={p:.2g} < {ALPHA}"


def test_column_log_scaling_runs_one_row():
    """``log_scaling_n_floor`` scales logits by the query's absolute cache column: one row has no holes, and its
    static cache reads the column a dynamic cache does."""
    model = testing.tiny_target(FAMILY, eos_bias=-30.0)
    model.config.text_config.log_scaling_n_floor = 8  # every column past 8 is scaled
    inputs = batch_inputs(FAMILY, 1)
    plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    hf_specmm.enable(model)
    try:
        for draft in (testing.text_draft_from_target(model), model):
            out = model.generate(**inputs, max_new_tokens=16, **STATIC, assistant_model=draft, num_assistant_tokens=3)
            assert torch.equal(out, plain)
            assert hf_specmm.last_stats(model).accepted_tokens > 0
    finally:
        hf_specmm.disable(model)


@pytest.mark.parametrize("case", ["tree", "log scaling"])
def test_what_stays_refused_is_refused_before_any_forward(case):
    """Draft trees (a node's conv states are its parent's plus its token) and, with ``log_scaling_n_floor``, a
    batch (a row with holes sits at later columns): refused on a static cache too, before any forward."""
    model = testing.tiny_target(FAMILY)
    draft = testing.text_draft_from_target(model)
    inputs, assistant = batch_inputs(FAMILY, 1), draft
    if case == "tree":
        assistant, pattern = hf_specmm.Tree(draft, top_k=2, depth=2, nodes=4), "short convolutions|static"
    else:
        model.config.text_config.log_scaling_n_floor = 8
        inputs, pattern = batch_inputs(FAMILY, 3), "log_scaling_n_floor"
    hf_specmm.enable(model)
    try:
        with count_forwards(model, draft) as calls, pytest.raises(SpecMMError, match=pattern):
            model.generate(**inputs, max_new_tokens=4, **STATIC, assistant_model=assistant)
    finally:
        hf_specmm.disable(model)
    assert calls["n"] == 0
