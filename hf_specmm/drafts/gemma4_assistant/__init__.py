"""The ``gemma4_assistant`` draft kind: the assistants Gemma 4 checkpoints ship with (``Gemma4AssistantForCausalLM``,
``Gemma4UnifiedAssistantForCausalLM``; transformers >= 5.24), drafting at one fixed position from the target's
shared K/V and last hidden state (see :mod:`.drafter`). Runs only: nothing here trains or builds one."""

from __future__ import annotations

from typing import Any

from ..registry import DraftKind, register_draft_kind
from .drafter import Gemma4AssistantDrafter
from .modeling import ASSISTANT_CLASSES, is_gemma4_assistant, tiny_assistant


def _loader(config: Any) -> "type | None":
    """Stock's classes load through their own ``AutoModelForCausalLM`` mapping."""
    return next((cls for cls in ASSISTANT_CLASSES if isinstance(config, cls.config_class)), None)


def _card_rows(draft: Any) -> str:
    own = draft.config.get_text_config()
    return (f"| Gemma 4 assistant | {own.num_hidden_layers} layers ({', '.join(own.layer_types)}), every one "
            f"reading the target's shared K/V; {sum(p.numel() for p in draft.parameters()):,} parameters |\n"
            "| needs | its target: the target's token embedding, shared K/V and last hidden state |\n")


GEMMA4_ASSISTANT = register_draft_kind(DraftKind(
    name="gemma4_assistant",
    title="Gemma 4 assistant",
    drafter=Gemma4AssistantDrafter,
    claims=is_gemma4_assistant,
    priority=28,
    loads=_loader,
    training_view=None,  # not trained here: use the assistant released with the target
    param_groups=None,
    card_rows=_card_rows,
))

__all__ = ["ASSISTANT_CLASSES", "GEMMA4_ASSISTANT", "Gemma4AssistantDrafter", "is_gemma4_assistant", "tiny_assistant"]
