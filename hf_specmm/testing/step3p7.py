"""Tiny Step3.7 fixture (``step3p7``, ``Step3p7ForConditionalGeneration``; transformers >= 5.25 only: on older
versions this module registers nothing).

Scaled-down layout: ``0 </s> 1 <unk> 2 <pad> 3 <s>`` (never written but ``</s>``), words, then ``120 <|im_end|> 121 <im_patch> 122 <im_start>
123 <im_end> 124 <patch_start> 125 <patch_end> 126 <patch_newline>``, ``V = 128``. EOS: ``</s>`` and ``<|im_end|>``.
An image is, as upstream's processor writes it, one ``<patch_start> <im_patch>×n <patch_end>`` run per local crop
(a ``<patch_newline>`` after each crop row but the last) then ``<im_start> <im_patch>×m <im_end>`` for the global
view: several placeholder runs per image. The vision tower (4-px patches, two stride-2 convolutions) makes a 32x32
global view 4 tokens and a 16x16 local crop 1; a 32x32 image has no crops, a 64x32 one 4x2 (upstream's plan).

Text decoder (3 layers: sliding (window 16), full, sliding): per-head attention gates, QK-norm, ``1 + w`` RMSNorms,
attention biases and one MoE layer (4 routed experts, top 2, a shared expert) between dense ones. transformers has
no causal LM for Step3.7's text config: :class:`Step3p7TextLM` (the text decoder and its LM head) is the text-only
copy. The image processor is a PIL one (upstream's needs torchvision) with upstream's crop plan.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import transformers
from transformers import BatchFeature, PretrainedConfig, PreTrainedModel, ProcessorMixin

from .. import _compat
from .layouts import Layout, LayoutFixtures
from .registry import register_fixture
from .shaping import BIAS_DIM, INIT_RANGE, language_model

AVAILABLE = _compat.STEP3P7_SUPPORTED and hasattr(transformers, "Step3p7ForConditionalGeneration")

STEP3P7_LAYOUT = Layout(
    vocab_size=128, text_end=120, head=["</s>", "<unk>", "<pad>", "<s>"], reserved_head=3, tail_start=120,
    tail=["<|im_end|>", "<im_patch>", "<im_start>", "<im_end>", "<patch_start>", "<patch_end>", "<patch_newline>"],
    pad="<pad>", eos=["</s>", "<|im_end|>"], bos="<s>", unk="<unk>", image="<im_patch>", marker="<im_patch>",
    draft_vocab=128)
IMAGE, CROP, PATCH = 32, 16, 4  # global view side, local crop side, ViT patch side (the tower downsamples 4x)

if AVAILABLE:
    from transformers import Step3p7Config, Step3p7ForConditionalGeneration, Step3p7Processor, Step3p7TextConfig
    from transformers.image_processing_backends import PilBackend
    from transformers.image_transforms import divide_to_patches
    from transformers.image_utils import SizeDict
    from transformers.models.step3p7.image_processing_step3p7 import (
        Step3p7ImageProcessor,
        Step3p7ImageProcessorKwargs,
    )
    from transformers.models.step3p7.modeling_step3p7 import Step3p7TextModel

    from .muse_glimmer import MuseGlimmerTextLM

    class Step3p7TextLM(MuseGlimmerTextLM):
        """Step3.7's text decoder with its LM head as a plain causal LM (logits ``lm_head(h)``, as the target's)."""

        config_class = Step3p7TextConfig

        def __init__(self, config: Step3p7TextConfig):
            PreTrainedModel.__init__(self, config)
            self.model = Step3p7TextModel(config)
            self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        def logits(self, hidden: torch.Tensor) -> torch.Tensor:
            return self.lm_head(hidden)

    class Step3p7ImageProcessorPil(PilBackend):
        """Upstream's global view and local crops without torchvision: upstream's crop plan
        (``Step3p7ImageProcessor._plan_patches``), PIL resizes; ``pixel_values`` (one global view per image),
        ``pixel_values_local`` (every image's crops, in order), ``num_local_patches`` and the newline masks."""

        size = {"height": IMAGE, "width": IMAGE}
        patch_size = CROP
        max_image_size = 4 * IMAGE
        vision_patch_size, downsampler_stride = PATCH, 4
        do_rescale, rescale_factor, do_normalize, do_convert_rgb = True, 1 / 255, True, True
        image_mean, image_std = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]
        valid_kwargs = Step3p7ImageProcessorKwargs
        model_input_names = ["pixel_values", "pixel_values_local", "num_local_patches"]
        _is_extreme_aspect = staticmethod(Step3p7ImageProcessor._is_extreme_aspect)
        _plan_patches = Step3p7ImageProcessor._plan_patches

        def _view(self, image: np.ndarray, height: int, width: int) -> np.ndarray:
            image = self.resize(image, SizeDict(height=height, width=width))
            return self.normalize(self.rescale(image, self.rescale_factor), self.image_mean, self.image_std)

        def _preprocess(self, images: list[np.ndarray], return_tensors: Any, **kwargs: Any) -> BatchFeature:
            views, crops, counts, newlines = [], [], [], []
            for image in images:  # channels first
                _, height, width = image.shape
                (gw, gh), (cw, ch), window, nx, ny, square = self._plan_patches(width, height, IMAGE, CROP)
                if square:
                    raise ValueError(f"the tiny Step3.7 processor does not pad extreme aspect ratios ({width}x{height})")
                views.append(self._view(self.resize(image, SizeDict(height=gh, width=gw)), IMAGE, IMAGE))
                tiles = divide_to_patches(self.resize(image, SizeDict(height=ch, width=cw)), window) if window else []
                crops += [self._view(tile, CROP, CROP) for tile in tiles]
                counts.append(len(tiles))
                newlines.append([c == nx - 1 and r < ny - 1 for r in range(ny) for c in range(nx)] if tiles else [])
            result = BatchFeature(data={"pixel_values": np.stack(views).astype(np.float32),
                                        "num_local_patches": counts}, tensor_type=return_tensors)
            if crops:
                result["pixel_values_local"] = torch.from_numpy(np.stack(crops).astype(np.float32))
                widest = max(counts)
                result["patch_newline_masks"] = [m + [False] * (widest - len(m)) for m in newlines]
            return result

    class TinyStep3p7Processor(Step3p7Processor):
        """``Step3p7Processor`` with the PIL image processor."""

        def check_argument_for_proper_class(self, argument_name: str, argument: object) -> type | None:
            if argument_name == "image_processor" and isinstance(argument, Step3p7ImageProcessorPil):
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    class Step3p7Fixtures(LayoutFixtures):
        """Shaped as the Llama-like fixtures (:func:`~hf_specmm.testing.shaping.shape_lm`), with the last layer's
        head-0 gate made constant (sigmoid(0) = 1/2, made up for on the bias channel) and the shared expert
        kept off the bias channel; image features carry nothing on it."""

        name = "step3p7"
        group = "step3p7"
        layout = STEP3P7_LAYOUT
        images_per_row = False  # the processor takes one flat list of images
        # unshifted, seed 3 with tests/test_parity.py's EOS bias stops one row of three; seed 4 stops all three at
        # different steps and seed 1 runs every row past 24 tokens (measured with tests/test_parity.py)
        seed_shift = 1  # seed s builds the model seed s + seed_shift would

        def target(self, seed: int, vocab_size: int, eos_bias: float | None) -> PreTrainedModel:
            return super().target(seed + self.seed_shift, vocab_size, eos_bias)

        def model(self, seed: int) -> PreTrainedModel:
            ids = self.layout.ids()
            text = Step3p7TextConfig(
                vocab_size=ids["vocab"], hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                initializer_range=INIT_RANGE, sliding_window=16, attention_bias=True,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                mlp_layer_types=["dense", "sparse", "dense"], n_routed_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, share_expert_dim=32, bos_token_id=ids["bos"], eos_token_id=ids["eos"][0],
                pad_token_id=ids["pad"], tie_word_embeddings=False)
            vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=IMAGE,
                          patch_size=PATCH, mlp_ratio=2.0, max_position_embeddings=(IMAGE // PATCH) ** 2)
            cfg = Step3p7Config(text_config=text.to_dict(), vision_config=vision, image_token_id=ids["image"],
                                tie_word_embeddings=False)
            model = Step3p7ForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
            with torch.no_grad():
                for name, p in model.model.named_parameters():  # the 0.02 init would make outputs context-free
                    if p.dim() > 1 and "e_score" not in name:
                        p.normal_(0.0, INIT_RANGE)
                model.model.multi_modal_projector.weight[BIAS_DIM] = 0.0  # image features: nothing on the bias channel
            return model

        @torch.no_grad()
        def shape(self, model: PreTrainedModel, eos_bias: float | None, gen: torch.Generator) -> None:
            decoder = language_model(model)
            attention = decoder.layers[-1].self_attn
            attention.g_proj.weight[0] = 0.0  # head 0's gate: sigmoid(0), constant
            for layer in decoder.layers:
                shared = getattr(layer.mlp, "shared_experts", None)
                if shared is not None:
                    shared.down_proj.weight[BIAS_DIM] = 0.0
            super().shape(model, eos_bias, gen)
            attention.o_proj.weight[BIAS_DIM, 0] *= 2.0  # the gate halves head 0's constant value

        def causal_lm_config(self, target: PreTrainedModel) -> PretrainedConfig:
            """Rebuilt from its dict: the target's copy carries the MoE kernel choice its own class made, which a
            class outside transformers' modeling files cannot take."""
            return Step3p7TextConfig.from_dict(target.config.text_config.to_dict())

        def text_lm(self, config: PretrainedConfig, attn_implementation: str) -> PreTrainedModel:
            return Step3p7TextLM._from_config(config, attn_implementation=attn_implementation)

        def processor(self, vocab_size: int) -> ProcessorMixin:
            tok = self.layout.tokenizer()
            return TinyStep3p7Processor(image_processor=Step3p7ImageProcessorPil(), tokenizer=tok,
                                        chat_template=tok.chat_template)

    STEP3P7 = register_fixture(Step3p7Fixtures())
