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
from collections.abc import Callable
from pathlib import Path

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
    "eagle3lab.cli.weakspots",
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
        return guarded(f"eagle3lab {args.command}", lambda: args.func(args), debug=args.debug,
                       debug_hint="Run `eagle3lab --debug ...` for the traceback.")
    except KeyboardInterrupt:
        print(f"eagle3lab {args.command}: interrupted; completed work is kept and a re-run "
              f"resumes from it.", file=sys.stderr)
        return 130


def guarded(prog: str, func: Callable[[], int | None], *, debug: bool, debug_hint: str) -> int:
    """Run `func` (a command's body) and return its exit code; an error it raises becomes
    one line on stderr instead of a traceback: a UserError `PROG: error: ...`, exit 1;
    anything else `PROG: unexpected error: ...` (see `unexpected`) plus `debug_hint`, exit 2.
    `debug` prints the traceback as well. The CLI and the bench/ scripts answer through it."""
    try:
        return int(func() or 0)
    except UserError as e:
        from eagle3lab.distributed import report

        show, linger_s = report(e)
        if debug:
            traceback.print_exc()
        if show:
            print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        time.sleep(linger_s)
        return 1
    except BrokenPipeError:  # `eagle3lab logs ... | head`: the reader left; not an error
        import os

        # Python flushes stdout again at exit: point it at /dev/null so that flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # the last resort: every known bad input is a UserError
        if debug:
            traceback.print_exc()
        print(f"{prog}: unexpected error: {unexpected(e)}" + ("" if debug else f" {debug_hint}"),
              file=sys.stderr)
        return 2


def bench_main(script: str, main: Callable[[], int | None]) -> int:
    """A bench/ script's entry point: `main` through `guarded`, so that bad input is one
    line; EAGLE3LAB_DEBUG=1 in the environment adds the traceback."""
    import os

    return guarded(f"bench/{script}", main, debug=bool(os.environ.get("EAGLE3LAB_DEBUG")),
                   debug_hint="Set EAGLE3LAB_DEBUG=1 for the traceback.")


def unexpected(e: BaseException) -> str:
    """One line for an exception no check anticipated: its type and message, the file it
    concerns (OSErrors name one) and the innermost frame of ours it passed through (the
    package's or a bench/ script's)."""
    msg = " ".join(str(e).split()) or "(no message)"
    if len(msg) > 300:
        msg = msg[:297] + "..."
    text = f"{type(e).__name__}: {msg}"
    filename = getattr(e, "filename", None)
    if filename and str(filename) not in msg:
        text += f" (file: {filename})"
    package = Path(__file__).resolve().parent.parent
    tops = (package, package.parent / "bench")
    ours = []
    for f in traceback.extract_tb(e.__traceback__):
        path = Path(f.filename).resolve()
        if any(path.is_relative_to(top) for top in tops):
            ours.append((f, path.relative_to(package.parent).as_posix()))
    if ours:  # guarded() itself is one, so there is always one
        f, where = ours[-1]
        text += f" [in {where}:{f.lineno}, {f.name}]"
    return text + "."


if __name__ == "__main__":
    raise SystemExit(main())
