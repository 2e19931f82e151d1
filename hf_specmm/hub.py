"""Drafts on the Hub: load any registered draft kind with one call; save / push with a model card.

Saved through hf_specmm, a draft's config carries ``hf_specmm`` metadata (draft kind, the target it
was made for, measured results), which the card is rendered from (:mod:`hf_specmm.drafts.cards`, re-exported
here). What differs between kinds (the class that loads a checkpoint, the LM the card describes, extra card
rows) comes from the draft-kind registry (``drafts/registry.py``); ``ImageAdapterDraft.save_pretrained`` /
``push_to_hub`` write the card too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import CONFIG_MAPPING, AutoConfig, PreTrainedModel

from . import _compat
from .drafts.cards import (annotate_draft, card_template, draft_kind, draft_metadata,  # noqa: F401  (public API)
                           push_draft_to_hub, render_model_card, save_draft)
from .drafts.checkpoints import index_shards, read_config_json, weight_files
from .drafts.declared import (check_declared_fields, check_declared_shapes, check_model_type, config_field_error,
                              meta_layout)
from .drafts.registry import check_checkpoint_config, draft_kinds, get_kind, importer_for, kind_of, loading_class
from .errors import DraftLoadError, DraftTargetError, IncompatibleDraftError, SpecMMError, check_strict_load

_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
_CONVERT = ("hf_specmm loads drafts from safetensors only (a pickle checkpoint can run code when loaded). "
            "Convert it once, where you trust the file: "
            "`AutoModelForCausalLM.from_pretrained(path, use_safetensors=False).save_pretrained(new_path)` "
            "(save_pretrained writes model.safetensors), then load new_path.")


def looks_local(name: str) -> bool:
    """A path rather than an ``org/name`` Hub id: exists, is absolute or relative, or has more than one '/'."""
    return Path(name).exists() or name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def _check_safetensors_file(path: Path) -> None:
    """Parse the file's header: a truncated or corrupt file is named here, not deep inside loading."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except (SafetensorError, OSError) as err:
        raise DraftLoadError(f"weight file {path} is corrupt or truncated ({err}); re-download or re-save "
                             "the draft.") from err


def _check_weight_files(folder: Path, where: str) -> None:
    """Safetensors present and readable (each file's header parsed); pickle-only checkpoints refused."""
    files = sorted(p for p in folder.iterdir() if p.name.endswith(_WEIGHTS))
    tensors = [p for p in files if p.name.endswith(".safetensors")]
    if not tensors:
        found = ", ".join(p.name for p in files) or "no weight files"
        raise DraftLoadError(f"{where} has no .safetensors weights ({found}). {_CONVERT}")
    for path in weight_files(folder, where):  # a stale extra file is refused, not silently loaded
        _check_safetensors_file(path)


def _config_file(name: str, hub_kwargs: dict) -> Path | None:
    """``name``'s config.json: in the local folder, or fetched from the Hub / its cache (None: not found)."""
    if looks_local(name):
        config_file = Path(name).expanduser() / "config.json"
        return config_file if config_file.is_file() else None
    found = _compat.hub_file(name, "config.json", **hub_kwargs)
    return None if found is None else Path(found)


def _check_remote_code(raw: dict, config_file: Path, trust_remote_code: bool) -> None:
    """A config whose ``model_type`` transformers does not know, with an ``auto_map`` naming Python files of the
    checkpoint, loads only by running them: refused unless the caller passed ``trust_remote_code=True``."""
    if trust_remote_code or not raw.get("auto_map") or raw.get("model_type") in CONFIG_MAPPING:
        return
    raise DraftLoadError(f"{config_file}: model_type {raw.get('model_type')!r} is defined only by the checkpoint's own "
                         f"code (auto_map {raw['auto_map']}); hf_specmm runs no code from a checkpoint unless you pass "
                         "load_draft(..., trust_remote_code=True), after reading that code.")


def _import_engine_checkpoint(name: str, folder: Path, importer: Any, target: Any, hub_kwargs: dict) -> PreTrainedModel:
    """A checkpoint in another library's layout, read by the importer of the kind that claims its config.json."""
    if not looks_local(name):  # every safetensors file of the repo next to the cached config.json
        from huggingface_hub import list_repo_files

        for file in list_repo_files(name, revision=hub_kwargs.get("revision"), token=hub_kwargs.get("token")):
            if file.endswith(".safetensors"):
                folder = Path(_compat.hub_file(name, file, **hub_kwargs)).parent
    _check_weight_files(folder, f"checkpoint {name}")
    try:  # each importer compares the config with the target before it reads a weight
        return importer(folder, target, name).eval()
    except DraftTargetError:
        raise
    except IncompatibleDraftError as err:
        raise DraftTargetError(f"{folder / 'config.json'}: {err}") from err


_HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only")


def _load_from_target_checkpoint(name: str, kind: str, target: Any, kwargs: dict, hub_kwargs: dict) -> PreTrainedModel:
    """``load_draft(name, kind=...)``: the kind's draft read out of the target checkpoint ``name``."""
    reads = get_kind(kind).from_target_checkpoint
    if reads is None:
        readers = [k for k in draft_kinds() if get_kind(k).from_target_checkpoint is not None]
        raise ValueError(f"load_draft(kind={kind!r}): a {kind} draft is a checkpoint of its own; load it without kind= "
                         f"(kinds read out of a target's checkpoint: {', '.join(readers)})")
    other = sorted(set(kwargs) - set(_HUB_KWARGS))
    if other:
        raise TypeError(f"load_draft(kind={kind!r}) takes no {', '.join(other)}: the draft takes the target's dtype "
                        "and device")
    def fetch(file: str) -> Path | None:
        """``file`` of the checkpoint: in the local folder, or fetched from the Hub (None: it has none)."""
        if looks_local(name):
            path = Path(name).expanduser() / file
            return path if path.is_file() else None
        found = _compat.hub_file(name, file, **hub_kwargs)
        return None if found is None else Path(found)

    draft = reads(name, target, fetch)
    get_kind(kind).drafter.check(target, draft)
    return draft.eval()


def load_draft(repo_or_path: str | Path, *, target: PreTrainedModel | None = None, trust_remote_code: bool = False,
               kind: str | None = None, **kwargs: Any) -> PreTrainedModel:
    """Load a draft of any registered kind: the one path every draft load takes (strict: missing, unexpected or
    mis-shaped weights are an error; safetensors only). A local path that does not exist, a Hub id that cannot
    be found, an invalid config.json, a config field a draft kind needs that is missing or ill-typed, a corrupt
    weight file or a pickle-only checkpoint is a :class:`~hf_specmm.errors.DraftLoadError` naming the file and
    what was wrong.

    ``trust_remote_code`` (default False) reaches every loader: a checkpoint whose config needs its own Python
    files is refused unless it is True, and nothing is ever asked on the terminal (docs/security.md). ``target``:
    checked now (and needed for EAGLE-3 drafts saved by vLLM's ``speculators`` or by SGLang / SpecForge
    (``LlamaForCausalLMEagle3``)). Checkpoints in another library's layout (those two, and ``speculators``'
    ``dflash``) are detected from their config.json read as data and imported by the draft kind that reads them
    (``DraftKind.imports``); a model class no kind claims is refused, naming the kinds. Other keyword arguments
    go to the draft class's ``from_pretrained`` (``revision``, ``token``, ``dtype``, ``device_map``, ...).

    ``kind``: a draft kind that lives inside a target's own checkpoint (``"mtp"``: its multi-token-prediction
    layer): ``repo_or_path`` is then the target's checkpoint, of which only that kind's tensors are read, and
    ``target`` the loaded target (whose embedding and LM head the draft uses). None: ``repo_or_path`` is a draft.

    >>> draft = hf_specmm.load_draft("org/my-llava-draft")  # doctest: +SKIP
    >>> eagle3 = hf_specmm.load_draft("org/qwen2.5-vl-eagle3", target=model)  # doctest: +SKIP
    >>> mtp = hf_specmm.load_draft("Qwen/Qwen3.5-9B", kind="mtp", target=model)  # doctest: +SKIP
    """
    if not isinstance(trust_remote_code, bool):
        raise TypeError(f"load_draft(trust_remote_code=...) takes True or False, got {trust_remote_code!r}")
    fixed = sorted(k for k in ("use_safetensors", "output_loading_info") if k in kwargs)
    if fixed:  # what load_draft guarantees (safetensors only, a strict load) is not an option
        raise TypeError(f"load_draft takes no {', '.join(fixed)}: drafts load from safetensors only, and strictly "
                        "(missing or unexpected weights are an error)")
    name = str(repo_or_path)
    hub_kwargs = {k: v for k, v in kwargs.items() if k in _HUB_KWARGS}
    if kind is not None:
        return _load_from_target_checkpoint(name, kind, target, kwargs, hub_kwargs)
    config_file = _config_file(name, hub_kwargs)
    if looks_local(name) and config_file is None:
        folder = Path(name).expanduser()
        what = "is not a folder" if not folder.is_dir() else "has no config.json"
        raise DraftLoadError(f"No draft at local path {name!r}: {folder.resolve()} {what} (a saved draft is a "
                             "folder with config.json and model.safetensors). For a Hub repo pass 'org/name'.")
    raw = None if config_file is None else read_config_json(config_file)
    importer = None if raw is None else importer_for(raw)
    if importer is not None:  # another library's layout (vLLM's speculators, SGLang), read as data by its kind
        return _import_engine_checkpoint(name, config_file.parent, importer, target, hub_kwargs)
    if raw is not None and raw.get("speculators_model_type") is not None:
        readers = [k for k in draft_kinds() if get_kind(k).imports is not None]
        raise DraftLoadError(f"{config_file}: a speculators {raw['speculators_model_type']!r} checkpoint, which no "
                             f"hf_specmm draft kind imports (the kinds that read other libraries' layouts: "
                             f"{', '.join(readers)}; all kinds: {', '.join(draft_kinds())})")
    if looks_local(name):
        _check_weight_files(Path(name).expanduser(), f"local draft folder {Path(name).expanduser().resolve()}")
    if raw is not None:
        _check_remote_code(raw, config_file, trust_remote_code)
        check_model_type(raw, str(config_file), trust_remote_code)
        check_checkpoint_config(raw, str(config_file))
        check_declared_fields(raw, str(config_file))
    try:
        config = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code, **hub_kwargs)
    except config_field_error as err:  # transformers' own field validation, named with the file
        raise DraftLoadError(f"{config_file or name}: {err}") from err
    except OSError as err:
        raise DraftLoadError(f"Could not find the draft {name!r} as a local folder (no such path) nor on the Hub "
                             f"or in its local cache: {err}") from err
    except ValueError as err:  # transformers refusing the checkpoint's own code (trust_remote_code=False)
        if "trust_remote_code" not in str(err):
            raise DraftLoadError(f"{config_file or name}: transformers cannot read this config ({err})") from err
        raise DraftLoadError(f"{name}: its config needs the checkpoint's own code; hf_specmm runs none unless you "
                             "pass load_draft(..., trust_remote_code=True), after reading that code.") from err
    files = None  # the weight files whose headers are read before any tensor is allocated
    if not looks_local(name):
        weights = _compat.hub_file(name, "model.safetensors", **hub_kwargs)
        index = None if weights is not None else _compat.hub_file(name, "model.safetensors.index.json", **hub_kwargs)
        if weights is None and index is None:
            raise DraftLoadError(f"The Hub repo {name!r} has no model.safetensors. {_CONVERT}")
        if weights is not None:
            _check_safetensors_file(Path(weights))
            files = [Path(weights)]
        else:
            index_shards(Path(index))  # shard names only: an index cannot point outside the repo
    else:
        files = weight_files(Path(name).expanduser(), f"local draft folder {Path(name).expanduser().resolve()}")
    cls = loading_class(config)  # the registered kind that loads this config (AutoModelForCausalLM last)
    laid_out = meta_layout(cls, config) if files is not None else None  # shapes only: nothing allocated
    if laid_out is not None:
        check_declared_shapes(laid_out, config, files, name)
        if target is not None:  # what the checkpoint declares against the target, before any tensor is allocated
            _check_for_target(target, laid_out, config_file or name, before=True)
    kwargs.setdefault("ignore_mismatched_sizes", True)  # mis-shaped weights are reported by name, then refused
    try:
        model, info = cls.from_pretrained(name, output_loading_info=True, use_safetensors=True,
                                          trust_remote_code=trust_remote_code, **kwargs)
    except SpecMMError:
        raise
    except (AssertionError, ValueError, TypeError, KeyError, IndexError, RuntimeError) as err:
        raise DraftLoadError(f"draft checkpoint {name}: its config.json describes a {cls.__name__} that cannot be "
                             f"built or loaded from its weights ({type(err).__name__}: {err})") from err
    check_strict_load(info, f"draft checkpoint {name}")
    kind_of(model)  # a class no draft kind claims is refused now, naming the kinds
    if target is not None:  # the loaded draft too (a vocabulary map's values, a class not laid out on meta)
        _check_for_target(target, model, config_file or name, before=False)
    return model.eval()


def _check_for_target(target: Any, draft: Any, source: Any, before: bool) -> None:
    """:func:`~hf_specmm.checks.check_pairing` (the rule ``generate`` applies) on the checkpoint's draft: on its
    meta-device layout (``before``: no tensor allocated yet) or the loaded draft; refused as a
    :class:`~hf_specmm.errors.DraftTargetError` naming the checkpoint's file."""
    from .checks import check_pairing

    try:
        check_pairing(target, draft)
    except DraftTargetError:
        raise
    except IncompatibleDraftError as err:
        when = " Refused before any of its tensors was allocated." if before else ""
        raise DraftTargetError(f"draft checkpoint {source}: {err}{when}") from err
