"""Tiny Gemma 4 fixtures (``gemma4``, ``gemma4_unified``; transformers >= 5.24 only: on older versions this
module registers nothing).

The Gemma 4 token layout scaled down (``Gemma4Config`` defaults: ``<|image>`` boi 255999 and ``<|audio>`` boa
256000 inside the text ids, ``<|image|>`` 258880, ``<|audio|>`` 258881, ``<image|>`` eoi 258882, ``<audio|>``
258883, ``<|video|>`` 258884 after them, all within the 262144 rows that the text LM has too):

``0 <pad> 1 <eos> 2 <bos> 3 <unk> 4 <|turn> 5 <turn|>``, words, ``100 <|image> 101 <|audio>``, ``128 <|image|>
129 <|audio|> 130 <image|> 131 <audio|> 132 <|video|>``, ``V = 136``. EOS: ``<eos>`` and ``<turn|>``. The natural
text draft (a Gemma 4 / Gemma 3 text LM, 262144 rows) has all ``V`` rows: the image ids lie inside its
vocabulary and are never proposed.

Text LM: 4 layers (sliding window 16, full, sliding, full), the last two reusing the first two's K/V
(``num_kv_shared_layers=2``), keys = values on full layers (``attention_k_eq_v``), bidirectional attention
over image blocks (``use_bidirectional_attention="vision"``); ``gemma4`` adds per-layer input embeddings
(``hidden_size_per_layer_input``). A prompt's ``<|image|>`` becomes ``<|image>`` + soft tokens + ``<image|>``:
images are not resized (``do_resize=False``; resized, every image would fill the processors' smallest budget,
``max_soft_tokens=70``, and its ~64 tokens would swamp a tiny LM's attention), so a 32x32 image is 4 soft
tokens and a 64x32 one 8, padded to the 280-patch budget as upstream. ``gemma4`` encodes 8-px patches with a
2-layer vision tower pooled 2x2; ``gemma4_unified`` is encoder-free: 16-px merged patches projected directly.
(Its upstream image processor needs torchvision: Gemma 4's PIL processor with patch 16 and no pooling writes
the same merged-patch layout, row-major, padded to the budget.)

    >>> from hf_specmm.testing import gemma4
    >>> gemma4.GEMMA4_LAYOUT.ids()["eos"] if gemma4.AVAILABLE else [1, 5]
    [1, 5]
"""

from __future__ import annotations

import copy
import re

import torch
from transformers import PreTrainedModel, ProcessorMixin

from .. import _compat
from .layouts import Layout, LayoutFixtures
from .registry import register_fixture
from .shaping import BIAS_DIM, BIAS_RATIO, INIT_RANGE, LOGIT_STD, RESERVED_LOGIT, bias_channel_value, \
    language_model, other_channels_norm

AVAILABLE = _compat.GEMMA4_SUPPORTED  # transformers >= 5.24 (see hf_specmm.targets.gemma4)

PATCH, POOL, SOFT_TOKENS = 8, 2, 70  # 70: the smallest budget the Gemma 4 image processors accept

GEMMA4_LAYOUT = Layout(
    vocab_size=136, text_end=128, head=["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"],
    inner={"<|image>": 100, "<|audio>": 101},
    tail=["<|image|>", "<|audio|>", "<image|>", "<audio|>", "<|video|>"], tail_start=128,
    pad="<pad>", eos=["<eos>", "<turn|>"], bos="<bos>", unk="<unk>", image="<|image|>", marker="<|image|>",
    draft_vocab=136,
    extra_special_tokens={"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>",
                          "boa_token": "<|audio>", "eoa_token": "<audio|>", "audio_token": "<|audio|>"})


def text_config(cls: type, **extra) -> object:
    """A 4-layer Gemma 4 text config in :data:`GEMMA4_LAYOUT`'s ids (``cls``: the family's text config)."""
    ids = GEMMA4_LAYOUT.ids()
    return cls(
        vocab_size=ids["vocab"], hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
        attention_k_eq_v=True, num_kv_shared_layers=2, sliding_window=16, use_bidirectional_attention="vision",
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=1024, initializer_range=INIT_RANGE, bos_token_id=ids["bos"],
        eos_token_id=ids["eos"], pad_token_id=ids["pad"], tie_word_embeddings=False, **extra)


def _mm_ids() -> dict[str, int]:
    vocab = GEMMA4_LAYOUT.vocab()
    return dict(boi_token_id=vocab["<|image>"], eoi_token_id=vocab["<image|>"], image_token_id=vocab["<|image|>"],
                video_token_id=vocab["<|video|>"], boa_token_id=vocab["<|audio>"], eoa_token_index=vocab["<audio|>"],
                audio_token_id=vocab["<|audio|>"])


def without_kv_sharing(model: PreTrainedModel) -> PreTrainedModel:
    """A copy of a tiny Gemma 4 / Unified target with ``num_kv_shared_layers=0`` that computes what it computes:
    each formerly KV-sharing layer gets its producer's K/V weights (the producer: the last earlier layer of its
    type that its config marks "store"). Its config still marks the last layer of each type "store"."""
    config = copy.deepcopy(model.config)
    config.text_config.num_kv_shared_layers = 0
    twin = type(model)._from_config(config, attn_implementation=model.config._attn_implementation).eval()
    state, text = model.state_dict(), model.config.get_text_config()
    for key in twin.state_dict().keys() - state.keys():
        head, index, rest = re.match(r"(.*\.layers\.)(\d+)\.(.*)", key).groups()  # type: ignore[union-attr]
        producer = max(j for j in range(int(index)) if text.kv_sharing_modes[j] == "store"
                       and text.layer_types[j] == text.layer_types[int(index)])
        state[key] = state[f"{head}{producer}.{rest}"]
    twin.load_state_dict(state, strict=True)
    twin.generation_config = copy.deepcopy(model.generation_config)
    return twin.to(model.device, model.dtype)


class _Gemma4Shaping(LayoutFixtures):
    """Gemma 4 writes every sub-layer through a post-norm (RMSNorm scaled by ``weight``) and normalises
    values without a scale, so the bias channel is carried from the embeddings instead: channel
    ``BIAS_DIM`` of every token embedding is a constant, every post-norm drops it (weight 0) and the
    image features have none; before the final norm it is calibrated to ``BIAS_RATIO`` times the largest
    norm of the other channels, as in :func:`~hf_specmm.testing.shaping.shape_lm`."""

    group = "gemma4"
    layout = GEMMA4_LAYOUT
    seed_shift = 0  # seed s builds the model seed s + seed_shift would

    def target(self, seed: int, vocab_size: int, eos_bias: float | None) -> PreTrainedModel:
        return super().target(seed + self.seed_shift, vocab_size, eos_bias)

    def image_projection(self, model: PreTrainedModel) -> torch.nn.Linear:
        raise NotImplementedError

    @torch.no_grad()
    def shape(self, model: PreTrainedModel, eos_bias: float | None, gen: torch.Generator) -> None:
        ids, d = self.layout.ids(), BIAS_DIM
        decoder, lm_head = language_model(model), model.lm_head
        for layer in decoder.layers:
            for name in ("post_attention_layernorm", "post_feedforward_layernorm", "post_per_layer_input_norm",
                         "input_layernorm", "pre_feedforward_layernorm"):
                norm = getattr(layer, name, None)
                if norm is not None:
                    norm.weight[d] = 0.0
        self.image_projection(model).weight[d] = 0.0
        embed = decoder.embed_tokens.weight
        embed[:, d] = 0.0
        seen: dict[str, torch.Tensor] = {}
        hook = decoder.norm.register_forward_hook(lambda mod, args, out: seen.update(x=args[0]))
        decoder(input_ids=torch.randint(6, ids["text_end"], (4, 48), generator=gen), use_cache=False)
        hook.remove()
        rest = seen["x"].norm(dim=-1).max().item()
        embed[:, d] = BIAS_RATIO * rest / decoder.embed_tokens.scalar_embed_scale
        hidden = lm_head.weight.shape[1]
        h0 = bias_channel_value(hidden)
        scale = decoder.norm.weight
        w = lm_head.weight
        w.copy_(torch.randn(w.shape, generator=gen) * (LOGIT_STD / other_channels_norm(hidden)))
        w[:, d] = 0.0
        for r in ids["reserved"] + [ids["pad"], ids["bos"], self.layout.vocab()[self.layout.unk]]:  # never written
            w[r] = 0.0
            w[r, d] = RESERVED_LOGIT / h0 / scale[d]
        if eos_bias is not None:
            for e in ids["eos"]:
                w[e, d] = eos_bias / h0 / scale[d]

    def tokenizer(self):
        tok = self.layout.tokenizer()
        tok.add_special_tokens({"additional_special_tokens": ["<|video|>"]})  # already in the vocabulary
        return tok


if AVAILABLE:
    from transformers import (
        Gemma4Config,
        Gemma4ForConditionalGeneration,
        Gemma4Processor,
        Gemma4TextConfig,
        Gemma4UnifiedConfig,
        Gemma4UnifiedForConditionalGeneration,
        Gemma4UnifiedProcessor,
        Gemma4UnifiedTextConfig,
        Gemma4UnifiedVisionConfig,
        Gemma4VisionConfig,
    )
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
    from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import (
        Gemma4UnifiedAudioFeatureExtractor,
    )

    class _NoTorchvision:
        """The processors accept ``video_processor=None`` and (Unified) a PIL image processor: their own
        video / Unified image processors need torchvision."""

        def check_argument_for_proper_class(self, argument_name: str, argument: object) -> type | None:
            if (argument is None and argument_name == "video_processor") or \
                    (argument_name == "image_processor" and isinstance(argument, Gemma4ImageProcessorPil)):
                return None
            return super().check_argument_for_proper_class(argument_name, argument)  # type: ignore[misc]

    class TinyGemma4Processor(_NoTorchvision, Gemma4Processor):
        """``Gemma4Processor`` without a video processor."""

    class TinyGemma4UnifiedProcessor(_NoTorchvision, Gemma4UnifiedProcessor):
        """``Gemma4UnifiedProcessor`` without a video processor, with a PIL image processor."""

    class Gemma4Fixtures(_Gemma4Shaping):
        name = "gemma4"
        # unshifted, seed 0's image row (the tests' default) stops at its 5th greedy token: too short for an
        # exact text copy to save a target forward; seeds 1..4 run on (measured with tests/test_parity.py)
        seed_shift = 1

        def model(self, seed: int) -> PreTrainedModel:
            text = text_config(Gemma4TextConfig, hidden_size_per_layer_input=8, vocab_size_per_layer_input=136)
            vision = Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, head_dim=8, patch_size=PATCH,
                                        pooling_kernel_size=POOL, position_embedding_size=64,
                                        initializer_range=INIT_RANGE)
            cfg = Gemma4Config(text_config=text, vision_config=vision, audio_config=None, tie_word_embeddings=False,
                               initializer_range=INIT_RANGE, **_mm_ids())
            return Gemma4ForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")

        def image_projection(self, model: PreTrainedModel) -> torch.nn.Linear:
            return model.model.embed_vision.embedding_projection

        def processor(self, vocab_size: int) -> ProcessorMixin:
            tok = self.tokenizer()
            ip = Gemma4ImageProcessorPil(patch_size=PATCH, pooling_kernel_size=POOL, max_soft_tokens=SOFT_TOKENS,
                                         do_resize=False)
            return TinyGemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(), image_processor=ip,
                                       tokenizer=tok, video_processor=None, chat_template=tok.chat_template,
                                       image_seq_length=SOFT_TOKENS)

    class Gemma4UnifiedFixtures(_Gemma4Shaping):
        name = "gemma4_unified"

        def model(self, seed: int) -> PreTrainedModel:
            vision = Gemma4UnifiedVisionConfig(patch_size=PATCH, pooling_kernel_size=POOL, mm_embed_dim=32,
                                               mm_posemb_size=64, output_proj_dims=32, initializer_range=INIT_RANGE)
            cfg = Gemma4UnifiedConfig(text_config=text_config(Gemma4UnifiedTextConfig), vision_config=vision,
                                      audio_config=None, tie_word_embeddings=False, initializer_range=INIT_RANGE,
                                      **_mm_ids())
            model = Gemma4UnifiedForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
            with torch.no_grad():  # transformers initialises the position table to zeros: positions would carry nothing
                model.model.embed_vision.pos_embedding.normal_(0.0, INIT_RANGE)
            return model

        def image_projection(self, model: PreTrainedModel) -> torch.nn.Linear:
            return model.model.embed_vision.multimodal_embedder.embedding_projection

        def processor(self, vocab_size: int) -> ProcessorMixin:
            tok = self.tokenizer()
            # Unified's merged patches: k x k patches of PATCH px = one (k PATCH)-px patch, row-major, as Gemma 4's
            # PIL processor cuts them with that patch size and no pooling (same resize budget, same padding)
            ip = Gemma4ImageProcessorPil(patch_size=PATCH * POOL, pooling_kernel_size=1, max_soft_tokens=SOFT_TOKENS,
                                          do_resize=False)
            return TinyGemma4UnifiedProcessor(feature_extractor=Gemma4UnifiedAudioFeatureExtractor(),
                                              image_processor=ip, tokenizer=tok, video_processor=None,
                                              chat_template=tok.chat_template, image_seq_length=SOFT_TOKENS)

    GEMMA4 = register_fixture(Gemma4Fixtures())
    GEMMA4_UNIFIED = register_fixture(Gemma4UnifiedFixtures())
