"""``hf-specmm`` command line: one sub-command per module, each with ``add_arguments`` and ``run``.

    hf-specmm demo
    hf-specmm bench --preset cpu-proxy --gammas 3 5
    hf-specmm train --target org/llava --draft-config tiny --data data.jsonl --images imgs/
"""

from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> module providing add_arguments(parser) and run(args) -> int
COMMANDS = {
    "bench": ("hf_specmm.bench.cli", "Measure plain vs stock-assisted vs hf_specmm generation side by side."),
    "train": ("hf_specmm.train.cli", "Distil a draft (text-only or image-adapter) from a target, optionally push it."),
    "demo": ("hf_specmm.world.demo", "Offline demo: the shipped miniature-world target, plain vs speculative."),
    "world-tau": ("hf_specmm.world.tau_table", "τ per task × γ × draft kind on held-out miniature-world scenes."),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-specmm", description="Lossless multimodal speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        try:
            importlib.import_module(module).add_arguments(sub_parser)
        except ModuleNotFoundError as err:
            if err.name is None or not module.startswith(err.name):  # a missing dependency, not the module
                raise
            sub_parser.set_defaults(_missing=module)
        sub_parser.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "_missing", None):
        print(f"hf-specmm {args.command}: not available in this installation", file=sys.stderr)
        return 2
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
