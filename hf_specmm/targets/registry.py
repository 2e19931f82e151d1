"""Target families: a registry of the multimodal architectures hf_specmm speculates for.

A family owns everything the loop, the drafts and training must know about a target's token stream:
its placeholder ids (image, video), the vision span markers a text-only view drops with them, where
its text vocabulary ends, the extra per-call inputs its forward takes (``pixel_values``, ...), the
config fields that fix how many placeholders an image expands to, and the position rule for a block
of new tokens. Each family module calls :func:`register_target_family` once (see ``llava.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..errors import UnsupportedTargetError
from .positions import ROPE_1D, PositionRule


@dataclass(frozen=True)
class TargetFamily:
    """A multimodal architecture whose text stream can be drafted.

    ``placeholder_attrs`` / ``span_attrs``: config attributes naming token ids, first found wins per tuple.
    ``image_layout_attrs``: dotted config attributes that decide how many placeholder tokens an image
    (or video) expands to; two models with equal values read the same prompt the same way.
    """

    name: str
    class_name: str
    placeholder_attrs: tuple[tuple[str, ...], ...]
    per_call_inputs: tuple[str, ...] = ("pixel_values",)
    image_layout_attrs: tuple[str, ...] = ()
    span_attrs: tuple[tuple[str, ...], ...] = ()  # vision start/end markers (dropped from a text-only view)
    positions: PositionRule = field(default=ROPE_1D)
    # config attribute giving the placeholders of every image when that number is fixed (LLaVA-1.5:
    # image_seq_length); None where it depends on the image (anyres tiling)
    tokens_per_image_attr: str | None = None
    # every image is one contiguous run of placeholders (LLaVA-1.5; LLaVA-NeXT / OneVision anyres, newline
    # tokens included; a Qwen-VL / Gemma 3 / InternVL image between its markers), so a prompt cannot hold more
    # runs than images; False where tiles are split by layout tokens (Idefics3 / SmolVLM)
    one_run_per_image: bool = False
    # the per-call input whose first dimension counts the images (or, Gemma 3 pan-and-scan crops / InternVL
    # tiles, the image pieces, each at least one image's worth); Qwen-VL's pixel_values are patches
    image_count_input: str = "pixel_values"
    # model_type of a plain causal LM that reads this family's text stream (a fresh text-only draft), when
    # the target's text config is not one itself (Qwen2-VL's "qwen2_vl_text" -> "qwen2"); None: the text config's
    text_model_type: str | None = None
    # image-layout tokens the config does not name (SmolVLM's <row_i_col_j>, InternVL's <img>), read by name
    # from the tokenizer when one is given; without one, ``layout_ids`` gives the upstream tokenizers' ids
    # from the config's image id, a guess that :class:`TargetSpec` keeps apart (see ``unverified_layout_ids``)
    layout_tokens: tuple[str, ...] = ()
    layout_ids: Callable[[Any], Iterable[int]] | None = None
    # per-call inputs of the target's forward that the loop does not handle for this family (Gemma 4's audio
    # and video): a call passing one is refused before any work
    refused_inputs: tuple[str, ...] = ()
    # draft kinds that cannot run on this family, with why (checked before any work, trees included)
    refused_draft_kinds: tuple[tuple[str, str], ...] = ()

    def model_class(self) -> type:
        import transformers

        return getattr(transformers, self.class_name)

    def image_layout(self, config: Any) -> dict[str, Any]:
        """The values of ``image_layout_attrs`` on ``config`` (missing ones as None)."""
        out = {}
        for path in self.image_layout_attrs:
            value: Any = config
            for part in path.split("."):
                value = getattr(value, part, None)
            out[path] = value
        return out

    def model_inputs(self, model_kwargs: dict[str, Any]) -> dict[str, Any]:
        """The per-call multimodal inputs present in ``model_kwargs`` (what a VLM draft receives too)."""
        return {k: model_kwargs[k] for k in self.per_call_inputs if model_kwargs.get(k) is not None}


SUPPORTED_TARGETS: dict[str, TargetFamily] = {}  # class name -> family


def register_target_family(family: TargetFamily) -> TargetFamily:
    """Add ``family`` (called once by the family's module). Registering a class twice is an error."""
    if family.class_name in SUPPORTED_TARGETS and SUPPORTED_TARGETS[family.class_name] != family:
        raise ValueError(f"target class {family.class_name} is already registered")
    SUPPORTED_TARGETS[family.class_name] = family
    return family


def family_of(model: Any) -> TargetFamily | None:
    """The family of ``model`` (its class or a base class registered), or None."""
    for cls in type(model).__mro__:
        family = SUPPORTED_TARGETS.get(cls.__name__)
        if family is not None:
            return family
    return None


def family_by_model_type(model_type: str) -> TargetFamily | None:
    return next((f for f in SUPPORTED_TARGETS.values() if f.name == model_type), None)


def target_family(model: Any) -> TargetFamily:
    """Return the family of ``model`` or raise listing the supported classes."""
    family = family_of(model)
    if family is None:
        supported = ", ".join(sorted(SUPPORTED_TARGETS))
        raise UnsupportedTargetError(
            f"hf_specmm cannot speculate for a {type(model).__name__}. Supported targets: {supported}. "
            "Load the model with one of these classes (e.g. LlavaForConditionalGeneration.from_pretrained)."
        )
    return family


def _first_ids(config: Any, groups: tuple[tuple[str, ...], ...]) -> set[int]:
    ids: set[int] = set()
    for attrs in groups:
        for attr in attrs:
            value = getattr(config, attr, None)
            if value is not None:
                ids.add(int(value))
                break
    return ids


@dataclass(frozen=True)
class TargetSpec:
    """What the decoding loop needs to know about one target's vocabulary."""

    family: TargetFamily
    vocab_size: int  # rows of the target's LM head
    placeholder_ids: frozenset[int]  # image/video placeholders
    dropped_ids: frozenset[int]  # removed from a text-only draft's view (placeholders + vision span markers)
    reserved_ids: frozenset[int]  # never proposed by a draft (dropped ids and an appended pad id)
    # where the upstream tokenizers put the family's layout tokens, when no tokenizer confirmed them by name:
    # neither dropped nor reserved (in another tokenizer they may be ordinary words), but past the text
    # vocabulary for :attr:`text_vocab_end` (a draft whose vocabulary ends right below them is the natural one)
    unverified_layout_ids: frozenset[int] = frozenset()

    @property
    def text_vocab_end(self) -> int:
        """Ids below this are the target's ordinary text ids (placeholders, and the run of reserved
        layout ids right before them, e.g. SmolVLM's <global-img> <row_i_col_j> <fake_token_around_image>,
        are appended after them)."""
        reserved = self.reserved_ids | self.unverified_layout_ids
        appended = [i for i in reserved if i >= min(self.placeholder_ids, default=self.vocab_size)]
        end = min(appended + [self.vocab_size])
        while end - 1 in reserved:
            end -= 1
        return end


def layout_ids_by_name(tokenizer: Any, names: Iterable[str]) -> set[int]:
    """The ids of ``names`` that ``tokenizer`` (or a processor's) holds as single tokens; a name it splits
    into pieces is text the draft reads as such."""
    vocab = getattr(tokenizer, "tokenizer", tokenizer).get_vocab()
    return {int(vocab[name]) for name in names if name in vocab}


def target_spec(model: Any, tokenizer: Any = None) -> TargetSpec:
    """What the loop needs to know about ``model``'s vocabulary. ``tokenizer`` (the target's tokenizer or
    processor, e.g. ``generate(tokenizer=...)``): the family's layout tokens are read from it by name."""
    family = target_family(model)
    config = model.config
    placeholders = _first_ids(config, family.placeholder_attrs)
    dropped = placeholders | _first_ids(config, family.span_attrs)
    unverified: set[int] = set()
    if family.layout_tokens and tokenizer is not None:
        dropped |= layout_ids_by_name(tokenizer, family.layout_tokens)
    elif family.layout_ids is not None:
        unverified = {int(i) for i in family.layout_ids(config)} - dropped
    text_config = config.get_text_config()
    reserved = set(dropped)
    # Idefics3 / SmolVLM configs warn on reading their deprecated top-level pad_token_id: read the text config's
    deprecated = isinstance(getattr(type(config), "pad_token_id", None), property)
    pad = None if deprecated else getattr(config, "pad_token_id", None)
    if pad is None:
        pad = getattr(text_config, "pad_token_id", None)
    # a pad id appended after the placeholders (LLaVA-1.5: <image>=32000, <pad>=32001) is not text
    if pad is not None and placeholders and int(pad) > min(placeholders):
        reserved.add(int(pad))
    return TargetSpec(family, int(text_config.vocab_size), frozenset(placeholders), frozenset(dropped),
                      frozenset(reserved), frozenset(unverified))
