"""The one module that touches private transformers internals.

Everything hf_specmm needs from transformers beyond its public API goes through here, behind a
version check, so that a transformers upgrade breaks in one place with a clear message.

Private things used (all read in the installed transformers source, 5.17 – 5.24):
- ``GenerationMixin.generate(custom_generate=<callable>)`` hands the callable fully prepared inputs
  (generation config, logits processors, stopping criteria, cache, multimodal kwargs).
- ``GenerationMixin._prefill`` runs the first forward exactly as plain ``generate`` does.
- ``GenerationConfig._pad_token_tensor`` / ``_eos_token_tensor``, set by ``_prepare_special_tokens``.
- ``Cache.crop(-n)`` with a negative count (positive counts were removed in 5.18).
- ``DynamicCache.layers[i].keys`` / ``.values`` (per-row compaction of sliding-window models' caches, and
  dropping finished rows from a batch).
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

MIN_TRANSFORMERS = Version("5.17.0")
MAX_TRANSFORMERS_EXCLUSIVE = Version("5.26.0")
TESTED_RANGE = f">={MIN_TRANSFORMERS},<{MAX_TRANSFORMERS_EXCLUSIVE}"

_INSTALLED = Version(transformers.__version__)


def check_transformers_version() -> None:
    """Raise if the installed transformers is outside the range whose internals we read."""
    base = Version(_INSTALLED.base_version)
    if not (MIN_TRANSFORMERS <= base < MAX_TRANSFORMERS_EXCLUSIVE):
        raise ImportError(
            f"hf_specmm supports transformers {TESTED_RANGE} (it hooks generate internals), but "
            f"transformers {transformers.__version__} is installed. Install a tested version, e.g. "
            f"`pip install 'transformers{TESTED_RANGE}'`."
        )


check_transformers_version()

from transformers import cache_utils  # noqa: E402 (in range only)
from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin  # noqa: E402

#: Gemma 4 / Gemma 4 Unified targets are supported from 5.24 on: 5.17 has the model classes, but its Gemma 4
#: processors import torchvision, so the offline fixtures (and the families) are not verified there
GEMMA4_SUPPORTED = _INSTALLED >= Version("5.24.0.dev0")
#: Step3.7 targets from 5.25 on: 5.17's Step3p7ForConditionalGeneration takes neither ``pixel_values`` nor
#: ``num_local_patches`` (text only), so the family is neither registered nor verified before
STEP3P7_SUPPORTED = _INSTALLED >= Version("5.25.0.dev0")

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
    excess = cache.get_seq_length() - new_length
    if excess > 0:
        for layer in kv_layers(cache):  # linear-attention states are rolled back by caches/linear.py
            layer.crop(-excess)


def new_dynamic_cache(model: Any = None) -> Any:
    """A dynamic cache with full (never sliding) layers: it can be cropped at any length. Sliding-window
    attention still applies, through the attention mask the model builds from its config. A ``model`` with
    linear-attention layers gets their state layers (``DynamicCache(config=...)`` with every attention layer a
    full one)."""
    from transformers import DynamicCache

    if model is None or not stateful_layer_types(model.config):
        return DynamicCache()
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    cache.layers = [layer if is_linear_cache_layer(layer) else DynamicLayer() for layer in cache.layers]
    return cache


def has_sliding_layers(config: Any) -> bool:
    """Whether a model attends through a sliding window in some layer (Gemma 3, Mistral, ...)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if types:
        return any(t in ("sliding_attention", "chunked_attention") for t in types)
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


def compact_cache(cache: Any, mask: torch.Tensor | None, prompt_len: int, length: int) -> Any:
    """The loop's holed cache as plain generate returns it: per row the prompt's slots and its valid
    generated slots, ``length`` slots in all (rows that finished early are zero-padded). Reads the
    per-layer ``keys`` / ``values`` tensors of a DynamicCache."""
    if mask is None or cache is None:
        return cache
    from transformers import DynamicCache

    slots = torch.arange(mask.shape[1], device=mask.device)
    keep = (slots[None] < prompt_len) | mask.bool()
    order = torch.sort((~keep).long(), dim=1, stable=True).indices[:, :length]  # kept slots first, in order
    valid = keep.gather(1, order)
    out = DynamicCache()
    for index, layer in enumerate(cache.layers):
        if is_linear_cache_layer(layer):  # no slots: its states are each row's own
            out.layers.append(layer)
            continue
        keys, values = layer.keys, layer.values  # [B, H, L, D]
        idx = order.to(keys.device)[:, None, :, None]
        zero = ~valid.to(keys.device)[:, None, :, None]
        keys = keys.gather(2, idx.expand(-1, keys.shape[1], -1, keys.shape[-1])).masked_fill(zero, 0)
        values = values.gather(2, idx.expand(-1, values.shape[1], -1, values.shape[-1])).masked_fill(zero, 0)
        out.update(keys, values, index)
    return out


def hub_file(repo_id: str, filename: str, **hub_kwargs: Any) -> str | None:
    """Local path of ``filename`` of a Hub repo (downloaded or from the cache), or None if the repo has no
    such file (``cached_file``'s private flag for "missing is not an error")."""
    from transformers.utils import cached_file

    return cached_file(repo_id, filename, _raise_exceptions_for_missing_entries=False, **hub_kwargs)


# ---- static caches and compilation (issue 20) --------------------------------------------------------
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


def new_static_cache(model: Any, max_cache_len: int, full_layers: bool = False) -> Any:
    """``StaticCache`` exactly as stock ``generate`` creates it for ``model``; ``full_layers``: sliding-window
    layers replaced by full-length ``StaticLayer``s (the attention mask then applies the window)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=max_cache_len)
    if full_layers:
        cache.layers = [StaticLayer(max_cache_len=max_cache_len) if getattr(layer, "is_sliding", False) else layer
                        for layer in cache.layers]
    return cache


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


# ---- custom 4-D masks: draft trees (issue 19), the static cache's windows ------------------------------------
# Read in transformers 5.17 and 5.24 (masking_utils._preprocess_mask_arguments): an attention mask that is
# already 4-D is returned as-is by create_causal_mask / create_sliding_window_causal_mask, so neither the
# causal pattern nor a sliding window is applied to it. Models that mix layer types (Gemma 3) build one mask
# per type and take a dict {layer type: mask} as-is instead (``isinstance(attention_mask, dict)``).


def mask_argument(config: Any, make_mask: Callable[[int | None], torch.Tensor]) -> Any:
    """The ``attention_mask`` argument that makes a model attend through a custom 4-D mask. ``make_mask(window)``
    builds it, with sliding window ``window`` applied (None: none). A model with both full and sliding layers
    (Gemma 3) gets ``{"full_attention": make_mask(None), "sliding_attention": make_mask(window)}``; one whose
    every layer slides (Mistral) the windowed mask; others the plain one."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
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


# ---- linear-attention layers (Qwen3.5's Gated DeltaNet, issue 25) ---------------------------------------
# Read in transformers 5.17 and 5.24 (the same storage; the module's cache keyword and where the key heads are
# repeated differ, see below): a ``DynamicCache(config=...)`` / ``StaticCache`` of a hybrid model
# holds a ``LinearAttentionLayer`` (no keys / values, no sequence length) for each "linear_attention" layer, with
# ``conv_states[0]`` [B, conv_dim, K] (the last K inputs of the causal conv) and ``recurrent_states[0]``
# [B, H_v, D_k, D_v] (float32), both written in place (``copy_``: static addresses). ``crop`` raises unless
# past recording is on, and then only trims the conv state: the recurrent state cannot be cropped. A layer's
# ``*GatedDeltaNet`` module reads its input through ``in_proj_qkv`` (-> the conv), ``in_proj_a`` (-> the decay g)
# and ``in_proj_b`` (-> beta); a single-token step updates the states with the modeling module's
# ``causal_conv1d_update`` and ``torch_recurrent_gated_delta_rule``, a longer block with the chunked kernel.
# A 2-D attention mask zeroes padded tokens' inputs, which is a no-op on a zero state (left padding) only.

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
    """Why ``model``'s stateful layers cannot be rolled back (None: it has none, or only Gated DeltaNet ones)."""
    types = stateful_layer_types(model.config)
    if not types:
        return None
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
    """Keep only rows ``keep`` of every linear-attention layer's states."""
    for layer in cache.layers:
        if is_linear_cache_layer(layer) and layer.has_previous_state[0]:
            index = keep.to(layer.conv_states[0].device)
            layer.conv_states[0] = layer.conv_states[0][index].contiguous()
            layer.recurrent_states[0] = layer.recurrent_states[0][index].contiguous()


def gated_delta_replay(modules: list[Any], states: list[tuple[torch.Tensor, torch.Tensor]],
                       inputs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                       keep: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The states of Gated DeltaNet layers after each row's kept tokens, as single decode steps compute them.

    Per layer: ``states`` (conv [B, C, K], recurrent [B, H, Dk, Dv]) before the tokens; ``inputs`` the tokens'
    ``in_proj_qkv`` [B, W, C] / ``in_proj_a`` / ``in_proj_b`` [B, W, H] outputs from the forward that read them;
    ``keep`` [B, W] bool: the tokens each row keeps (in order; the others never happened for that row). Each
    kept token is one call of the modeling module's own recurrent step (``torch_recurrent_gated_delta_rule``,
    the kernel of plain generate's decode steps) on its conv output (``causal_conv1d_fn`` over the row's last
    K kept inputs); layers of one shape take their steps together (one kernel call per step for all of them)."""
    modeling = sys.modules[type(modules[0]).__module__]
    batch = keep.shape[0]
    counts = keep.sum(-1)
    steps = int(counts.max()) if counts.numel() else 0
    # each row's kept tokens first, in order (a stable sort): their conv windows are contiguous
    order = torch.sort((~keep).long(), dim=1, stable=True).indices
    convs, per_step = [], []
    for module, (conv, _), (qkv, a, b) in zip(modules, states, inputs):
        qkv, a, b = (x.gather(1, order.to(x.device)[..., None].expand_as(x)) for x in (qkv, a, b))
        kernel = conv.shape[-1]
        stream = torch.cat([conv, qkv.transpose(1, 2).to(conv.dtype)], dim=-1)  # [B, C, K + W]
        window = counts.to(conv.device)[:, None, None] + torch.arange(kernel, device=conv.device)
        convs.append(stream.gather(2, window.expand(batch, stream.shape[1], kernel)))
        if steps == 0:
            continue
        mixed = modeling.causal_conv1d_fn(stream, module.conv1d.weight.squeeze(1), module.conv1d.bias,
                                          activation=module.activation)[:, :, kernel : kernel + steps]
        mixed = mixed.transpose(1, 2).to(qkv.dtype)
        query, key, value = torch.split(mixed, [module.key_dim, module.key_dim, module.value_dim], dim=-1)
        query = query.reshape(batch, steps, -1, module.head_k_dim)
        key = key.reshape(batch, steps, -1, module.head_k_dim)
        value = value.reshape(batch, steps, -1, module.head_v_dim)
        if not _KERNEL_REPEATS_KEY_HEADS and module.num_v_heads != module.num_k_heads:
            query = query.repeat_interleave(module.num_v_heads // module.num_k_heads, dim=2)
            key = key.repeat_interleave(module.num_v_heads // module.num_k_heads, dim=2)
        g = -module.A_log.float().exp() * torch.nn.functional.softplus(a[:, :steps].float() + module.dt_bias)
        per_step.append((query, key, value, g, b[:, :steps].sigmoid()))
    if steps == 0:
        return [(conv, recurrent.clone()) for conv, (_, recurrent) in zip(convs, states)]
    recurrents = [recurrent for _, recurrent in states]
    same = len({(m.num_k_heads, m.num_v_heads, m.head_k_dim, m.head_v_dim, r.dtype, r.device)
                for m, r in zip(modules, recurrents)}) == 1
    groups = [list(range(len(modules)))] if same else [[i] for i in range(len(modules))]
    out: list[Any] = [None] * len(modules)
    for group in groups:  # one batch of B x layers rows per step
        query, key, value, g, beta = (torch.cat([per_step[i][n] for i in group]) for n in range(5))
        state = torch.cat([recurrents[i] for i in group])
        live = counts.to(state.device).repeat(len(group))
        for j in range(steps):
            one = slice(j, j + 1)
            _, stepped = modeling.torch_recurrent_gated_delta_rule(
                query[:, one], key[:, one], value[:, one], g=g[:, one], beta=beta[:, one], initial_state=state,
                output_final_state=True, use_qk_l2norm_in_kernel=True)
            state = torch.where((live > j)[:, None, None, None], stepped.to(state.dtype), state)
        for n, i in enumerate(group):
            out[i] = (convs[i], state[n * batch : (n + 1) * batch])
    return out


#: the keyword a Gated DeltaNet module's forward takes its cache under (5.24 renamed it, as CACHE_KWARG)
LINEAR_CACHE_KWARG = "cache" if _INSTALLED >= Version("5.24.0.dev0") else "cache_params"
#: 5.24's gated delta kernels repeat the key heads over the value heads themselves; 5.17's module does it first
_KERNEL_REPEATS_KEY_HEADS = _INSTALLED >= Version("5.24.0.dev0")


# ---- Gemma 4 assistants (transformers >= 5.24, see drafts/gemma4_assistant) -----------------------------------
# Read in 5.24: a Gemma 4 text config's ``kv_sharing_modes`` marks, per layer, "store" (the last layer of its type
# before the KV-sharing ones, or the last of its type where none shares: its K/V is what the shared layers and
# assistants read), "reuse" or None. A target's cache holds a
# "store" layer's K/V at that layer's index (``cache.layers[i].keys`` / ``.values``, [B, kv heads, slots, D]).
# ``Gemma4AssistantForCausalLM.forward`` (the Unified one is the same) builds its own masks from a 2-D padding
# mask; :func:`gemma4_assistant_step` runs its parts with per-row 4-D masks instead (per-row lengths, holes).

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


def gemma4_assistant_step(assistant: Any, inputs_embeds: torch.Tensor, position_ids: torch.Tensor,
                          shared_kv: dict[str, tuple[torch.Tensor, torch.Tensor]],
                          masks: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``Gemma4AssistantForCausalLM.forward`` with ``masks`` (per layer type, additive [B, 1, Q, S]) in place of the
    ones it builds: (logits [B, Q, V], projected last hidden state [B, Q, backbone hidden])."""
    hidden = assistant.pre_projection(inputs_embeds)
    out = assistant.model(input_ids=None, inputs_embeds=hidden, attention_mask=masks, position_ids=position_ids,
                          shared_kv_states=shared_kv, use_cache=False,
                          # not an int: no slicing before the KV-shared layers, which 5.24 cannot do without
                          # per-layer inputs (an assistant has none) once Q > 1 (a tree level's nodes)
                          logits_to_keep=None)
    last = out.last_hidden_state
    if assistant.config.use_ordered_embeddings:
        logits = assistant.masked_embedding(last, assistant.lm_head.weight)
    else:
        logits = assistant.lm_head(last)
    return logits, assistant.post_projection(last)
