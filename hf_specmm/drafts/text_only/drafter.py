"""Text-only drafting (2404.08856): any causal LM sharing the target's text ids reads the conversation
with the image/video placeholders (and vision span markers) removed."""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

import torch

from ...drafter import DraftPrompt, Prompt
from ...errors import IncompatibleDraftError
from ...vocab import VocabMap
from ..chain import LMDrafter
from ..registry import draft_kinds
from ..wrapper import DraftWrapper


def _lm_head(model: Any) -> Any:
    """``model``'s LM head, or None where it has none (a base model, a block drafter using the target's)."""
    try:
        return model.get_output_embeddings()
    except (AttributeError, NotImplementedError):  # transformers raises where it cannot find one
        return None


def runs_alone(model: Any) -> bool:
    """Whether ``model`` drafts from token ids alone, as a text-only draft runs it: its forward reads ``input_ids``,
    it has its own LM head, and it is none of transformers' ``*_assistant`` model types (Gemma 4's assistant, Muse
    Glimmer's DFlash drafter), which read their target's internal states and so need a draft kind of their own."""
    model_type = str(getattr(getattr(model, "config", None), "model_type", None) or "")
    forward = getattr(model, "forward", None)
    if forward is None:
        return False
    # the class's own forward is asked once (inspect.signature was a tenth of a millisecond of every generate
    # call's checks); an instance's (accelerate's partial, a compiled forward) holds its module: not kept
    own = isinstance(forward, types.MethodType) and forward.__func__ is getattr(type(model), "forward", None)
    reads_ids = _class_forward_reads_ids(forward.__func__) if own else _reads_ids(forward)
    return reads_ids and _lm_head(model) is not None and not model_type.endswith("_assistant")


def _reads_ids(forward: Any) -> bool:
    """Whether a forward takes ``input_ids`` (by name or ``**kwargs``)."""
    try:
        params = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):  # no inspectable forward
        return False
    return any(p.name == "input_ids" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


_class_forward_reads_ids = functools.lru_cache(maxsize=256)(_reads_ids)


class TextOnly(DraftWrapper):
    """Use ``model`` as a text-only draft even where hf_specmm would pick another kind for it (e.g. a
    small VLM whose image layout differs from the target's): ``assistant_model=hf_specmm.TextOnly(vlm)``.

    Example::

        >>> import hf_specmm
        >>> from hf_specmm import testing
        >>> hf_specmm.TextOnly(testing.tiny_target("llava")).model.__class__.__name__
        'LlavaForConditionalGeneration'
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        if isinstance(model, TextOnly):
            model = model.model
        self.model = model


def text_only_view(vocab: VocabMap, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A text-only draft's prompt: each row's visible tokens (placeholders removed), left-padded.
    Returns ``(ids, valid)``, both [B, width]."""
    visible = vocab.visible_prompt(input_ids, attention_mask)
    width = max(int(visible.sum(-1).max()), 1)
    order = torch.sort(visible.long(), dim=1, stable=True).indices  # hidden slots first, order kept
    ids = input_ids.gather(1, order)[:, -width:]
    valid = visible.gather(1, order)[:, -width:]
    return ids.masked_fill(~valid, 0), valid


class TextOnlyDrafter(LMDrafter):
    """Drafts with a causal LM that never sees the image."""

    def __init__(self, draft: Any, vocab: VocabMap):
        super().__init__(draft, vocab, model=draft.model if isinstance(draft, TextOnly) else draft)

    @classmethod
    def check(cls, target: Any, draft: Any) -> None:
        model = draft.model if isinstance(draft, TextOnly) else draft
        if not runs_alone(model):
            raise IncompatibleDraftError(
                f"a text-only draft must be a causal LM that drafts from token ids alone, with its own LM head (a "
                f"*ForCausalLM); {type(model).__name__} is not (no LM head, or it reads its target's internal states). "
                f"The draft kinds are {', '.join(draft_kinds())}: pass a causal LM, a VLM of the target's family, an "
                "ImageAdapterDraft, a feature head or a DFlash block drafter (e.g. MuseGlimmerAssistantModel).")

    def draft_inputs(self, prompt: Prompt) -> DraftPrompt:
        ids, valid = text_only_view(self.vocab, prompt.input_ids, prompt.attention_mask)
        return DraftPrompt(ids, valid, self.positions)
