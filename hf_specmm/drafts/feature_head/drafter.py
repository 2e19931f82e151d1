"""Runs a :class:`FeatureHeadDraft` in the speculative loop (EAGLE-1 drafting with batches and rollback).

The head's KV cache only ever holds slots computed from the target's **true** features:

- prefill: one slot per prompt position t, at the target's position t, reading the target's input
  embedding of x_t (an image feature at image positions) and the target's last hidden state f_{t-1} at the
  position before (zero for a row's first token): at image positions that state is how the target's LM
  represents the vision tokens. The zero slot makes a head that copies the target's layers (``fc`` reading
  the embedding only) an exact copy of the target: such a head is accepted 100 % (tests);
- each round: the pending slots (true features of what the last verification accepted) are read, then
  d_1..d_γ are drafted from the head's own predicted features (temporary slots);
- after verification the temporary slots are cropped (``SlottedCache.rollback``), and the verification
  forward's features of the accepted tokens become the next pending slots: a row that accepted n drafts
  queues n + 1 slots (f(cur), d_1), ..., (f(d_n), next). Rows of a batch queue different counts; the
  shorter ones are left-padded with masked holes, as every draft cache here handles them.

The target's features are captured by a forward hook on its text decoder (whose output is the LM
head's input), around the prefill and every verification forward: no ``output_hidden_states`` of all
layers, nothing recomputed. A decoder that skips positions whose logits are not kept (Gemma 4 runs its
KV-shared layers on the prefill's last position only) is asked for every position while watched
(:func:`keep_every_position`): the head reads the features of the whole prompt.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ...caches import CacheFactory, mask_to
from ...drafter import Drafter, Prompt, Proposal, every_prompt_position
from ...errors import IncompatibleDraftError
from ...hooks import this_call
from ...targets import target_family
from ...targets.positions import ROPE_1D, PositionRule
from .modeling import FeatureHeadDraft
from ...vocab import VocabMap


class FeatureHeadDrafter(Drafter):
    """The head on :class:`~hf_specmm.drafter.Drafter`: its ``pending`` slots are ``(features [A, k, H],
    ids [A, k], valid [A, k])``, and the drafts it read are dropped after verification (``keeps_read_drafts``:
    they were computed from its own predicted features; the true ones are queued instead)."""

    observes_prefill = True
    observes_verification = True
    keeps_read_drafts = False

    def __init__(self, draft: Any, vocab: VocabMap, positions: PositionRule = ROPE_1D):
        super().__init__(draft, vocab, draft, positions)
        self.device = draft.fc.weight.device
        self.target: Any = None  # set by watch(): the head's positions are its target's (bound per prompt)
        self.captured: tuple[torch.Tensor | None, torch.Tensor] | None = None  # (inputs_embeds, features)
        self.verified: torch.Tensor | None = None  # [B, γ + 1, H] features of the last verification block
        self.level_features: torch.Tensor | None = None  # [B, k, H] predicted by the round's last forward

    @classmethod
    def check(cls, target: Any, draft: Any) -> None:
        if not isinstance(draft, FeatureHeadDraft):
            raise IncompatibleDraftError(f"a feature_head draft must be a FeatureHeadDraft, got {type(draft).__name__}")
        draft.check_target(target)

    @classmethod
    def prompt_lengths(cls, draft: Any, vocab: VocabMap, input_ids: torch.Tensor,
                       attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Every prompt position (image positions included) takes a slot of the head's cache."""
        return every_prompt_position(input_ids, attention_mask)

    @contextlib.contextmanager
    def watch(self, target: Any) -> Iterator[None]:
        """Attach the head to ``target`` (checked before the call) and capture its decoder's input embeddings
        and output (the LM head's input) during the forward."""
        self.draft.attach(target, check=False)
        self.target = target  # its family's position rule numbers the head's slots (one per target position)

        def capture(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
            embeds = kwargs.get("inputs_embeds")
            self.captured = (None if embeds is None else embeds.detach(), output[0].detach())

        decoder = target.get_decoder()
        handles = [decoder.register_forward_pre_hook(this_call(keep_every_position), with_kwargs=True),
                   decoder.register_forward_hook(this_call(capture), with_kwargs=True)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _take(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        if self.captured is None:
            raise RuntimeError("the target's last hidden states were not captured during its forward")
        captured, self.captured = self.captured, None
        return captured

    def observe_prefill(self, target_outputs: Any) -> None:
        self.prompt_capture = self._take()

    def observe_verification(self, target_outputs: Any) -> None:
        self.verified = self._take()[1]

    # ---- the head's cache ------------------------------------------------------------------------
    def forward(self, features: torch.Tensor, embeds: torch.Tensor, valid: torch.Tensor | None,
                logits: bool = True, position_ids: torch.Tensor | None = None, tree_mask: Any = None,
                keep: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed k slots into the head's cache; returns the last predicted feature [B, 1, H] and its
        target-vocabulary logits [B, V] (on the loop's device). ``position_ids``: given for the prompt
        (M-RoPE grid positions), else the position rule's block positions. A tree level: ``tree_mask`` its 4-D
        mask in place of the cache's 2-D one, the last ``keep`` features [B, keep, H] and logits [B, keep, V]."""
        assert self.state is not None
        inputs = self.state.append(valid, features.shape[1], position_ids)
        mask = inputs["attention_mask"] if tree_mask is None else tree_mask
        call = self.model if position_ids is not None else self.state.step_call(self.model)  # the prompt: eager
        # contiguous inputs: a slice of a wider block has other strides, which a compiled call would guard on
        out = call(features=features.to(self.device).contiguous(), inputs_embeds=embeds.to(self.device).contiguous(),
                         attention_mask=mask_to(mask, self.device),
                         position_ids=inputs["position_ids"].to(self.device), cache=self.state.cache,
                         use_cache=True, **self.model_kwargs())
        self.model_output = out  # what a subclass reads beyond the predicted features (an MTP draft's layers)
        last = out.hidden_states[:, -keep:]
        if not logits:
            return last, None
        scores = self.vocab.to_target(self.model.lm_logits(last).to(device=self.state.device, dtype=torch.float32))
        return last, scores[:, -1] if tree_mask is None else scores

    def model_kwargs(self) -> dict[str, Any]:
        """Further keyword arguments of the head's forward (none here; an MTP draft's step)."""
        return {}

    @property
    def reads_target_embeddings(self) -> bool:
        """Whether the prompt's slots read the target's input embeddings (image features included), captured
        from its forward; else the head embeds the prompt's ids itself (:meth:`FeatureHeadDraft.embed`)."""
        return True

    def prefill(self, prompt: Prompt, first_tokens: torch.Tensor, new_cache: CacheFactory) -> None:
        embeds, features = self.prompt_capture
        self.prompt_capture = None
        ids, mask = prompt.input_ids, prompt.attention_mask
        batch, width = ids.shape
        if embeds is None or not self.reads_target_embeddings:
            embeds = self.model.embed(ids)
        # the slots are the target's prompt positions: the target family's rule, bound to this prompt
        self.positions = target_family(self.target).positions.bind(self.target, ids, mask, prompt.model_inputs)
        self.state = new_cache(self.model, batch, ids.device, self.positions)
        features = features[:, :width]
        valid = None if mask is None or bool(mask.all()) else mask.bool()
        prompt_positions = self.positions.prompt_positions(torch.ones_like(ids) if mask is None else mask.long())
        slots, prompt_positions = self.prompt_slots(valid, ids, prompt_positions)
        self.forward(previous_features(features, valid), embeds[:, :width], slots, logits=False,
                     position_ids=prompt_positions)
        self.pending = (features[:, -1:], first_tokens[:, None], torch.ones_like(first_tokens[:, None], dtype=torch.bool))

    def prompt_slots(self, valid: torch.Tensor | None, ids: torch.Tensor,
                     positions: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Which prompt slots the head reads ([B, L] bool, None: all) and their positions: every real token's, at
        the target's positions (``positions`` [..., B, L])."""
        return valid, positions

    def read_pending(self, cur: torch.Tensor) -> torch.Tensor:
        assert self.pending is not None
        features, ids, valid = self.pending
        self.level_features, logits = self.forward(features, self.model.embed(ids), None if bool(valid.all()) else valid)
        return logits

    def read_draft(self, token: torch.Tensor) -> torch.Tensor:
        """d_{j+1} read with the head's own predicted feature (dropped after verification)."""
        self.level_features, logits = self.forward(self.level_features, self.model.embed(token[:, None]), None)
        return logits

    def read_level(self, tokens: torch.Tensor, parents: torch.Tensor, attention_mask: Any,
                    position_ids: torch.Tensor) -> torch.Tensor:
        """Each node reads its parent's predicted feature (the root's: the pending read's last)."""
        previous = self.level_features
        index = parents.clamp_min(0).to(previous.device)[..., None].expand(-1, -1, previous.shape[-1])
        features = previous.gather(1, index)
        self.level_features, logits = self.forward(features, self.model.embed(tokens), None, position_ids=position_ids,
                                                   tree_mask=attention_mask, keep=tokens.shape[1])
        return logits

    def prepare_round(self, gamma: int) -> None:
        if self.state is not None and self.state.compile_config is not None:  # compiled rounds read one pending
            self.pending = pad_pending(self.pending, gamma + 1)                # width, γ + 1: one graph

    def follow(self, next_tokens: torch.Tensor) -> None:
        """A plain step verified [cur] alone: its true feature f(cur) and the target's token make the slot
        (f(cur), next), queued after the pending ones (whose last token is cur)."""
        assert self.pending is not None and self.verified is not None
        features, ids, valid = self.pending
        feature = self.verified[:, :1].to(features.device)
        self.pending = (torch.cat([features, feature], 1), torch.cat([ids, next_tokens[:, None].to(ids)], 1),
                        torch.cat([valid, torch.ones_like(valid[:, :1])], 1))
        self.verified = None

    def queue(self, proposal: Proposal, keep: torch.Tensor, next_tokens: torch.Tensor, path: torch.Tensor | None,
              unread: torch.Tensor) -> None:
        """The kept tokens with the verification's true features: row i queues (f(cur), d_1), ...,
        (f(d_{keep_i}), next_i), right-aligned (a tree: the kept path's tokens, with the features at its nodes)."""
        assert self.verified is not None
        verified, drafts = self.verified.to(keep.device), proposal.drafts_on_path(path)
        if path is not None:
            verified = verified.gather(1, path[..., None].expand(-1, -1, verified.shape[-1]))
        width = int(keep.max()) + 1
        k = torch.arange(width, device=keep.device)[None] - (width - 1 - keep[:, None])  # source index per slot
        valid = k >= 0
        k = k.clamp_min(0)
        tokens = torch.cat([drafts, next_tokens[:, None]], 1)
        tokens = tokens.scatter(1, keep[:, None], next_tokens[:, None])  # next_i right after the keep_i drafts
        ids = tokens.gather(1, k).masked_fill(~valid, 0)
        features = verified.gather(1, k[..., None].expand(-1, -1, verified.shape[-1]))
        self.pending, self.verified, self.level_features = (features, ids, valid), None, None


def keep_every_position(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Forward pre-hook on the target's text decoder: ``logits_to_keep=0`` (every position) for a decoder that
    reads it. Gemma 4's decoder runs its KV-shared layers on the last ``logits_to_keep`` positions only (they
    write no cache, so generate needs no more), which leaves no final or late-layer features for the rest of
    the prompt; the model still slices its logits with its own ``logits_to_keep``, so the target's outputs
    keep plain generate's shapes. Other decoders take no ``logits_to_keep``: left as they are."""
    keep = kwargs.get("logits_to_keep", 0)
    if not isinstance(keep, int) or keep == 0:  # a tensor of indices already keeps every position upstream
        return None
    return args, {**kwargs, "logits_to_keep": 0}


def previous_features(features: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """[B, L, H] -> the feature each slot reads: f_{t-1} at slot t, zero at a row's first valid slot
    (``valid`` [B, L] bool for left-padded rows, None = all valid)."""
    shifted = torch.nn.functional.pad(features, (0, 0, 1, 0))[:, :-1]
    if valid is None:
        return shifted
    before = torch.nn.functional.pad(valid, (1, 0))[:, :-1]  # the slot before is a real token
    return shifted * before[..., None].to(shifted.dtype)


def pad_pending(pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features [B, k, F], ids [B, k], valid [B, k]) left-padded with holes (invalid slots) to ``width``."""
    features, ids, valid = pending
    extra = width - ids.shape[1]
    if extra <= 0:
        return pending
    return (torch.nn.functional.pad(features, (0, 0, extra, 0)), torch.nn.functional.pad(ids, (extra, 0)),
            torch.nn.functional.pad(valid, (extra, 0), value=False))
