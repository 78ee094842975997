"""The `eagle3lab` command: one subcommand per pipeline arrow, each a thin wrapper that
parses arguments and calls the same typed keyword function a notebook calls.

Each subcommand module exposes `add_parser(subparsers)`, which registers its parser and
sets `func` (args -> exit code). Bad input raises `UserError`: printed as one paragraph,
exit 1, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from eagle3lab import __version__
from eagle3lab.errors import UserError

#: Modules that register subcommands, in the order `--help` lists them (pipeline order).
SUBCOMMAND_MODULES = [
    "eagle3lab.cli.prepare",
    "eagle3lab.cli.selfprompt",
    "eagle3lab.cli.regenerate",
    "eagle3lab.cli.extract",
    "eagle3lab.cli.vocab",
    "eagle3lab.cli.train",
    "eagle3lab.cli.inspect",
    "eagle3lab.cli.convert",
    "eagle3lab.cli.accept",
    "eagle3lab.cli.demo",
    "eagle3lab.cli.serve",
    "eagle3lab.cli.logs",
    "eagle3lab.cli.report",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle3lab",
        description="A research workbench for EAGLE-3 draft models: prepare a target, "
        "have it write prompts and regenerate training responses, extract hidden-state "
        "shards, and more. "
        "Run `eagle3lab COMMAND --help` for each command.",
    )
    parser.add_argument("--version", action="version", version=f"eagle3lab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        if not getattr(e, "from_main", False):  # (under torchrun: rank 0's, printed there)
            print(f"eagle3lab {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"eagle3lab {args.command}: interrupted; completed work is kept and a re-run "
              f"resumes from it.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
