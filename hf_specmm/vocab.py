"""Which target ids a draft may propose, and how draft logits map onto the target's vocabulary.

A draft is compatible when every ordinary text id of the target is inside the draft's vocabulary.
Ids the target reserves (image/video placeholders, an appended pad id, rows beyond either
vocabulary) are never proposed, so the target never receives a placeholder it has no image for.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from .errors import IncompatibleDraftError
from .targets import TargetSpec


def draft_vocab_size(draft: Any) -> int:
    head = draft.get_output_embeddings() if hasattr(draft, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(draft.config.get_text_config().vocab_size)


def _first_differing_token(tokenizer: Any, draft_tokenizer: Any, end: int) -> str | None:
    ours = tokenizer.convert_ids_to_tokens(list(range(min(end, len(tokenizer)))))
    theirs = draft_tokenizer.convert_ids_to_tokens(list(range(min(end, len(draft_tokenizer)))))
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return f"id {i} is {a!r} for the target but {b!r} for the draft"
    return None


def check_vocab_compatible(
    spec: TargetSpec, draft: Any, tokenizer: Any = None, draft_tokenizer: Any = None
) -> None:
    """Raise :class:`IncompatibleDraftError` unless the draft covers every ordinary text id."""
    vd = draft_vocab_size(draft)
    end = spec.text_vocab_end
    if tokenizer is not None and draft_tokenizer is not None:
        end = min(end, len(tokenizer))
        diff = _first_differing_token(tokenizer, draft_tokenizer, end)
        if diff is not None:
            raise IncompatibleDraftError(
                f"The draft's tokenizer differs from the target's: {diff} (target vocab {spec.vocab_size}, "
                f"draft vocab {vd}). Use a draft trained with the target's tokenizer."
            )
    if vd < end:
        raise IncompatibleDraftError(
            f"The draft's vocabulary ({vd} ids) does not cover the target's text vocabulary "
            f"({end} ordinary text ids of {spec.vocab_size}; reserved ids {sorted(spec.reserved_ids)}): the draft's "
            f"vocab_size is {vd}, the target's {spec.vocab_size}. "
            "Use a draft that shares the target's tokenizer (e.g. a Llama/Vicuna draft for LLaVA-1.5, "
            "a Qwen2 draft for LLaVA-OneVision-qwen2)."
        )


@functools.lru_cache(maxsize=64)
def vocab_map(spec: TargetSpec, draft_vocab: int, device: torch.device) -> "VocabMap":
    """The :class:`VocabMap` of a target spec, a draft vocabulary size and a device, built once (it is read, never
    changed): building it was a tenth of a millisecond of every ``generate`` call's checks, a host-to-device copy
    of two vocabulary-sized masks on a GPU."""
    return VocabMap(spec, draft_vocab, device)


class VocabMap:
    """Maps draft logits ``[..., Vd]`` to target-vocabulary logits ``[..., Vt]`` with non-proposable ids at -inf."""

    def __init__(self, spec: TargetSpec, draft_vocab: int, device: torch.device):
        self.target_vocab = spec.vocab_size
        self.draft_vocab = draft_vocab
        proposable = torch.zeros(self.target_vocab, dtype=torch.bool)
        proposable[: min(draft_vocab, self.target_vocab)] = True
        for i in spec.reserved_ids:
            if i < self.target_vocab:
                proposable[i] = False
        self.proposable = proposable.to(device)
        # ids a text-only view reads: inside the draft's vocabulary, not a placeholder or vision span marker
        visible = torch.zeros(max(self.target_vocab, draft_vocab) + 1, dtype=torch.bool)
        visible[:draft_vocab] = True
        for i in spec.dropped_ids:
            if i < visible.numel():
                visible[i] = False
        self.draft_visible = visible.to(device)
        # what the draft reads in place of a generated id it cannot read (outside its vocabulary, a placeholder):
        # a readable stand-in keeps the draft's positions counting the target's generated tokens one for one
        self.stand_in = int(visible.nonzero()[0]) if bool(visible.any()) else 0
        # the family's layout ids guessed by position (no tokenizer named them) that this draft can read
        self.family = spec.family.name
        self.unverified = sorted(i for i in spec.unverified_layout_ids if i < draft_vocab)

    def to_target(self, draft_logits: torch.Tensor) -> torch.Tensor:
        vt, vd = self.target_vocab, draft_logits.shape[-1]
        if vd >= vt:
            logits = draft_logits[..., :vt]
        else:
            pad = draft_logits.new_full((*draft_logits.shape[:-1], vt - vd), float("-inf"))
            logits = torch.cat([draft_logits, pad], dim=-1)
        return logits.masked_fill(~self.proposable.to(logits.device), float("-inf"))

    def visible_prompt(self, ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Bool [B, L]: the prompt slots a text-only draft reads (not padding, not a placeholder)."""
        if self.unverified:
            self._warn_unverified(ids)
        visible = self.visible_to_draft(ids)
        if attention_mask is not None:
            visible &= attention_mask.to(visible.device).bool()
        return visible

    def visible_to_draft(self, ids: torch.Tensor) -> torch.Tensor:
        """Bool mask of target ids the draft reads (placeholders and out-of-vocabulary ids are dropped)."""
        visible = self.draft_visible.to(ids.device)
        return visible[ids.clamp(0, visible.numel() - 1)] & (ids >= 0)

    def readable(self, ids: torch.Tensor) -> torch.Tensor:
        """Generated target ids as the draft reads them: ids it cannot read become :attr:`stand_in`. Unlike a
        prompt's placeholders (dropped, see :meth:`visible_prompt`), a generated token keeps its slot."""
        return ids.masked_fill(~self.visible_to_draft(ids), self.stand_in)

    def _warn_unverified(self, ids: torch.Tensor) -> None:
        """Once per family and id range: the prompt holds ids where the upstream tokenizers put the family's
        layout tokens, and no tokenizer said what they are here; the draft reads them as text."""
        key = (self.family, self.unverified[0], self.unverified[-1])
        if key in _WARNED or not bool(torch.isin(ids, torch.tensor(self.unverified, device=ids.device)).any()):
            return
        _WARNED.add(key)
        warnings.warn(
            f"{self.family} target without its tokenizer: the prompt holds ids in {key[1]}..{key[2]}, where the "
            "upstream tokenizers put the image-layout tokens; without the tokenizer hf_specmm cannot tell them "
            "from ordinary words (a fine-tuned tokenizer may hold words there), so the draft reads them as text "
            "(lossless; only drafting quality can suffer). Pass tokenizer=processor.tokenizer to generate (a "
            "pipeline: generate_kwargs={'tokenizer': processor.tokenizer}) to have them read by name and dropped "
            "from a text-only draft's view.",
            UserWarning, stacklevel=3)


_WARNED: set[tuple[str, int, int]] = set()
