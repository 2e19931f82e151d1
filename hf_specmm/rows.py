"""The rows of a speculative ``generate`` call: what each has emitted, whether it has finished, and
what plain ``generate`` would have kept of a block of new tokens (stopping criteria, ``max_length``)."""

from __future__ import annotations

from typing import Any

import torch

from .history import RowHistory, stop_counts


class Rows:
    """Rows advance by different amounts per round; each keeps exactly the tokens plain generate would."""

    def __init__(self, input_ids: torch.Tensor, max_length: int, pad_id: int, stopping_criteria: Any,
                 streamer: Any = None):
        self.history = RowHistory(input_ids, max_length + 2, pad_id)
        self.max_length, self.pad_id = max_length, pad_id
        self.stopping_criteria, self.streamer = stopping_criteria, streamer
        self.unfinished = [True] * input_ids.shape[0]

    def any_unfinished(self) -> bool:
        return any(self.unfinished)

    def live(self, device: torch.device) -> torch.Tensor:
        return torch.tensor(self.unfinished, device=device)

    def budget(self) -> list[int]:
        """Tokens each row may still add before ``max_length``."""
        return [self.max_length - length for length in self.history.lengths]

    def emit(self, block: torch.Tensor, counts: torch.Tensor) -> list[int]:
        """Offer ``counts`` [B] tokens of ``block`` [B, m] per row; returns how many each row kept."""
        self.history.write(block)
        kept, stopped = stop_counts(self.stopping_criteria, self.history, block, counts)
        self.history.advance(kept)
        for i in range(len(kept)):
            if stopped[i]:
                self.unfinished[i] = False
        if self.streamer is not None and kept[0]:
            self.streamer.put(block[:, : kept[0]].cpu())
        return kept

    def sequences(self) -> torch.Tensor:
        """[B, P0 + new] laid out as plain generate's: rows that finished early are padded."""
        total = max(self.history.lengths)
        sequences = self.history.ids[:, :total].clone()
        for i, length in enumerate(self.history.lengths):
            sequences[i, length:] = self.pad_id
        return sequences
