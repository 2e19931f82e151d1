"""lmms-eval integration (``pip install "hf_specmm[lmms]"``): the ``hf_specmm`` model, registered through
lmms-eval's ``lmms_eval.models`` entry point (pyproject.toml), so that

    lmms-eval --model hf_specmm --model_args pretrained=<target>,draft=<Hub id or folder> --tasks <task>

evaluates with a draft. Only lmms-eval imports this package; the model class (``model.HFSpecMM``) is
imported by lmms-eval when the model is asked for. See docs/lmms-eval.md.
"""

from __future__ import annotations

from typing import Any

MODEL_ID = "hf_specmm"
MODEL_CLASS = "hf_specmm.integrations.lmms_eval.model.HFSpecMM"


def manifests() -> list[Any]:
    """The entry point's payload: one chat model (lmms-eval loads the class by its path on first use)."""
    from lmms_eval.models.registry_v2 import ModelManifest  # lmms-eval is installed: it is calling this

    return [ModelManifest(model_id=MODEL_ID, chat_class_path=MODEL_CLASS)]
