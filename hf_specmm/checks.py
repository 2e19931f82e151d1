"""Everything that can be wrong with a ``generate(..., assistant_model=draft)`` call, checked before any
forward pass runs. Each error names what was wrong and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import _compat
from .devices import execution_device
from .errors import IncompatibleDraftError, UnsupportedGenerationError
from .drafts import DraftKind, kind_of
from .budget import CallContext, DraftBudget
from .caches import backend_for
from .prompt_checks import check_placeholders
from .targets import TargetSpec, target_spec
from .vocab import VocabMap, check_vocab_compatible, draft_vocab_size, vocab_map

DEFAULT_GAMMA = 5
"""γ when neither generate() nor the draft's generation_config sets ``num_assistant_tokens``.
With a draft ~1 % of the target (c ≈ 0.01–0.05) and acceptance α ≈ 0.6–0.8, the cost model
τ/(1 + γc), τ = (1 - α^(γ+1))/(1 - α), is nearly flat between γ = 4 and 7; 5 is also one of the
two block sizes of 2404.08856."""

SCHEDULES = ("constant", "heuristic", "heuristic_transient")
#: ``cache_implementation`` values a speculative call honours (None: the default dynamic cache)
CACHE_IMPLEMENTATIONS = (None, "dynamic", "static")


@dataclass
class Plan:
    kind: DraftKind  # the draft's kind (drafts/<kind>/): which Drafter runs it
    vocab: VocabMap
    budget: DraftBudget  # γ, its schedule, the confidence threshold
    kwargs: dict  # what goes on to stock generate
    backend: Any = None  # the call's cache backend (caches.backend_for(cache_implementation))
    draft: Any = None  # the draft the drafter runs (``assistant_model``, unwrapped from ``hf_specmm.Tree``)


def _fail(cls: type[Exception], message: str) -> None:
    raise cls(message)


def _input_ids(inputs: Any, kwargs: dict) -> torch.Tensor:
    ids = inputs if inputs is not None else kwargs.get("input_ids")
    if ids is None or not isinstance(ids, torch.Tensor):
        _fail(UnsupportedGenerationError, "generate(assistant_model=...) needs `input_ids` (the draft reads the "
              "prompt's text tokens); `inputs_embeds` alone is not supported. Pass the processor's input_ids.")
    return ids if ids.dim() == 2 else ids[None]


def _explicit(name: str, kwargs: dict, generation_config: Any, *configs: Any) -> Any:
    """First value of ``name`` set explicitly: generate kwargs, the passed config, then ``configs``.
    (The merged config cannot tell: stock fills in its global defaults, e.g. num_assistant_tokens=20.)"""
    if kwargs.get(name) is not None:
        return kwargs[name]
    for config in (generation_config, *configs):
        value = getattr(config, name, None) if config is not None else None
        if value is not None:
            return value
    return None


def _chosen(name: str, kwargs: dict, generation_config: Any, *configs: Any) -> bool:
    """Whether the caller chose ``name``: in generate's kwargs, on a model's or the draft's generation config,
    or on the passed config with another value than the one transformers fills into unset fields (a 5.17
    pipeline passes such a filled config)."""
    if kwargs.get(name) is not None or any(getattr(c, name, None) is not None for c in configs if c is not None):
        return True
    value = getattr(generation_config, name, None) if generation_config is not None else None
    return value is not None and value != _compat.filled_generation_default(name)


def _resolve_budget(target: Any, draft: Any, generation_config: Any, kwargs: dict) -> DraftBudget:
    sources = (getattr(target, "generation_config", None), getattr(draft, "generation_config", None))
    gamma = _explicit("num_assistant_tokens", kwargs, generation_config, *sources)
    kind = _explicit("num_assistant_tokens_schedule", kwargs, generation_config, *sources)
    gamma = DEFAULT_GAMMA if gamma is None else gamma
    kind = "constant" if kind is None else kind
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        _fail(UnsupportedGenerationError, f"num_assistant_tokens must be an integer >= 1, got {gamma!r}.")
    if kind not in SCHEDULES:
        _fail(UnsupportedGenerationError, f"num_assistant_tokens_schedule={kind!r} is not supported with "
              f"hf_specmm; use one of {SCHEDULES}.")
    # stock reads it from the assistant's generation config (generate kwargs win)
    threshold = _explicit("assistant_confidence_threshold", kwargs, generation_config,
                          getattr(draft, "generation_config", None))
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not 0 <= threshold <= 1):
        _fail(UnsupportedGenerationError, f"assistant_confidence_threshold must be a number in [0, 1], "
              f"got {threshold!r}.")
    return DraftBudget(gamma, kind, None if threshold is None else float(threshold))


def _check_config(config: Any, kwargs: dict, batch: int, streamer: Any) -> None:
    bad = None
    if (config.num_beams or 1) > 1:
        bad = f"num_beams={config.num_beams}: speculative decoding verifies one sequence per row; use num_beams=1"
    elif (config.num_return_sequences or 1) > 1:
        bad = (f"num_return_sequences={config.num_return_sequences}: repeat the inputs along the batch instead "
               "(each row is drafted and verified on its own)")
    elif config.use_cache is False:
        bad = "use_cache=False: the draft and the target must keep KV caches; remove use_cache=False"
    elif (config.cache_implementation not in CACHE_IMPLEMENTATIONS
          or _compat.is_static_cache(_compat.passed_cache(kwargs))):
        bad = (f"cache_implementation={config.cache_implementation or type(_compat.passed_cache(kwargs)).__name__!r}: "
               f"the loop's caches are one of {CACHE_IMPLEMENTATIONS[1:]} (made per call, rolled back per row); use "
               "one of those, and pass no cache to generate")
    elif _compat.passed_cache(kwargs) is not None:
        bad = (f"{_compat.CACHE_KWARG}: a speculative call starts from the prompt; do not pass a cache "
               "(past_key_values / cache)")
    elif config.prompt_lookup_num_tokens is not None or config.assistant_early_exit is not None:
        bad = ("prompt_lookup_num_tokens / assistant_early_exit together with assistant_model: choose one kind "
               "of drafting")
    elif config.penalty_alpha is not None or config.dola_layers is not None:
        bad = "penalty_alpha (contrastive search) / dola_layers (DoLa): other decoding methods; drop them"
    elif kwargs.get("prefix_allowed_tokens_fn") is not None or kwargs.get("negative_prompt_ids") is not None:
        bad = "prefix_allowed_tokens_fn / negative_prompt_ids: not supported with a draft"
    elif (config.guidance_scale or 1) != 1:
        bad = "guidance_scale (classifier-free guidance): not supported with a draft"
    elif kwargs.get("synced_gpus"):
        bad = "synced_gpus=True (multi-GPU ZeRO-3/FSDP generation): not supported with a draft"
    elif streamer is not None and batch > 1:
        bad = f"a streamer with batch size {batch}: streamers take one sequence; stream a batch of 1"
    if bad is not None:
        _fail(UnsupportedGenerationError, f"generate(assistant_model=...) cannot be used with {bad}.")


def check_pairing(target: Any, draft: Any, spec: TargetSpec | None = None, tokenizer: Any = None,
                  draft_tokenizer: Any = None) -> DraftKind:
    """The rule of whether ``draft`` can draft for ``target``, from what both declare (configs, tensor shapes): its
    kind (one the target's family does not refuse), the kind's own :meth:`~hf_specmm.drafter.Drafter.check` (hidden
    sizes, target layers, image widths, placeholder ids, ...) and, for a kind with its own vocabulary, that it covers
    the target's text ids. Raises :class:`~hf_specmm.errors.IncompatibleDraftError`; returns the kind.

    ``generate`` applies it to the draft it is given; ``load_draft(..., target=...)`` to the draft a checkpoint
    declares, laid out on the meta device before any tensor is allocated (value checks a kind makes on tensors, a
    vocabulary map's entries, wait for the loaded draft)."""
    spec = target_spec(target, tokenizer) if spec is None else spec
    kind = kind_of(draft)
    why = dict(spec.family.refused_draft_kinds).get(kind.name)
    if why is not None:
        _fail(IncompatibleDraftError, f"a {kind.name} draft cannot speculate for a {type(target).__name__} target: "
              f"{why}. Use a text-only draft (a small text LM of the family) or a vlm draft (a smaller model of "
              "the family, or the target itself).")
    kind.drafter.check(target, draft)  # first: a draft that is no kind's (no LM head) may have no vocabulary either
    # a kind scoring with the target's LM head proposes from the target's vocabulary: nothing to compare
    if kind.target_vocab_size is None:
        check_vocab_compatible(spec, draft, tokenizer, draft_tokenizer)
    return kind


def _check_draft(draft: Any, kind: DraftKind, ids: torch.Tensor, config: Any, vocab: VocabMap, kwargs: dict) -> None:
    if execution_device(draft).type == "meta":  # offloaded weights of a dispatched draft are fine
        _fail(IncompatibleDraftError, "The draft's weights are on the meta device (not loaded); load it on a real "
              "device, e.g. AutoModelForCausalLM.from_pretrained(repo, device_map='cpu').")
    context = getattr(draft.config.get_text_config(), "max_position_embeddings", None)
    if context is None:
        return
    mask = kwargs.get("attention_mask")
    mask = mask if isinstance(mask, torch.Tensor) and mask.shape == ids.shape else None
    text_len = int(kind.drafter.prompt_lengths(draft, vocab, ids.to(vocab.proposable.device), mask).max())
    new = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - ids.shape[1]
    if text_len + new + 1 > context:
        _fail(IncompatibleDraftError, f"The draft's context window ({context} positions) is shorter than the text "
              f"prompt it reads ({text_len} tokens) + max_new_tokens ({new}). Lower max_new_tokens to "
              f"{max(context - text_len - 1, 0)} or use a draft with a longer context.")


def _check_static(config: Any, budget: DraftBudget) -> None:
    """What a static cache (fixed shapes, one graph per block width) cannot honour exactly: refused."""
    bad = None
    if budget.schedule != "constant":
        bad = (f"num_assistant_tokens_schedule={budget.schedule!r}: a static cache verifies blocks of one width "
               "(γ + 1); use num_assistant_tokens_schedule='constant'")
    elif budget.confidence is not None:
        bad = ("assistant_confidence_threshold: it ends rounds early (blocks of varying width); a static cache "
               "verifies blocks of one width. Drop the threshold or use the default dynamic cache")
    elif config.return_dict_in_generate:
        bad = ("return_dict_in_generate=True: the loop's static cache keeps rejected slots as holes, so it cannot "
               "be returned as plain generate's StaticCache; drop return_dict_in_generate or the static cache")
    if bad is not None:
        _fail(UnsupportedGenerationError, f"generate(assistant_model=..., cache_implementation='static') cannot be "
              f"used with {bad}.")


def _gamma_source(kwargs: dict, generation_config: Any, target: Any) -> str | None:
    """Where the caller chose ``num_assistant_tokens`` (None: nowhere). The draft's own generation config is not
    asked: its γ (a checkpoint's chain default, or one a heuristic schedule wrote back, as stock does) is what a
    chain of that draft uses, and a Tree or Auto shape replaces it."""
    named = (("generate(num_assistant_tokens=...)", None), ("the passed generation_config", None),
             ("the target's generation_config", getattr(target, "generation_config", None)))
    if kwargs.get("num_assistant_tokens") is not None:
        return named[0][0]
    if _chosen("num_assistant_tokens", {}, generation_config):
        return named[1][0]
    return next((label for label, config in named[2:] if _chosen("num_assistant_tokens", {}, None, config)), None)


def resolve_plan(target: Any, draft: Any, inputs: Any, generation_config: Any, streamer: Any, kwargs: dict) -> Plan:
    """Validate the call and return what the loop needs. Raises before any forward pass."""
    spec = target_spec(target, kwargs.get("tokenizer"))  # layout tokens read by name when it is given
    # a wrapper that shapes rounds (hf_specmm.Tree, hf_specmm.Auto) builds the call's budget; its draft's kind runs it
    shaper = draft if callable(getattr(type(draft), "call_budget", None)) else None
    draft = shaper.draft if shaper is not None else draft
    if not isinstance(draft, torch.nn.Module) or not hasattr(draft, "config"):
        _fail(IncompatibleDraftError, f"assistant_model must be a transformers model, got {type(draft).__name__}.")
    kwargs = dict(kwargs)
    tokenizer = kwargs.pop("tokenizer", None)
    draft_tokenizer = kwargs.pop("assistant_tokenizer", None)
    stateful = None  # the first role whose model keeps recurrent states
    for role, model in (("target", target), ("draft", draft)):
        if not _compat.stateful_layer_types(model.config):
            continue
        stateful = stateful or role
        why = _compat.unsupported_stateful_layers(model)
        if why is not None:
            _fail(IncompatibleDraftError if role == "draft" else UnsupportedGenerationError,
                  f"generate(assistant_model=...) cannot roll back the {role} {type(model).__name__}: {why}. "
                  "Use a model whose stateful layers are Gated DeltaNet linear attention (Qwen3.5) or attention only.")
    kind = check_pairing(target, draft, spec, tokenizer, draft_tokenizer)
    own_vocab = kind.target_vocab_size is None
    ids = _input_ids(inputs, kwargs)
    config = _compat.resolve_generation_config(target, generation_config, kwargs)
    _check_config(config, kwargs, ids.shape[0], streamer)
    if config.return_dict_in_generate and config.output_attentions and _compat.has_sliding_layers(target.config):
        _fail(UnsupportedGenerationError, "generate(assistant_model=...) cannot return output_attentions for a "
              "sliding-window target (Gemma 3): the loop keeps full cache layers and moves rejected slots, so the "
              "attention weights would not have plain generate's layout; drop output_attentions (scores, logits "
              "and hidden states are returned).")
    mask = kwargs.get("attention_mask")
    mask = mask if isinstance(mask, torch.Tensor) and mask.shape == ids.shape else None
    refused = [k for k in spec.family.refused_inputs if kwargs.get(k) is not None]
    if refused:
        _fail(UnsupportedGenerationError, f"generate(assistant_model=...) does not support {', '.join(refused)} for a "
              f"{type(target).__name__} target (hf_specmm speculates on its text and image inputs): drop them, or "
              "call hf_specmm.disable(model) and generate without an assistant_model.")
    floor = _compat.column_log_scaling(target.config)
    if floor is not None and ids.shape[0] > 1:
        _fail(UnsupportedGenerationError, f"a {type(target).__name__} with log_scaling_n_floor={floor} scales its "
              "logits by each query's cache column; in a batch, a row that keeps fewer drafted tokens than another "
              "writes later columns than plain generate does, so its outputs would differ. Generate one row at a time.")
    check_placeholders(spec, target.config, ids, mask, spec.family.model_inputs(kwargs))
    vocab = vocab_map(spec, draft_vocab_size(draft) if own_vocab else kind.target_vocab_size(draft, target), ids.device)
    _check_draft(draft, kind, ids, config, vocab, kwargs)
    if config.stop_strings is not None:
        if tokenizer is None:
            _fail(UnsupportedGenerationError, "stop_strings needs the tokenizer: pass tokenizer=processor.tokenizer.")
        from transformers import StoppingCriteriaList
        from transformers.generation import StopStringCriteria

        criteria = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=config.stop_strings))
        kwargs["stopping_criteria"], kwargs["stop_strings"] = criteria, None
    sources = (getattr(target, "generation_config", None), getattr(draft, "generation_config", None))
    budget = _resolve_budget(target, draft, generation_config, kwargs)
    if budget.confidence is not None and (shaper is not None or config.cache_implementation == "static") \
            and not _chosen("assistant_confidence_threshold", kwargs, generation_config, sources[1]):
        budget.confidence = None  # transformers' filled-in default, not the caller's: no threshold for fixed shapes
    chosen_gamma = _gamma_source(kwargs, generation_config, target)  # a γ the caller set conflicts with a shape
    if shaper is not None:
        budget = shaper.call_budget(budget, CallContext(target, kind, config, chosen_gamma, vocab.target_vocab,
                                                        stateful, ids.shape[0], ids.device))
    for key in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
        kwargs.pop(key, None)  # consumed here; stock generate must not see an assisted-mode option
    if config.cache_implementation == "static":
        _check_static(config, budget)
        budget.fixed_width = True  # one block width: compiled graphs are reused round after round
    return Plan(kind, vocab, budget, kwargs, backend_for(config.cache_implementation), draft)
