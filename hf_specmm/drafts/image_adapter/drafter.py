"""Runs an :class:`ImageAdapterDraft` in the speculative loop.

Differs from the text-only drafter in two steps only: while the target runs its prefill, the image
embeddings its projector produced are captured from the input of the target's language model (no
second vision tower run, no second preprocessing); the draft's prompt keeps the image positions
(pooled by ``image_pool``) and receives those embeddings through its adapter.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ...drafters import TextOnlyDrafter
from ...vocab import VocabMap
from .modeling import pool_image_features


class ImageAdapterDrafter(TextOnlyDrafter):
    def __init__(self, draft: Any, vocab: VocabMap):
        super().__init__(draft, vocab)
        self.placeholder_ids = tuple(draft.config.placeholder_ids)
        self.pool = int(draft.config.image_pool)
        self.target_embeds: torch.Tensor | None = None

    @contextlib.contextmanager
    def observe_target(self, target: Any) -> Iterator[None]:
        def capture(module: Any, args: tuple, kwargs: dict) -> None:
            if self.target_embeds is None and kwargs.get("inputs_embeds") is not None:
                self.target_embeds = kwargs["inputs_embeds"].detach()

        handle = target.get_decoder().register_forward_pre_hook(capture, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    def rows_and_runs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[list[list[int]], list[int]]:
        """Per row, the draft's prompt ids (placeholder runs pooled) and the run lengths in row-major order."""
        ids_host = input_ids.tolist()
        mask_host = attention_mask.tolist() if attention_mask is not None else [[1] * len(r) for r in ids_host]
        visible_host = self.vocab.visible_to_draft(input_ids).tolist()
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

    def prompt_view(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        rows, _ = self.rows_and_runs(input_ids, attention_mask)
        return _left_pad(rows, input_ids)

    def draft_inputs(self, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Prompt view plus the captured image embeddings, pooled, for its image slots (one pass over the
        prompt). Consumes the capture of :meth:`observe_target`; used by inference and by training."""
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
        return ids, valid, {"image_features": features}


def _left_pad(rows: list[list[int]], like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(max(map(len, rows)), 1)
    ids = like.new_zeros(len(rows), width)
    valid = torch.zeros(len(rows), width, dtype=torch.bool, device=like.device)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(row, device=like.device)
            valid[i, width - len(row):] = True
    return ids, valid
