"""Controlled acceptance for systems benchmarks.

Random weights give no meaningful acceptance. This wrapper runs the real draft forward (its real
cost) and then overrides the proposal at the last position: the draft's guess for generated token k
of row r is the target's reference token (from a plain greedy run) when ``hit[r, k]``, otherwise a
wrong token. ``hit[r, k] = u(seed, r, k) < α`` with ``u`` a fixed hash of (seed, row, absolute
generated position) onto [0, 1): the draws do not depend on how often or in which order the draft
is called, so every loop (plain, stock assisted, hf_specmm, any draft kind, any batch size) sees the
SAME accept/reject pattern, and with the same γ the same number of rounds: τ is equal, and speedups
compare costs only (generated token 0 is always a miss: see :func:`set_reference`). Each hit is an independent Bernoulli(α), so for greedy decoding the expected
tokens per round is τ = (1 − α^(γ+1)) / (1 − α). This is a SYSTEMS benchmark: real acceptance comes
from trained drafts.

Draft trees (``hf_specmm.Tree``): a level's K nodes share one position (their depth), so every node of a
level proposes that position's controlled token first; its other children tie far below (the lowest ids),
misses unless one happens to be the reference token. A tree's τ under control is thus the chain's at γ = D
(plus such chance hits), and its timing shows what the wider verification and the level forwards cost. Chain
forwards are overridden exactly as before (one logits position: the last).

Rank-aware control (``profile``, ``--acceptance-profile``): ``profile[d][r]`` is the probability that the
target's token is the draft's r-th choice at depth d of a round (d = 1: the first draft after the round's
root). The draft's proposal for generated token k of row r then ranks R candidates by the profile's
probabilities (its logits are their logs: a calibrated draft, so EAGLE-2's ranking is the acceptance's), and
the reference token is the candidate of rank ``rank(u(seed, r, k), d)`` — the inverse of depth d's cumulative
profile at the same uniform draw as above — or none (a miss). Every method sees the same draws; a chain's hit
is rank 0 (``u < profile[d][0]``), and a tree's other children are hits as often as the profile says, so trees
gain τ under control as they do with trained drafts. A round's depth needs its root: the first draft forward
after each target forward reads the round's pending tokens, whose last slot is the root (a forward hook on the
target, :func:`watch_target`, marks each target forward).

Two wrappers: :func:`controlled_acceptance` for causal LM drafts (the small LM draft; stock's
``assistant_model.generate()`` runs it too) and the same for a :class:`FeatureHeadDraft`, whose logits
come through the target's LM head (``lm_logits``) rather than its ``forward``. A DFlash drafter and a Gemma 4
assistant are overridden where their drafters hand the logits over (``override_block_logits``,
``override_step_logits``) with the positions they predict from: an assistant runs every step of a round at the
root's position, so its drafter passes each row's root position (its count of kept target slots) plus the step's
depth, never a count of calls.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from .. import _compat
from ..drafts.gemma4_assistant.modeling import is_gemma4_assistant
from ..drafts.registry import kind_of

_MASK = (1 << 64) - 1


def uniform_draw(seed: int, row: int, position: int) -> float:
    """A fixed uniform number in [0, 1) for (seed, row, generated position): splitmix64 of the three."""
    x = (seed * 0x9E3779B97F4A7C15 + (row + 1) * 0xBF58476D1CE4E5B9 + (position + 1) * 0x94D049BB133111EB) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    x ^= x >> 31
    return (x >> 11) / float(1 << 53)


def hit_table(alpha: float, seed: int, rows: list[int], length: int) -> torch.Tensor:
    """[len(rows), length] bool: whether the draft's guess of generated token k of each row is right."""
    return torch.tensor([[uniform_draw(seed, r, k) < alpha for k in range(length)] for r in rows], dtype=torch.bool)


def _text_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, k] text positions of the slots: position ids [B, k], or M-RoPE's [3 or 4, B, k] (text row first)."""
    return position_ids[0] if position_ids.dim() == 3 else position_ids


class _Controlled:
    """State and the proposal override shared by both wrappers."""

    alpha: float
    seed: int
    wrong_modulus: int
    proposable: torch.Tensor  # [V] bool: target ids every compared draft can propose
    reference: torch.Tensor  # [B, R] the target's greedy continuation per row
    prompt_positions: torch.Tensor  # [B] draft position of the first generated token, per row
    hits: torch.Tensor  # [B, R] bool, from hit_table
    profile: torch.Tensor | None = None  # [D, K] rank probabilities per depth (rank-aware control), else None
    draws: torch.Tensor | None = None  # [B, R] the uniform draws (rank-aware control)
    hits_allowed: torch.Tensor | None = None  # [B, R] bool: positions a draft may hit at all (rank-aware control)
    root: torch.Tensor | None = None  # [B] position of the running round's root
    fresh: bool = True  # a target forward ran since the last draft forward: the next one reads a new root

    def _controlled_tokens(self, positions: torch.Tensor) -> torch.Tensor:
        """The proposal [B] (or [B, L]) for slots of row b at ``positions[b]`` ([B] or [B, L]). Device-side
        gathers only: no host sync added to the draft step (reference and hits live on the draft's device)."""
        one = positions.dim() == 1
        positions = positions[:, None] if one else positions
        index = positions.to(self.reference.device) + 1 - self.prompt_positions[:, None]  # generated token predicted
        length = self.reference.shape[1]
        inside = (index >= 0) & (index < length)
        at = index.clamp(0, length - 1)
        ref = self.reference.gather(1, at)
        hit = self.hits.gather(1, at) & inside
        tokens = torch.where(hit, ref, (ref + 1) % self.wrong_modulus)
        return tokens[:, 0] if one else tokens

    def select_rows(self, keep: torch.Tensor) -> None:
        """Rows that finished left the batch (the drafter tells its draft): keep the others' references."""
        keep = keep.to(self.reference.device)
        self.reference, self.prompt_positions, self.hits = self.reference[keep], self.prompt_positions[keep], self.hits[keep]
        if self.draws is not None:
            self.draws, self.hits_allowed = self.draws[keep], self.hits_allowed[keep]
        if self.root is not None:
            self.root = self.root[keep]

    def _ranked_logits(self, logits: torch.Tensor, positions: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Rank-aware control: logits [B, w, V] with the slots at ``last`` replaced by the profile's ranked
        candidates (the reference at its drawn rank, or nowhere on a miss)."""
        assert self.profile is not None and self.draws is not None
        device = logits.device
        root_now = positions[:, -1]
        if self.fresh and bool((root_now + 1 - self.prompt_positions.to(device) > 0).all()):
            # the round's first draft forward (not the draft's prompt: that one predicts generated token 0)
            self.root, self.fresh = root_now.clone(), False
        root = root_now if self.root is None else self.root.to(device)
        index = positions + 1 - self.prompt_positions.to(device)[:, None]
        length = self.reference.shape[1]
        at = index.clamp(0, length - 1)
        ref = self.reference.to(device).gather(1, at)
        usable = self.hits_allowed.to(device).gather(1, at) & (index >= 0) & (index < length)
        u = torch.where(usable, self.draws.to(device).gather(1, at), torch.full_like(self.draws.to(device).gather(1, at), 2.0))
        depth = (positions - root[:, None]).clamp_min(0).clamp_max(self.profile.shape[0] - 1)
        profile = self.profile.to(device)
        ranks = profile.shape[1]
        rank = (u[..., None] >= profile.cumsum(-1)[depth]).sum(-1)  # [B, w]: ranks = a miss
        slot = torch.arange(ranks, device=device)
        candidates = (ref[..., None] + 1 + slot) % self.wrong_modulus  # wrong tokens, distinct from ref
        candidates = torch.where(slot == rank[..., None], ref[..., None], candidates)
        values = profile.clamp_min(1e-6).log()
        values = values - torch.arange(ranks, device=device) * 1e-3  # strictly by rank, whatever the profile
        ranked = torch.full_like(logits, -1e4).scatter_(2, candidates, values[depth].to(logits.dtype))
        return torch.where(last[..., None], ranked, logits)

    def _override_last(self, logits: torch.Tensor, positions: torch.Tensor) -> None:
        """Replace (in place) the logits [B, L, V] of the slots at the last position (``positions`` [B, k] the
        forward's text positions: a chain's last slot, or every node of a tree level) by one-hots of the
        controlled proposal."""
        width = min(logits.shape[1], positions.shape[1])
        positions = positions[:, -width:].to(logits.device)
        last = positions == positions[:, -1:]  # [B, width]
        if self.profile is not None:
            logits[:, -width:] = self._ranked_logits(logits[:, -width:], positions, last)
            return
        token = self._controlled_tokens(positions).to(logits.device)
        one_hot = torch.full_like(logits[:, -width:], -1e4).scatter_(2, token[..., None], 1e4)
        logits[:, -width:] = torch.where(last[..., None], one_hot, logits[:, -width:])


class _ControlledAcceptanceMixin(_Controlled):
    """Mixed into a causal LM draft's own class so stock ``assistant_model.generate()`` works on it too."""

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                logits_to_keep: int | torch.Tensor = 0, **kwargs: Any) -> Any:
        cache = _compat.passed_cache(kwargs)  # under this transformers' name for it, left in kwargs
        past = cache.get_seq_length() if cache is not None else 0
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask,  # type: ignore[misc]
                              position_ids=position_ids,
                              logits_to_keep=logits_to_keep, **kwargs)
        batch, width = input_ids.shape
        positions = _text_positions(position_ids) if position_ids is not None else \
            (past + torch.arange(width)).expand(batch, width)
        self._override_last(out.logits, positions)
        return out


class _ControlledHeadMixin(_Controlled):
    """Mixed into a ``FeatureHeadDraft``: its drafter runs ``forward`` (features -> predicted features) and then
    ``lm_logits`` on the last predicted feature; the positions of the forward pick the controlled token."""

    def forward(self, *args: Any, position_ids: torch.Tensor | None = None, **kwargs: Any) -> Any:
        out = super().forward(*args, position_ids=position_ids, **kwargs)  # type: ignore[misc]
        # an MTP layer's slots sit at their features' positions, ``slot_lag`` before their tokens' (drafts/mtp/)
        self._positions = _text_positions(position_ids) + getattr(self, "slot_lag", 0)
        return out

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().lm_logits(hidden)  # type: ignore[misc]  # the real LM head product (its real cost)
        self._override_last(logits, self._positions)
        return logits


class _ControlledBlockMixin(_Controlled):
    """Mixed into a DFlash block drafter: its drafter scores the block with the target's LM head and hands the
    logits [B, block - 1, V] here with the positions of the slots before them; every position is overridden."""

    def override_block_logits(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        token = self._controlled_tokens(positions).to(logits.device)
        return torch.full_like(logits, -1e4).scatter_(2, token[..., None], 1e4)


class _ControlledStepMixin(_Controlled):
    """Mixed into a Gemma 4 assistant: it drafts every step of a round at the round's root position, so its forward
    tells no step apart; its drafter hands each step's logits [B, Q, V] here with the positions of the tokens the
    step read (each row's root position, from the target's cache it kept, plus the step's depth in the round)."""

    def override_step_logits(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self._override_last(logits, positions)
        return logits


def controlled_acceptance(draft: Any, alpha: float, seed: int = 0, wrong_modulus: int | None = None,
                          proposable: torch.Tensor | None = None,
                          profile: list[list[float]] | None = None) -> Any:
    """A view of ``draft`` (same weights, same cost) whose proposals are right with probability ``alpha``,
    decided per (row, generated position) by :func:`uniform_draw`. Works for causal LM drafts and for a
    ``FeatureHeadDraft``. Call :func:`set_reference` before each generate call.
    ``wrong_modulus``: a miss proposes an id below it; ``proposable`` [V] bool: the target ids every compared
    draft can propose (default: the ids below ``wrong_modulus``); a reference id outside it is a miss.
    ``profile``: rank-aware control (``profile[d][r]``, see the module; ``alpha`` is then unused, and the target
    must be watched: :func:`watch_target`).

        >>> from hf_specmm import testing
        >>> target = testing.tiny_target("llava")
        >>> view = controlled_acceptance(testing.random_text_draft(target), 0.8)
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {alpha}")
    cls = type(draft)
    # a draft whose logits come from ``lm_logits`` after its forward (a feature head) is overridden there, a block
    # drafter's (scored by its drafter with the target's LM head) where its drafter hands them over, as a Gemma 4
    # drafter, an assistant's (one position for every step) where its drafter hands them over with their positions
    mixin = _ControlledBlockMixin if kind_of(draft).block_drafter else \
        _ControlledStepMixin if is_gemma4_assistant(draft) else \
        _ControlledHeadMixin if callable(getattr(draft, "lm_logits", None)) else _ControlledAcceptanceMixin
    wrapped_cls = type(f"ControlledAcceptance{cls.__name__}", (mixin, cls), {})
    wrapped = copy.copy(draft)  # shares parameters and submodules; own plain attributes
    wrapped.__class__ = wrapped_cls
    wrapped.alpha = alpha
    wrapped.seed = seed
    wrapped.wrong_modulus = wrong_modulus or draft.config.get_text_config().vocab_size
    if proposable is None:
        proposable = torch.ones(wrapped.wrong_modulus, dtype=torch.bool)
    wrapped.proposable = proposable.cpu()
    if profile is not None:
        width = max(len(row) for row in profile)
        wrapped.profile = torch.tensor([list(row) + [0.0] * (width - len(row)) for row in profile], dtype=torch.float32)
    return wrapped


def watch_target(draft: Any, target: Any) -> Any:
    """Mark every forward of ``target`` on the controlled ``draft`` (rank-aware control reads each round's root
    from the draft forward that follows). Returns the hook's handle (``.remove()`` it when done)."""
    def mark(module: Any, args: tuple) -> None:
        draft.fresh = True

    return target.register_forward_pre_hook(mark)


def set_reference(draft: Any, reference: torch.Tensor, prompt_positions: torch.Tensor, seed: int | None = None,
                  rows: list[int] | None = None) -> None:
    """``reference`` [B, R] target greedy continuation; ``prompt_positions`` [B] where generation starts in the
    draft's positions. ``rows``: each row's key in the draws (default 0..B-1; pass ``[i]`` to run row i of a
    batch alone with the same pattern)."""
    if seed is not None:
        draft.seed = seed
    rows = list(range(reference.shape[0])) if rows is None else list(rows)
    if len(rows) != reference.shape[0]:
        raise ValueError(f"rows has {len(rows)} keys for a reference of {reference.shape[0]} rows")
    device = getattr(draft, "device", torch.device("cpu"))
    draft.reference = reference.to(device)
    draft.prompt_positions = prompt_positions.to(device)
    hits = hit_table(draft.alpha, draft.seed, rows, reference.shape[1])
    # generated token 0: hf_specmm takes it from the target's prefill, stock drafts it in its first round (its
    # first target forward is the prompt plus γ drafts). A miss there makes stock's first forward yield exactly
    # that one token, so its later rounds line up with ours: same rounds, same τ (stock pays γ wasted draft
    # steps once, ~γ·Td per call)
    hits[:, 0] = False
    # a reference id no draft can propose (a random target's greedy pick among its reserved or extra rows,
    # e.g. 32000-32063 of LLaVA-1.5's 32064 beside a 32000-id draft) is a miss for every method alike
    ref = reference.cpu()
    inside = ref < draft.proposable.numel()
    allowed = inside & draft.proposable[ref.clamp(0, draft.proposable.numel() - 1)]
    hits &= allowed
    draft.hits = hits.to(device)
    if draft.profile is not None:  # the same draws, read as ranks
        draft.draws = torch.tensor([[uniform_draw(draft.seed, r, k) for k in range(reference.shape[1])] for r in rows])
        draft.draws = draft.draws.to(device)
        allowed[:, 0] = False  # generated token 0 is the target's prefill's
        draft.hits_allowed = allowed.to(device)
        draft.root, draft.fresh = None, True
