"""The user's real launch command -> what the engine will be asked to serve (`LaunchSpec`).

Prevents judging a launch other than the one that will run: the command line is read the
way each engine reads it, not re-typed by hand into another tool.
- SGLang (`python -m sglang.launch_server ...`, `sglang serve ...`): SGLang's own
  `prepare_server_args` checks the whole command where sglang imports
  (eagle3lab/engines/sglang_check.py, run by run.py); the fields preflight needs are read
  here by a small argparse mirroring SGLang 0.5.23's flags (sglang/srt/arg_groups/fields/:
  model.py `--model-path` alias `--model`, `--context-length`, `--dtype`,
  `--trust-remote-code`, `--revision`; spec.py `--speculative-algorithm`,
  `--speculative-draft-model-path` alias `--speculative-draft-model`,
  `--speculative-draft-model-revision`, `--speculative-num-steps`,
  `--speculative-eagle-topk`, `--speculative-num-draft-tokens`; parallel.py `--tp-size`
  alias `--tensor-parallel-size`; argparse's prefix matching makes `--tp` work, as in
  SGLang), with the values the user typed (SGLang may override some: checks.py says so).
- vLLM (`vllm serve MODEL ...`, `python -m vllm.entrypoints.cli.main serve MODEL ...` (the
  `vllm` script's module), `python -m vllm.entrypoints.openai.api_server ...`): vLLM
  cannot be installed here, so a small argparse mirrors the flags of vLLM 0.25.1's
  vllm/engine/arg_utils.py `EngineArgs.add_cli_args` (`--model`, `--tensor-parallel-size`
  / `-tp`, `--pipeline-parallel-size` / `-pp`, `--max-model-len`, `--dtype`,
  `--trust-remote-code`, `--speculative-config` / `-sc` as JSON),
  vllm/entrypoints/openai/cli_args.py (`--host`, `--port`) and
  vllm/entrypoints/cli/serve.py (the model as the positional `model_tag`); vLLM's
  FlexibleArgumentParser (vllm/utils) accepts `--flag_name` for `--flag-name`, so
  underscores are normalised. The speculative config keys read: `method`, `model`,
  `num_speculative_tokens`, `draft_tensor_parallel_size`, `max_model_len`
  (vllm/config/speculative.py `SpeculativeConfig`).
- Environment assignments before the command (`VLLM_USE_V2_MODEL_RUNNER=0 vllm serve ...`,
  `env A=B ...`) are kept in `flags["env"]`: vLLM 0.25.1 picks its model runner from one.
- `eagle3lab serve` (the reference server): the parser of its own options
  (eagle3lab/engines/serve_args.py, the one the CLI's `serve` is built from; the CLI itself
  is not imported); with `--engine vllm|sglang`, the engine command it starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from typing import Any

from eagle3lab.engines.serve_args import launch_config, serve_parser
from eagle3lab.errors import UserError


@dataclasses.dataclass
class LaunchSpec:
    engine: str  # sglang | vllm | reference
    argv: list[str]
    target: str | None
    draft: str | None
    algorithm: str | None  # EAGLE3 (SGLang's spelling), eagle3 (vLLM's method), ...
    steps: int | None  # draft steps per verify (vLLM: num_speculative_tokens)
    topk: int | None
    draft_tokens: int | None  # tokens verified per step as given (None: engine default)
    tp: int
    draft_tp: int | None
    context_length: int | None
    dtype: str | None
    flags: dict[str, Any]  # the other parsed values checks read (attention backend, ...)
    unknown: list[str]  # arguments the mirror does not know (the engine's parser judges them)

    @property
    def speculative(self) -> bool:
        return bool(self.draft) and (self.algorithm or "").lower() == "eagle3"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def split_command(command: str | list[str]) -> list[str]:
    """A command line as argv (a string is split like a POSIX shell; `\\` newlines go)."""
    if isinstance(command, str):
        return shlex.split(command.replace("\\\n", " "))
    return [str(a) for a in command]


def detect_engine(argv: list[str]) -> tuple[str, list[str]]:
    """(engine, the engine's own arguments) from a command line; UserError otherwise."""
    for i, tok in enumerate(argv):
        base = tok.rsplit("/", 1)[-1]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if tok == "sglang.launch_server":
            return "sglang", argv[i + 1:]
        if base == "sglang" and nxt == "serve":
            return "sglang", argv[i + 2:]
        if tok in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"):
            return "vllm", argv[i + 1:]
        if (base == "vllm" or tok == "vllm.entrypoints.cli.main") and nxt == "serve":
            return "vllm", argv[i + 2:]  # the `vllm` script, or its module (-m)
        if base == "eagle3lab" and nxt == "serve":
            return "reference", argv[i + 2:]
    shown = " ".join(argv[:6]) + (" ..." if len(argv) > 6 else "")
    raise UserError(
        f"Not a serving command preflight knows: {shown!r}. Pass the launch command after "
        f"`--`, e.g. `eagle3lab preflight -- python -m sglang.launch_server --model-path T "
        f"--speculative-algorithm EAGLE3 --speculative-draft-model-path D`, or `vllm serve T "
        f"--speculative-config '{{\"method\": \"eagle3\", \"model\": \"D\"}}'`.")


class _Parser(argparse.ArgumentParser):
    """argparse that raises UserError instead of exiting."""

    def error(self, message):
        raise UserError(f"The launch command does not parse: {message}.")


def _sglang_parser() -> _Parser:
    p = _Parser(add_help=False, prog="sglang.launch_server")
    p.add_argument("--model-path", "--model", dest="model_path")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model",
                   dest="draft")
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--context-length", type=int)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attention-backend")
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--trust-remote-code", action="store_true")
    return p


def _vllm_parser() -> _Parser:
    p = _Parser(add_help=False, prog="vllm serve")
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--model")
    p.add_argument("--tensor-parallel-size", "-tp", dest="tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", dest="pp", type=int, default=1)
    p.add_argument("--max-model-len", type=str)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--speculative-config", "-sc", dest="spec_config")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    return p


def _env_prefix(argv: list[str]) -> dict[str, str]:
    """NAME=VALUE assignments before the command (after an optional `env`)."""
    env: dict[str, str] = {}
    for tok in argv:
        if tok == "env":
            continue
        name, eq, value = tok.partition("=")
        if not eq or not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
            break
        env[name] = value
    return env


def _human_int(value: str | None, flag: str) -> int | None:
    """vLLM's --max-model-len also takes 1k/1K/32k style values."""
    if value is None:
        return None
    v = value.strip().lower()
    mult = {"k": 1000, "m": 1000 ** 2}.get(v[-1:], 1) if v[-1:] in "km" else 1
    try:
        return int(float(v[:-1] if mult > 1 else v) * mult)
    except ValueError:
        raise UserError(f"{flag} {value!r} is not a number.") from None


def parse_command(command: str | list[str]) -> LaunchSpec:
    """Parse a launch command (string or argv) for the engine it names."""
    argv = split_command(command)
    engine, args = detect_engine(argv)
    if engine == "sglang":
        ns, unknown = _sglang_parser().parse_known_args(args)
        return LaunchSpec(
            engine="sglang", argv=argv, target=ns.model_path, draft=ns.draft,
            algorithm=ns.speculative_algorithm, steps=ns.speculative_num_steps,
            topk=ns.speculative_eagle_topk, draft_tokens=ns.speculative_num_draft_tokens,
            tp=ns.tp_size, draft_tp=None, context_length=ns.context_length, dtype=ns.dtype,
            flags={"attention_backend": ns.attention_backend,
                   "max_running_requests": ns.max_running_requests,
                   "disable_cuda_graph": ns.disable_cuda_graph,
                   "trust_remote_code": ns.trust_remote_code},
            unknown=unknown)
    if engine == "vllm":
        args = [a.split("=", 1)[0].replace("_", "-") + ("=" + a.split("=", 1)[1] if "=" in a
                                                        else "")
                if a.startswith("--") else a for a in args]
        ns, unknown = _vllm_parser().parse_known_args(args)
        sc = _speculative_config(ns.spec_config)
        return LaunchSpec(
            engine="vllm", argv=argv, target=ns.model or ns.model_tag, draft=sc.get("model"),
            algorithm=sc.get("method"), steps=sc.get("num_speculative_tokens"), topk=1,
            draft_tokens=None, tp=ns.tp, draft_tp=sc.get("draft_tensor_parallel_size"),
            context_length=_human_int(ns.max_model_len, "--max-model-len"), dtype=ns.dtype,
            flags={"speculative_config": sc, "trust_remote_code": ns.trust_remote_code,
                   "pipeline_parallel_size": ns.pp, "env": _env_prefix(argv)},
            unknown=unknown)
    try:
        ns = serve_parser().parse_args(args)
    except SystemExit:  # argparse printed why
        raise UserError(f"The eagle3lab serve command does not parse: {' '.join(args)!r} "
                        f"(eagle3lab serve --help lists its options).") from None
    if ns.engine != "reference":
        # `eagle3lab serve --engine vllm|sglang`: judge the engine command it starts
        return dataclasses.replace(parse_command(launch_config(ns).to_argv()), argv=argv)
    return LaunchSpec(
        engine="reference", argv=argv, target=ns.target, draft=ns.draft,
        algorithm="EAGLE3" if (ns.draft or ns.speculative) else None, steps=ns.steps,
        topk=ns.topk, draft_tokens=ns.draft_tokens, tp=1, draft_tp=None, context_length=None,
        dtype=None, flags={"speculative": ns.speculative, "device": ns.device}, unknown=[])


def json_object_flag(flag: str, text: str | None, example: str,
                     consequence: str = "") -> dict[str, Any]:
    """A launch flag's JSON-object value ({} when the flag is absent); not JSON, or not an
    object, is one line naming the flag, what the engine does with it (`consequence`, e.g.
    ": the engine refuses the command"), and how to quote it."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{flag} {text!r} is not valid JSON ({e.msg} at column {e.colno})"
                        f"{consequence}. Quote it for the shell: {flag} '{example}'.") from None
    if not isinstance(value, dict):
        raise UserError(f"{flag} must be a JSON object, not {text!r}{consequence}.")
    return value


def _speculative_config(text: str | None) -> dict[str, Any]:
    return json_object_flag("--speculative-config", text, '{"method": "eagle3", ...}')
