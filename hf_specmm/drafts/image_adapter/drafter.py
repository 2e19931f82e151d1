"""Runs an :class:`ImageAdapterDraft` in the speculative loop.

Differs from the text-only drafter in two steps only (``watch`` and ``draft_inputs``): while the target runs its prefill, the image
embeddings its projector produced are captured from the input of the target's language model (no
second vision tower run, no second preprocessing); the draft's prompt keeps the image positions
(pooled by ``image_pool``) and receives those embeddings through its adapter.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ...drafter import DraftPrompt, Prompt
from ...errors import IncompatibleDraftError
from ...hooks import this_call
from ...targets import target_spec
from ...vocab import VocabMap
from ..chain import LMDrafter
from .modeling import pool_image_features


class ImageAdapterDrafter(LMDrafter):
    observes_prefill = True

    def __init__(self, draft: Any, vocab: VocabMap):
        super().__init__(draft, vocab)
        self.placeholder_ids = tuple(draft.config.placeholder_ids)
        self.pool = int(draft.config.image_pool)
        self.target_embeds: torch.Tensor | None = None

    @classmethod
    def check(cls, target: Any, draft: Any) -> None:
        """The draft must have been made for this target's image embeddings and placeholders."""
        spec = target_spec(target)
        width = target.config.get_text_config().hidden_size
        made_for = draft.config.target or draft.config.target_class or "another target"
        if draft.config.image_feature_dim != width:
            raise IncompatibleDraftError(
                f"This ImageAdapterDraft reads image embeddings of width {draft.config.image_feature_dim} "
                f"(image_feature_dim; made for {made_for}), but the target's are {width} wide (its text config's "
                "hidden_size). Use a draft made for this target "
                "(ImageAdapterDraft.for_target(target, ...)).")
        if draft.config.image_token_id not in spec.placeholder_ids:
            raise IncompatibleDraftError(
                f"This ImageAdapterDraft expects image token id {draft.config.image_token_id} (image_token_id; made "
                f"for {made_for}), but the target's placeholder ids are {sorted(spec.placeholder_ids)}. "
                "Use a draft made for this target.")

    @classmethod
    def prompt_lengths(cls, draft: Any, vocab: VocabMap, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Text tokens plus the pooled image slots (an upper bound when ``image_pool`` > 1: each run of
        placeholders may add one partial chunk)."""
        images = torch.isin(input_ids, torch.tensor(draft.config.placeholder_ids, device=input_ids.device))
        text = cls.readable(input_ids, vocab) & ~images
        if attention_mask is not None:
            images &= attention_mask.bool()
            text &= attention_mask.bool()
        starts = images & ~torch.nn.functional.pad(images, (1, 0))[:, :-1]
        return text.sum(-1) + images.sum(-1) // draft.config.image_pool + starts.sum(-1)

    @staticmethod
    def readable(ids: torch.Tensor, vocab: VocabMap) -> torch.Tensor:
        """Prompt ids this draft reads as tokens: every id of its vocabulary (placeholders are handled
        apart). Unlike a text-only view it keeps the image-block markers around the placeholders (Gemma
        3's <start_of_image>, SmolVLM's <row_i_col_j>, InternVL's <img>): it reads the image as the target
        does. Ids beyond the draft's vocabulary (SmolVLM's layout ids for a SmolLM2 draft) stay dropped."""
        return (ids >= 0) & (ids < vocab.draft_vocab)

    @contextlib.contextmanager
    def watch(self, target: Any) -> Iterator[None]:
        def capture(module: Any, args: tuple, kwargs: dict) -> None:
            if self.target_embeds is None and kwargs.get("inputs_embeds") is not None:
                self.target_embeds = kwargs["inputs_embeds"].detach()

        handle = target.get_decoder().register_forward_pre_hook(this_call(capture), with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    def rows_and_runs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[list[list[int]], list[int]]:
        """Per row, the draft's prompt ids (placeholder runs pooled) and the run lengths in row-major order."""
        ids_host = input_ids.tolist()
        mask_host = attention_mask.tolist() if attention_mask is not None else [[1] * len(r) for r in ids_host]
        visible_host = self.readable(input_ids, self.vocab).tolist()
        rows, runs = [], []
        for ids, mask, visible in zip(ids_host, mask_host, visible_host):
            row: list[int] = []
            run = 0
            for tok, m, vis in zip(ids + [-1], mask + [1], visible + [False]):
                if m and tok in self.placeholder_ids:
                    run += 1
                    continue
                if run:
                    runs.append(run)
                    row.extend([self.placeholder_ids[0]] * -(-run // self.pool))
                    run = 0
                if m and vis:
                    row.append(tok)
            rows.append(row)
        return rows, runs

    def draft_inputs(self, prompt: Prompt) -> DraftPrompt:
        """Prompt view plus the captured image embeddings, pooled, for its image slots (one pass over the
        prompt). Consumes the capture of :meth:`watch`; used by inference and by training."""
        input_ids, attention_mask = prompt.input_ids, prompt.attention_mask
        rows, runs = self.rows_and_runs(input_ids, attention_mask)
        ids, valid = _left_pad(rows, input_ids)
        features = None
        if runs:
            if self.target_embeds is None:
                raise RuntimeError("the target's image embeddings were not captured during its forward")
            placeholders = torch.isin(input_ids, torch.tensor(self.placeholder_ids, device=input_ids.device))
            if attention_mask is not None:
                placeholders &= attention_mask.bool()
            embeds = self.target_embeds[:, : input_ids.shape[1]]  # the target may have read more (training)
            features = pool_image_features(embeds[placeholders.to(embeds.device)], runs, self.pool)
        self.target_embeds = None  # one capture per target forward
        return DraftPrompt(ids, valid, self.positions, {"image_features": features})


def _left_pad(rows: list[list[int]], like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(max(map(len, rows)), 1)
    ids = like.new_zeros(len(rows), width)
    valid = torch.zeros(len(rows), width, dtype=torch.bool, device=like.device)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(row, device=like.device)
            valid[i, width - len(row):] = True
    return ids, valid
