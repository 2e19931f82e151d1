"""Runs an :class:`~.eagle3.Eagle3FeatureHead` in the speculative loop.

Everything but the features is the EAGLE-1 drafter's (:class:`~.drafter.FeatureHeadDrafter`: the head's
slotted cache, pending true-feature slots, rollback). The feature of a true slot is the concatenation of
the inputs of the target's decoder layers ``aux_layers`` (3H wide; the head's ``fc`` fuses it; index L =
the last layer's output), captured by forward (pre-)hooks on those layers during the target's own prefill and verification forwards: no extra
target forward, no ``output_hidden_states`` of every layer. A drafted slot's feature is the head's own
pre-norm output (H wide), as in vLLM and SGLang.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ...errors import IncompatibleDraftError
from ...hooks import this_call
from .drafter import FeatureHeadDrafter, keep_every_position
from .eagle3 import Eagle3FeatureHead


def decoder_layers(target: Any) -> Any:
    """The target's text decoder layers (``ModuleList``)."""
    layers = getattr(target.get_decoder(), "layers", None)
    if layers is None:
        raise IncompatibleDraftError(f"{type(target).__name__}'s text decoder has no .layers for an EAGLE-3 head")
    return layers


class Eagle3Drafter(FeatureHeadDrafter):
    @classmethod
    def check(cls, target: Any, draft: Any) -> None:
        if not isinstance(draft, Eagle3FeatureHead):
            raise IncompatibleDraftError(f"an eagle3 draft must be an Eagle3FeatureHead, got {type(draft).__name__}")
        draft.check_target(target)

    @contextlib.contextmanager
    def watch(self, target: Any) -> Iterator[None]:
        """Attach the head and capture, during the forward, the decoder's input embeddings and the inputs of
        the ``aux_layers`` decoder layers (concatenated in that order)."""
        self.draft.attach(target, check=False)
        self.target = target
        wanted = list(self.draft.config.aux_layers)
        seen: dict[int, torch.Tensor] = {}
        embeds: list[torch.Tensor | None] = [None]

        def on_decoder(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            given = kwargs.get("inputs_embeds")
            embeds[0] = None if given is None else given.detach()
            seen.clear()
            return keep_every_position(module, args, kwargs)  # late aux layers at every prompt position (Gemma 4)

        def on_layer(index: int) -> Any:
            def hook(module: Any, args: tuple, kwargs: dict) -> None:
                seen[index] = (args[0] if args else kwargs["hidden_states"]).detach()
            return hook

        def on_done(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
            first = seen[wanted[0]]  # a dispatched target's layers may sit on several devices
            self.captured = (embeds[0], torch.cat([seen[k].to(first.device) for k in wanted], -1))

        layers = decoder_layers(target)
        decoder = target.get_decoder()
        handles = [decoder.register_forward_pre_hook(this_call(on_decoder), with_kwargs=True),
                   decoder.register_forward_hook(this_call(on_done), with_kwargs=True)]
        depth = len(layers)

        def on_last(module: Any, args: tuple, kwargs: dict, output: Any) -> None:  # index L: the last layer's output
            seen[depth] = (output[0] if isinstance(output, tuple) else output).detach()

        handles += [layers[k].register_forward_pre_hook(this_call(on_layer(k)), with_kwargs=True)
                    for k in sorted(set(wanted)) if k < depth]
        if depth in wanted:
            handles.append(layers[depth - 1].register_forward_hook(this_call(on_last), with_kwargs=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
