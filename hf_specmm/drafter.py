"""The Drafter: the one base every draft kind's drafter derives from to run inside hf_specmm's speculative loop.

Documented like transformers' ``CandidateGenerator``: a small abstract interface, one subclass per draft kind
(``drafts/<kind>/``). The loop (:class:`hf_specmm.loop.SpeculativeDecoding`) calls, per ``generate`` call::

    Drafter.check(target, draft)              # before any work (classmethod): raise IncompatibleDraftError
    with drafter.watch(target):               # around the target's prefill forward
        out = target(prompt, images...)
    drafter.observe_prefill(out)              # read what the prefill produced
    drafter.observe_target_cache(target_kv)   # the target's cache as the loop keeps it (rolled back each round)
    drafter.prefill(prompt, cur, new_cache)   # read the prompt; queue the target's first token
    while rows are unfinished:
        proposal = drafter.propose(budget, select, cur)  # d_1..d_γ (+ q_1..q_γ when sampling), or a tree at cur
        with drafter.watch(target):               # only when observes_verification
            out = target([cur, d_1..d_γ])
        drafter.observe_verification(out)
        drafter.accept(proposal, keep, cur, path)  # keep `keep` drafts per row (a tree: along its kept root
                                                   # path; a chain: path None), queue the new cur
        drafter.follow(cur)                       # instead of propose / accept: a plain target step
        drafter.select_rows(keep)                 # rows finished: drop them

``cur`` [A], each row's current token (the first of its next block, the root of its next tree), is kept by
the loop alone (``CallState.cur``) and handed to the drafter where it needs it. ``new_cache`` is the call's
cache factory (:data:`~hf_specmm.caches.CacheFactory`): a drafter never builds a cache itself, so the backend
(dynamic or static) is chosen in one place. ``select`` is a :class:`~hf_specmm.selector.Selector`.

A drafter drafts from a context it keeps between rounds: ``state``, its cache (its own
:class:`~hf_specmm.caches.SlottedCache` for an LM or a feature head; the target features' keys / values for a
DFlash block drafter; None for a Gemma 4 assistant, whose context is the target's own cache, rolled back by
the loop), and ``pending``, the slots it has not read yet. Every round has the same life, written once here::

    propose(budget, select, cur)
        start = begin_round(γ)                              # RoundStart(state.length, pending width), or None
        root logits = read_pending(cur)                     # ONE forward over the pending slots
        chain:  d_j = select(logits, j); logits = read_draft(d_j)     (γ - 1 reads; d_γ is read next round)
        tree:   expand_tree(cur, root logits, step)         # step = tree_levels(shape): one read per level
    accept(proposal, keep, next_tokens, path)
        state.rollback(start, pending + the kept drafts it read, in path order)      (a state of its own only)
        queue(...)                                          # the next round's pending slots
    follow(next_tokens)                                     # a plain target step: queue, read next round
    select_rows(keep)                                       # finished rows leave: state, pending

A subclass supplies only what it reads: the abstract :meth:`prefill` (build ``state``, read the prompt, set
``pending``), :meth:`read_pending` (the pending slots → the root's logits [A, V]), :meth:`read_draft` (one drafted
token → the next logits), :meth:`queue` and :meth:`follow` (the next round's ``pending``: an LM queues the target's
tokens; a feature head or a block drafter the verification's true features of every kept token; an assistant the
target's hidden state at the last kept one); for trees :meth:`read_level` (a level of K nodes in one forward with
the 4-D mask and positions it is given), or its own :meth:`tree_levels` (a block drafter reads level d from its
block).

``pending`` is not a second copy of ``cur``: it is what the draft's context still lacks, in the draft's own terms
(an LM: target ids mapped to ids it can read, several after a plain step, a kept draft it never read before the new
token; a feature head: (feature, token) pairs; a block drafter: target features; an assistant: the target's hidden
state): per-row tensors [A, k, ...], ``valid`` [A, k] bool last (left-padded rows hold masked holes).
``keeps_read_drafts``: whether the drafts it read stay in its cache when accepted (an LM's do; a feature head's
were computed from its own predicted features and are re-read from the target's true ones; a block drafter never
keeps its block). ``reads_last_draft``: whether d_γ is read in its own round (a draft with linear-attention layers:
a hole would advance its recurrent state) rather than next round, only if accepted. ``max_depth``: the deepest
round it drafts (a block drafter: its block).

Training runs a kind's *training view* (``DraftKind.training_view``), a drafter used only through
:meth:`Drafter.draft_inputs`, :attr:`Drafter.model`, :attr:`Drafter.positions` and :meth:`Drafter.watch`:
what is trained is what runs.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ContextManager, NamedTuple

import torch

from . import _compat
from .budget import RoundBudget
from .targets.positions import ROPE_1D, PositionRule
from .trees import DraftTree, LevelAncestry, TreeShape, expand_tree, extend_paths
from .vocab import VocabMap

if TYPE_CHECKING:
    from .caches import CacheFactory, SlottedCache
    from .selector import Selector

#: reads one tree level: ``(tokens [A, K], parents [A, K], depth) -> logits [A, K, V]`` (target vocabulary), the
#: nodes ``tokens`` at ``depth`` (1: the root's children), each the child of ``parents`` among the level before
LevelReader = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]

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
    #: whether the drafts it read stay in its cache when accepted (see the module doc)
    keeps_read_drafts: bool = True
    #: the deepest chain or tree a round drafts (None: as deep as the budget asks)
    max_depth: int | None = None

    def __init__(self, draft: Any, vocab: VocabMap, model: Any = None, positions: PositionRule = ROPE_1D):
        self.draft = draft
        self.vocab = vocab
        #: the module run each step and trained by the training view (``draft`` unwrapped)
        self.model = draft if model is None else model
        #: the draft's position rule (bound to the prompt by :meth:`prefill`)
        self.positions = positions
        #: its own cache (``length``, ``reserve``, ``rollback``, ``select_rows``), or None where its context is the
        #: target's cache
        self.state: Any = None
        #: the slots to read first next round: per-row tensors [A, k, ...], ``valid`` [A, k] last
        self.pending: tuple[torch.Tensor, ...] | None = None

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

    # ---- what a subclass reads -------------------------------------------------------------------------
    @abstractmethod
    def read_pending(self, cur: torch.Tensor) -> torch.Tensor:
        """Feed the pending slots (one forward); the target-vocabulary logits [A, V] after the last. ``cur`` [A]:
        each row's current token, for a drafter whose pending slots do not hold it (a block's anchor; the token an
        assistant reads with the target's hidden state)."""

    @abstractmethod
    def read_draft(self, token: torch.Tensor) -> torch.Tensor:
        """Feed the drafted token [A]; the logits [A, V] of the next."""

    def read_level(self, tokens: torch.Tensor, parents: torch.Tensor, attention_mask: Any,
                   position_ids: torch.Tensor) -> torch.Tensor:
        """Append a tree level of K slots (``tokens`` [A, K], each the child of ``parents`` [A, K] among the previous
        level's slots, -1: the root) with ``attention_mask`` in place of the cache's 2-D one and ``position_ids``;
        their logits [A, K, V] (target vocabulary, loop device). Read by the default :meth:`tree_levels`."""
        raise NotImplementedError(f"{type(self).__name__} reads tree levels through its own tree_levels")

    @abstractmethod
    def queue(self, proposal: Proposal, keep: torch.Tensor, next_tokens: torch.Tensor, path: torch.Tensor | None,
              unread: torch.Tensor) -> None:
        """After the rollback: set :attr:`pending` for the next round, which begins at ``next_tokens`` [A].
        ``unread`` [A] bool: rows whose last kept draft was kept without being read (only with
        :attr:`keeps_read_drafts`): read it first."""

    @abstractmethod
    def follow(self, next_tokens: torch.Tensor) -> None:
        """A round was a plain target step (nothing drafted): queue ``next_tokens`` [B] after what the drafter
        has not read yet, so its next :meth:`propose` reads them all first (one forward)."""

    def prepare_round(self, gamma: int) -> None:
        """Before a chain round's first forward (a compiled drafter pads ``pending`` to one width)."""

    @property
    def reads_last_draft(self) -> bool:
        return False

    # ---- the round -------------------------------------------------------------------------------------
    def pending_width(self) -> int:
        assert self.pending is not None
        return self.pending[-1].shape[1]

    def begin_round(self, gamma: int | None) -> RoundStart | None:
        """Where the round begins, for :meth:`accept`'s rollback (None: no state of its own to roll back). A
        chain of ``gamma`` reserves its room first (a tree: None), so that slot indices stay put."""
        if self.state is None:
            return None
        if gamma is not None:
            self.prepare_round(gamma)
            self.state.reserve(self.pending_width() + gamma)
        return RoundStart(self.state.length, self.pending_width())

    def propose(self, budget: RoundBudget, select: "Selector", cur: torch.Tensor) -> Proposal:
        """Draft ``budget.gamma`` ≥ 1 tokens per row after each row's current token ``cur`` [A] (fewer once
        ``select.stop``; a tree of ``budget.tree``'s shape rooted at ``cur``); ``select(logits, j)`` turns the
        logits of step j into d_{j+1}."""
        assert self.pending is not None and budget.gamma >= 1
        if budget.tree is not None:
            return self.propose_tree(budget.tree, select, cur)
        gamma = budget.gamma if self.max_depth is None else min(budget.gamma, self.max_depth)
        start = self.begin_round(gamma)
        logits = self.read_pending(cur)
        tokens, probs = [], []
        for j in range(gamma):
            token, prob = select(logits, j)
            tokens.append(token)
            probs.append(prob)
            if select.stop:  # every row is below the confidence threshold: end the round
                if self.reads_last_draft:
                    self.read_draft(token)
                break
            # d_γ is read next round, only if accepted (or now, see reads_last_draft)
            if j + 1 < gamma or self.reads_last_draft:
                logits = self.read_draft(token)
        return Proposal(torch.stack(tokens, 1), torch.stack(probs, 1) if probs[0] is not None else None, start)

    def propose_tree(self, shape: TreeShape, select: "Selector", cur: torch.Tensor) -> Proposal:
        """Read the pending slots, then :func:`~hf_specmm.trees.expand_tree` from the root ``cur``, one
        :meth:`tree_levels` read per level; history-reading processors see each node's own root path."""
        if self.max_depth is not None:
            shape = shape.cut(min(shape.depth, self.max_depth))
        start = self.begin_round(None)
        root_logits = self.read_pending(cur)
        read = self.tree_levels(shape)
        level_paths: list[torch.Tensor] = []  # the previous level's nodes' root paths [A, K, depth - 1]

        def step(tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
            paths = extend_paths(level_paths, tokens, parents)
            depth = paths.shape[-1]
            return select.level_scores(read(tokens, parents, depth), depth, paths)

        root = select.level_scores(root_logits[:, None], 0)[:, 0]
        tree = expand_tree(cur, root, step, shape)
        return Proposal(tree.tokens[:, 1:], None, start, tree=tree, depth=shape.depth)

    def tree_levels(self, shape: TreeShape) -> LevelReader:
        """After the pending read: a :data:`LevelReader` appending each level's K frontier nodes to ``state`` in
        ONE :meth:`read_level` forward, at the position their depth gives (the position rule's chain positions,
        M-RoPE included), attending through :class:`~hf_specmm.trees.LevelAncestry`'s 4-D mask (the prefix as it
        was after the pending slots, plus each node's own root path)."""
        state = self.state
        prefix = state.length if state.mask is None else state.mask.clone()  # the root is its last valid slot
        chain = state.positions.block_positions(state.next_positions(), None, shape.depth)
        dtype = self.model.dtype if self.model.dtype.is_floating_point else torch.float32
        config = self.model.config
        ancestry = LevelAncestry()

        def read(tokens: torch.Tensor, parents: torch.Tensor, depth: int) -> torch.Tensor:
            ancestry.add(parents)
            mask = _compat.mask_argument(config, lambda w: ancestry.attention_mask(prefix, dtype, w))
            positions = chain[..., depth - 1 : depth].expand(*chain.shape[:-1], tokens.shape[1])
            return self.read_level(tokens, parents, mask, positions)

        return read

    def accept(self, proposal: Proposal, keep: torch.Tensor, next_tokens: torch.Tensor,
               path: torch.Tensor | None = None) -> None:
        """Keep the first ``keep`` [B] drafts of ``proposal`` per row (a tree: along its kept root ``path``
        [B, D+1], node indices root first; None for a chain): roll ``state`` back to the round's start plus the
        kept drafts it read (a tree's gathered into place), then :meth:`queue` the next round's slots, up to
        ``next_tokens`` [B] (the target's bonus token)."""
        unread = torch.zeros_like(keep, dtype=torch.bool)
        start = proposal.start
        if start is not None:
            read, order = torch.zeros_like(keep), None
            if self.keeps_read_drafts:
                read, order = self._read_on_path(proposal, keep, path)
                unread = read < keep
            self.state.rollback(start.length, start.pending + read, order)
        self.queue(proposal, keep, next_tokens, path, unread)

    def _read_on_path(self, proposal: Proposal, keep: torch.Tensor,
                      path: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[A] kept drafts the drafter read, and (a tree) the order of the slots to keep: the pending ones, then
        the fed-slot index of each kept path node. Only a path's last node can be unread (a node the draft read
        is a frontier node, whose parent was one too)."""
        if proposal.tree is None:  # a chain read d_1..d_{γ-1} (every one where it reads the last draft too)
            return keep.clamp_max(proposal.gamma if self.reads_last_draft else proposal.gamma - 1), None
        slots = proposal.tree.draft_slots.gather(1, path[:, 1:].to(proposal.tree.draft_slots.device))
        on_path = torch.arange(slots.shape[1], device=keep.device)[None] < keep[:, None]
        read = ((slots >= 0) & on_path).sum(-1)
        width = proposal.start.pending
        pending = torch.arange(width, device=keep.device).expand(keep.shape[0], width)
        return read, torch.cat([pending, width + slots.clamp_min(0)], 1)

    def select_rows(self, keep: torch.Tensor) -> None:
        """After :meth:`accept`: keep only rows ``keep`` [k] (indices into the current batch, in order) of
        every per-row state (``state``, ``pending``); later calls see a batch of k rows. A subclass with per-row
        state of its own drops it and calls ``super().select_rows(keep)``, which tells a draft module that keeps
        per-row state (one with a ``select_rows`` method) too."""
        assert self.pending is not None
        select = getattr(self.draft, "select_rows", None)
        if callable(select):
            select(keep)
        if self.state is not None:
            self.state.select_rows(keep)
        self.pending = tuple(t[keep.to(t.device)] for t in self.pending)
