"""``hf-specmm`` command line: one sub-command per module, each with ``add_arguments`` and ``run``.

    hf-specmm demo
    hf-specmm bench --preset cpu-proxy --gammas 3 5
    hf-specmm train --target org/llava --draft-config tiny --data data.jsonl --images imgs/

Also the shared pieces of every sub-command's parser: :class:`HelpFormatter` (each option's help line shows
its default) and the validating ``type=`` factories :func:`int_at_least` and :func:`number_in`, so that a bad
number is a one-line argparse error (exit code 2) before any model is built.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NoReturn

if TYPE_CHECKING:
    from .trees import TreeShape

# sub-command -> module providing add_arguments(parser) and run(args) -> int
COMMANDS = {
    "bench": ("hf_specmm.bench.cli", "Measure plain vs stock-assisted vs hf_specmm generation side by side."),
    "train": ("hf_specmm.train.cli", "Distil a draft of any registered kind (--draft-kind) from a target, measure its "
                                     "held-out τ, optionally push it."),
    "demo": ("hf_specmm.world.demo", "Offline demo: the shipped miniature-world target, plain vs speculative."),
    "world-tau": ("hf_specmm.world.tau_table", "τ per task × γ × draft kind on held-out miniature-world scenes."),
    "world-task": ("hf_specmm.world.lmms_task", "Write the miniature world as an offline lmms-eval task folder."),
    "auto-sim": ("hf_specmm.bench.sim_profile", "Simulate hf_specmm.Auto beside every fixed shape on a cost profile "
                                                "(virtual clock, no model)."),
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps descriptions as written and appends ``(default: X)`` to every option's help, except where the
    help already states its default (options whose default is ``None`` must say in words what that means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text.lower() or action.default is None or action.required:
            return text
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """Errors are one line on stderr (``prog: error: ...``), exit code 2: no usage block, no traceback."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type=``: an integer ``>= low`` (for ``nargs="+"`` lists, each element is checked)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"  # what argparse names the type in its messages
    return parse


def tree_shape(text: str) -> "TreeShape":
    """An argparse ``type=``: ``K,D,N`` (top_k, depth, nodes) as a checked :class:`~hf_specmm.trees.TreeShape`."""
    from .trees import TreeShape

    try:
        top_k, depth, nodes = (int(part) for part in text.split(","))
        return TreeShape(top_k=top_k, depth=depth, nodes=nodes)
    except ValueError as error:  # three integers, then TreeShape's own checks
        raise argparse.ArgumentTypeError(f"expected K,D,N (top_k,depth,nodes), e.g. 8,12,64; got {text!r}: "
                                         f"{error}") from None


def number_in(low: float | None = None, high: float | None = None, low_open: bool = False,
              high_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type=``: a finite float in the given interval (``None``: unbounded on that side)."""
    if low is not None and high is not None:  # how the bounds read in messages: "in [0, 1)", "> 0", ...
        span = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        span = f"{'>' if low_open else '>='} {low:g}"
    else:
        span = "that is finite" if high is None else f"{'<' if high_open else '<='} {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {span}, got {text!r}") from None
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if not math.isfinite(value) or too_low or too_high:
            raise argparse.ArgumentTypeError(f"must be a number {span}, got {text}")
        return value

    parse.__name__ = f"number {span}"
    return parse


def existing_folder(text: str) -> str:
    """An argparse ``type=``: a folder that exists (checked at parse time, before any work)."""
    if not Path(text).expanduser().is_dir():
        raise argparse.ArgumentTypeError(f"no such folder: {text!r}")
    return text


def check_writable(folder: Path, what: str, create: bool = False) -> None:
    """Raise ``argparse.ArgumentTypeError`` unless files can be written into ``folder``: a probe file is written in
    it, or (``folder`` missing, ``create`` False) in its nearest existing ancestor, which the run's folders are made
    in; a parse that fails on a later option thus leaves nothing behind. ``create``: make ``folder`` now."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file, not a folder" if existing == folder else f"is not a folder ({str(existing)!r} is a file)"
        raise argparse.ArgumentTypeError(f"{what} {str(folder)!r} {where}")
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
            existing = folder
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise argparse.ArgumentTypeError(f"cannot write into {what} {str(folder)!r} ({err.strerror or err})") from None


def output_folder(text: str) -> str:
    """An argparse ``type=``: a folder results go to (made by the run), checked writable now."""
    check_writable(Path(text).expanduser(), "folder")
    return text


def output_file(text: str) -> str:
    """An argparse ``type=``: a file written later (or ``text`` as a prefix of files: ``<text>.json``, ...), not a
    folder; its folder is checked writable now."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    check_writable(path.parent, "the folder of")
    return text


def model_source(text: str) -> str:
    """An argparse ``type=``: a Hub id (``org/name``) or a local folder that exists. A path that does not exist
    is refused here (transformers would report it as an invalid repo id, with a traceback)."""
    from .hub import looks_local  # transformers is imported only once a sub-command's flags are parsed

    if looks_local(text) and not Path(text).expanduser().is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is neither an existing local folder nor a Hub id (org/name)")
    return text


def device_name(text: str) -> str:
    """An argparse ``type=``: a torch device name (``cpu``, ``cuda``, ``cuda:1``, ``mps``, ...)."""
    import torch

    try:
        torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} (e.g. cpu, cuda, cuda:0)") from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="hf-specmm", description="Lossless multimodal speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    for name, (module, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        try:
            importlib.import_module(module).add_arguments(sub_parser)
        except ModuleNotFoundError as err:
            if err.name is None or not module.startswith(err.name):  # a missing dependency, not the module
                raise
            sub_parser.set_defaults(_missing=module)
        sub_parser.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # name the sub-command whose --help lists the valid flags (argparse would blame `hf-specmm`)
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "_missing", None):
        print(f"hf-specmm {args.command}: not available in this installation", file=sys.stderr)
        return 2
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
