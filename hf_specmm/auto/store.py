"""The process's cost tables (:class:`~hf_specmm.auto.costs.CostTable`) by key: (target, draft, device, dtype,
batch bucket, cache kind), kept for the process and, with ``Auto(costs_file=)``, loaded from and saved to a JSON
file."""

from __future__ import annotations

import json
import os
import threading
import weakref
from pathlib import Path
from typing import Any

from .costs import CostTable


class CostStore:
    """The process's cost tables by key, optionally loaded from and saved to JSON files (``Auto(costs_file=)``)."""

    def __init__(self) -> None:
        self.tables: dict[str, CostTable] = {}
        self.loaded: set[str] = set()
        self.lock = threading.Lock()

    def table(self, key: str, path: str | os.PathLike | None = None) -> CostTable:
        with self.lock:
            if path is not None and str(path) not in self.loaded:
                self.loaded.add(str(path))
                for k, data in load_costs(path).items():
                    self.tables.setdefault(k, CostTable(data))
            table = self.tables.get(key)
            if table is None:
                table = self.tables[key] = CostTable()
            return table

    def save(self, path: str | os.PathLike, keys: list[str]) -> None:
        """Write the tables of ``keys`` into ``path`` (merged with what the file already holds)."""
        with self.lock:
            data = load_costs(path)
            data.update({k: self.tables[k].to_json() for k in keys if k in self.tables})
            target = Path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(target.suffix + ".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(target)

    def clear(self) -> None:
        with self.lock:
            self.tables.clear()
            self.loaded.clear()


def load_costs(path: str | os.PathLike) -> dict[str, Any]:
    """A costs file's tables by key ({} when the file does not exist yet); a malformed file is an error."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"hf_specmm.Auto costs_file {str(path)!r} is not valid JSON ({error}); delete it or pass "
                         "another path") from error
    if not isinstance(data, dict):
        raise ValueError(f"hf_specmm.Auto costs_file {str(path)!r} must hold a JSON object of cost tables")
    return data


#: every process-wide cost table (see :class:`CostStore`)
COSTS = CostStore()


def batch_bucket(batch: int) -> int:
    """1, 2, 4, 8, ...: the power of two at or above ``batch``."""
    bucket = 1
    while bucket < batch:
        bucket *= 2
    return bucket


_NAMES: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def model_name(model: Any) -> str:
    """A model's class, checkpoint name and size: stable across processes (for saved costs); once per model."""
    if model not in _NAMES:
        config = getattr(model, "config", None)
        name = getattr(config, "_name_or_path", "") or ""
        size = sum(p.numel() for p in model.parameters())
        _NAMES[model] = f"{type(model).__name__}({name}, {size} params)"
    return _NAMES[model]


def cost_key(target: Any, draft: Any, device: Any, dtype: Any, batch: int, cache: str) -> str:
    return " | ".join((model_name(target), model_name(draft), str(device), str(dtype), f"batch<={batch_bucket(batch)}",
                       cache))
