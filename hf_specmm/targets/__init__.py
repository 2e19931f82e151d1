"""Supported target families (see ``registry``); importing this package registers the built-in ones."""

from . import llava  # noqa: F401  (registers the LLaVA families)
from . import qwen_vl  # noqa: F401  (registers the Qwen-VL families)
from . import gemma3, idefics3, internvl  # noqa: F401  (Gemma 3, Idefics3 / SmolVLM, InternVL)
from . import muse_glimmer  # noqa: F401  (Muse Glimmer, transformers >= 5.24)
from . import gemma4  # noqa: F401  (Gemma 4, Gemma 4 Unified; transformers >= 5.24)
from . import qwen3_5  # noqa: F401  (Qwen3.5, where transformers has it)
from . import llava_onevision1_5, ovis2_5  # noqa: F401  (transformers >= 5.25)
from . import step3p7  # noqa: F401  (Step3.7, transformers >= 5.25)
from . import inkling  # noqa: F401  (Inkling, transformers >= 5.25)
from .positions import COLUMNS, MROPE, ROPE_1D, ColumnPositions, MRope, PositionRule
from .registry import (SUPPORTED_TARGETS, TargetFamily, TargetSpec, family_by_model_type, family_of,
                       register_target_family, target_family, target_spec)

__all__ = ["COLUMNS", "ColumnPositions", "MROPE", "MRope", "ROPE_1D", "PositionRule", "SUPPORTED_TARGETS", "TargetFamily", "TargetSpec", "family_by_model_type",
           "family_of", "register_target_family", "target_family", "target_spec"]
