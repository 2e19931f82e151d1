"""Tiny Inkling fixture (``inkling``, ``InklingForConditionalGeneration``; transformers >= 5.25 only: on older
versions this module registers nothing).

Layout: ``0 <unk> 1 <s> 2 </s> 3 <pad>``, words, then ``120 <|content_image|> 121 <|unused_200054|>
122 <|content_audio_input|> 123 <|unused_200053|>`` (upstream's names for the image / audio begin markers and
placeholders), ``V = 128``; EOS ``</s>``. An image is ``<|content_image|>`` then one placeholder per patch, as
upstream's processor writes it.

Text decoder (3 layers: sliding (window 16), full, sliding; every layer with its four short convolutions):
relative position bias, QK-norm, a normed embedding, one MoE layer (4 routed experts, top 2, a shared one) between
dense ones, ``logits_mup_width_multiplier`` 1 (upstream divides the last hidden state by it). The vision tower
folds 4-px patches (2 frames) in 4 projections. Upstream's image processor needs torchvision: the fixture's
processor builds the same patches with PIL and torch (upstream's patch grid, padding with -1 before
normalisation, a 2-frame repeat), from images downscaled by half (``rescale_image_frac``, an upstream option): a
32x32 image is 4x5 patches, 20 placeholders.

:func:`mtp_checkpoint` saves the target with MTP layers in an Inkling checkpoint's layout (``model.mtp.*``), the
decoder blocks' tensors named as transformers saves an Inkling decoder layer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from transformers import BatchFeature, PretrainedConfig, PreTrainedModel, ProcessorMixin

from .. import _compat
from .layouts import Layout, LayoutFixtures
from .registry import register_fixture
from .shaping import BIAS_DIM, BIAS_RATIO, INIT_RANGE, LOGIT_STD, RESERVED_LOGIT, bias_channel_value, \
    other_channels_norm

AVAILABLE = _compat.INKLING_SUPPORTED and hasattr(transformers, "InklingForConditionalGeneration")

IMAGE_TOKEN, IMAGE_BOS = "<|unused_200054|>", "<|content_image|>"
INKLING_LAYOUT = Layout(
    vocab_size=128, text_end=120, head=["<unk>", "<s>", "</s>", "<pad>"], reserved_head=1, tail_start=120,
    tail=[IMAGE_BOS, IMAGE_TOKEN, "<|content_audio_input|>", "<|unused_200053|>"],
    pad="<pad>", eos=["</s>"], bos="<s>", unk="<unk>", image=IMAGE_TOKEN, marker=f"{IMAGE_BOS} {IMAGE_TOKEN}",
    draft_vocab=128)
PATCH, FRAMES, RESCALE = 4, 2, 0.5
# added to tiny_target's eos_bias: EOS logits are sharper here than the Llama-like fixtures' (measured with
# tests/test_parity.py: seed 3 then stops the three rows at different steps)
EOS_OFFSET = -2.0
# image features scaled down (as the Ovis2.5 fixture's): at full scale they decide every token of an image row,
# where a real VLM's answer follows the text too
IMAGE_SCALE = 0.1
# the relative position bias drawn small: at INIT_RANGE it ties each row's output to where its image ends, so the
# text-only copy (which sees no image span) agrees with the target on no image row
REL_RANGE = 0.02

if AVAILABLE:
    from transformers import InklingConfig, InklingForConditionalGeneration, InklingProcessor
    from transformers.image_processing_backends import PilBackend
    from transformers.image_utils import SizeDict

    class InklingImageProcessorPil(PilBackend):
        """Upstream's patches without torchvision: the image rescaled by ``rescale_image_frac`` (PIL), cut into
        ``(ceil(h / P), w // P + 1)`` patches, each padded to P x P with -1, rescaled, normalised, repeated over
        2 frames: ``pixel_values`` [patches, 2, P, P, 3] and ``num_patches`` per image."""

        size = {"height": PATCH, "width": PATCH}
        do_rescale, rescale_factor, do_normalize, do_convert_rgb = True, 1 / 255, True, True
        image_mean, image_std = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]
        model_input_names = ["pixel_values"]

        def _patches(self, image: np.ndarray) -> torch.Tensor:
            _, height, width = image.shape  # channels first
            size = SizeDict(height=int(np.floor(height * RESCALE + 0.5)), width=int(np.floor(width * RESCALE + 0.5)))
            image = torch.from_numpy(np.asarray(self.resize(image, size), dtype=np.float32))
            rows, cols = (size.height + PATCH - 1) // PATCH, size.width // PATCH + 1
            grid = torch.full((3, rows * PATCH, cols * PATCH), -1.0)
            grid[:, : size.height, : size.width] = image
            patches = grid.reshape(3, rows, PATCH, cols, PATCH).permute(1, 3, 0, 2, 4).reshape(-1, 3, PATCH, PATCH)
            mean, std = (torch.tensor(v)[:, None, None] for v in (self.image_mean, self.image_std))
            return (patches * self.rescale_factor - mean) / std

        def _preprocess(self, images: list[np.ndarray], return_tensors: Any, **kwargs: Any) -> BatchFeature:
            per_image = [self._patches(image) for image in images]
            pixels = torch.cat(per_image)[..., None].repeat(1, 1, 1, 1, FRAMES).permute(0, 4, 2, 3, 1)
            return BatchFeature(data={"pixel_values": pixels.contiguous(),
                                      "num_patches": torch.tensor([p.shape[0] for p in per_image])})

    class TinyInklingProcessor(InklingProcessor):
        """``InklingProcessor`` with the PIL image processor and no audio feature extractor."""

        def check_argument_for_proper_class(self, argument_name: str, argument: object) -> type | None:
            if argument_name == "image_processor" and isinstance(argument, InklingImageProcessorPil):
                return None
            if argument_name == "feature_extractor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    class InklingFixtures(LayoutFixtures):
        """The bias channel (see :mod:`~hf_specmm.testing.shaping`) is written by the embedding: a constant
        column before the embedding's own norm, every layer's writers (attention and MLP outputs, experts,
        shared experts) kept off it and its norms not reading it, the short convolutions being depthwise. Image
        features carry it too (their other channels scaled down), so that every token is normed alike."""

        name = "inkling"
        group = "inkling"
        layout = INKLING_LAYOUT
        images_per_row = False
        # a copy of the last layer noised by 0.05 still agrees on every token here (measured: acceptance 1.0 at
        # γ 1, 4, 8, batch 1); 0.3 gives 0.62-0.77
        head_noise = 0.3

        def target(self, seed: int, vocab_size: int, eos_bias: float | None) -> PreTrainedModel:
            return super().target(seed, vocab_size, None if eos_bias is None else eos_bias + EOS_OFFSET)

        def model(self, seed: int) -> PreTrainedModel:
            ids = self.layout.ids()
            text = dict(
                vocab_size=ids["vocab"], hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, swa_num_attention_heads=4,
                swa_num_key_value_heads=2, swa_head_dim=16, sliding_window_size=16, d_rel=4, rel_extent=64,
                layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding"],
                mlp_layer_types=["dense", "sparse", "dense"], n_routed_experts=4, num_experts_per_tok=2,
                n_shared_experts=1, moe_intermediate_size=32, logits_mup_width_multiplier=1.0,
                max_position_embeddings=1024, initializer_range=INIT_RANGE, bos_token_id=ids["bos"],
                eos_token_id=ids["eos"][0], pad_token_id=ids["pad"])
            vision = dict(patch_size=PATCH, temporal_patch_size=FRAMES, hidden_size=32, num_hidden_layers=4,
                          initializer_range=INIT_RANGE)
            audio = dict(n_mel_bins=4, mel_vocab_size=8)
            vocab = self.layout.vocab()
            cfg = InklingConfig(text_config=text, vision_config=vision, audio_config=audio,
                                image_token_id=ids["image"], audio_token_id=vocab["<|unused_200053|>"],
                                image_bos_token_id=vocab[IMAGE_BOS], audio_bos_token_id=vocab["<|content_audio_input|>"])
            model = InklingForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
            with torch.no_grad():
                for name, p in model.model.named_parameters():  # the 0.02 init would make outputs context-free
                    if p.dim() > 1 and "conv" not in name:
                        p.normal_(0.0, REL_RANGE if name.endswith("rel_logits_proj.proj") else INIT_RANGE)
                # image features: the bias channel as the text embeddings carry it (set in shape), the rest scaled
                # down; the last projection's bias-channel row sums its (GELU'd, mostly positive) inputs
                tower = model.model.vision_tower
                tower.encoder_layers[-1].projection.weight[BIAS_DIM] = INIT_RANGE
                tower.final_norm.weight.mul_(IMAGE_SCALE)
            return model

        @torch.no_grad()
        def shape(self, model: PreTrainedModel, eos_bias: float | None, gen: torch.Generator) -> None:
            ids = self.layout.ids()
            decoder, head, d = model.model.language_model, model.lm_head, BIAS_DIM
            decoder.embed_tokens.weight[:, d] = 1.0
            norm = decoder.embed_tokens.embed_norm
            for layer in decoder.layers:  # the layers neither read nor write the bias channel
                layer.input_layernorm.weight[d] = 0.0
                layer.post_attention_layernorm.weight[d] = 0.0
                layer.self_attn.o_proj.weight[d] = 0.0
                mlp = layer.mlp
                if hasattr(mlp, "experts"):
                    mlp.experts.down_proj[:, d] = 0.0
                    mlp.shared_experts.down_proj[:, d] = 0.0
                else:
                    mlp.down_proj.weight[d] = 0.0
            seen: dict[str, torch.Tensor] = {}
            hooks = [decoder.norm.register_forward_hook(lambda mod, args, out: seen.update(x=args[0])),
                     norm.register_forward_hook(lambda mod, args, out: seen.update(e=out))]
            probe = torch.randint(4, ids["text_end"], (4, 48), generator=gen)
            model.model(input_ids=probe, use_cache=False)
            rest = torch.cat([seen["x"][..., :d], seen["x"][..., d + 1:]], dim=-1).norm(dim=-1).mean().item()
            norm.weight[d] *= BIAS_RATIO * rest / seen["e"][..., d].mean().item()
            for hook in hooks:
                hook.remove()
            tower = model.model.vision_tower
            features = tower(pixel_values=torch.randn(8, FRAMES, PATCH, PATCH, 3, generator=gen)).last_hidden_state
            tower.final_norm.weight[d] *= BIAS_RATIO * rest / features[..., d].mean().item()
            hidden = head.weight.shape[1]
            h0 = bias_channel_value(hidden)
            w = head.weight
            w.copy_(torch.randn(w.shape, generator=gen) * (LOGIT_STD / other_channels_norm(hidden)))
            w[:, d] = 0.0
            for r in ids["reserved"]:
                w[r] = 0.0
                w[r, d] = RESERVED_LOGIT / h0
            if eos_bias is not None:
                for e in ids["eos"]:
                    w[e, d] = eos_bias / h0

        def causal_lm_config(self, target: PreTrainedModel) -> PretrainedConfig:
            """Rebuilt from its dict: the target's copy carries the MoE kernel choice its own class made."""
            return type(target.config.text_config).from_dict(target.config.text_config.to_dict())

        def processor(self, vocab_size: int) -> ProcessorMixin:
            tok = self.layout.tokenizer()
            return TinyInklingProcessor(feature_extractor=None, image_processor=InklingImageProcessorPil(),
                                        tokenizer=tok, chat_template=tok.chat_template)

    INKLING = register_fixture(InklingFixtures())


def mtp_checkpoint(folder: str | Path, layers: int = 1, noise: float = 0.1, chain_norm: bool = False, seed: int = 0,
                   eos_bias: float | None = -30.0, logits_multiplier: float = 2.0) -> tuple[PreTrainedModel, Any]:
    """The tiny Inkling of ``seed`` saved to ``folder`` with ``layers`` MTP layers, and ``(the target loaded back
    from it, the MTP layers as made)``. Each layer is a full-attention hybrid with a dense MLP: the target's last
    (dense) layer with the relative bias of its full-attention one, ``fc`` passing the embedding through and its
    embedding norm the target's (a one-layer cut of the target), its matrices perturbed by ``noise``.
    ``chain_norm``: the config's ``chain_hidden_post_norm``, every layer's output normed by one
    ``model.mtp.chain_norm`` (the target's final norm). ``logits_multiplier``: the config's
    ``logits_mup_width_multiplier`` (the target's and the MTP layers' last hidden states are divided by it before
    the LM head; the fixture's 1 would leave that unchecked). The blocks' tensors are named by transformers' own
    saving of an Inkling with those layers."""
    import tempfile

    from safetensors import safe_open

    from ..drafts.mtp import MtpDraft
    from .mtp import write_mtp_checkpoint

    base = INKLING.seeded_target(seed, INKLING_LAYOUT.vocab_size, eos_bias)
    text = base.config.text_config
    text.num_mtp_layers, text.chain_hidden_post_norm = layers, chain_norm
    text.logits_mup_width_multiplier = logits_multiplier
    made = MtpDraft.for_target(base, layers)
    lm, hidden = base.model.language_model, text.hidden_size
    dense = max(i for i, kind in enumerate(text.mlp_layer_types) if kind == "dense")
    full = max(i for i, kind in enumerate(text.layer_types) if kind == "hybrid")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in made.mtp_layers:
            state = dict(lm.layers[dense].state_dict())
            state["self_attn.rel_logits_proj.proj"] = lm.layers[full].self_attn.rel_logits_proj.proj
            layer.body.layers[0].load_state_dict(state)
            layer.fc.weight.zero_()
            layer.fc.weight[:, hidden:] = torch.eye(hidden)  # [hidden_norm(h); embed_norm(emb)]: the embedding half
            layer.pre_fc_norm_embedding.load_state_dict(lm.embed_tokens.embed_norm.state_dict())
            if chain_norm:
                layer.body.norm.load_state_dict(lm.norm.state_dict())
            for p in layer.parameters():
                if noise > 0 and p.dim() > 1:
                    p.add_(noise * p.std() * torch.randn(p.shape, generator=gen).to(p))
    # the blocks saved as decoder layers of an Inkling of those layers alone: transformers names their tensors
    blocks = base.config.to_dict()
    blocks["text_config"].update(num_hidden_layers=layers, layer_types=text.mtp_layer_types,
                                 mlp_layer_types=text.mtp_mlp_layer_types)
    holder = InklingForConditionalGeneration._from_config(InklingConfig.from_dict(blocks))
    for k, layer in enumerate(made.mtp_layers):
        holder.model.language_model.layers[k].load_state_dict(layer.body.layers[0].state_dict())
    tensors = {}
    with tempfile.TemporaryDirectory() as scratch:
        holder.save_pretrained(scratch)
        with safe_open(str(Path(scratch) / "model.safetensors"), framework="pt") as f:
            for key in f.keys():
                for k in range(layers):
                    if key.startswith(f"model.llm.layers.{k}."):
                        rest = key.removeprefix(f"model.llm.layers.{k}.")
                        tensors[f"model.mtp.layers.{k}.transformer_block.{rest}"] = f.get_tensor(key)
    for k, layer in enumerate(made.mtp_layers):
        for stored, module in (("input_proj", layer.fc), ("embed_norm", layer.pre_fc_norm_embedding),
                               ("hidden_norm", layer.pre_fc_norm_hidden)):
            tensors[f"model.mtp.layers.{k}.{stored}.weight"] = module.weight.detach().clone()
    if chain_norm:
        tensors["model.mtp.chain_norm.weight"] = made.body.norm.weight.detach().clone()
    write_mtp_checkpoint(base, made, folder, count=layers, count_field="num_mtp_layers",
                         extra_config={"chain_hidden_post_norm": chain_norm}, tensors=tensors)
    return InklingForConditionalGeneration.from_pretrained(folder).eval(), made.eval()
