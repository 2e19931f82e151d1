"""The Drafter interface: what a draft kind implements to run inside hf_specmm's speculative loop.

Documented like transformers' ``CandidateGenerator``; one subclass per draft kind (``drafts/<kind>/``).
The loop (``loop.speculative_decode``) calls, per ``generate`` call::

    Drafter.check(target, draft)              # before any work (classmethod): raise IncompatibleDraftError
    with drafter.watch(target):               # around the target's prefill forward
        out = target(prompt, images...)
    drafter.observe_prefill(out)              # read what the prefill produced
    drafter.prefill(prompt, first_token)      # read the prompt + the target's first token
    while rows are unfinished:
        proposal = drafter.propose(γ, select)     # d_1..d_γ (+ q_1..q_γ when sampling)
        with drafter.watch(target):               # only when observes_verification
            out = target([cur, d_1..d_γ])
        drafter.observe_verification(out)
        drafter.accept(proposal, n, next_token)   # keep n drafts per row, queue the target's token
        drafter.select_rows(keep)                 # rows finished: drop them (only if selects_rows)

Everything a drafter needs between ``propose`` and ``accept`` travels in the :class:`Proposal` it
returned, never in attributes left behind for later.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch

from .vocab import VocabMap

# picks d_{j+1} from target-vocabulary draft logits [B, V] of step j; returns (tokens [B], probabilities
# [B, V] or None). The loop's selector also has a ``stop`` attribute: True once every row has stopped
# drafting this round (assistant_confidence_threshold); a drafter should then return the tokens so far.
SelectFn = Callable[[torch.Tensor, int], tuple[torch.Tensor, "torch.Tensor | None"]]


@dataclass
class Prompt:
    """One ``generate`` call's prompt as the target reads it.

    ``input_ids`` [B, P] left-padded target ids (image placeholders included), ``attention_mask`` [B, P]
    or None, ``model_inputs`` the per-call multimodal inputs of the target's family (``pixel_values``,
    ``image_sizes``, ...; see ``TargetFamily.per_call_inputs``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None
    model_inputs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Proposal:
    """What :meth:`Drafter.propose` returns: ``tokens`` [B, γ] target ids d_1..d_γ, ``probs`` [B, γ, V]
    their (processed) draft distributions q_1..q_γ when sampling, else None, and ``restore``: whatever
    the drafter needs in :meth:`Drafter.accept` to roll back to this round's start (its own business)."""

    tokens: torch.Tensor
    probs: torch.Tensor | None
    restore: Any = None

    @property
    def gamma(self) -> int:
        return self.tokens.shape[1]


class Drafter(ABC):
    """Proposes γ tokens per round for every row of a batch; rolled back to what the target accepted.

    Args:
        draft: the draft model (``assistant_model``), as the draft kind's ``claims`` recognised it.
        vocab: maps the draft's logits onto the target's vocabulary and says which target ids the draft
            may read and propose (placeholders and ids outside either vocabulary never are).
    """

    #: True when the drafter reads the target's prefill through :meth:`watch` / :meth:`observe_prefill`
    #: (training then runs the target forward even where its loss needs no target logits)
    observes_prefill: bool = False
    #: True when :meth:`observe_verification` needs :meth:`watch` entered around verification forwards
    #: too (the loop skips the context otherwise: it is on the hot path)
    observes_verification: bool = False
    #: True when :meth:`select_rows` is implemented: the loop then drops finished rows from the batch
    #: (from the target's cache and through this method from the drafter's state), so later rounds run
    #: only the unfinished rows. False: every row stays in both batches until the call ends.
    selects_rows: bool = False

    def __init__(self, draft: Any, vocab: VocabMap):
        self.draft = draft
        self.vocab = vocab

    @classmethod
    def check(cls, target: Any, draft: Any) -> None:
        """Raise :class:`~hf_specmm.errors.IncompatibleDraftError` if ``draft`` cannot draft for ``target``.
        Runs before any forward pass; the vocabulary cover is checked for every kind by the caller."""

    @classmethod
    def prompt_lengths(cls, draft: Any, vocab: VocabMap, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """How many positions of the draft's context each row's prompt takes [B] (checked against the
        draft's context window before any work). Default: the text tokens (placeholders dropped)."""
        return vocab.visible_prompt(input_ids, attention_mask).sum(-1)

    def watch(self, target: Any) -> ContextManager:
        """Context entered around the target's prefill forward (e.g. to hook a module of the target)."""
        return contextlib.nullcontext()

    def observe_prefill(self, target_outputs: Any) -> None:
        """Called with the target's prefill outputs (logits, cache, ``image_hidden_states``, ...)."""

    def observe_verification(self, target_outputs: Any) -> None:
        """Called with the outputs of every verification forward, before :meth:`accept`."""

    @abstractmethod
    def prefill(self, prompt: Prompt, first_tokens: torch.Tensor) -> None:
        """Read the prompt and the target's first generated token per row (``first_tokens`` [B])."""

    @abstractmethod
    def propose(self, gamma: int, select: SelectFn) -> Proposal:
        """Draft γ ≥ 1 tokens per row; ``select(logits, j)`` turns the logits of step j into d_{j+1}."""

    @abstractmethod
    def accept(self, proposal: Proposal, n: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Keep the first ``n`` [B] drafts of ``proposal`` per row and queue ``next_tokens`` [B] (the
        target's correction or bonus token), so the next :meth:`propose` continues from there."""

    def select_rows(self, keep: torch.Tensor) -> None:
        """After :meth:`accept`: keep only rows ``keep`` [k] (indices into the current batch, in order) of
        every per-row state; later calls see a batch of k rows. Only called when :attr:`selects_rows`.
        A subclass drops its own state and calls ``super().select_rows(keep)``, which tells a draft module
        that keeps per-row state of its own (one with a ``select_rows`` method) too."""
        if not self.selects_rows:
            raise NotImplementedError(f"{type(self).__name__} keeps every row (selects_rows is False)")
        select = getattr(self.draft, "select_rows", None)
        if callable(select):
            select(keep)
