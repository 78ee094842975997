"""What the subcommands share: their registration and the options several of them take,
each option defined once as an argparse parent parser (`parents=[...]`).

Prevents one option drifting apart between commands (`--device` taking other values, or
`--no-progress` another meaning, in one command only): the name, type, default and help
of a shared option live here; a command may only add a note to its help.
"""

from __future__ import annotations

import argparse
from typing import Callable, Sequence

from eagle3lab.config import DEFAULT_TARGET

TARGET_HELP = "preset name, Hugging Face model directory, or hub id"


def add_command(sub, name: str, func: Callable[[argparse.Namespace], int], *, help: str,
                description: str, parents: Sequence[argparse.ArgumentParser] = (),
                show_defaults: bool = True) -> argparse.ArgumentParser:
    """Register subcommand `name` (its help lists each option's default unless
    show_defaults=False); `func(args)` returns the exit code."""
    kw = {"formatter_class": argparse.ArgumentDefaultsHelpFormatter} if show_defaults else {}
    p = sub.add_parser(name, help=help, description=description, parents=list(parents), **kw)
    p.set_defaults(func=func)
    return p


def _parent(*flags: str, **kw) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(*flags, **kw)
    return p


def target_option(note: str = "") -> argparse.ArgumentParser:
    """--target: the model a command runs (default: the embedded default target)."""
    return _parent("--target", default=DEFAULT_TARGET,
                   help=TARGET_HELP + (f" ({note})" if note else ""))


def device_option(note: str = "") -> argparse.ArgumentParser:
    """--device: where the model runs."""
    return _parent("--device", default="auto",
                   help="auto, cpu, cuda, cuda:1, ..." + (f" ({note})" if note else ""))


def dtype_option(help: str = "model dtype (bfloat16 on GPUs)") -> argparse.ArgumentParser:
    """--dtype: the dtype the model runs in."""
    return _parent("--dtype", default="float32", help=help)


def no_progress_option(help: str = "no progress bar") -> argparse.ArgumentParser:
    """--no-progress: no tqdm bars (args.no_progress)."""
    return _parent("--no-progress", action="store_true", help=help)


def json_option(help: str = "print one JSON object") -> argparse.ArgumentParser:
    """--json: machine-readable output instead of the table."""
    return _parent("--json", action="store_true", help=help)


def generation_options(target_note: str = "") -> argparse.ArgumentParser:
    """The options of the commands where the target writes text (regenerate, self-prompt):
    --target, --device, --dtype, --system-prompt, --no-progress."""
    p = argparse.ArgumentParser(add_help=False, parents=[
        target_option(target_note), device_option(), dtype_option(), no_progress_option()])
    p.add_argument("--system-prompt", default=None, help="system message (default: template's)")
    return p


def scale_options() -> argparse.ArgumentParser:
    """--device-map and --dist-timeout: the options of the stages that run a target on many
    GPUs (extract, regenerate, self-prompt)."""
    from eagle3lab.data.stagerun import DEFAULT_TIMEOUT_S
    from eagle3lab.target.adapter import DEVICE_MAPS

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--device-map", choices=DEVICE_MAPS, default=None,
                   help="spread the target's layers over the visible GPUs with accelerate's "
                   "device map (a target larger than one GPU; instead of --device). Under "
                   "torchrun each rank takes its own GPU (--device cuda or auto) or, with a "
                   "device map, an equal group of its node's GPUs")
    p.add_argument("--dist-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help="under torchrun: seconds a rank waits for the others (at the end of "
                   "its share) before the job fails (default: %(default)g)")
    return p


def server_options() -> argparse.ArgumentParser:
    """--server, --api, --concurrency, --server-model, --retries: the options of the data
    stages a running server can generate for (regenerate, self-prompt)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("generation through a server")
    g.add_argument("--server", default=None, metavar="URL",
                   help="a running server that generates (e.g. http://127.0.0.1:30000); "
                   "the target's weights are not loaded here")
    g.add_argument("--api", choices=("sglang", "openai"), default="sglang",
                   help="sglang: native /generate with input_ids (SGLang, eagle3lab serve); "
                   "openai: /v1/completions with token ids and return_token_ids (vLLM)")
    g.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    g.add_argument("--server-model", default=None,
                   help="the name the server serves the target under, when it is not the "
                   "target's (checked against the server's model before writing)")
    g.add_argument("--retries", type=int, default=5,
                   help="retries per failed request (exponential backoff from 1 s)")
    return p
