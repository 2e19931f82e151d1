"""A draft's model card and metadata: save / push with the card, rendered from the ``hf_specmm`` metadata its
config carries (draft kind, the target it was made for, measured results). What differs between kinds (the LM
the card describes, extra card rows) comes from the draft-kind registry. Loading lives in :mod:`hf_specmm.hub`;
the drafts' own ``save_pretrained`` / ``push_to_hub`` (``checkpoints.DraftCheckpointMixin``) write the card
through this module, which sits below the hub so that no draft module imports it."""

from __future__ import annotations

import re
import string
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from .registry import kind_of


def draft_kind(draft: PreTrainedModel) -> str:
    """The registered kind's name (``text_only``, ``image_adapter``, ``vlm``, ...)."""
    return kind_of(draft).name


def draft_metadata(draft: PreTrainedModel) -> dict[str, Any]:
    """``{"draft_kind", "target", "results", "training_data"}`` as stored in the draft's config."""
    meta = dict(getattr(draft.config, "hf_specmm", None) or {})
    meta["draft_kind"] = draft_kind(draft)
    if getattr(draft.config, "target", None):  # a config that records its target (ImageAdapterDraftConfig)
        meta.setdefault("target", draft.config.target)
    meta.setdefault("target", None)
    meta.setdefault("results", {})
    meta.setdefault("training_data", None)
    return meta


def annotate_draft(draft: PreTrainedModel, target: str | None = None, results: dict[str, dict] | None = None,
                   training_data: str | None = None) -> PreTrainedModel:
    """Record what the draft was made for and how well it did (merged into earlier metadata)."""
    meta = draft_metadata(draft)
    if target is not None:
        meta["target"] = target
        if hasattr(draft.config, "target"):
            draft.config.target = target
    if results:
        meta["results"] = {**meta["results"], **results}
    if training_data is not None:
        meta["training_data"] = training_data
    draft.config.hf_specmm = meta
    return draft


def _is_repo_id(name: str | None) -> bool:
    """``org/name`` on the Hub, not a local path (a card's base_model must be a repo id)."""
    return bool(name) and re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None and not Path(name).exists() \
        and not name.startswith((".", "/"))


def _results_table(results: dict[str, dict]) -> str:
    if not results:
        return "Not measured yet (use `hf-specmm bench` or the training CLI's held-out evaluation)."
    lines = ["| task | γ | τ (tokens per target forward) | acceptance rate |", "|---|---|---|---|"]
    for task, r in results.items():
        tau, acc = r.get("block_efficiency"), r.get("acceptance_rate")
        lines.append(f"| {task} | {r.get('gamma', '')} | {'' if tau is None else f'{tau:.2f}'} | "
                     f"{'' if acc is None else f'{acc:.2f}'} |")
    return "\n".join(lines)


def card_template(name: str) -> str:
    """A template from the top-level ``model_cards/`` folder: installed (wheel) as the package data of
    ``hf_specmm.model_cards``; in a source checkout read from the folder itself."""
    source = Path(__file__).resolve().parents[2] / "model_cards" / name
    if source.is_file():
        return source.read_text()
    return resources.files("hf_specmm.model_cards").joinpath(name).read_text()


def _vocab_rows(lm: Any, lm_config: Any) -> int:
    head = lm.get_output_embeddings()  # None for a decoder without its own LM head (a feature head uses the target's)
    return int(head.weight.shape[0]) if head is not None else int(lm_config.vocab_size)


def render_model_card(draft: PreTrainedModel, repo_id: str | None = None) -> str:
    """The README.md of a draft, rendered from the top-level ``model_cards/draft_card.md`` (installed as
    ``hf_specmm.model_cards``)."""
    from huggingface_hub import ModelCardData

    meta = draft_metadata(draft)
    kind = kind_of(draft)
    target = meta["target"]
    lm = kind.language_model(draft)
    lm_config = lm.config.get_text_config()
    tags = ["hf_specmm", "speculative-decoding", "draft-model", f"{kind.title}-draft"]
    data = ModelCardData(base_model=target if _is_repo_id(target) else None, library_name="hf_specmm",
                         tags=tags, pipeline_tag="text-generation",
                         hf_specmm={"draft_kind": kind.name, "target": target, "results": meta["results"]})
    front = data.to_yaml()
    template = card_template("draft_card.md")
    return string.Template(template).substitute(
        front_matter=front.strip(),
        title=repo_id or f"{kind.title} draft",
        kind_name=kind.title,
        target_link=f"[{target}](https://huggingface.co/{target})" if _is_repo_id(target) else (target or "its target"),
        target_text=target or "not recorded",
        repo_id=repo_id or "path/to/this/draft",
        params=f"{sum(p.numel() for p in draft.parameters()):,}",
        lm_desc=(f"{lm_config.model_type}, {lm_config.num_hidden_layers} layers, hidden {lm_config.hidden_size}, "
                 f"vocabulary {_vocab_rows(lm, lm_config):,}"),
        adapter_rows=kind.card_rows(draft),
        results=_results_table(meta["results"]),
        training_data=meta["training_data"] or "Not recorded.",
    )


def save_draft(draft: PreTrainedModel, save_directory: str | Path, target: str | None = None,
               repo_id: str | None = None, **save_kwargs: Any) -> Path:
    """``save_pretrained`` (safetensors) plus the model card; ``target`` records what it was made for.

    >>> hf_specmm.save_draft(draft, "my-draft", target="llava-hf/llava-1.5-7b-hf")  # doctest: +SKIP
    """
    annotate_draft(draft, target=target)
    save_directory = Path(save_directory)
    PreTrainedModel.save_pretrained(draft, save_directory, **save_kwargs)
    (save_directory / "README.md").write_text(render_model_card(draft, repo_id))
    return save_directory


def push_draft_to_hub(draft: PreTrainedModel, repo_id: str, target: str | None = None, token: str | None = None,
                      private: bool | None = None, commit_message: str = "Upload hf_specmm draft",
                      revision: str | None = None, create_pr: bool = False) -> Any:
    """Create the repo if needed and upload weights, config and model card in one commit."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    with tempfile.TemporaryDirectory() as tmp:
        save_draft(draft, tmp, target=target, repo_id=repo_id)
        return api.upload_folder(folder_path=tmp, repo_id=repo_id, commit_message=commit_message,
                                 revision=revision, create_pr=create_pr)
