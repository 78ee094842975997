"""`eagle3lab serve`'s own options, and the `LaunchConfig` an `eagle3lab serve --engine
vllm|sglang` command line means.

Prevents preflight judging another command than the one `eagle3lab serve` runs, without
preflight importing the CLI (an arrow up, which closed a circle through the launcher): the
options are defined once, here. The CLI adds them to its `serve` subcommand
(`add_serve_options`, beside its shared --target and --device); preflight parses an
`eagle3lab serve ...` command line with `serve_parser()`, which mirrors those two
(tests/engines/test_serve_args.py checks both parsers take the same options with the same
defaults), and judges `--engine vllm|sglang` by the argv of `launch_config(args)`, the
config the CLI starts.
"""

from __future__ import annotations

import argparse

from eagle3lab.config import DEFAULT_TARGET, TARGET_PRESETS, preset_dir
from eagle3lab.engines.argv import LaunchConfig
from eagle3lab.workdir import drafter_or_default


def add_serve_options(p: argparse.ArgumentParser) -> None:
    """Every option of `eagle3lab serve` but --target and --device (the CLI's shared ones)."""
    p.add_argument("--draft", default=None,
                   help="EAGLE-3 draft checkpoint (implies --speculative); without it and "
                   "without --speculative, plain decoding")
    p.add_argument("--speculative", action="store_true",
                   help="speculative decoding; without --draft, with the default drafter "
                   "(data/drafters/TARGET for a preset target, else the demo's trained one)")
    p.add_argument("--steps", type=int, default=3, help="draft steps per verify")
    p.add_argument("--topk", type=int, default=1, help="draft top-k (1 = chain)")
    p.add_argument("--draft-tokens", type=int, default=None,
                   help="tokens verified per step (default steps + 1 for a chain)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind; anything but loopback is reachable from outside")
    p.add_argument("--port", type=int, default=30000, help="port to listen on")
    p.add_argument("--served-model-name", default=None,
                   help="the model name /v1/models and /metrics report (default: --target, "
                   "as vLLM)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="reference server: the target's and drafter's dtype (float32 is "
                   "exact; bfloat16 is the fastest on CPUs with native bf16)")
    p.add_argument("--threads", type=int, default=0,
                   help="reference server on a CPU: torch threads (0: torch's default)")
    p.add_argument("--force", action="store_true",
                   help="serve even when the launch's preflight (eagle3lab preflight) finds "
                   "an error")
    g = p.add_argument_group(
        "a real engine (--engine vllm or sglang)",
        "Starts `python -m vllm.entrypoints.cli.main serve` (= `vllm serve`) or "
        "`python -m sglang.launch_server` with the target, the drafter (--draft, or the "
        "default one with --speculative), --steps/--topk/--draft-tokens, --host/--port, "
        "and every argument after `--` passed on verbatim; preflight judges the exact "
        "command first (an error refuses unless --force); the watchdog says ready, hung "
        "(with the likely cause) or crashed (with the traceback's last line); Ctrl-C or "
        "SIGTERM stops the whole process group. docs/vllm.md: vLLM 0.25.1 on an H200.")
    g.add_argument("--engine", choices=("reference", "vllm", "sglang"), default="reference",
                   help="reference: the CPU reference server; vllm / sglang: that engine, "
                   "which must import in --python's environment")
    g.add_argument("--python", default=None,
                   help="the interpreter that has the engine (default: this one)")
    g.add_argument("--no-cuda-graph", action="store_true",
                   help="vLLM --enforce-eager / SGLang --disable-cuda-graph (faster start, "
                   "slower decoding)")
    g.add_argument("--run-dir", default=None,
                   help="where the log (ENGINE.log), the launch record and the watchdog's "
                   "verdict go (default: data/runs/serve-ENGINE-TIMESTAMP)")
    g.add_argument("--start-timeout-s", type=float, default=900.0,
                   help="give up on a start that is still progressing after this long")
    g.add_argument("--silence-s", type=float, default=240.0,
                   help="a start with no new log line for this long (and an idle GPU) is "
                   "hung")
    g.add_argument("engine_args", nargs="*", metavar="-- ENGINE_ARGS",
                   help="arguments for the engine itself, after --, e.g. -- --dtype bfloat16 "
                   "--max-model-len 2048")



def serve_parser() -> argparse.ArgumentParser:
    """`eagle3lab serve`'s parser without the CLI: its options, --target and --device as
    the CLI defines them (cli/common.py), no --help."""
    p = argparse.ArgumentParser(prog="eagle3lab serve", add_help=False)
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--device", default="auto")
    add_serve_options(p)
    return p


def launch_config(args: argparse.Namespace) -> LaunchConfig:
    """The `LaunchConfig` of an `eagle3lab serve --engine vllm|sglang` command line (also
    what preflight judges for it): a preset target as its prepared directory, the drafter
    given or, with --speculative, the default one (for SGLang the SGLang-servable shipped
    drafter: the default one is normed, which SGLang refuses)."""
    target = str(preset_dir(args.target)) if args.target in TARGET_PRESETS else args.target
    draft = (str(drafter_or_default(args.draft, args.target, engine=args.engine))
             if args.speculative or args.draft else None)
    return LaunchConfig(engine=args.engine, target=target, draft=draft, steps=args.steps,
                        topk=args.topk, draft_tokens=args.draft_tokens, host=args.host,
                        port=args.port, cuda_graph=not args.no_cuda_graph,
                        python=args.python, extra_args=list(args.engine_args))
