"""What every draft class with its own weights does on save and load: the hf_specmm model card beside
the safetensors weights, upload with that card, and strict loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DraftLoadError, check_strict_load
from .cards import push_draft_to_hub, render_model_card
from .declared import check_shard_name

if TYPE_CHECKING:
    import torch


def read_config_json(path: str | Path) -> dict[str, Any]:
    """A checkpoint's config.json as JSON data (never through code it names): invalid JSON or anything but a
    JSON object is a :class:`DraftLoadError` naming the file."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise DraftLoadError(f"{path} is not valid JSON ({err}): the draft's config.json is corrupt; re-download or "
                             "re-save the draft") from err
    if not isinstance(raw, dict):
        raise DraftLoadError(f"{path} holds a JSON {type(raw).__name__}, not an object: not a model config")
    return raw


def index_shards(index: Path) -> list[str]:
    """The shard file names a ``model.safetensors.index.json`` lists, each a plain file name beside the index."""
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()), key=str)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise DraftLoadError(f"{index} is not a safetensors index (a JSON object with weight_map): {err}") from err
    return [check_shard_name(name, index) for name in shards]


def weight_files(folder: Path, source: str) -> list[Path]:
    """The checkpoint's safetensors files: the shards its ``model.safetensors.index.json`` lists, else
    ``model.safetensors``, else the one ``*.safetensors`` file. Any other safetensors file beside them (a stale
    copy) is refused: which one holds the real weights cannot be told."""
    present = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = [folder / name for name in index_shards(index)]
    elif (folder / "model.safetensors").is_file() or len(present) != 1:
        files = [folder / "model.safetensors"]
    else:
        files = present
    absent = [p.name for p in files if not p.is_file()]
    if absent or not files:
        raise DraftLoadError(f"{source} lacks {absent or ['model.safetensors']}; hf_specmm reads drafts from "
                             "safetensors only (a pickle checkpoint can run code when loaded)")
    stale = [p.name for p in present if p not in files]
    if stale:
        raise DraftLoadError(f"{source} holds {stale} beside its weights {[p.name for p in files]}: remove the stale "
                             "file(s); hf_specmm does not guess which file holds the head")
    return files


def read_checked_tensors(paths: dict[str, Path], files: dict[str, str], wanted: dict[str, str],
                         expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors ``wanted`` ({draft parameter: checkpoint key}) only, from the files ``files`` ({key: file name},
    ``paths``: {file name: path}) places them in, each shape-checked against ``expected`` before any is used."""
    from safetensors import SafetensorError, safe_open

    state: dict[str, torch.Tensor] = {}
    for file, path in paths.items():
        try:
            with safe_open(str(path), framework="pt") as f:
                present = set(f.keys())
                for param, key in wanted.items():
                    if files[key] != file:
                        continue
                    if key not in present:
                        raise DraftLoadError(f"{path}: lacks {key}, which the index places there")
                    shape = list(f.get_slice(key).get_shape())
                    if shape != list(expected[param].shape):
                        raise DraftLoadError(f"{path}: tensor {key} has shape {shape}; the draft "
                                             f"needs {list(expected[param].shape)} ({param})")
                    state[param] = f.get_tensor(key)
        except (SafetensorError, OSError) as err:
            raise DraftLoadError(f"{path} is corrupt or truncated ({err})") from err
    return state


class DraftCheckpointMixin:
    """Mixed in before ``PreTrainedModel`` by draft classes (``ImageAdapterDraft``, ``FeatureHeadDraft``)."""

    save_formats: tuple[str, ...] = ("hf_specmm",)  # layouts save_pretrained(format=...) writes

    def save_pretrained(self, save_directory: Any, *args: Any, format: str = "hf_specmm", **kwargs: Any) -> None:
        """Safetensors weights + config + the hf_specmm model card (README.md). ``format``: one of
        :attr:`save_formats` (others are refused, not ignored)."""
        self.check_save_format(format)
        super().save_pretrained(save_directory, *args, **kwargs)  # type: ignore[misc]
        if kwargs.get("is_main_process", True):
            (Path(save_directory) / "README.md").write_text(render_model_card(self))

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Upload weights, config and the hf_specmm model card (stock push_to_hub writes a generic card)."""
        return push_draft_to_hub(self, repo_id, **kwargs)

    def check_save_format(self, format: str) -> None:
        if format not in self.save_formats:
            extra = (" (the speculators / SGLang layouts hold EAGLE-3 heads: build one with variant='eagle3')"
                     if format in ("speculators", "sglang") else "")
            raise ValueError(f"save_pretrained(format={format!r}): a {type(self).__name__} is saved as "
                             f"{' or '.join(repr(f) for f in self.save_formats)}{extra}")

    def check_loaded(self, where: str) -> None:
        """Checks of a loaded checkpoint's values that shapes cannot catch (none by default)."""

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        """Strict load: a missing, unexpected or mis-shaped weight is an error, not a warning."""
        user_wants_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)  # type: ignore[misc]
        where = f"{cls.__name__} checkpoint {args[0] if args else kwargs.get('pretrained_model_name_or_path', '')}"
        check_strict_load(info, where)
        model.check_loaded(where)
        return (model, info) if user_wants_info else model
