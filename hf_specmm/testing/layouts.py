"""Shared pieces of the fixtures that keep an upstream token layout, scaled down (Gemma 3, Idefics3 /
SmolVLM, InternVL): a :class:`Layout` (which special tokens sit where), the WordLevel tokenizer built
from it, and :class:`LayoutFixtures`, the fixture family that builds a target from a layout.

Words fill the ids between the head and the tail tokens; ``inner`` special tokens sit inside the text
vocabulary (Gemma's image markers). Each target's LM head gives image / layout ids and padding rows a
logit of about -20 (never generated) and outputs depend on context, as for the LLaVA fixtures.

    >>> from hf_specmm.testing.idefics3 import SMOLVLM_LAYOUT
    >>> vocab = SMOLVLM_LAYOUT.vocab()
    >>> vocab["<global-img>"], vocab["<image>"], vocab["<end_of_utterance>"]
    (96, 134, 135)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedModel, PreTrainedTokenizerFast, ProcessorMixin

from .registry import FixtureFamily
from .shaping import BIAS_DIM, INIT_RANGE, bias_channel_value, language_model, shape_lm, words

IMAGE_SIZE, PATCH_SIZE, TOKENS_PER_TILE = 32, 8, 4
CHAT = (
    "{% for m in messages %}{{ m['role'] }} : "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}" + "MARKER" + " {% elif c['type'] == 'text' %}{{ c['text'] }} {% endif %}"
    "{% endfor %}{% endif %} {% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"
)


@dataclass(frozen=True)
class Layout:
    """Where a family's special tokens sit: ``head`` from id 0, ``tail`` from ``tail_start``, ``inner`` at
    fixed ids inside the text vocabulary; ``vocab`` rows in the target's LM head, ``text_end`` the first
    id past its text vocabulary, ``draft_vocab`` the natural text draft's rows."""

    vocab_size: int
    text_end: int
    head: list[str]
    tail: list[str]
    tail_start: int
    pad: str
    eos: list[str]
    bos: str | None
    unk: str
    image: str
    marker: str
    draft_vocab: int
    inner: dict[str, int] = field(default_factory=dict)
    extra_special_tokens: dict[str, str] = field(default_factory=dict)  # named for the family's processor
    reserved_head: int = 0  # how many of the last ``head`` tokens the LM never writes (layout tokens there)

    def vocab(self) -> dict[str, int]:
        """token -> id (text words fill the ids between the head and the tail tokens)."""
        vocab = {t: i for i, t in enumerate(self.head)}
        free = [i for i in range(len(vocab), self.tail_start) if i not in self.inner.values()]
        vocab.update(dict(zip(words(len(free)), free)))
        vocab.update(self.inner)
        vocab.update({t: self.tail_start + i for i, t in enumerate(self.tail)})
        return vocab

    def ids(self) -> dict[str, Any]:
        """image, pad, bos, eos (list), the text vocabulary end, the natural draft's size, the reserved ids."""
        vocab = self.vocab()
        eos = [vocab[t] for t in self.eos]
        return dict(image=vocab[self.image], pad=vocab[self.pad], bos=vocab[self.bos] if self.bos else None,
                    eos=eos, text_end=self.text_end, vocab=self.vocab_size, draft_vocab=self.draft_vocab,
                    reserved=[i for i in range(self.tail_start, self.vocab_size) if i not in set(eos)]
                    + sorted(self.inner.values()) + list(range(len(self.head) - self.reserved_head, len(self.head))))

    def tokenizer(self) -> PreTrainedTokenizerFast:
        vocab = self.vocab()
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=self.unk))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        specials = self.head + list(self.inner) + self.tail
        tok.add_special_tokens(sorted(specials, key=vocab.get))  # split out of unspaced image blocks
        if self.bos:  # Gemma's tokenizer prepends <bos>
            tok.post_processor = processors.TemplateProcessing(single=f"{self.bos} $A",
                                                               special_tokens=[(self.bos, vocab[self.bos])])
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token=self.bos, eos_token=self.eos[0], unk_token=self.unk,
            pad_token=self.pad, padding_side="left", model_max_length=4096,
            chat_template=CHAT.replace("MARKER", self.marker), extra_special_tokens=self.extra_special_tokens)


class NoVideo:
    """Mixin: the family's processor without its video processor (which needs torchvision)."""

    def check_argument_for_proper_class(self, argument_name: str, argument: object) -> type | None:
        if argument is None and argument_name == "video_processor":
            return None
        return super().check_argument_for_proper_class(argument_name, argument)  # type: ignore[misc]


def llama_like(cls: type, layout: Layout, **extra: Any) -> Any:
    """A 2-layer / hidden-64 text config of ``cls`` (Llama, Qwen2) in ``layout``'s ids."""
    ids = layout.ids()
    return cls(vocab_size=layout.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
               initializer_range=INIT_RANGE, bos_token_id=ids["bos"], eos_token_id=ids["eos"][0],
               pad_token_id=ids["pad"], tie_word_embeddings=False, **extra)


class LayoutFixtures(FixtureFamily):
    """A family built from a :class:`Layout`: subclasses set :attr:`layout` and build :meth:`model` and
    :meth:`processor`; the LM is shaped by :meth:`shape` (Llama-like by default)."""

    layout: Layout
    images_per_row = True  # these processors take the images of each row as a list

    @property
    def image_marker(self) -> str:  # type: ignore[override]
        return self.layout.marker

    def ids(self, vocab_size: int) -> dict[str, Any]:
        return self.layout.ids()

    def natural_draft_vocab(self, target: PreTrainedModel) -> int:
        return self.layout.draft_vocab

    def model(self, seed: int) -> PreTrainedModel:
        raise NotImplementedError

    def shape(self, model: PreTrainedModel, eos_bias: float | None, gen: torch.Generator) -> None:
        ids = self.layout.ids()
        decoder = language_model(model)
        shape_lm(decoder, model.lm_head, ids["vocab"], ids["reserved"], None, gen, probe_high=ids["text_end"])
        if eos_bias is not None:  # every EOS id gets the bias
            with torch.no_grad():
                for e in ids["eos"]:
                    model.lm_head.weight[e, BIAS_DIM] = eos_bias / bias_channel_value(model.lm_head.weight.shape[1])

    def target(self, seed: int, vocab_size: int, eos_bias: float | None) -> PreTrainedModel:
        ids = self.layout.ids()
        model = self.model(seed)
        self.shape(model, eos_bias, torch.Generator().manual_seed(seed + 1000))
        gc = model.generation_config
        gc.bos_token_id, gc.pad_token_id = ids["bos"], ids["pad"]
        gc.eos_token_id = ids["eos"] if len(ids["eos"]) > 1 else ids["eos"][0]
        return model.to(torch.float32).eval()

    def processor(self, vocab_size: int) -> ProcessorMixin:
        raise NotImplementedError


