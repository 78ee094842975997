"""The `eagle3lab` command: one subcommand per pipeline arrow, each a thin wrapper that
parses arguments and calls the same typed keyword function a notebook calls.

Each subcommand module exposes `add_parser(subparsers)`, which registers its parser and
sets `func` (args -> exit code).

Prevents a Python traceback as the answer to bad input. Bad input raises `UserError`
(printed as one paragraph naming the file/line/field and the fix, exit 1); anything else
that escapes a command is caught here as the last resort and printed as one line naming
the exception, the file it concerns (when it names one) and where it was raised, exit 2;
`eagle3lab --debug COMMAND ...` prints the traceback as well.
Under torchrun, `main` is wrapped in torchrun's `record` (an exception's traceback goes to
torchrun's error file) and a UserError is written there too, so torchrun's summary shows
the message of the rank that failed first; errors every rank raises are printed by rank 0
only (`eagle3lab.distributed.report`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback

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
    "eagle3lab.cli.preflight",
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
        epilog="Exit status: 0 done; 1 bad input (one paragraph naming the file, line or "
        "field and the fix); 2 a usage error, or an unexpected error (one line naming it and "
        "the file; --debug shows the traceback); 130 interrupted (completed work is kept).",
    )
    parser.add_argument("--version", action="version", version=f"eagle3lab {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, also print the Python traceback")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from eagle3lab.distributed import under_torchrun

    if under_torchrun():
        from torch.distributed.elastic.multiprocessing.errors import record

        return record(_main)(argv)
    return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        from eagle3lab.distributed import report

        show, linger_s = report(e)
        if args.debug:
            traceback.print_exc()
        if show:
            print(f"eagle3lab {args.command}: error: {e}", file=sys.stderr, flush=True)
        time.sleep(linger_s)
        return 1
    except KeyboardInterrupt:
        print(f"eagle3lab {args.command}: interrupted; completed work is kept and a re-run "
              f"resumes from it.", file=sys.stderr)
        return 130
    except Exception as e:  # the last resort: every known bad input is a UserError
        if args.debug:
            traceback.print_exc()
        print(f"eagle3lab {args.command}: unexpected error: {unexpected(e)}"
              + ("" if args.debug else " Run `eagle3lab --debug ...` for the traceback."),
              file=sys.stderr)
        return 2


def unexpected(e: BaseException) -> str:
    """One line for an exception no check anticipated: its type and message, the file it
    concerns (OSErrors name one) and the innermost eagle3lab frame it passed through."""
    msg = " ".join(str(e).split()) or "(no message)"
    if len(msg) > 300:
        msg = msg[:297] + "..."
    text = f"{type(e).__name__}: {msg}"
    filename = getattr(e, "filename", None)
    if filename and str(filename) not in msg:
        text += f" (file: {filename})"
    ours = [f for f in traceback.extract_tb(e.__traceback__)
            if "/eagle3lab/" in f.filename.replace("\\", "/")]
    if ours:  # main() itself is one, so there is always one
        where = ours[-1].filename.replace("\\", "/")
        where = where[where.rfind("/eagle3lab/") + 1:]
        text += f" [in {where}:{ours[-1].lineno}, {ours[-1].name}]"
    return text + "."


if __name__ == "__main__":
    raise SystemExit(main())
