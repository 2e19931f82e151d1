"""What one round verifies: the verification block.

A block is the tokens the target scores in one forward, plus their shape: a *chain* ``[cur, d_1..d_γ]``
today (each token attends to the ones before it), a *tree* with the draft-tree wrapper (each node attends
to its ancestors). The block writes itself into a cache (:meth:`ChainBlock.append_to`): it knows its own
validity, attention mask and positions through the cache's position rule. What a verifier keeps of it is an
:class:`~hf_specmm.verify.Acceptance`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .caches import SlottedCache
from .drafter import Proposal


@dataclass
class ChainBlock:
    """``tokens`` [A, γ + 1]: the row's current token, then its drafts d_1..d_γ."""

    tokens: torch.Tensor

    @classmethod
    def of(cls, cur: torch.Tensor, proposal: Proposal) -> "ChainBlock":
        return cls(torch.cat([cur[:, None], proposal.tokens], dim=1))

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    def append_to(self, cache: SlottedCache) -> dict[str, torch.Tensor | None]:
        """Record the block in ``cache``; the attention mask and position ids of the forward that writes it."""
        return cache.append(None, self.width)
