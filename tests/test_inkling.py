"""Inkling: its short-convolution states rolled back per row, what it refuses before any work (audio, draft trees,
EAGLE-3 heads, batches with column log scaling), stock's assisted generation beside ours (static caches:
tests/test_inkling_static.py). (The shared matrices over
``testing.FAMILIES`` run its greedy parity, sampling and draft kinds.)"""

from __future__ import annotations

import pytest
import torch
import hf_specmm
from hf_specmm import _compat, testing
from hf_specmm.caches.short_conv import ShortConvStates
from hf_specmm.errors import SpecMMError, UnsupportedGenerationError
from hf_specmm.targets import SUPPORTED_TARGETS

FAMILY = "inkling"
AVAILABLE = _compat.INKLING_SUPPORTED
needs_inkling = pytest.mark.skipif(not AVAILABLE, reason="Inkling needs transformers >= 5.25")


def _inputs(batch, with_images=True):
    from conftest import batch_inputs

    return batch_inputs(FAMILY, batch, with_images)


def _count_forwards(model):
    from test_bad_inputs import count_forwards

    return count_forwards(model)


def test_registered_from_transformers_5_25():
    """5.17 has the class, but norms its merged embeddings twice: no draft that embeds tokens itself could match it."""
    assert ("InklingForConditionalGeneration" in SUPPORTED_TARGETS) == AVAILABLE == (FAMILY in testing.FAMILIES)


def _forward(model, cache, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, use_cache=True, **_compat.cache_kwargs(cache)).logits


@needs_inkling
def test_rollback_leaves_each_rows_conv_states_as_its_kept_tokens_make_them():
    """Batch of 3 left-padded text rows; a 4-token block, then rows keep 0, 2 and 4 of it: every layer's four conv
    states equal those of a fresh run over the row's prompt and kept tokens alone (a crop alone leaves the block's)."""
    model = testing.tiny_target(FAMILY)
    inputs = _inputs(3, with_images=False)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    cache = _compat.new_dynamic_cache(model)
    _forward(model, cache, ids, mask)
    states = ShortConvStates(model, cache, batch_size=3)
    assert len(states.modules) == 4 * model.config.text_config.num_hidden_layers
    block = torch.randint(4, 100, (3, 4), generator=torch.Generator().manual_seed(0))
    states.append(None, 4, ids.device)
    _forward(model, cache, block, torch.cat([mask, torch.ones_like(block)], 1))
    before = {key: _compat.conv_state(cache, *key).clone() for key in states.modules}
    counts = torch.tensor([0, 2, 4])
    states.rollback(ids.shape[1], counts, ids.shape[1] + 4)
    states.close()
    for row in range(3):
        kept = torch.cat([ids[row][mask[row].bool()], block[row, : counts[row]]])[None]
        fresh = _compat.new_dynamic_cache(model)
        _forward(model, fresh, kept, None)
        for key in states.modules:
            want = _compat.conv_state(fresh, *key)[0]
            torch.testing.assert_close(_compat.conv_state(cache, *key)[row], want, atol=2e-5, rtol=1e-4)
            if counts[row] < 4:  # the block's states were not the kept ones
                assert not torch.allclose(before[key][row], want, atol=1e-3)


@needs_inkling
@pytest.mark.parametrize("case", ["audio", "tree"])
def test_refused_before_any_work(case):
    model = testing.tiny_target(FAMILY)
    draft = testing.text_draft_from_target(model)
    inputs, kwargs = dict(_inputs(1)), dict(max_new_tokens=4, do_sample=False)
    assistant = draft
    if case == "audio":
        inputs["audio_input_ids"] = torch.zeros(1, 2, model.config.audio_config.n_mel_bins, dtype=torch.long)
        pattern = "audio_input_ids"
    else:
        assistant, pattern = hf_specmm.Tree(draft, top_k=2, depth=2, nodes=4), "short convolutions"
    hf_specmm.enable(model)
    try:
        with _count_forwards(model) as calls, pytest.raises(SpecMMError, match=pattern):
            model.generate(**inputs, **kwargs, assistant_model=assistant)
    finally:
        hf_specmm.disable(model)
    assert calls["n"] == 0


@needs_inkling
def test_eagle3_heads_are_refused_naming_why():
    with pytest.raises(SpecMMError, match="rotary position embeddings"):
        hf_specmm.FeatureHeadDraft.for_target(testing.tiny_target(FAMILY), variant="eagle3")


@needs_inkling
def test_column_log_scaling_runs_one_row_and_refuses_a_batch():
    """``log_scaling_n_floor`` scales logits by the query's cache column: one row is exact (no holes), a batch is
    refused before any work."""
    model = testing.tiny_target(FAMILY, eos_bias=-30.0)
    model.config.text_config.log_scaling_n_floor = 8  # every column past 8 is scaled
    draft = testing.random_text_draft(model)
    one = _inputs(1)
    plain = model.generate(**one, max_new_tokens=16, do_sample=False)
    hf_specmm.enable(model)
    try:
        out = model.generate(**one, max_new_tokens=16, do_sample=False, assistant_model=draft, num_assistant_tokens=3)
        assert torch.equal(out, plain)
        with _count_forwards(model) as calls, pytest.raises(UnsupportedGenerationError, match="log_scaling_n_floor"):
            model.generate(**_inputs(3), max_new_tokens=4, do_sample=False, assistant_model=draft)
        assert calls["n"] == 0
    finally:
        hf_specmm.disable(model)


@needs_inkling
def test_stock_refuses_a_batch_and_ours_runs_it():
    """Stock's assisted generation refuses a batch (it runs one row); ours is plain generate's at batch 3,
    left-padded, with an image-less row."""
    model = testing.tiny_target(FAMILY)
    draft = testing.text_draft_from_target(model)
    three = _inputs(3)
    with pytest.raises(ValueError, match="batch_size = 1"):
        model.generate(**three, max_new_tokens=8, do_sample=False, assistant_model=draft)
    plain = model.generate(**three, max_new_tokens=16, do_sample=False)
    hf_specmm.enable(model)
    try:
        out = model.generate(**three, max_new_tokens=16, do_sample=False, assistant_model=draft,
                             num_assistant_tokens=4)
        assert hf_specmm.last_stats(model).accepted_tokens > 0
    finally:
        hf_specmm.disable(model)
    assert torch.equal(out, plain)


@needs_inkling
def test_auto_runs_chains_of_every_exact_draft_kind():
    """``hf_specmm.Auto`` over the exact text copy, the vlm copy and the exact feature head (batch 3, left padding,
    an image-less row): trees are not tried on a stateful target, the chains equal plain generate."""
    model = testing.tiny_target(FAMILY, eos_bias=-30.0)
    inputs = _inputs(3)
    plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    drafts = {"text": testing.text_draft_from_target(model), "vlm": testing.tiny_target(FAMILY, eos_bias=-30.0),
              "head": testing.feature_head_from_target(model)}
    hf_specmm.enable(model)
    try:
        for name, draft in drafts.items():
            out = model.generate(**inputs, max_new_tokens=16, do_sample=False, assistant_model=hf_specmm.Auto(draft))
            assert torch.equal(out, plain), name
            assert hf_specmm.last_stats(model).accepted_tokens > 0, name
    finally:
        hf_specmm.disable(model)
