"""`eagle3lab serve`'s options defined once (eagle3lab/engines/serve_args.py): the CLI's
`serve` and preflight's parser take the same options with the same defaults, and preflight
reads an `eagle3lab serve ...` command, `--engine vllm` included, without the CLI."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3lab.cli import serve
from eagle3lab.config import TARGET_PRESETS, preset_dir
from eagle3lab.engines.serve_args import launch_config, serve_parser

REPO = Path(__file__).resolve().parents[2]


def _options(p: argparse.ArgumentParser) -> dict:
    return {a.dest: (tuple(a.option_strings), a.default, a.type, a.choices, a.nargs,
                     type(a).__name__)
            for a in p._actions if not isinstance(a, argparse._HelpAction)}


def _cli_serve() -> argparse.ArgumentParser:
    """The CLI's `serve` subcommand, registered as `eagle3lab.cli` registers it."""
    sub = argparse.ArgumentParser(prog="eagle3lab").add_subparsers()
    serve.add_parser(sub)
    return sub.choices["serve"]


def test_the_cli_and_preflight_parse_serve_with_the_same_options():
    cli, own = _options(_cli_serve()), _options(serve_parser())
    assert cli == own
    assert {"target", "device", "engine", "engine_args", "draft", "speculative"} <= set(own)


@pytest.mark.parametrize("argv", [
    [],
    ["--target", "T", "--draft", "D", "--steps", "2", "--topk", "1", "--draft-tokens", "3"],
    ["--engine", "vllm", "--target", "/m/T", "--draft", "/d", "--no-cuda-graph", "--port",
     "0", "--python", "/usr/bin/python3", "--", "--dtype", "bfloat16", "--max-model-len", "2k"],
    ["--engine", "sglang", "--speculative", "--run-dir", "r", "--silence-s", "5"],
])
def test_both_parsers_read_a_command_alike(argv):
    cli = vars(_cli_serve().parse_args(argv))
    cli.pop("func")
    assert cli == vars(serve_parser().parse_args(argv))


def test_launch_config_of_an_engine_command(tmp_path):
    ns = serve_parser().parse_args(["--engine", "vllm", "--target", str(tmp_path), "--draft",
                                    "/d", "--steps", "2", "--no-cuda-graph", "--", "--x", "1"])
    cfg = launch_config(ns)
    assert (cfg.engine, cfg.target, cfg.draft, cfg.steps, cfg.cuda_graph, cfg.extra_args) == \
        ("vllm", str(tmp_path), "/d", 2, False, ["--x", "1"])
    preset = next(iter(TARGET_PRESETS))
    plain = launch_config(serve_parser().parse_args(["--engine", "sglang", "--target", preset]))
    assert plain.target == str(preset_dir(preset)) and plain.draft is None


def test_preflight_reads_eagle3lab_serve_without_importing_the_cli(tmp_path):
    code = (
        "import json, sys\n"
        "from eagle3lab.preflight.command import parse_command\n"
        f"s = parse_command(['eagle3lab', 'serve', '--engine', 'vllm', '--target', "
        f"{str(tmp_path)!r}, '--draft', '/d', '--steps', '2', '--', '--dtype', 'bfloat16'])\n"
        "print(json.dumps({'cli': sorted(m for m in sys.modules if m.startswith("
        "'eagle3lab.cli')), 'engine': s.engine, 'target': s.target, 'draft': s.draft, "
        "'steps': s.steps, 'dtype': s.dtype, 'argv0': s.argv[:2]}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True)
    got = json.loads(out.stdout)
    assert got == {"cli": [], "engine": "vllm", "target": str(tmp_path), "draft": "/d",
                   "steps": 2, "dtype": "bfloat16", "argv0": ["eagle3lab", "serve"]}
