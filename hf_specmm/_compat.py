"""The one module that touches private transformers internals.

Everything hf_specmm needs from transformers beyond its public API goes through here, so that a transformers
upgrade breaks in one place with a clear message. Tested with transformers 5.17 to 5.25; :data:`INTERNALS` lists
what is read, probed at import: an older transformers is refused there, a newer one imports with one warning, and
``enable()`` refuses where an internal is missing or changed (docs/transformers-versions.md).

Private things used (all read in the installed transformers source, 5.17 to 5.25):
- ``GenerationMixin.generate(custom_generate=<callable>)`` hands the callable fully prepared inputs
  (generation config, logits processors, stopping criteria, cache, multimodal kwargs).
- ``GenerationMixin._prefill`` runs the first forward exactly as plain ``generate`` does.
- ``GenerationConfig._pad_token_tensor`` / ``_eos_token_tensor``, set by ``_prepare_special_tokens``.
- ``Cache.crop(-n)`` with a negative count (positive counts were removed in 5.18).
- ``DynamicCache.layers[i].keys`` / ``.values`` (per-row compaction of sliding-window models' caches, and
  dropping finished rows from a batch).
- Linear-attention cache layers' states and, from 5.25, their token count (``cumulative_length_linear``).
- The name of the KV cache in forward kwargs, model outputs and ``generate``'s ``model_kwargs``:
  ``past_key_values`` up to 5.23, ``cache`` from 5.24 (the old name still works there, with a warning).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch
import transformers
from packaging.version import Version
from transformers import GenerationMixin

from . import versions
from .versions import MIN_TRANSFORMERS, NEWEST_TESTED, TESTED_RANGE, TESTED_WINDOW, Internal  # noqa: F401

_INSTALLED = versions.INSTALLED
versions.refuse_older(_INSTALLED)  # before reading anything below


def _written_layer(cls: Any) -> Any:
    layer = cls()
    layer.update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
    return layer


_QWEN3_5 = "models.qwen3_5.modeling_qwen3_5"
_GEMMA4_ASSISTANT = "models.gemma4_assistant.modeling_gemma4_assistant"

#: every private internal read below, as the tested versions have it (probed at import: :func:`probe_internals`)
INTERNALS = (
    Internal("generation.utils.GenerationMixin.generate", params=("custom_generate",)),
    Internal("generation.utils.GenerationMixin._prefill",
             params=("input_ids", "generation_config", "model_kwargs", "is_first_iteration")),
    Internal("generation.utils.GenerationMixin._prepare_generation_config", params=("generation_config",)),
    Internal("generation.utils.GenerationMixin._prepare_special_tokens", params=("generation_config",)),
    Internal("generation.utils.GenerationMixin._valid_auto_compile_criteria",
             params=("model_kwargs", "generation_config")),
    Internal("modeling_utils.PreTrainedModel.get_compiled_call", params=("compile_config",)),
    Internal("utils.cached_file", params=("path_or_repo_id", "filename")),
    Internal("masking_utils._preprocess_mask_arguments", params=("attention_mask",)),
    Internal("cache_utils.CacheLayerMixin"),
    Internal("cache_utils.LinearAttentionCacheLayerMixin"),
    Internal("cache_utils.DynamicCache", params=("config",), attrs=("layers",), sample=lambda cls: cls()),
    Internal("cache_utils.DynamicLayer", attrs=("keys", "values", "crop"), sample=_written_layer),
    Internal("cache_utils.StaticCache", params=("config", "max_cache_len")),
    Internal("cache_utils.StaticLayer", params=("max_cache_len",),
             attrs=("max_cache_len", "cumulative_length", "is_initialized"), sample=lambda cls: cls(max_cache_len=1)),
    Internal("cache_utils.LinearAttentionLayer", attrs=("conv_states", "recurrent_states", "has_previous_state"),
             sample=lambda cls: cls()),
    # from 5.25 a linear layer counts its tokens, and a cache whose layer 0 is one reports that count as its length
    Internal("cache_utils.LinearAttentionLayer", attrs=("cumulative_length_linear",), sample=lambda cls: cls(),
             since="5.25"),
    # Inkling's hybrid layers (short-convolution states beside keys / values): a full-attention one for every layer
    Internal("cache_utils.LinearAttentionAndFullAttentionLayer", params=("number_of_states",),
             attrs=("conv_states", "has_previous_state", "number_of_states", "keys", "values"),
             sample=lambda cls: cls(number_of_states=4), since="5.25"),
    Internal("cache_utils.LinearAttentionAndStaticFullAttentionLayer", params=("max_cache_len", "number_of_states"),
             attrs=("conv_states", "has_previous_state", "number_of_states", "max_cache_len", "cumulative_length"),
             sample=lambda cls: cls(max_cache_len=1, number_of_states=4), since="5.25"),
    Internal(f"{_QWEN3_5}.causal_conv1d_fn", params=("hidden_states", "weight", "bias", "activation")),
    Internal(f"{_QWEN3_5}.torch_recurrent_gated_delta_rule",
             params=("query", "key", "value", "g", "beta", "initial_state", "output_final_state",
                     "use_qk_l2norm_in_kernel")),
    Internal(f"{_QWEN3_5}.Qwen3_5GatedDeltaNet.forward", params=("cache",), since="5.24"),
    Internal("cache_utils.DummyLayer", since="5.24"),
    Internal("models.gemma4.Gemma4TextConfig", attrs=("kv_sharing_modes", "num_kv_shared_layers", "layer_types"),
             sample=lambda cls: cls(), since="5.24"),
    Internal(f"{_GEMMA4_ASSISTANT}.Gemma4AssistantForCausalLM", since="5.24"),
)


#: the internals :func:`check_transformers_version` found missing or changed (``enable()`` refuses while any is)
MISSING_INTERNALS: list[str] = []


def probe_internals(installed: Version = _INSTALLED) -> list[str]:
    """What is missing or changed in this transformers among :data:`INTERNALS` (see :func:`versions.probe`)."""
    return versions.probe(INTERNALS, installed)


def check_transformers_version(installed: Version = _INSTALLED) -> None:
    """At import: refuse a transformers older than the tested window, probe :data:`INTERNALS`, and warn once if
    the version is newer than the tested window."""
    global MISSING_INTERNALS
    MISSING_INTERNALS = versions.check(INTERNALS, installed)


def require_internals() -> None:
    """Raise (``enable()``) if a private internal hf_specmm reads is missing or changed in this transformers."""
    if MISSING_INTERNALS:
        from .errors import UnsupportedTransformersError

        raise UnsupportedTransformersError(
            f"hf_specmm cannot run on transformers {_INSTALLED} (tested with {TESTED_WINDOW}): "
            + "; ".join(MISSING_INTERNALS)
            + f". Install a tested version, e.g. `pip install 'transformers{TESTED_RANGE}'`."
        )


check_transformers_version()

from transformers import cache_utils  # noqa: E402 (in range only)
from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin  # noqa: E402

#: Gemma 4 / Gemma 4 Unified targets are supported from 5.24 on: 5.17 has the model classes, but its Gemma 4
#: processors import torchvision, so the offline fixtures (and the families) are not verified there
GEMMA4_SUPPORTED = _INSTALLED >= Version("5.24.0.dev0")
#: Step3.7 targets on every supported transformers (5.17 has the class; its forward takes ``pixel_values``,
#: ``pixel_values_local`` and ``num_local_patches``, and plain ``generate`` runs image prompts)
STEP3P7_SUPPORTED = _INSTALLED >= Version("5.17.0")
#: Inkling targets from 5.25 on: 5.17's InklingForConditionalGeneration norms its merged input embeddings twice (in
#: ``InklingModel``, then again in its text model), so no draft that embeds tokens itself (its own text model as a
#: causal LM, a feature head, the target drafting for itself) reads what the target reads; 5.25 norms them once
INKLING_SUPPORTED = _INSTALLED >= Version("5.25.0.dev0")

#: the KV cache's keyword in a model's forward, its outputs and generate's model_kwargs (renamed in 5.24)
CACHE_KWARG = "cache" if _INSTALLED >= Version("5.24.0.dev0") else "past_key_values"
#: every name a user may pass a cache under (the old one is still accepted by 5.24, with a warning)
CACHE_KWARG_NAMES = ("cache", "past_key_values")


def cache_kwargs(cache: Any) -> dict[str, Any]:
    """``{<this transformers' cache keyword>: cache}`` for a model forward."""
    return {CACHE_KWARG: cache}


def output_cache(out: Any) -> Any:
    """The KV cache a model forward returned (``out.cache`` from 5.24, ``out.past_key_values`` before)."""
    return getattr(out, CACHE_KWARG, None)


def passed_cache(kwargs: dict) -> Any:
    """The cache a user passed to ``generate`` under either name, or None."""
    for name in CACHE_KWARG_NAMES:
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


def stock_generate(model: Any, *args: Any, **kwargs: Any) -> Any:
    """Plain ``GenerationMixin.generate`` of the model's class, bypassing our instance hook."""
    return type(model).generate(model, *args, **kwargs)


def generate_with_decoding_fn(model: Any, decoding_fn: Callable[..., Any], **kwargs: Any) -> Any:
    """Run stock ``generate`` preparation, then ``decoding_fn(model, input_ids, logits_processor=...,
    stopping_criteria=..., generation_config=..., **model_kwargs)``. Stock passes a callable only the
    keyword arguments its own signature adds over ``_sample``'s: the streamer reaches it by closure."""
    return type(model).generate(model, custom_generate=decoding_fn, **kwargs)


def target_prefill(model: Any, input_ids: torch.Tensor, generation_config: Any, model_kwargs: dict) -> Any:
    """First forward of the target, exactly as plain generate does it (multimodal inputs included)."""
    return GenerationMixin._prefill(model, input_ids, generation_config, model_kwargs, is_first_iteration=True)


def pad_token_tensor(generation_config: Any) -> torch.Tensor | None:
    return getattr(generation_config, "_pad_token_tensor", None)


def eos_token_tensor(generation_config: Any) -> torch.Tensor | None:
    return getattr(generation_config, "_eos_token_tensor", None)


def crop_cache(cache: Any, new_length: int) -> None:
    """Shrink a cache to ``new_length`` physical slots (no copy for dynamic layers)."""
    layers = kv_layers(cache)  # linear-attention states are rolled back by caches/linear.py
    # the attention layers' length: from 5.25 ``cache.get_seq_length()`` reads layer 0, a linear layer's count
    excess = (layers[0].get_seq_length() if layers else 0) - new_length
    if excess > 0:
        for layer in layers:
            _kv_crop(layer)(layer, -excess)
    set_linear_length(cache, new_length)


def _kv_crop(layer: Any) -> Callable[[Any, int], None]:
    """The attention part's ``crop`` of a cache layer: a hybrid layer's own ``crop`` also crops its conv states,
    which raises unless past recording is on (its states are rolled back by caches/short_conv.py instead)."""
    for cls in type(layer).__mro__:
        if "crop" in vars(cls) and not issubclass(cls, LinearAttentionCacheLayerMixin):
            return vars(cls)["crop"]
    return type(layer).crop


def set_linear_length(cache: Any, length: int) -> None:
    """Set the token count of every linear-attention layer of ``cache`` to ``length`` (in place). From 5.25 such a
    layer counts the tokens it read (``cumulative_length_linear``, what ``get_seq_length`` returns for a cache
    whose layer 0 is one, e.g. for M-RoPE positions); a rollback that rewrites its states must move it too."""
    for layer in cache.layers:
        count = getattr(layer, "cumulative_length_linear", None) if has_conv_states(layer) else None
        if isinstance(count, torch.Tensor):
            count.fill_(length)


def new_dynamic_cache(model: Any = None) -> Any:
    """A dynamic cache with full (never sliding) layers: it can be cropped at any length. Sliding-window
    attention still applies, through the attention mask the model builds from its config. A ``model`` with
    linear-attention layers gets their state layers (``DynamicCache(config=...)`` with every attention layer a
    full one)."""
    from transformers import DynamicCache

    if model is None or not stateful_layer_types(model.config):
        return DynamicCache()
    from transformers.cache_utils import DynamicLayer, LinearAttentionAndFullAttentionLayer

    cache = DynamicCache(config=model.config)
    # hybrid layers (Inkling: conv states and keys / values) get a full attention part too
    cache.layers = [layer if is_linear_cache_layer(layer)
                    else LinearAttentionAndFullAttentionLayer(number_of_states=layer.number_of_states)
                    if has_conv_states(layer) else DynamicLayer() for layer in cache.layers]
    return cache


def has_sliding_layers(config: Any) -> bool:
    """Whether a model attends through a sliding window in some layer (Gemma 3, Mistral, ...)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if types:
        return any(t in ("sliding_attention", "chunked_attention", "hybrid_sliding") for t in types)
    return getattr(text, "sliding_window", None) is not None and getattr(text, "use_sliding_window", True) is not False


def gather_cache_slots(cache: Any, start: int, index: torch.Tensor) -> None:
    """Per row, slot ``start + j`` of every layer becomes old slot ``start + index[b, j]`` ([B, k]); slots
    past ``start + k`` are left as they are (the caller crops them)."""
    for layer in cache.layers:
        for name in ("keys", "values"):
            states = getattr(layer, name, None)  # a static layer has none before its first write
            if states is None or states.numel() == 0:
                continue
            b, h, _, d = states.shape
            k = index.shape[1]
            idx = (index.to(states.device) + start)[:, None, :, None].expand(b, h, k, d)
            states[:, :, start : start + k] = states.gather(2, idx)


def select_cache_rows(cache: Any, keep: torch.Tensor) -> None:
    """Keep only the rows ``keep`` [k] (batch indices, in the new order) of every layer of ``cache``."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel() > 0:
            index = keep.to(layer.keys.device)  # a dispatched model's layers sit on several devices
            layer.keys, layer.values = layer.keys[index], layer.values[index]
    select_linear_rows(cache, keep)


def is_static_cache(cache: Any) -> bool:
    from transformers import StaticCache

    return isinstance(cache, StaticCache)


def filled_generation_default(name: str) -> Any:
    """The value transformers fills into a generation config field left unset (``_get_default_generation_params``;
    5.17's pipelines pass configs filled this way, e.g. ``assistant_confidence_threshold=0.4``,
    ``num_assistant_tokens=20``), or None where this version fills nothing."""
    from transformers import GenerationConfig

    defaults = getattr(GenerationConfig, "_get_default_generation_params", None)
    return defaults().get(name) if callable(defaults) else None


def resolve_generation_config(model: Any, generation_config: Any, kwargs: dict) -> Any:
    """The generation config ``generate`` would use (model defaults < ``generation_config`` < kwargs)."""
    config, _ = model._prepare_generation_config(generation_config, **dict(kwargs))
    return config


def rebuild_dynamic_cache(cache: Any, kv: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                          length: int) -> Any:
    """A new ``DynamicCache``: each attention layer of ``cache`` holds ``kv(keys, values)`` of the old one's
    (per-layer ``keys`` / ``values`` [B, H, L, D]); each linear-attention layer is carried over as it is (its
    states are each row's own), its token count set to ``length``."""
    from transformers import DynamicCache

    out = DynamicCache()
    for index, layer in enumerate(cache.layers):
        if is_linear_cache_layer(layer):
            out.layers.append(layer)
        elif has_conv_states(layer):  # a hybrid layer (Inkling): its conv states carried over with it
            layer.keys, layer.values = kv(layer.keys, layer.values)
            out.layers.append(layer)
        else:
            out.update(*kv(layer.keys, layer.values), index)
    set_linear_length(out, length)
    return out


def hub_file(repo_id: str, filename: str, **hub_kwargs: Any) -> str | None:
    """Local path of ``filename`` of a Hub repo (downloaded or from the cache), or None if the repo has no
    such file (``cached_file``'s private flag for "missing is not an error")."""
    from transformers.utils import cached_file

    return cached_file(repo_id, filename, _raise_exceptions_for_missing_entries=False, **hub_kwargs)


# ---- static caches and compilation --------------------------------------------------------------------
# Read in transformers 5.17 and 5.24 (identical where used here): a ``StaticLayer`` preallocates
# ``keys`` / ``values`` [B, H, max_cache_len, D] on its first update and writes every row's new states at
# the same slots, ``arange(k) + layer.cumulative_length`` (a 0-d long tensor it advances in place); neither
# version's models take a ``cache_position`` argument any more. The mask is sized from the layer
# (``get_mask_sizes`` -> ``(max_cache_len, 0)``: a 2-D mask is zero-padded to the full width) and the causal
# offset of the queries is ``cumulative_length`` itself (``Cache.get_query_offset``). 5.17's StaticLayer has
# no ``crop`` (5.24 added one that moves ``cumulative_length``), so the write pointer is set here directly.
# Stock ``generate`` builds ``StaticCache(config=text_config, max_cache_len=max(max_length - 1,
# generation_config.max_cache_len, model._previous_max_cache_length))`` and records the size on the model.
# Sliding layers become ``StaticSlidingWindowLayer``: a buffer of ``sliding_window`` slots that rolls once
# full (states past the window are dropped for good: not croppable, and a hole would waste a window slot).


def static_cache_length(model: Any, needed: int, generation_config: Any = None) -> int:
    """The slots stock ``generate`` would give a static cache that must hold ``needed`` slots: never less than
    ``generation_config.max_cache_len`` nor than the model's previous static cache (so later calls, up to that
    size, reuse compiled graphs). Records the size on the model, as stock does."""
    length = max(needed, getattr(generation_config, "max_cache_len", None) or 0,
                 getattr(model, "_previous_max_cache_length", -1))
    model._previous_max_cache_length = length
    return length


class ColumnStaticCache(cache_utils.StaticCache):
    """A ``StaticCache`` whose query offset is a copy of its layer's write pointer. Inkling's attention (5.25)
    keeps ``cache.get_query_offset()`` and reads it after ``cache.update``: a ``StaticLayer``'s pointer is a tensor
    advanced in place, so stock's static cache shifts every query column (relative position bias, log scaling)
    right by the forward's width; a dynamic cache's offset is an int, read as it was before the write."""

    def get_query_offset(self, layer_idx: int = 0) -> Any:
        offset = super().get_query_offset(layer_idx)
        return offset.clone() if isinstance(offset, torch.Tensor) else offset


def new_static_cache(model: Any, max_cache_len: int, full_layers: bool = False) -> Any:
    """``StaticCache`` as stock ``generate`` creates it for ``model`` (a :class:`ColumnStaticCache` for a model
    that reads distances off cache columns); ``full_layers``: sliding-window layers replaced by full-length ones
    (the attention mask then applies the window)."""
    from transformers import StaticCache

    kind = ColumnStaticCache if distances_by_column(model.config) else StaticCache
    cache = kind(config=model.config.get_text_config(decoder=True), max_cache_len=max_cache_len)
    if full_layers:
        cache.layers = [_full_static_layer(layer, max_cache_len) if getattr(layer, "is_sliding", False) else layer
                        for layer in cache.layers]
    return cache


def _full_static_layer(layer: Any, max_cache_len: int) -> Any:
    """A full-length static layer in place of the sliding one ``layer``: a hybrid one (Inkling: conv states beside
    keys / values) keeps its conv states."""
    if has_conv_states(layer):
        from transformers.cache_utils import LinearAttentionAndStaticFullAttentionLayer

        return LinearAttentionAndStaticFullAttentionLayer(max_cache_len=max_cache_len,
                                                          number_of_states=layer.number_of_states)
    from transformers.cache_utils import StaticLayer

    return StaticLayer(max_cache_len=max_cache_len)


def kv_layers(cache: Any) -> list:
    """The layers of ``cache`` that hold keys / values: a hybrid model's linear-attention layers (rolled back by
    caches/linear.py) left out, and Gemma 4's KV-shared layers, which read their producer layer's states and get a
    ``DummyLayer`` (5.24: ``keys`` None, no length, never written) in a cache built from the config."""
    dummy = getattr(cache_utils, "DummyLayer", None)
    return [layer for layer in cache.layers
            if not is_linear_cache_layer(layer) and (dummy is None or not isinstance(layer, dummy))]


def static_capacity(cache: Any) -> int:
    """Slots per row of a static cache (every layer of a full-layer static cache has the same)."""
    return min(layer.max_cache_len for layer in kv_layers(cache))


def set_static_length(cache: Any, length: int) -> None:
    """Move every layer's write pointer to slot ``length`` in place (the tensors keep their static addresses,
    so compiled graphs and CUDA graphs stay valid): later writes overwrite the slots from there on."""
    for layer in kv_layers(cache):
        if layer.is_initialized:
            layer.cumulative_length.fill_(length)
    set_linear_length(cache, length)


def select_static_rows(cache: Any, keep: torch.Tensor) -> None:
    """Keep only rows ``keep`` of a static cache: new (smaller) tensors, marked static again, so a compiled
    forward recompiles once for the new batch size."""
    select_linear_rows(cache, keep)
    for layer in kv_layers(cache):
        if not layer.is_initialized:
            continue
        index = keep.to(layer.keys.device)
        layer.keys, layer.values = layer.keys[index].contiguous(), layer.values[index].contiguous()
        layer.batch_size = int(keep.numel())
        torch._dynamo.mark_static_address(layer.keys)
        torch._dynamo.mark_static_address(layer.values)


def compile_requested(model: Any, model_kwargs: dict, generation_config: Any) -> bool:
    """Whether stock ``generate`` would decode with a compiled forward (``_valid_auto_compile_criteria``:
    not ``disable_compile``; a compileable, non-dynamic cache in ``model_kwargs``; a CUDA/XPU/... device, or
    any device with ``compile_config._compile_all_devices``; no quantizer that forbids it, no CPU/disk
    offload). 5.17 reads the cache from ``model_kwargs['past_key_values']``, 5.24 from ``['cache']``."""
    kwargs = dict(model_kwargs)
    cache = passed_cache(kwargs)
    for name in CACHE_KWARG_NAMES:
        kwargs[name] = cache
    return bool(model._valid_auto_compile_criteria(kwargs, generation_config))


def compiled_graph_count() -> int:
    """Graphs torch.compile (dynamo) has compiled in this process so far, recompilations included."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


_RECOMPILE_LIMIT = "Dynamo recompile limit exceeded"  # the start of dynamo's message when it gives up on a frame


def recompile_limit_hits() -> int:
    """Frames dynamo has given up compiling in this process so far (its ``recompile_limit`` hit: they run eager
    from then on, for the rest of the process, without compiling anything more). Read from dynamo's own
    ``counters["unimplemented"]`` (torch 2.1x), where each give-up is recorded once."""
    from torch._dynamo.utils import counters

    return int(sum(n for message, n in counters["unimplemented"].items() if message.startswith(_RECOMPILE_LIMIT)))


def compiled_call(model: Any, compile_config: Any = None) -> Callable[..., Any]:
    """``torch.compile(model.__call__, **compile_config.to_dict())`` as stock builds it (cached on the model,
    rebuilt when the config changes; ``CompileConfig()`` defaults: inductor, ``mode="reduce-overhead"``)."""
    if hasattr(model, "get_compiled_call") and hasattr(model, "generation_config"):
        return model.get_compiled_call(compile_config)
    # a module without a generation config (a wrapped draft): the same compile, cached on it the same way
    cached = vars(model).get("_hf_specmm_compiled_call")
    if cached is None or cached[0] != compile_config:
        cached = (compile_config, torch.compile(model.__call__, **compile_config.to_dict()))
        vars(model)["_hf_specmm_compiled_call"] = cached
    return cached[1]


# ---- custom 4-D masks: draft trees, the static cache's windows ----------------------------------------------
# Read in transformers 5.17 and 5.24 (masking_utils._preprocess_mask_arguments): an attention mask that is
# already 4-D is returned as-is by create_causal_mask / create_sliding_window_causal_mask, so neither the
# causal pattern nor a sliding window is applied to it. Models that mix layer types (Gemma 3) build one mask
# per type and take a dict {layer type: mask} as-is instead (``isinstance(attention_mask, dict)``).


def mask_argument(config: Any, make_mask: Callable[[int | None], torch.Tensor],
                  block_mask: torch.Tensor | None = None) -> Any:
    """The ``attention_mask`` argument that makes a model attend through a custom 4-D mask. ``make_mask(window)``
    builds it, with sliding window ``window`` applied (None: none). A model with both full and sliding layers
    (Gemma 3) gets ``{"full_attention": make_mask(None), "sliding_attention": make_mask(window)}``; one whose
    every layer slides (Mistral) the windowed mask; others the plain one. Inkling's hybrids also take their short
    convolutions' padding mask under ``"linear_attention"``: ``block_mask`` [B, block width] (None: no padding)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    if has_short_convs(config):
        # Inkling's text model picks "full_attention" / "sliding_attention" per layer and zeroes its convolutions'
        # inputs where "linear_attention" (a 2-D mask of the block's slots) is 0
        masks = {"full_attention": make_mask(None), "linear_attention": block_mask}
        if "hybrid_sliding" in stateful_layer_types(config):
            masks["sliding_attention"] = make_mask(window)
        return masks
    if "linear_attention" in (getattr(text, "layer_types", None) or ()):
        # a hybrid (Qwen3.5): the full-attention layers take the 4-D mask; None for the linear-attention layers,
        # which otherwise read the last block-width columns of a 2-D mask as the block's padding
        return {"full_attention": make_mask(None), "linear_attention": None}
    if not has_sliding_layers(config) or window is None:
        return make_mask(None)
    types = set(getattr(text, "layer_types", None) or ["sliding_attention"])
    if types == {"sliding_attention"}:
        return make_mask(window)
    if types != {"full_attention", "sliding_attention"}:
        raise NotImplementedError(f"draft trees support full and sliding-window attention layers, not {sorted(types)}")
    return {"full_attention": make_mask(None), "sliding_attention": make_mask(window)}


# ---- linear-attention layers (Qwen3.5's Gated DeltaNet) -------------------------------------------------------
# Read in transformers 5.17, 5.24 and 5.25 (the same storage; the module's cache keyword and where the key heads
# are repeated differ, see below): a ``DynamicCache(config=...)`` / ``StaticCache`` of a hybrid model
# holds a ``LinearAttentionLayer`` (no keys / values) for each "linear_attention" layer, with
# ``conv_states[0]`` [B, conv_dim, K] (the last K inputs of the causal conv) and ``recurrent_states[0]``
# [B, H_v, D_k, D_v] (float32), both written in place (``copy_``: static addresses). ``crop`` raises unless
# past recording is on (5.25: it then also restores recorded recurrent states). From 5.25 the layer counts the
# tokens it read (``cumulative_length_linear``), and ``Cache.get_seq_length()`` reports layer 0's count when
# layer 0 is a linear layer (Qwen3.5's is). A layer's ``*GatedDeltaNet`` module reads its input through
# ``in_proj_qkv`` (-> the conv), ``in_proj_a`` (-> the decay g) and ``in_proj_b`` (-> beta); a single-token step
# updates the states with the modeling module's ``causal_conv1d_update`` and ``torch_recurrent_gated_delta_rule``,
# a longer block with the chunked kernel (5.25: both kernels wrapped as kernel-hub modules, same arguments).
# A 2-D attention mask zeroes padded tokens' inputs, which is a no-op on a zero state (left padding) only.
# The replay maths: caches/gated_delta.py.

STATEFUL_LAYER_TYPES = ("linear_attention", "conv", "hybrid", "hybrid_sliding", "mamba")
_GATED_DELTA_PARTS = ("in_proj_qkv", "in_proj_a", "in_proj_b", "conv1d", "A_log", "dt_bias", "layer_idx")


def stateful_layer_types(config: Any) -> set[str]:
    """The layer types of ``config``'s decoder that keep a recurrent state (empty for attention-only models)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return {t for t in (getattr(text, "layer_types", None) or ()) if t in STATEFUL_LAYER_TYPES}


def gated_delta_modules(model: Any) -> dict[int, Any]:
    """``{layer index: module}`` of ``model``'s Gated DeltaNet linear-attention modules (Qwen3.5, Qwen3-Next)."""
    found = {}
    for module in model.modules():
        if type(module).__name__.endswith("GatedDeltaNet") and all(hasattr(module, p) for p in _GATED_DELTA_PARTS):
            found[int(module.layer_idx)] = module
    return found


def unsupported_stateful_layers(model: Any) -> str | None:
    """Why ``model``'s stateful layers cannot be rolled back (None: it has none, or only Gated DeltaNet ones, or
    only short convolutions beside attention)."""
    types = stateful_layer_types(model.config)
    if not types:
        return None
    if types <= set(SHORT_CONV_LAYER_TYPES):
        return unsupported_short_convs(model)
    if types != {"linear_attention"}:
        return f"its layer types {sorted(types)} keep states hf_specmm cannot roll back (only 'linear_attention')"
    text = model.config.get_text_config(decoder=True)
    wanted = {i for i, t in enumerate(text.layer_types) if t == "linear_attention"}
    missing = wanted - set(gated_delta_modules(model))
    if missing:
        return (f"its linear-attention layers {sorted(missing)[:4]} are not Gated DeltaNet modules "
                f"(in_proj_qkv / in_proj_a / in_proj_b / conv1d), the only kind hf_specmm rolls back")
    return None


def is_linear_cache_layer(layer: Any) -> bool:
    """A cache layer that holds only linear-attention states (no keys / values, no sequence length)."""
    return isinstance(layer, LinearAttentionCacheLayerMixin) and not isinstance(layer, CacheLayerMixin)


def linear_states(cache: Any, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(conv, recurrent)`` states of a linear-attention layer, or None before its first forward."""
    layer = cache.layers[layer_idx]
    if not layer.has_previous_state[0]:
        return None
    return layer.conv_states[0], layer.recurrent_states[0]


def write_linear_states(cache: Any, layer_idx: int, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
    """Overwrite a layer's states in place (same tensors: compiled graphs and static addresses stay valid)."""
    layer = cache.layers[layer_idx]
    layer.conv_states[0].copy_(conv)
    layer.recurrent_states[0].copy_(recurrent)


def select_linear_rows(cache: Any, keep: torch.Tensor) -> None:
    """Keep only rows ``keep`` of every linear-attention (or hybrid) layer's states."""
    for layer in cache.layers:
        if not has_conv_states(layer):
            continue
        for states in (layer.conv_states, layer.recurrent_states):
            for i, state in states.items():
                if isinstance(state, torch.Tensor):
                    states[i] = state[keep.to(state.device)].contiguous()


def has_conv_states(layer: Any) -> bool:
    """A cache layer with conv (and maybe recurrent) states: a linear-attention layer or a hybrid one."""
    return isinstance(layer, LinearAttentionCacheLayerMixin)


# ---- short convolutions beside attention (Inkling) ------------------------------------------------------------
# Read in transformers 5.17 and 5.25: Inkling's layer types are "hybrid" / "hybrid_sliding"; a cache built from
# its config holds a ``LinearAttentionAnd{Full,SlidingWindow}AttentionLayer`` per layer: keys / values and
# ``number_of_conv_states`` (4) conv states, ``conv_states[i]`` [B, C, K] (float32: the last K inputs of the
# layer's short convolution ``conv_idx == i``), written in place (``copy_``) by a forward. Each
# ``InklingShortConvolution`` (``conv1d``, ``layer_idx``, ``conv_idx``) takes its cache under ``cache`` (5.25)
# or ``past_key_values`` (5.17) and its input [B, W, C] as its first argument; it convolves ``input.float()``
# (padding zeroed by a 2-D ``conv_mask``) with no activation, and adds the input back. Nothing else is a state:
# a short convolution is rolled back by a window over its inputs (caches/short_conv.py).

SHORT_CONV_LAYER_TYPES = ("hybrid", "hybrid_sliding")
SHORT_CONV_CACHE_KWARGS = ("cache", "past_key_values")
_SHORT_CONV_PARTS = ("conv1d", "layer_idx", "conv_idx")


def has_short_convs(config: Any) -> bool:
    """Whether a model's layers are hybrids with short-convolution states (Inkling)."""
    types = stateful_layer_types(config)
    return bool(types) and types <= set(SHORT_CONV_LAYER_TYPES)


def short_conv_modules(model: Any) -> dict[tuple[int, int], Any]:
    """``{(layer index, conv index): module}`` of ``model``'s short convolutions whose states its cache keeps."""
    found = {}
    for module in model.modules():
        if type(module).__name__.endswith("ShortConvolution") and all(hasattr(module, p) for p in _SHORT_CONV_PARTS):
            found[(int(module.layer_idx), int(module.conv_idx))] = module
    return found


def unsupported_short_convs(model: Any) -> str | None:
    """Why the conv states of ``model``'s hybrid layers cannot be rolled back (None: each is a short conv's)."""
    text = model.config.get_text_config(decoder=True)
    per_layer = int(getattr(text, "number_of_conv_states", 1))
    found = short_conv_modules(model)
    types = text.layer_types[: text.num_hidden_layers]  # a cut-down copy keeps its source's list
    wanted = {(i, c) for i, t in enumerate(types) if t in SHORT_CONV_LAYER_TYPES for c in range(per_layer)}
    missing = sorted(wanted - set(found))
    if missing:
        return (f"the conv states {missing[:4]} (layer, state) of its hybrid layers belong to no short convolution "
                "(conv1d / layer_idx / conv_idx), the only kind of hybrid layer hf_specmm rolls back")
    if any(m.conv1d.bias is not None for m in found.values()):
        return "its short convolutions have biases, which hf_specmm's rollback does not replay"
    return None


def conv_state(cache: Any, layer_idx: int, conv_idx: int) -> torch.Tensor | None:
    """Conv state ``conv_idx`` [B, C, K] of layer ``layer_idx``, or None before the layer's first forward."""
    layer = cache.layers[layer_idx]
    return layer.conv_states[conv_idx] if layer.has_previous_state[conv_idx] else None


def write_conv_state(cache: Any, layer_idx: int, conv_idx: int, state: torch.Tensor) -> None:
    """Overwrite a conv state in place (same tensor: static addresses stay valid)."""
    cache.layers[layer_idx].conv_states[conv_idx].copy_(state)


def has_embedding_norm(table: Any) -> bool:
    """Whether a token table norms its rows (Inkling's ``InklingNormedEmbedding``: an ``nn.Embedding`` whose
    forward applies its ``embed_norm``); transformers' ``MtpModel`` embeds with the table without it."""
    return isinstance(table, torch.nn.Embedding) and isinstance(getattr(table, "embed_norm", None), torch.nn.Module)


def unnormed_embeddings(table: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """The rows of ``table`` for ``input_ids``, without the table's own embedding norm (see
    :func:`has_embedding_norm`)."""
    if not has_embedding_norm(table):
        return table(input_ids)
    return torch.nn.functional.embedding(input_ids, table.weight, table.padding_idx)


def distances_by_column(config: Any) -> bool:
    """Whether the model reads distances between tokens off cache columns (Inkling's relative position bias:
    ``cache.get_query_offset`` / ``get_mask_sizes``, no ``position_ids``): a hole would count as a token."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "rel_extent", None) is not None and "hybrid" in "".join(getattr(text, "layer_types", ()) or ())


def column_log_scaling(config: Any) -> int | None:
    """Inkling's ``log_scaling_n_floor`` (None: off): full-attention logits scaled by ``1 + a * log(column / floor)``
    of the query's cache column (``cache.get_query_offset``), the only absolute position it reads."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "log_scaling_n_floor", None) if distances_by_column(config) else None


def gated_delta_kernels(module: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``(causal_conv1d_fn, torch_recurrent_gated_delta_rule)`` of a Gated DeltaNet ``module``'s own modeling file:
    its conv over a window and the single-step state update plain ``generate``'s decode steps run."""
    modeling = sys.modules[type(module).__module__]
    return modeling.causal_conv1d_fn, modeling.torch_recurrent_gated_delta_rule


#: the keyword a Gated DeltaNet module's forward takes its cache under (5.24 renamed it, as CACHE_KWARG)
LINEAR_CACHE_KWARG = "cache" if _INSTALLED >= Version("5.24.0.dev0") else "cache_params"
#: 5.24's gated delta kernels repeat the key heads over the value heads themselves; 5.17's module does it first
KERNEL_REPEATS_KEY_HEADS = _INSTALLED >= Version("5.24.0.dev0")


# ---- Gemma 4 assistants (transformers >= 5.24, see drafts/gemma4_assistant) -----------------------------------
# Read in 5.24: a Gemma 4 text config's ``kv_sharing_modes`` marks, per layer, "store" (the last layer of its type
# before the KV-sharing ones, or the last of its type where none shares: its K/V is what the shared layers and
# assistants read), "reuse" or None. A target's cache holds a
# "store" layer's K/V at that layer's index (``cache.layers[i].keys`` / ``.values``, [B, kv heads, slots, D]).
# ``Gemma4AssistantForCausalLM.forward`` (the Unified one is the same) builds its own masks from a 2-D padding
# mask; :func:`gemma4_assistant_backbone` runs its decoder with per-row 4-D masks instead (per-row lengths,
# holes); the projections around it: drafts/gemma4_assistant/modeling.py.

def gemma4_assistant_classes() -> tuple[type, ...]:
    """Stock's Gemma 4 assistant classes (none before 5.24, where the kind is not registered)."""
    if not GEMMA4_SUPPORTED:
        return ()
    names = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")
    return tuple(getattr(transformers, name) for name in names if hasattr(transformers, name))


def gemma4_assistant_class_for(target: Any) -> tuple[type, type]:
    """(assistant class, its config class) that stock pairs with ``target``'s family."""
    unified = "Unified" in type(target).__name__
    prefix = "Gemma4UnifiedAssistant" if unified else "Gemma4Assistant"
    return getattr(transformers, prefix + "ForCausalLM"), getattr(transformers, prefix + "Config")


def shared_kv_producers(text_config: Any) -> dict[str, int]:
    """Layer type -> index of the target layer whose K/V the KV-sharing layers of that type reuse, or that
    stores it for an assistant where no layer shares (``num_kv_shared_layers`` 0: 5.24 marks the last layer of
    each type "store" all the same); empty for a config without ``kv_sharing_modes``."""
    if not GEMMA4_SUPPORTED:
        return {}
    modes = getattr(text_config, "kv_sharing_modes", None) or ()
    return {text_config.layer_types[i]: i for i, mode in enumerate(modes) if mode == "store"}


def cache_layer_states(cache: Any, layer_idx: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [B, kv heads, length, D] of layer ``layer_idx``'s first ``length`` slots (dynamic or static)."""
    layer = cache.layers[layer_idx]
    return layer.keys[:, :, :length], layer.values[:, :, :length]


def gemma4_assistant_backbone(assistant: Any, hidden: torch.Tensor, position_ids: torch.Tensor,
                              shared_kv: dict[str, tuple[torch.Tensor, torch.Tensor]],
                              masks: dict[str, torch.Tensor]) -> torch.Tensor:
    """The last hidden state [B, Q, H] of a Gemma 4 assistant's decoder (``assistant.model``) over ``hidden`` (the
    pre-projected inputs), attending to the target's ``shared_kv`` (per layer type) through ``masks`` (per layer
    type, additive [B, 1, Q, S]) in place of the ones ``Gemma4AssistantForCausalLM.forward`` builds."""
    out = assistant.model(input_ids=None, inputs_embeds=hidden, attention_mask=masks, position_ids=position_ids,
                          shared_kv_states=shared_kv, use_cache=False,
                          # not an int: no slicing before the KV-shared layers, which 5.24 cannot do without
                          # per-layer inputs (an assistant has none) once Q > 1 (a tree level's nodes)
                          logits_to_keep=None)
    return out.last_hidden_state
