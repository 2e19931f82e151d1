"""Compiled static rounds with feature heads (EAGLE-1, EAGLE-3) compile their graphs in the
first call and none after (fixed shapes for the head's inputs: the pending read is always
γ + 1 wide, contiguous), outputs equal plain generate's; and when dynamo gives up (its recompile limit), the
call's statistics say so instead of reading as "0 graphs compiled, all warm". The chain drafters (text, vlm,
image adapter: pending reads of 1 or 2 tokens) have their own test (test_static_generate.py)."""

from __future__ import annotations

import torch
from transformers import CompileConfig

import hf_specmm
from hf_specmm import testing
from conftest import processor, target
from eagle3_fixtures import lagged_head

STATIC = dict(do_sample=False, cache_implementation="static", max_cache_len=96)
PROMPTS = ["a cat sits on the mat", "the dog runs", "one two three four five six seven"]


def _drafts(model):
    """Drafts that accept part of each block (rows accept different counts: the pending width varies)."""
    return {"feature_head": testing.feature_head_from_target(model, noise=0.3),
            "eagle3": lagged_head(model)}


def test_compiled_head_rounds_compile_once_per_kind():
    model = target("llava")
    config = CompileConfig(fullgraph=False, dynamic=False, mode="default")
    config._compile_all_devices = True  # stock compiles only on accelerators unless told otherwise
    kwargs = dict(max_new_tokens=12, compile_config=config, **STATIC)
    proc = processor("llava")
    inputs = [testing.make_inputs("llava", proc, [p], [testing.tiny_image(i)]) for i, p in enumerate(PROMPTS)]
    hf_specmm.disable(model)
    plain = [model.generate(**x, max_new_tokens=12, **STATIC) for x in inputs]
    hf_specmm.enable(model)
    limit_hits = hf_specmm._compat.recompile_limit_hits()
    try:
        for kind, draft in _drafts(model).items():
            accepted = set()
            for i, x in enumerate(inputs):
                out = model.generate(**x, **kwargs, assistant_model=draft, num_assistant_tokens=3)
                stats = hf_specmm.last_stats(model)
                assert torch.equal(out, plain[i]), (kind, i)
                assert (stats.graphs_compiled >= 1) if i == 0 else (stats.graphs_compiled == 0), (kind, i, stats.graphs_compiled)
                assert stats.recompile_limit_hits == limit_hits, kind
                accepted |= {n for row in stats.tokens_per_round for n in row}
            assert len(accepted - {0}) > 1, (kind, accepted)  # rounds kept different counts: pending widths varied
        # dynamo giving up is visible: a new block width with the recompile limit already reached runs eager
        with torch._dynamo.config.patch(recompile_limit=1):
            out = model.generate(**inputs[0], **{**kwargs, "max_new_tokens": 6}, assistant_model=draft,
                                 num_assistant_tokens=2)
        stats = hf_specmm.last_stats(model)
        assert stats.graphs_compiled == 0 and stats.recompile_limit_hits > limit_hits
        assert torch.equal(out, plain[0][:, : out.shape[1]])
    finally:
        hf_specmm.disable(model)


def test_pad_pending_left_pads_with_holes():
    """The compiled rounds' padding: holes (invalid, zero) before the pending slots, up to the width."""
    from hf_specmm.drafts.feature_head.drafter import pad_pending

    features, ids, valid = torch.ones(2, 2, 3), torch.tensor([[4, 5], [6, 7]]), torch.tensor([[False, True], [True, True]])
    f, i, v = pad_pending((features, ids, valid), 4)
    assert f.shape == (2, 4, 3) and not bool(f[:, :2].any()) and i.tolist() == [[0, 0, 4, 5], [0, 0, 6, 7]]
    assert v.tolist() == [[False, False, False, True], [False, False, True, True]]
    assert pad_pending((features, ids, valid), 2)[1] is ids
