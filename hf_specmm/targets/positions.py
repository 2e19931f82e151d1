"""Position rules: where a block of new tokens sits in a model's rotary positions.

A rule is the one place that numbers tokens, for the target's verification block, for a draft's
tokens after a rollback and for the teacher-forced training batches, so inference and training
cannot drift apart. Slots marked invalid (left padding, holes left by a rollback) take the position of
the next valid token; they are masked out of attention, so their own position is never read.

Some rules need per-call state (Qwen-VL's 3-D M-RoPE: where text resumes after each image depends on
the images' grids). :meth:`PositionRule.bind` turns a rule into the rule of one call's prompt: stateless
rules return themselves, :class:`MRope` returns a :class:`BoundMRope` holding that prompt's positions.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


class PositionRule:
    """1-D rotary positions (LLaVA's Llama/Qwen2/Mistral LMs): a token's position is the number of valid
    slots before it, which is how plain ``generate`` numbers left-padded prompts (``cumsum(mask) - 1``)."""

    name = "1d"
    #: [B] added to every new slot's position: where plain generate continues a prompt whose last column is
    #: not its last valid token (right padding: stock resumes at the last column's position + 1)
    offset: torch.Tensor | None = None

    def bind(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
             inputs: dict[str, Any] | None = None) -> "PositionRule":
        """The rule for one call whose prompt is ``input_ids`` (with ``inputs``: the call's prepared kwargs).
        1-D positions need per-call state only where the prompt does not end on a valid token: then new
        tokens continue from the ``position_ids`` stock ``generate`` gave the prompt's last column."""
        given = (inputs or {}).get("position_ids")
        if attention_mask is None or not isinstance(given, torch.Tensor) or given.shape != input_ids.shape:
            return self
        bound = PositionRule()  # zeros for a left-padded prompt; set, so the loop knows stock's positions are known
        bound.offset = given[:, -1].to(attention_mask.device) + 1 - attention_mask.long().sum(-1)
        return bound

    def block_positions(self, start: torch.Tensor, valid: torch.Tensor | None, width: int) -> torch.Tensor:
        """Positions [B, width] of ``width`` new slots after ``start`` [B] valid ones (``valid`` [B, width] or None = all)."""
        if self.offset is not None:
            start = start + self.offset.to(start.device)
        if valid is None:
            return start[:, None] + torch.arange(width, device=start.device)
        valid = valid.long()
        return start[:, None] + valid.cumsum(-1) - valid

    def prompt_positions(self, mask: torch.Tensor) -> torch.Tensor:
        """Positions [B, L] of a left-padded prompt (or ``[prompt | answer]`` training row) with ``mask`` [B, L]."""
        return self.block_positions(mask.new_zeros(mask.shape[0]), mask, mask.shape[1])

    def select(self, keep: torch.Tensor) -> "PositionRule":
        """The rule for the rows ``keep`` [k] of the batch it was bound to (finished rows dropped)."""
        if self.offset is None:
            return self
        bound = PositionRule()
        bound.offset = self.offset[keep.to(self.offset.device)]
        return bound


ROPE_1D = PositionRule()


class MRope(PositionRule):
    """Qwen-VL's multimodal RoPE: position ids [4, B, k], a text row (1-D, what the attention mask is built
    from) and the temporal / height / width rows. Image and video tokens get grid positions; text after
    them resumes at the image's largest position + 1, so each row's rows 1-3 run ahead of (or behind) its
    text row by a per-row, per-dimension delta fixed by its prompt. Generated tokens keep that delta
    (plain ``generate`` adds 1 per token to every row of the last prompt position), and holes (rejected
    slots of shorter rows) do not count, exactly as for :class:`PositionRule`.
    """

    name = "mrope"

    def bind(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
             inputs: dict[str, Any] | None = None) -> "BoundMRope":
        """Positions of this prompt: the ones stock ``generate`` prepared (``inputs['position_ids']``,
        [4, B, L]) when present, else the model's own ``get_rope_index`` on the call's grids."""
        inputs = inputs or {}
        given = inputs.get("position_ids")
        if isinstance(given, torch.Tensor) and given.dim() == 3 and given.shape[0] == 4 \
                and given.shape[-1] == input_ids.shape[1]:
            return BoundMRope(given.to(input_ids.device), attention_mask)
        mask = attention_mask
        text = ROPE_1D.prompt_positions(mask.long()) if mask is not None else \
            ROPE_1D.block_positions(input_ids.new_zeros(input_ids.shape[0]), None, input_ids.shape[1])
        grids = {k: inputs.get(k) for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts",
                                            "mm_token_type_ids")}
        if grids["image_grid_thw"] is None and grids["video_grid_thw"] is None:
            rope = text[None].expand(3, -1, -1)
        else:
            get_rope_index = getattr(getattr(model, "model", model), "get_rope_index")
            accepted = inspect.signature(get_rope_index).parameters
            kwargs = {k: v for k, v in grids.items() if v is not None and k in accepted}
            rope, _ = get_rope_index(input_ids, attention_mask=mask, **kwargs)
            rope = rope.to(text.device)
        return BoundMRope(torch.cat([text[None], rope], dim=0), attention_mask)


class BoundMRope(PositionRule):
    """:class:`MRope` bound to one prompt: ``prompt`` [4, B, L] its position ids."""

    name = "mrope"

    def __init__(self, prompt: torch.Tensor, attention_mask: torch.Tensor | None = None):
        self.prompt = prompt
        # per row and rope dimension: how far rows 1-3 run ahead of the text row after the prompt
        self.deltas = prompt[1:, :, -1] - prompt[0:1, :, -1]  # [3, B]
        if attention_mask is not None:  # a prompt not ending on a valid token (right padding), as PositionRule.bind
            self.offset = prompt[0, :, -1].to(attention_mask.device) + 1 - attention_mask.long().sum(-1)

    def bind(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
             inputs: dict[str, Any] | None = None) -> "BoundMRope":
        return MROPE.bind(model, input_ids, attention_mask, inputs)

    def select(self, keep: torch.Tensor) -> "BoundMRope":
        bound = BoundMRope.__new__(BoundMRope)
        bound.prompt = self.prompt[:, keep.to(self.prompt.device)]
        bound.deltas = self.deltas[:, keep.to(self.deltas.device)]
        if self.offset is not None:
            bound.offset = self.offset[keep.to(self.offset.device)]
        return bound

    def block_positions(self, start: torch.Tensor, valid: torch.Tensor | None, width: int) -> torch.Tensor:
        text = super().block_positions(start, valid, width)  # [B, width]
        return torch.cat([text[None], text[None] + self.deltas[:, :, None].to(text.device)], dim=0)

    def prompt_positions(self, mask: torch.Tensor) -> torch.Tensor:
        """The bound prompt's positions, then (a ``[prompt | answer]`` training row) the answer's."""
        length = self.prompt.shape[-1]
        tail = mask[:, length:]
        if tail.shape[1] == 0:
            return self.prompt.to(mask.device)
        start = mask[:, :length].long().sum(-1)
        rest = self.block_positions(start, tail, tail.shape[1])
        return torch.cat([self.prompt.to(mask.device), rest], dim=-1)


MROPE = MRope()


class ColumnPositions(PositionRule):
    """1-D RoPE numbered by cache column (Ovis2.5): the model's ``prepare_inputs_for_generation`` sets
    ``position_ids = None``, so plain ``generate``'s forwards number every column, left padding included
    (a row with ``p`` pads starts its prompt at position ``p``). New tokens follow their row's last column:
    the valid slots before them plus the row's pads (holes left by a rollback do not count, as plain
    ``generate`` has none)."""

    name = "columns"

    def bind(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
             inputs: dict[str, Any] | None = None) -> "ColumnPositions":
        bound = ColumnPositions()
        bound.offset = input_ids.new_zeros(input_ids.shape[0]) if attention_mask is None else \
            input_ids.shape[1] - attention_mask.long().sum(-1)
        return bound

    def prompt_positions(self, mask: torch.Tensor) -> torch.Tensor:
        """Every column's index (the prompt's, then a training row's answer: columns too)."""
        return torch.arange(mask.shape[1], device=mask.device).expand(mask.shape[0], -1)

    def select(self, keep: torch.Tensor) -> "ColumnPositions":
        bound = ColumnPositions()
        bound.offset = None if self.offset is None else self.offset[keep.to(self.offset.device)]
        return bound


COLUMNS = ColumnPositions()
