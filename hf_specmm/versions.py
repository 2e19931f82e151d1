"""Which transformers versions hf_specmm runs on (docs/transformers-versions.md).

Tested with :data:`TESTED_WINDOW`. An older transformers is refused at import. A newer one imports with one
:class:`UntestedTransformersWarning`; every private internal hf_specmm reads is listed, with the shape it must have,
in ``_compat.INTERNALS`` and probed here at import (:func:`check`): ``enable()`` refuses where one is missing or
changed. Nothing here reads an internal by itself: it checks the names the table gives.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import transformers
from packaging.version import Version

MIN_TRANSFORMERS = Version("5.17.0")
NEWEST_TESTED = Version("5.25")  # the newest minor release the test suite runs on (CI: the lowest and this one)
FIRST_UNTESTED = Version(f"{NEWEST_TESTED.major}.{NEWEST_TESTED.minor + 1}")
TESTED_RANGE = f">={MIN_TRANSFORMERS},<{FIRST_UNTESTED}"
TESTED_WINDOW = f"{MIN_TRANSFORMERS.major}.{MIN_TRANSFORMERS.minor} to {NEWEST_TESTED}"

INSTALLED = Version(transformers.__version__)


class UntestedTransformersWarning(UserWarning):
    """The installed transformers is newer than the versions hf_specmm is tested with."""


@dataclass(frozen=True)
class Internal:
    """A private transformers internal hf_specmm relies on, and the shape it must have.

    ``name``: its dotted path under ``transformers``; ``params``: parameters its signature must take (a callable,
    or an ``nn.Module`` wrapping a kernel: its ``forward``); ``attrs``: attributes it must have, read on
    ``sample(obj)`` where given (attributes set in ``__init__`` or on first use) else on the object itself;
    ``since``: checked only from that version on (absent before it, and not read there)."""

    name: str
    params: tuple[str, ...] = ()
    attrs: tuple[str, ...] = ()
    sample: Callable[[Any], Any] | None = None
    since: str | None = None

    def applies(self, installed: Version) -> bool:
        return self.since is None or installed >= Version(self.since + ".0.dev0")


def refuse_older(installed: Version = INSTALLED) -> None:
    """Raise ``ImportError`` for a transformers older than the tested window."""
    if Version(installed.base_version) < MIN_TRANSFORMERS:
        raise ImportError(
            f"hf_specmm needs transformers >= {MIN_TRANSFORMERS} (it hooks generate internals; tested with "
            f"{TESTED_WINDOW}), but transformers {installed} is installed. Install a tested version, e.g. "
            f"`pip install 'transformers{TESTED_RANGE}'`."
        )


def _resolve(name: str) -> Any:
    """The object at ``transformers.<name>`` (modules imported on the way; AttributeError where absent)."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(["transformers", *parts[:split]]))
        except ImportError:
            continue
        for part in parts[split:]:
            obj = getattr(obj, part)
        return obj
    raise AttributeError(name)


def _missing(internal: Internal) -> str | None:
    """What ``internal`` lacks in the installed transformers (None: it is as expected)."""
    try:
        obj = _resolve(internal.name)
    except AttributeError:
        return "is missing"
    if internal.params:
        target = obj.forward if isinstance(obj, torch.nn.Module) else obj
        try:
            takes = inspect.signature(target).parameters
        except (TypeError, ValueError):
            return "has no readable signature"
        absent = [p for p in internal.params if p not in takes]
        if absent:
            return f"takes no parameter {', '.join(absent)}"
    if internal.attrs:
        try:
            holder = internal.sample(obj) if internal.sample is not None else obj
        except Exception as err:  # noqa: BLE001 - any failure to build one means its shape changed
            return f"cannot be built as expected ({type(err).__name__}: {err})"
        absent = [a for a in internal.attrs if not hasattr(holder, a)]
        if absent:
            return f"has no attribute {', '.join(absent)}"
    return None


def probe(internals: tuple[Internal, ...], installed: Version = INSTALLED) -> list[str]:
    """``"transformers.<name> <what is wrong>"`` for each of ``internals`` (those that apply to ``installed``)
    that is not as the tested versions have it."""
    problems = []
    for internal in internals:
        why = _missing(internal) if internal.applies(installed) else None
        if why is not None:
            problems.append(f"transformers.{internal.name} {why}")
    return problems


def check(internals: tuple[Internal, ...], installed: Version = INSTALLED) -> list[str]:
    """At import: refuse an older transformers, probe ``internals``, and warn once where ``installed`` is newer
    than the tested window (saying whether every internal is present). Returns what is missing or changed."""
    refuse_older(installed)
    problems = probe(internals, installed)
    if Version(installed.base_version) >= FIRST_UNTESTED:
        found = ("every private internal it reads is present as expected" if not problems else
                 "hf_specmm.enable() will refuse: " + "; ".join(problems))
        warnings.warn(f"hf_specmm is tested with transformers {TESTED_WINDOW}, not {installed}: {found}.",
                      UntestedTransformersWarning, stacklevel=3)
    return problems
