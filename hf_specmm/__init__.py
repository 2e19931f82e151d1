"""hf_specmm: lossless speculative decoding for multimodal LLMs through ``model.generate(assistant_model=...)``.

    >>> import hf_specmm
    >>> hf_specmm.enable(model)  # doctest: +SKIP
    >>> model.generate(**inputs, assistant_model=draft, max_new_tokens=64)  # doctest: +SKIP
    >>> hf_specmm.last_stats(model).block_efficiency  # doctest: +SKIP
"""

from ._compat import TESTED_RANGE as TESTED_TRANSFORMERS
from .api import disable, enable, is_enabled, last_stats
from .checks import DEFAULT_GAMMA
from .drafter import Drafter, Prompt, Proposal
from .drafts import (DraftKind, FeatureHeadDraft, FeatureHeadDraftConfig, ImageAdapterDraft, ImageAdapterDraftConfig, MtpDraft, TextOnly, draft_kinds, get_kind, kind_of,
                     register_draft_kind)
from .errors import (IncompatibleDraftError, SpecMMError, UnsupportedGenerationError, UnsupportedTargetError,
                     UnsupportedTransformersError)
from .hub import annotate_draft, draft_metadata, load_draft, push_draft_to_hub, render_model_card, save_draft
from .stats import SpecStats
from .drafts.wrapper import Tree
from .auto import Auto
from . import simulator  # noqa: F401,E402  (sets hf_specmm.auto.simulate)
from .targets import SUPPORTED_TARGETS, TargetFamily, register_target_family

__version__ = "0.1.0"


def _register_auto_classes() -> None:
    """``AutoConfig`` / ``AutoModelForCausalLM.from_pretrained(repo)`` load an ImageAdapterDraft, a
    FeatureHeadDraft or an MtpDraft (no remote code)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .drafts.mtp import MtpDraftConfig

    for config, model in ((ImageAdapterDraftConfig, ImageAdapterDraft), (FeatureHeadDraftConfig, FeatureHeadDraft),
                          (MtpDraftConfig, MtpDraft)):
        try:
            AutoConfig.register(config.model_type, config)
            AutoModelForCausalLM.register(config, model)
        except ValueError:  # already registered (module reloaded)
            pass


_register_auto_classes()

__all__ = [
    "Auto",
    "DEFAULT_GAMMA",
    "DraftKind",
    "Drafter",
    "Prompt",
    "Proposal",
    "SUPPORTED_TARGETS",
    "TargetFamily",
    "TextOnly",
    "Tree",
    "TESTED_TRANSFORMERS",
    "FeatureHeadDraft",
    "FeatureHeadDraftConfig",
    "ImageAdapterDraft",
    "ImageAdapterDraftConfig",
    "IncompatibleDraftError",
    "MtpDraft",
    "SpecMMError",
    "SpecStats",
    "UnsupportedGenerationError",
    "UnsupportedTargetError",
    "UnsupportedTransformersError",
    "annotate_draft",
    "disable",
    "draft_kinds",
    "draft_metadata",
    "get_kind",
    "kind_of",
    "register_draft_kind",
    "register_target_family",
    "load_draft",
    "push_draft_to_hub",
    "render_model_card",
    "save_draft",
    "enable",
    "is_enabled",
    "last_stats",
]

# training (``hf-specmm train``); imported last: it builds on everything above
from .train import TrainConfig, TrainingInputError, TrainResult, train_draft  # noqa: E402

__all__ += ["TrainConfig", "TrainResult", "TrainingInputError", "train_draft"]
