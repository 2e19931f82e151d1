"""Every unsupported or inconsistent ``generate(..., assistant_model=draft)`` call fails with the documented
error class and a message naming the problem, BEFORE any forward pass of the target or the draft (and before
stock generate touches the streamer). Also: where γ comes from (generate kwarg > draft generation_config >
DEFAULT_GAMMA)."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import re

import pytest
import torch
import transformers
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast, StaticCache
from transformers.generation.streamers import BaseStreamer

import hf_specmm
from hf_specmm import _compat
from hf_specmm import testing
from hf_specmm.errors import (
    IncompatibleDraftError,
    SpecMMError,
    UnsupportedGenerationError,
    UnsupportedTargetError,
)
from hf_specmm.targets import target_spec
from conftest import batch_inputs, draft, processor, target

MAX_NEW = 12


@functools.lru_cache(maxsize=None)
def enabled_target(family: str):
    """A private target instance (the shared conftest one is never enabled here)."""
    return hf_specmm.enable(testing.tiny_target(family))


class RecordingStreamer(BaseStreamer):
    def __init__(self):
        self.puts: list[torch.Tensor] = []
        self.ended = 0

    def put(self, value):
        self.puts.append(value.clone())

    def end(self):
        self.ended += 1


@contextlib.contextmanager
def count_forwards(*models):
    """Counts forward calls of every submodule of ``models`` (0 means no work at all was done)."""
    calls = {"n": 0}

    def hook(module, args):
        calls["n"] += 1

    handles = [m.register_forward_pre_hook(hook) for model in models for m in model.modules()]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def _swapped_tokenizer(tokenizer, a: int, b: int):
    """A copy of ``tokenizer`` whose ids ``a`` and ``b`` are swapped."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    ta, tb = tokenizer.convert_ids_to_tokens([a, b])
    vocab[ta], vocab[tb] = b, a
    from tokenizers import Tokenizer

    swapped = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(state)), bos_token="<s>",
                                      eos_token="</s>", unk_token="<unk>", pad_token="<pad>", padding_side="left")
    assert swapped.convert_ids_to_tokens([a, b]) == [tb, ta]
    return swapped


def _short_context_draft(model, context: int):
    cfg = testing.causal_lm_config(model)
    cfg.max_position_embeddings = context
    if not getattr(cfg, "num_kv_shared_layers", 0):  # Gemma 4's KV-shared layers need their producers: kept
        cfg.num_hidden_layers = 1
    torch.manual_seed(0)
    d = testing.fixture_of(model).text_lm(cfg, "sdpa").eval()
    d.generation_config = copy.deepcopy(model.generation_config)
    return d


def _meta_draft(model):
    cfg = testing.causal_lm_config(model)
    if not getattr(cfg, "num_kv_shared_layers", 0):  # Gemma 4's KV-shared layers need their producers: kept
        cfg.num_hidden_layers = 1
    with torch.device("meta"):
        d = testing.fixture_of(model).text_lm(cfg, "sdpa")
    assert d.device.type == "meta"
    return d


def _text_len(family, inputs) -> int:
    """Tokens of the prompt the draft reads: not padding, not an image placeholder or layout token."""
    dropped = torch.tensor(sorted(target_spec(target(family)).dropped_ids))
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    return int((~torch.isin(ids, dropped) & mask.bool()).sum(-1).max())


# ---- the cases ----------------------------------------------------------------------------------------------
# each builder gets (family, model) and returns (draft, generate kwargs, streamer or None)

def _vocab_too_small(family, model):
    small = target_spec(model).text_vocab_end - 6  # LLaVA fixtures: 118 of 124 text ids (128 rows)
    return testing.random_text_draft(model, vocab_size=small), {}, None


def _different_tokenizers(family, model):
    tok = processor(family).tokenizer
    return draft(family, "self"), {"tokenizer": tok, "assistant_tokenizer": _swapped_tokenizer(tok, 5, 9)}, None


def _static_cache_object(family, model):
    cache = StaticCache(config=model.config, max_cache_len=256)
    return draft(family, "random"), {"past_key_values": cache}, None


def _streamer_batch3(family, model):
    return draft(family, "random"), {}, RecordingStreamer()


def _inputs_embeds_only(family, model):
    return draft(family, "random"), {"_embeds": True}, None


def _short_context(family, model):
    return _short_context_draft(model, context=16), {"max_new_tokens": 24}, None


def _meta(family, model):
    return _meta_draft(model), {}, None


def _not_a_model(family, model):
    return "double7/vicuna-68m", {}, None


def _kw(**kw):
    return lambda family, model: (draft(family, "random"), dict(kw), None)


V_MINUS_10 = r"\b{small}\b"  # the draft's rows: 6 short of the target's text ids (118 for the LLaVA fixtures)
CASES = {
    # name: (builder, batch, error class, regexes the message must match)
    "vocab_too_small": (_vocab_too_small, 1, IncompatibleDraftError, [V_MINUS_10, r"\b{vocab}\b", "vocab"]),
    "different_tokenizers": (_different_tokenizers, 1, IncompatibleDraftError,
                             [r"tokenizer", r"\bid 5\b", r"'an'", r"'which'"]),
    "num_beams": (_kw(num_beams=2), 1, UnsupportedGenerationError, [r"num_beams=2"]),
    # with sampling: greedy + num_return_sequences=2 is already rejected by stock GenerationConfig.validate
    "num_return_sequences": (_kw(num_return_sequences=2, do_sample=True), 1, UnsupportedGenerationError,
                             [r"num_return_sequences=2"]),
    "static_heuristic_schedule": (_kw(cache_implementation="static", num_assistant_tokens_schedule="heuristic"), 1,
                                  UnsupportedGenerationError, [r"static", r"num_assistant_tokens_schedule", r"constant"]),
    "static_cache_object": (_static_cache_object, 1, UnsupportedGenerationError, [r"StaticCache"]),
    "use_cache_false": (_kw(use_cache=False), 1, UnsupportedGenerationError, [r"use_cache=False"]),
    "short_draft_context": (_short_context, 1, IncompatibleDraftError,
                            [r"context", r"\b16\b", r"max_new_tokens", r"\b24\b"]),
    "num_assistant_tokens_0": (_kw(num_assistant_tokens=0), 1, UnsupportedGenerationError,
                               [r"num_assistant_tokens", r"\b0\b"]),
    "num_assistant_tokens_negative": (_kw(num_assistant_tokens=-3), 1, UnsupportedGenerationError,
                                      [r"num_assistant_tokens", r"-3"]),
    "schedule_dynamic": (_kw(num_assistant_tokens_schedule="dynamic"), 1, UnsupportedGenerationError,
                         [r"num_assistant_tokens_schedule", r"dynamic", r"constant", r"heuristic"]),
    "streamer_batch3": (_streamer_batch3, 3, UnsupportedGenerationError, [r"streamer", r"\b3\b"]),
    "early_exit": (_kw(assistant_early_exit=2), 1, UnsupportedGenerationError, [r"assistant_early_exit"]),
    "contrastive": (_kw(penalty_alpha=0.6, top_k=4), 1, UnsupportedGenerationError, [r"penalty_alpha"]),
    "dola": (_kw(dola_layers="low"), 1, UnsupportedGenerationError, [r"dola_layers"]),
    "quantized_cache": (_kw(cache_implementation="quantized"), 1, UnsupportedGenerationError,
                        [r"quantized", r"dynamic", r"static"]),
    "prompt_lookup": (_kw(prompt_lookup_num_tokens=3), 1, UnsupportedGenerationError,
                      [r"prompt_lookup_num_tokens"]),
    "meta_draft": (_meta, 1, IncompatibleDraftError, [r"meta"]),
    "inputs_embeds_only": (_inputs_embeds_only, 1, UnsupportedGenerationError, [r"inputs_embeds", r"input_ids"]),
    "draft_not_a_model": (_not_a_model, 1, IncompatibleDraftError, [r"assistant_model", r"str"]),
}


@pytest.mark.parametrize("family", testing.FAMILIES)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_before_any_forward(family, case):
    builder, batch, error, patterns = CASES[case]
    model = enabled_target(family)
    if family in testing.MORE_FAMILIES:  # the numbers and words above are the LLaVA fixtures'
        end = target_spec(model).text_vocab_end
        patterns = {"vocab_too_small": [rf"\b{end - 6}\b", rf"\b{end}\b", "vocab"],
                    "different_tokenizers": [r"tokenizer", r"\bid 5\b"]}.get(case, patterns)
    d, kwargs, streamer = builder(family, model)
    inputs = dict(batch_inputs(family, batch))
    if kwargs.pop("_embeds", False):
        ids = inputs.pop("input_ids")
        with torch.no_grad():
            inputs["inputs_embeds"] = model.get_input_embeddings()(ids)
    kwargs = {"max_new_tokens": MAX_NEW, "do_sample": False, **kwargs}  # case kwargs win
    stats_before = hf_specmm.last_stats(model)
    modules = (model, d) if isinstance(d, torch.nn.Module) else (model,)
    with count_forwards(*modules) as calls, pytest.raises(SpecMMError) as info:
        model.generate(**inputs, assistant_model=d, streamer=streamer, **kwargs)
    got = type(info.value).__name__
    assert type(info.value) is error, f"{case}: expected {error.__name__}, got {got}: {info.value}"
    message = str(info.value)
    spec = target_spec(model)
    numbers = {"small": spec.text_vocab_end - 6, "vocab": spec.vocab_size}  # the family's own sizes
    for pattern in (p.format(**numbers) if "{" in p else p for p in patterns):
        assert re.search(pattern, message), f"{case}: message does not match {pattern!r}: {message}"
    assert calls["n"] == 0, f"{case}: {calls['n']} forward calls before the error"
    if streamer is not None:
        assert streamer.puts == [] and streamer.ended == 0, "the streamer was fed before the error"
    assert hf_specmm.last_stats(model) is stats_before, "a rejected call must not replace the stats"
    assert hf_specmm.is_enabled(model)


def test_errors_are_value_errors_with_common_base():
    for cls in (IncompatibleDraftError, UnsupportedGenerationError, UnsupportedTargetError):
        assert issubclass(cls, SpecMMError) and issubclass(cls, ValueError)
        assert cls is getattr(hf_specmm, cls.__name__)


MUSE = {"MuseGlimmerForConditionalGeneration"} if hasattr(transformers, "MuseGlimmerForConditionalGeneration") else set()
QWEN3_5 = {name for name in ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
           if hasattr(transformers, name)}


def test_unsupported_target_lists_supported_classes():
    cfg = copy.deepcopy(testing.tiny_target("llava").config.text_config)
    llama = LlamaForCausalLM(cfg).eval()
    with count_forwards(llama) as calls, pytest.raises(UnsupportedTargetError) as info:
        hf_specmm.enable(llama)
    message = str(info.value)
    assert "LlamaForCausalLM" in message
    for name in hf_specmm.SUPPORTED_TARGETS:
        assert name in message
    assert set(hf_specmm.SUPPORTED_TARGETS) == {"LlavaForConditionalGeneration", "LlavaNextForConditionalGeneration",
                                                "LlavaOnevisionForConditionalGeneration",
                                                "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                                                "Qwen3VLForConditionalGeneration",
                                                "Gemma3ForConditionalGeneration", "Idefics3ForConditionalGeneration",
                                                "SmolVLMForConditionalGeneration", "InternVLForConditionalGeneration",
                                                "Qwen3VLMoeForConditionalGeneration"} | MUSE | QWEN3_5 \
        | ({"Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration"} if _compat.GEMMA4_SUPPORTED else set()) \
        | {name for name in ("LlavaOnevision15ForConditionalGeneration", "Ovis2_5ForConditionalGeneration")
           if hasattr(transformers, name)} \
        | ({"Step3p7ForConditionalGeneration"} if _compat.STEP3P7_SUPPORTED else set()) \
        | ({"InklingForConditionalGeneration"} if _compat.INKLING_SUPPORTED else set())
    assert calls["n"] == 0
    assert not hf_specmm.is_enabled(llama) and "generate" not in vars(llama)


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_short_context_boundary_is_the_text_part_of_the_prompt(family):
    """The limit counts the draft's view (no image placeholders): the suggested max_new_tokens runs, one more fails."""
    model = enabled_target(family)
    inputs = batch_inputs(family, 1)
    text_len = _text_len(family, inputs)
    # the whole prompt + the suggested max_new_tokens (11) must exceed the context (text_len + 12); InternVL
    # without its tokenizer: the draft reads <img> </img> (see tests/test_more_families.py), 4 placeholders are left
    assert inputs["input_ids"].shape[1] + 11 > text_len + 12, "fixture: image placeholders should make the prompt longer"
    context = text_len + 12
    d = _short_context_draft(model, context)
    with pytest.raises(IncompatibleDraftError) as info:
        model.generate(**inputs, assistant_model=d, max_new_tokens=12, do_sample=False)
    suggested = int(re.search(r"Lower max_new_tokens to (\d+)", str(info.value)).group(1))
    assert suggested == context - text_len - 1 == 11
    plain = testing.tiny_target(family).generate(**inputs, max_new_tokens=suggested, do_sample=False)
    out = model.generate(**inputs, assistant_model=d, max_new_tokens=suggested, do_sample=False)
    assert torch.equal(out, plain)


def test_same_tokenizer_for_both_is_accepted():
    family = "llava"
    model = enabled_target(family)
    tok = processor(family).tokenizer
    inputs = batch_inputs(family, 1)
    out = model.generate(**inputs, assistant_model=draft(family, "self"), tokenizer=tok, assistant_tokenizer=tok,
                         max_new_tokens=MAX_NEW, do_sample=False)
    plain = testing.tiny_target(family).generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    assert torch.equal(out, plain)


# ---- γ: generate kwarg > draft generation_config > DEFAULT_GAMMA ---------------------------------------------

def _gamma_run(draft_gamma=None, draft_schedule=None, **kwargs):
    family = "llava"
    model = enabled_target(family)
    d = testing.random_text_draft(model)  # private: its generation_config is changed below
    d.generation_config.num_assistant_tokens = draft_gamma
    d.generation_config.num_assistant_tokens_schedule = draft_schedule
    model.generate(**batch_inputs(family, 1), assistant_model=d, max_new_tokens=30, do_sample=False, **kwargs)
    return hf_specmm.last_stats(model)


def test_default_gamma():
    assert hf_specmm.DEFAULT_GAMMA == 5
    stats = _gamma_run()
    assert stats.gamma == hf_specmm.DEFAULT_GAMMA, f"γ={stats.gamma}, gammas={stats.gammas}"
    assert stats.gammas[0] == hf_specmm.DEFAULT_GAMMA


def test_gamma_from_draft_generation_config():
    stats = _gamma_run(draft_gamma=3)
    assert stats.gamma == 3, f"draft's num_assistant_tokens=3 ignored: γ={stats.gamma}, gammas={stats.gammas}"
    assert stats.gammas[:5] == [3] * 5


def test_generate_kwarg_gamma_wins_over_draft_generation_config():
    stats = _gamma_run(draft_gamma=3, num_assistant_tokens=2)
    assert stats.gamma == 2
    assert set(stats.gammas[:-2]) == {2}, stats.gammas


def test_schedule_from_draft_generation_config():
    """A random draft is always wrong: the heuristic schedule lowers γ by one per round."""
    stats = _gamma_run(draft_gamma=4, draft_schedule="heuristic")
    assert stats.gammas[:5] == [4, 3, 2, 1, 1], f"draft's heuristic schedule ignored: {stats.gammas}"


def test_generate_kwarg_schedule_wins_over_draft_generation_config():
    stats = _gamma_run(draft_gamma=4, draft_schedule="heuristic", num_assistant_tokens=4,
                       num_assistant_tokens_schedule="constant")
    assert stats.gammas[:5] == [4] * 5, stats.gammas
