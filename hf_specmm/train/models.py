"""Loading the target (right LLaVA-family class from its config), building or loading the draft, content
fingerprints (for the response cache and the resume check) and the draft/target compatibility checks.

    >>> target, processor = load_target("llava-hf/llava-1.5-7b-hf", "cpu", "fp32")  # doctest: +SKIP
    >>> fields = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4}
    >>> draft = fresh_language_model(target, fields)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoProcessor, AutoTokenizer, GenerationConfig,
                          PreTrainedModel)

from ..drafts import get_kind, kind_of
from ..drafts.registry import trainable_kinds
from ..errors import UnsupportedTargetError
from ..hub import load_draft
from ..targets import SUPPORTED_TARGETS, family_by_model_type, target_spec
from ..vocab import check_vocab_compatible
from .config import TrainConfig, TrainingInputError, resolve_draft_config

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_SAMPLE = 1 << 20  # bytes hashed at each end of a weight file


def _folder_digest(folder: Path) -> str:
    """config.json + every weight file's name, size and first/last MiB: cheap (no full read of a 14 GB
    checkpoint) and changes whenever the weights are replaced in practice."""
    h = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.name == "config.json" or path.name.endswith(_WEIGHT_SUFFIXES):
            size = path.stat().st_size
            h.update(f"{path.name}\0{size}\0".encode())
            with path.open("rb") as f:
                h.update(f.read(_SAMPLE))
                if size > 2 * _SAMPLE:
                    f.seek(size - _SAMPLE)
                    h.update(f.read(_SAMPLE))
    return h.hexdigest()[:16]


def fingerprint(name: str) -> str:
    """Identity of a model by content: ``local:<digest>`` for a folder, ``hub:<repo>@<commit>`` for a Hub id."""
    if Path(name).is_dir():
        return "local:" + _folder_digest(Path(name))
    from transformers.utils import cached_file

    folder = Path(cached_file(name, "config.json")).parent  # .../snapshots/<commit sha>/config.json
    if folder.parent.name == "snapshots":
        return f"hub:{name}@{folder.name}"
    return "local:" + _folder_digest(folder)


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def target_class(name: str, trust_remote_code: bool = False) -> type:
    """The registered target family's class for the checkpoint ``name`` (from its config's model_type)."""
    try:
        config = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)
    except ValueError as err:  # transformers refusing the checkpoint's own code
        if "trust_remote_code" not in str(err):
            raise
        raise TrainingInputError(f"{name}: its config needs the checkpoint's own code; hf_specmm runs none unless "
                                 "you pass trust_remote_code=True (hf-specmm train --trust-remote-code), after "
                                 "reading that code") from err
    family = family_by_model_type(config.model_type)
    if family is not None:
        return family.model_class()
    supported = ", ".join(f.name for f in SUPPORTED_TARGETS.values())
    raise UnsupportedTargetError(f"{name} is a {config.model_type!r} model; hf_specmm trains drafts for "
                                 f"the registered target families ({supported}).")


def load_target(name: str, device: str, dtype: str, device_map: str | dict | None = None,
                max_memory: dict | None = None, offload_folder: str | Path | None = None,
                trust_remote_code: bool = False) -> tuple[PreTrainedModel, Any]:
    """Frozen target in eval mode (bf16 when training in bf16: it is only ever run forward) + its processor.
    ``device_map`` (with ``max_memory`` / ``offload_folder``): dispatched by accelerate as ``from_pretrained``
    does, for a target larger than one device; otherwise the whole target on ``device``. ``trust_remote_code``
    reaches every loader (config, weights, processor): nothing from the checkpoint runs unless it is True."""
    cls = target_class(name, trust_remote_code)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    if device_map is None:
        model = cls.from_pretrained(name, dtype=torch_dtype, trust_remote_code=trust_remote_code).to(device).eval()
    else:
        model = cls.from_pretrained(name, dtype=torch_dtype, device_map=device_map, max_memory=max_memory,
                                    offload_folder=offload_folder, trust_remote_code=trust_remote_code).eval()
    model.requires_grad_(False)
    processor = AutoProcessor.from_pretrained(name, trust_remote_code=trust_remote_code)
    return model, processor


def default_target_name(name: str) -> str:
    """What the model card calls the target: the Hub id, or a local folder's name (never a local path)."""
    return Path(name).resolve().name if Path(name).exists() else name


def fresh_language_model(target: PreTrainedModel, fields: dict[str, Any], seed: int = 0) -> PreTrainedModel:
    """A randomly initialised causal LM of the target's text family with the target's full text vocabulary."""
    text = target.config.get_text_config()
    fields = dict(fields)
    family = family_by_model_type(target.config.model_type)
    model_type = fields.pop("model_type", (family and family.text_model_type) or text.model_type)
    hidden, heads = int(fields["hidden_size"]), int(fields["num_attention_heads"])
    kwargs: dict[str, Any] = dict(
        vocab_size=text.vocab_size, intermediate_size=4 * hidden, num_key_value_heads=heads,
        max_position_embeddings=getattr(text, "max_position_embeddings", 2048), tie_word_embeddings=False,
        bos_token_id=text.bos_token_id, eos_token_id=text.eos_token_id, pad_token_id=text.pad_token_id,
    )
    if model_type == "qwen2":
        kwargs["use_sliding_window"] = False
    kwargs.update(fields)
    config = AutoConfig.for_model(model_type, **kwargs)
    with torch.random.fork_rng(devices=[]):  # the draft's init depends on the seed only
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    gen = target.generation_config
    model.generation_config = GenerationConfig(bos_token_id=gen.bos_token_id, eos_token_id=gen.eos_token_id,
                                               pad_token_id=gen.pad_token_id)
    return model


def _draft_tokenizer(name: str, trust_remote_code: bool = False) -> Any:
    """The draft's own tokenizer when its folder / repo has one (to compare ids with the target's)."""
    if Path(name).is_dir():
        if not any((Path(name) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
            return None
    else:
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "tokenizer_config.json"), str):
            return None  # not cached: the vocabulary-size check still runs
    return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)


def make_draft(cfg: TrainConfig, target: PreTrainedModel, tokenizer: Any,
               target_name: str) -> tuple[PreTrainedModel, str]:
    """Load ``cfg.draft`` or build one from ``cfg.draft_config``; build the asked kind around it if it is a
    plain LM (e.g. an image-adapter draft around a text-only one). Raises
    :class:`~hf_specmm.errors.IncompatibleDraftError` / :class:`TrainingInputError` before any forward."""
    draft_tok = None
    if cfg.draft is not None and _in_target_checkpoint(cfg):  # fine-tune the layer a target checkpoint carries
        draft = load_draft(cfg.draft, kind=cfg.draft_kind, target=target)
    elif cfg.draft is not None:
        draft = load_draft(cfg.draft, trust_remote_code=cfg.trust_remote_code)
        draft_tok = _draft_tokenizer(cfg.draft, cfg.trust_remote_code)
    else:
        draft = fresh_language_model(target, resolve_draft_config(cfg.draft_config), cfg.seed)
    loaded = kind_of(draft)
    kind = get_kind(cfg.draft_kind or loaded.name)
    if kind.training_view is None:
        raise TrainingInputError(f"{cfg.draft or 'the draft'} is a {kind.title} draft, which hf_specmm runs but does "
                                 f"not train (trainable kinds: {', '.join(trainable_kinds())})")
    if kind != loaded:
        if loaded.name != "text_only" or kind.build is None:
            source = cfg.draft or "the draft built from draft_config"
            raise TrainingInputError(f"{source} is a {loaded.title} draft; it cannot be trained as a {kind.title} "
                                     f"draft (train it with draft_kind={loaded.name}, or start from a plain causal LM)")
        check_draft(target, draft, tokenizer, draft_tok)
        try:
            draft, draft_tok = kind.build(target, draft, cfg, target_name), None
        except ValueError as err:  # a size the target cannot take (draft_vocab_size above its vocabulary, ...)
            raise TrainingInputError(f"cannot build a {kind.title} draft for {target_name}: {err}") from err
    check_draft(target, draft, tokenizer, draft_tok)
    return draft.to(device=cfg.device, dtype=torch.float32), kind.name


def _in_target_checkpoint(cfg: TrainConfig) -> bool:
    """Whether ``cfg.draft`` names a target checkpoint holding a draft of ``cfg.draft_kind`` (an MTP layer), not a
    saved draft: its config.json (read as data) is not of an hf_specmm draft."""
    if cfg.draft_kind is None or get_kind(cfg.draft_kind).from_target_checkpoint is None:
        return False
    from .. import _compat
    from ..drafts.checkpoints import read_config_json
    from ..hub import looks_local

    path = Path(cfg.draft) / "config.json" if looks_local(cfg.draft) else _compat.hub_file(cfg.draft, "config.json")
    if path is None or not Path(path).is_file():
        return False
    return not str(read_config_json(path).get("model_type", "")).startswith("hf_specmm_")


def check_draft(target: PreTrainedModel, draft: PreTrainedModel, tokenizer: Any = None,
                draft_tokenizer: Any = None) -> None:
    """The checks ``generate(assistant_model=draft)`` runs (vocabulary cover, then the draft kind's own)."""
    kind = kind_of(draft)
    if kind.target_vocab_size is None:  # a kind scoring with the target's LM head has no vocabulary of its own
        check_vocab_compatible(target_spec(target), draft, tokenizer, draft_tokenizer)
    kind.drafter.check(target, draft)
