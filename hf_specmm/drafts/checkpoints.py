"""What every draft class with its own weights does on save and load: the hf_specmm model card beside
the safetensors weights, upload with that card, and strict loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import check_strict_load


class DraftCheckpointMixin:
    """Mixed in before ``PreTrainedModel`` by draft classes (``ImageAdapterDraft``, ``FeatureHeadDraft``)."""

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> None:
        """Safetensors weights + config + the hf_specmm model card (README.md)."""
        from ..hub import render_model_card

        super().save_pretrained(save_directory, *args, **kwargs)  # type: ignore[misc]
        if kwargs.get("is_main_process", True):
            (Path(save_directory) / "README.md").write_text(render_model_card(self))

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Upload weights, config and the hf_specmm model card (stock push_to_hub writes a generic card)."""
        from ..hub import push_draft_to_hub

        return push_draft_to_hub(self, repo_id, **kwargs)

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        """Strict load: a missing, unexpected or mis-shaped weight is an error, not a warning."""
        user_wants_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)  # type: ignore[misc]
        check_strict_load(info, f"{cls.__name__} checkpoint")
        return (model, info) if user_wants_info else model
