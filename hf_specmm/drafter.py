"""The Drafter interface: what a draft kind implements to run inside hf_specmm's speculative loop.

Documented like transformers' ``CandidateGenerator``; one subclass per draft kind (``drafts/<kind>/``).
The loop (:class:`hf_specmm.loop.SpeculativeDecoding`) calls, per ``generate`` call::

    Drafter.check(target, draft)              # before any work (classmethod): raise IncompatibleDraftError
    with drafter.watch(target):               # around the target's prefill forward
        out = target(prompt, images...)
    drafter.observe_prefill(out)              # read what the prefill produced
    drafter.observe_target_cache(target_kv)   # the target's cache as the loop keeps it (rolled back each round)
    drafter.prefill(prompt, first_token, new_cache)  # read the prompt + the target's first token
    while rows are unfinished:
        proposal = drafter.propose(budget, select)   # d_1..d_γ (+ q_1..q_γ when sampling)
        with drafter.watch(target):               # only when observes_verification
            out = target([cur, d_1..d_γ])
        drafter.observe_verification(out)
        drafter.accept(proposal, keep, next_token, path)  # keep `keep` drafts per row (a tree: along its
                                                  # kept root path; a chain: path None), queue the target's token
        drafter.select_rows(keep)                 # rows finished: drop them (only if selects_rows)

``new_cache`` is the call's cache factory (:data:`~hf_specmm.caches.CacheFactory`): a drafter never builds
a cache itself, so the backend (dynamic today, static next) is chosen in one place. ``select`` is a
:class:`~hf_specmm.selector.Selector`. Everything a drafter needs between ``propose`` and ``accept``
travels in the :class:`Proposal` it returned, never in attributes left behind for later.

Training runs a kind's *training view* (``DraftKind.training_view``), a drafter used only through
:meth:`Drafter.draft_inputs`, :attr:`Drafter.model`, :attr:`Drafter.positions` and :meth:`Drafter.watch`:
what is trained is what runs.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ContextManager, NamedTuple

import torch

from .budget import RoundBudget
from .targets.positions import ROPE_1D, PositionRule
from .trees import DraftTree
from .vocab import VocabMap

if TYPE_CHECKING:
    from .caches import CacheFactory, SlottedCache
    from .selector import Selector


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
class DraftPrompt:
    """What a draft reads of a :class:`Prompt`: ``ids`` [B, W], ``valid`` [B, W] bool, the ``positions``
    rule bound to this prompt (M-RoPE grids for a VLM draft) and ``extra`` forward kwargs (image inputs)."""

    ids: torch.Tensor
    valid: torch.Tensor
    positions: PositionRule = ROPE_1D
    extra: dict[str, Any] = field(default_factory=dict)


class RoundStart(NamedTuple):
    """Where a KV-cached drafter's round began: its cache's ``length`` and the ``pending`` slots it read first
    (:meth:`Drafter.accept` rolls back to ``length + pending`` plus the kept drafts it read)."""

    length: int
    pending: int


@dataclass
class Proposal:
    """What :meth:`Drafter.propose` returns: ``tokens`` [B, γ] target ids d_1..d_γ, ``probs`` [B, γ, V]
    their (processed) draft distributions q_1..q_γ when sampling, else None, and ``start``: where the drafter's
    round began (a drafter without a cache of its own: None). ``tree``: a :class:`~hf_specmm.trees.DraftTree`
    rooted at the row's current token when the round drafted a tree (``tokens`` its N draft nodes; ``gamma``
    its ``depth``)."""

    tokens: torch.Tensor
    probs: torch.Tensor | None
    start: RoundStart | None = None
    tree: DraftTree | None = None
    depth: int | None = None  # the round's γ (a tree's depth: its draft forwards); None: one per token

    @property
    def gamma(self) -> int:
        return self.tokens.shape[1] if self.depth is None else self.depth

    def drafts_on_path(self, path: torch.Tensor | None) -> torch.Tensor:
        """[B, D] the drafts along each row's kept ``path`` (a tree's root path, root left out; None: the chain)."""
        return self.tokens if path is None else self.tree.tokens.gather(1, path)[:, 1:]

    @classmethod
    def empty(cls, rows: int, vocab_size: int, like: torch.Tensor) -> "Proposal":
        """No drafts this round (one token left: a plain target step), shaped like a real proposal."""
        return cls(like.new_zeros(rows, 0, dtype=torch.long), like.new_zeros(rows, 0, vocab_size, dtype=torch.float32))


def every_prompt_position(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """[B] every valid prompt position (image positions included): the prompt length of a drafter whose cache
    holds a slot per target position (a feature head, a DFlash context)."""
    if attention_mask is None:
        return torch.full((input_ids.shape[0],), input_ids.shape[1], device=input_ids.device)
    return attention_mask.sum(-1)


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

    def __init__(self, draft: Any, vocab: VocabMap, model: Any = None, positions: PositionRule = ROPE_1D):
        self.draft = draft
        self.vocab = vocab
        #: the module run each step and trained by the training view (``draft`` unwrapped)
        self.model = draft if model is None else model
        #: the draft's position rule (bound to the prompt by :meth:`prefill`)
        self.positions = positions

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

    def observe_target_cache(self, cache: "SlottedCache") -> None:
        """Called once, after the target's prefill, with the call's target cache (before :meth:`prefill`). The
        loop alone appends, rolls back and drops its rows; a drafter that reads the target's K/V (a Gemma 4
        assistant) reads it from here, as each row kept it."""

    def draft_inputs(self, prompt: Prompt) -> DraftPrompt:
        """What the draft reads of ``prompt`` (inference and training share it). Drafters that read the
        prompt some other way (a feature head reads the target's features) need not implement it."""
        raise NotImplementedError(f"{type(self).__name__} has no token view of the prompt")

    @abstractmethod
    def prefill(self, prompt: Prompt, first_tokens: torch.Tensor, new_cache: "CacheFactory") -> None:
        """Read the prompt and the target's first generated token per row (``first_tokens`` [B]) into a
        cache made by ``new_cache(model, batch_size, device, positions)``."""

    @abstractmethod
    def propose(self, budget: RoundBudget, select: "Selector") -> Proposal:
        """Draft ``budget.gamma`` ≥ 1 tokens per row (fewer once ``select.stop``); ``select(logits, j)``
        turns the logits of step j into d_{j+1}."""

    @abstractmethod
    def accept(self, proposal: Proposal, keep: torch.Tensor, next_tokens: torch.Tensor,
               path: torch.Tensor | None = None) -> None:
        """Keep the first ``keep`` [B] drafts of ``proposal`` per row (a tree: along its kept root ``path``
        [B, D+1], node indices root first; None for a chain) and queue ``next_tokens`` [B] (the target's bonus
        token), so the next :meth:`propose` continues from there."""

    #: True when :meth:`propose` drafts a tree for a budget with a tree shape (``hf_specmm.Tree``, ``Auto``)
    drafts_trees: bool = False

    #: True when :meth:`follow` is implemented: rounds may then be plain target steps (``hf_specmm.Auto``)
    follows_plain_steps: bool = False

    def follow(self, next_tokens: torch.Tensor) -> None:
        """A round was a plain target step (nothing drafted): queue ``next_tokens`` [B] after what the drafter
        has not read yet, so its next :meth:`propose` reads them all first (one forward). Only called when
        :attr:`follows_plain_steps`."""
        raise NotImplementedError(f"{type(self).__name__} does not follow plain target steps")

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
