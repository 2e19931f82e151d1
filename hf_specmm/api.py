"""``enable`` / ``disable``: route ``model.generate(..., assistant_model=draft)`` through hf_specmm.

Only the one model instance is patched (an instance attribute shadows ``GenerationMixin.generate``);
calls without a draft go straight to stock ``generate``. Stock ``generate`` still prepares everything
(generation config, processors, stopping criteria, cache, image inputs); we replace only the decoding
loop, through its ``custom_generate=<callable>`` hook.
"""

from __future__ import annotations

import time
import types
from typing import Any

import torch

from . import _compat
from .checks import resolve_plan
from .devices import execution_device, without_cudnn_attention
from .loop import SpeculativeDecoding
from .stats import SpecStats
from .targets import target_family

_STATE = "_hf_specmm_state"


class _State:
    def __init__(self) -> None:
        self.last_stats: SpecStats | None = None


def enable(model: Any) -> Any:
    """Make ``model.generate(..., assistant_model=draft)`` use hf_specmm's lossless multimodal
    speculative decoding. Per instance, idempotent, undone by :func:`disable`.

    Example::

        >>> import hf_specmm
        >>> from transformers import LlavaForConditionalGeneration, AutoModelForCausalLM
        >>> model = LlavaForConditionalGeneration.from_pretrained("llava-hf/llava-1.5-7b-hf")  # doctest: +SKIP
        >>> draft = AutoModelForCausalLM.from_pretrained("double7/vicuna-68m")  # doctest: +SKIP
        >>> hf_specmm.enable(model)  # doctest: +SKIP
        >>> out = model.generate(**inputs, assistant_model=draft, max_new_tokens=64)  # doctest: +SKIP
    """
    _compat.require_internals()  # a newer transformers that changed what hf_specmm reads: refused here
    target_family(model)  # unsupported targets fail here, not at generate time
    if getattr(model, _STATE, None) is None:
        setattr(model, _STATE, _State())
        model.generate = types.MethodType(_speculative_generate, model)
    return model


def disable(model: Any) -> Any:
    """Undo :func:`enable`: ``model.generate`` is the class's stock method again."""
    if getattr(model, _STATE, None) is not None:
        vars(model).pop("generate", None)
        delattr(model, _STATE)
    return model


def is_enabled(model: Any) -> bool:
    return getattr(model, _STATE, None) is not None


def last_stats(model: Any) -> SpecStats | None:
    """Statistics of the model's last ``generate`` call with a draft (None before the first one)."""
    state = getattr(model, _STATE, None)
    if state is None:
        raise ValueError("hf_specmm is not enabled on this model: call hf_specmm.enable(model) first.")
    return state.last_stats


def _speculative_generate(self: Any, inputs: torch.Tensor | None = None, generation_config: Any = None,
                          logits_processor: Any = None, stopping_criteria: Any = None,
                          prefix_allowed_tokens_fn: Any = None, synced_gpus: bool | None = None,
                          assistant_model: Any = None, streamer: Any = None, **kwargs: Any) -> Any:
    # same positional order as GenerationMixin.generate
    for name, value in (("logits_processor", logits_processor), ("stopping_criteria", stopping_criteria),
                        ("prefix_allowed_tokens_fn", prefix_allowed_tokens_fn), ("synced_gpus", synced_gpus)):
        if value is not None:
            kwargs[name] = value
    if assistant_model is None:
        return _compat.stock_generate(self, inputs, generation_config=generation_config, streamer=streamer, **kwargs)

    start = time.perf_counter()
    plan = resolve_plan(self, assistant_model, inputs, generation_config, streamer, kwargs)  # raises before work
    if plan.budget.runs_plain():  # hf_specmm.Auto measured plain generate's own loop as the fastest here
        return _plain_call(self, plan, inputs, generation_config, streamer, start)
    drafter = plan.kind.drafter(plan.draft, plan.vocab)  # the draft kind's runtime (drafts/<kind>/)
    image_inputs = target_family(self).model_inputs(plan.kwargs)  # before stock generate encodes and drops them
    decoding = SpeculativeDecoding(drafter, plan.budget, streamer, image_inputs, plan.backend)  # stock generate calls it
    with without_cudnn_attention(execution_device(self)):  # its per-shape graphs would cost most rounds (devices.py)
        result = _compat.generate_with_decoding_fn(
            self, decoding, inputs=inputs, generation_config=generation_config, streamer=streamer, **plan.kwargs)
    if plan.budget.schedule == "heuristic" and getattr(assistant_model, "generation_config", None) is not None:
        assistant_model.generation_config.num_assistant_tokens = plan.budget.gamma  # persists, as stock's
    decoding.stats.wall_time_s = time.perf_counter() - start
    decoding.stats.auto = plan.budget.report()
    getattr(self, _STATE).last_stats = decoding.stats
    return result


def _plain_call(model: Any, plan: Any, inputs: Any, generation_config: Any, streamer: Any, start: float) -> Any:
    """Stock ``generate`` without the draft (its output is plain generate's by definition), its steps told to the
    budget; ``last_stats`` says so (``auto["shapes"] == ["plain generate"]``)."""
    result = _compat.stock_generate(model, inputs, generation_config=generation_config, streamer=streamer,
                                    **plan.kwargs)
    sequences = result if isinstance(result, torch.Tensor) else result.sequences
    prompt = inputs if isinstance(inputs, torch.Tensor) else plan.kwargs.get("input_ids")
    batch = sequences.shape[0]
    steps = max(sequences.shape[1] - (prompt.shape[-1] if isinstance(prompt, torch.Tensor) else 0) - 1, 0)
    plan.budget.close_plain_call(steps + 1, batch)
    # one token per row and forward (rows that stopped at EOS count their padding, as plain generate runs them)
    stats = SpecStats(batch_size=batch, target_forwards=batch * (steps + 1), generated_tokens=batch * (steps + 1),
                      tokens_per_round=[[1] * batch for _ in range(steps)], gammas=[0] * steps)
    stats.wall_time_s = time.perf_counter() - start
    stats.auto = plan.budget.report()
    getattr(model, _STATE).last_stats = stats
    return result
