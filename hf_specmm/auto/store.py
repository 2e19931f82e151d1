"""The process's cost tables by key, and costs files (``Auto(costs_file=)``): read and checked before a call's
first forward, written at each call's end through a per-process temporary file under a lock, merged with what
other processes wrote."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import threading
import warnings
import weakref
from pathlib import Path
from typing import Any, Iterator

from .costs import Table, _shape_of

try:
    import fcntl
except ImportError:  # not on Windows: the temporary file and the merge still keep the file whole
    fcntl = None  # type: ignore[assignment]


def check_path(path: Any) -> Path:
    """``Auto(costs_file=)``: a path (str or os.PathLike) that is not a directory."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"Auto costs_file must be a path (str or os.PathLike), got {type(path).__name__}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"Auto costs_file {str(path)!r} is a directory; pass a file path (e.g. {str(path / 'auto.json')!r})")
    return path


def read(path: Path) -> dict[str, Any]:
    """The file's entries by key ({} when it does not exist yet); a file that is not a JSON object is refused."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"hf_specmm.Auto costs_file {str(path)!r} cannot be read as JSON ({error}); delete it or "
                         "pass another path") from error
    if not isinstance(data, dict):
        raise ValueError(f"hf_specmm.Auto costs_file {str(path)!r} must hold a JSON object of cost tables by key")
    return data


def check_entry(path: Path, key: str, entry: Any) -> None:
    """One entry's layout (:class:`~hf_specmm.auto.costs.Table`): ``{"version": 4, "arms": {shape: [5 numbers]},
    "calls": {"plain": [4 numbers], "speculative": [4 numbers]}}``."""
    def bad(why: str) -> ValueError:
        return ValueError(f"hf_specmm.Auto costs_file {str(path)!r}: entry {key!r} {why}; delete the entry or the file")

    if not isinstance(entry, dict) or set(entry) - {"version", "arms", "calls"}:
        raise bad("must be an object with 'version', 'arms' and 'calls'")
    if entry.get("version") != 4:
        raise bad(f"has version {entry.get('version')!r}, not 4 (an earlier hf_specmm's layout)")
    for part, names, size in (("arms", None, 5), ("calls", ("plain", "speculative"), 4)):
        sums = entry.get(part, {})
        if not isinstance(sums, dict):
            raise bad(f"has {part!r} that is not an object")
        for name, values in sums.items():
            if (names is None and _shape_of(name) is None) or (names is not None and name not in names):
                raise bad(f"has an unknown {part[:-1]} {name!r}")
            if not isinstance(values, list) or len(values) != size or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                    for x in values) or (names is None and values[1] > values[0]):
                raise bad(f"has {part}[{name!r}] that is not {size} finite numbers >= 0"
                          + (", its prior rounds at most its rounds" if names is None else ""))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path.with_name(path.name + ".lock"), "a") as lock:  # closing the file releases the lock
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class Store:
    """The process's tables by key, each loaded once from its costs file (entries of this key's model pair
    checked; other models' entries left as they are)."""

    def __init__(self) -> None:
        self.tables: dict[str, Table] = {}
        self.lock, self.warned = threading.Lock(), set[str]()

    def table(self, key: str, path: Path | None = None) -> Table:
        with self.lock:
            if key not in self.tables:
                entry = read(path).get(key) if path is not None else None
                if entry is not None:
                    check_entry(path, key, entry)  # type: ignore[arg-type]
                self.tables[key] = Table(entry)
            return self.tables[key]

    def check(self, path: Path, prefix: str) -> None:
        """Before a call's first forward: the file reads, and its entries for this model pair are well formed."""
        for key, entry in read(path).items():
            if key.startswith(prefix):
                check_entry(path, key, entry)

    def save(self, path: Path, keys: list[str]) -> None:
        """Merge the tables of ``keys`` into ``path`` atomically; a failure warns once per file (the call goes on)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with _locked(path):
                try:
                    data = read(path)
                except ValueError:
                    data = {}  # a torn or foreign file is replaced, not merged
                data.update({k: self.tables[k].to_json() for k in keys if k in self.tables})
                handle, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
                with os.fdopen(handle, "w") as out:
                    json.dump(data, out, indent=1, sort_keys=True)
                os.replace(tmp, path)
        except OSError as error:
            if str(path) not in self.warned:
                self.warned.add(str(path))
                warnings.warn(f"hf_specmm.Auto could not save costs_file {str(path)!r} ({error}); decoding goes on, "
                              "the costs stay in this process", RuntimeWarning, stacklevel=2)

    def clear(self) -> None:
        with self.lock:
            self.tables.clear()


#: every process-wide cost table
COSTS = Store()

_NAMES: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def model_name(model: Any) -> str:
    """A model's class, checkpoint name and size: stable across processes (for saved costs); once per model."""
    if model not in _NAMES:
        name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
        _NAMES[model] = f"{type(model).__name__}({name}, {sum(p.numel() for p in model.parameters())} params)"
    return _NAMES[model]


def cost_key(pair: str, device: Any, dtype: Any, rows: int, cache: str) -> str:
    """The key of a round of ``rows`` live rows: its batch bucket is the power of two at or above ``rows``."""
    return " | ".join((pair, str(device), str(dtype), f"batch<={1 << max(rows - 1, 0).bit_length()}", cache))
