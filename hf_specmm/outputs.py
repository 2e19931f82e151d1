"""``return_dict_in_generate=True``: scores, logits, attentions, hidden states and the cache, laid out as
plain / stock assisted ``generate`` lays them out, although rows advance by different amounts per round.

Step t of every tuple is the forward that produced generated token t + 1: step 0 is the prefill
(attentions [B, H, P, P], hidden states [B, P, D]); step t ≥ 1 holds one query per row (attentions
[B, H, 1, P + t], hidden states [B, 1, D]). The values of accepted tokens come from the verification
forward that scored them. The target's cache keeps rejected slots as masked holes; attentions over it
are gathered back to the row's own P + t key slots, and the returned cache is compacted the same way.
Rows that finished early hold zeros after their end (plain generate would show pad-token forwards).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from . import _compat
from .caches.dynamic import compact_cache

if TYPE_CHECKING:
    from .caches import SlottedCache


class GenerateOutputs:
    """Collects, per row and generated token, what the generation config asks to return."""

    def __init__(self, generation_config: Any, batch: int, prompt_len: int, compacted: bool = False):
        wanted = bool(generation_config.return_dict_in_generate)
        self.return_dict = wanted
        self.scores_on = wanted and bool(generation_config.output_scores or generation_config.output_logits)
        self.attentions_on = wanted and bool(generation_config.output_attentions)
        self.hidden_on = wanted and bool(generation_config.output_hidden_states)
        self.output_scores = bool(generation_config.output_scores)
        self.output_logits = bool(generation_config.output_logits)
        self.prompt_len = prompt_len
        # sliding-window targets: the loop's cache moves holes left, so it has no plain-generate layout
        self.compacted = compacted
        self.tokens: list[list[dict[str, Any]]] = [[] for _ in range(batch)]  # per row, per generated token
        self.prefill_attentions: tuple | None = None
        self.prefill_hidden: tuple | None = None

    def forward_kwargs(self) -> dict[str, bool]:
        """What the target's verification forwards must be asked for."""
        out = {}
        if self.attentions_on:
            out["output_attentions"] = True
        if self.hidden_on:
            out["output_hidden_states"] = True
        return out

    def record(self, out: Any, kept: list[int], scores: torch.Tensor, logits: torch.Tensor,
               cache: "SlottedCache | None", block_start: int) -> None:
        """A forward's kept tokens: row i keeps ``kept[i]`` of the positions scored in ``scores`` [B, m, V].
        ``cache`` / ``block_start``: the target's cache and where this block starts in it (``block_start`` =
        0 for the prefill, whose attentions and hidden states are kept whole)."""
        if not self.return_dict:
            return
        attentions = getattr(out, "attentions", None) if self.attentions_on else None
        if attentions is not None and (len(attentions) == 0 or attentions[0] is None):
            attentions = None  # sdpa/flash kernels return no attention weights (stock skips them too)
        hidden = getattr(out, "hidden_states", None) if self.hidden_on else None
        prefill = block_start == 0
        if prefill:
            self.prefill_attentions, self.prefill_hidden = attentions, hidden
        for i, k in enumerate(kept):
            for j in range(k):
                token: dict[str, Any] = {}
                if self.scores_on:
                    token["score"], token["logit"] = scores[i, j], logits[i, j]
                if not prefill and attentions is not None:
                    # the row's own key slots: the prompt's (padding included, as plain generate) and its
                    # valid generated slots, without the holes rejected drafts left
                    cols = cache.row_slots(i, block_start + j, always=self.prompt_len)
                    token["attentions"] = tuple(a[i, :, j : j + 1, cols] for a in attentions)
                if not prefill and hidden is not None:
                    token["hidden"] = tuple(h[i, j : j + 1] for h in hidden)
                self.tokens[i].append(token)

    def build(self, sequences: torch.Tensor, cache: "SlottedCache") -> Any:
        from transformers.generation import GenerateDecoderOnlyOutput

        steps = sequences.shape[1] - self.prompt_len

        def per_step(key: str, start: int, part: int | None = None) -> list[torch.Tensor]:
            """Step ``start``.. of ``key`` stacked over rows; rows past their end give zeros."""
            out = []
            for t in range(start, steps):
                pieces = [row[t].get(key) if t < len(row) else None for row in self.tokens]
                pieces = [p if p is None or part is None else p[part] for p in pieces]
                ref = next(p for p in pieces if p is not None)  # the longest row has every step
                out.append(torch.stack([torch.zeros_like(ref) if p is None else p for p in pieces]))
            return out

        def by_layer(key: str, first: tuple) -> tuple:
            """(prefill's per-layer tuple, then one per-layer tuple per later step)."""
            layers = [per_step(key, 1, layer) for layer in range(len(first))]
            return (first,) + tuple(tuple(layer[t] for layer in layers) for t in range(steps - 1))

        scores = logits = attentions = hidden = None
        if self.scores_on and steps:
            scores = tuple(per_step("score", 0)) if self.output_scores else None
            logits = tuple(per_step("logit", 0)) if self.output_logits else None
        if self.attentions_on:  # () when the attention kernel returns no weights, as stock
            attentions = () if self.prefill_attentions is None else by_layer("attentions", self.prefill_attentions)
        if self.hidden_on and self.prefill_hidden is not None:
            hidden = by_layer("hidden", self.prefill_hidden)
        past = None if self.compacted else compact_cache(cache.cache, cache.mask, self.prompt_len,
                                                          sequences.shape[1] - 1)
        return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits, attentions=attentions,
                                         hidden_states=hidden, **_compat.cache_kwargs(past))
