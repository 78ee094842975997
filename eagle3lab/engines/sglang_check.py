"""Check an SGLang launch command with SGLang's own parser, on a machine without a GPU.

Prevents a launch that fails (or silently means something else) only after minutes of
start-up on a GPU node: a misspelt flag, a flag the installed SGLang renamed, a value of
the wrong type. `sglang.srt.server_args.prepare_server_args(argv)` parses and records the
command exactly as `python -m sglang.launch_server` will (sgl-project/sglang,
python/sglang/srt/server_args.py). Resolution against the checkpoint (`resolve_once`)
is not run: it reads the model and imports torchvision on 0.5.23.

Run in its own interpreter (stdlib only; it does not import eagle3lab, so the interpreter
that will run SGLang can run it), through runpy so that this directory does not land on
sys.path, where a module of ours could shadow one sglang imports
(`sglang_parser.check_argv_with_sglang`):
    python -c "import runpy; runpy.run_path('.../sglang_check.py', run_name='__main__')" \
        --model-path M --speculative-algorithm EAGLE3 ...
It prints one JSON line: {"status": "ok"|"invalid"|"unavailable", "reason", "parsed",
"stubbed", "messages"}.

sglang imports `triton` at module level (sglang/srt/utils/common.py) although parsing
never runs a kernel. On a CPU machine without triton (a ~1 GB wheel) this script puts a
stand-in `triton` module on the import path of this process only, and says so in
"stubbed"; with a real triton installed nothing is stubbed.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import sys
import types

#: ServerArgs fields reported back (when present in the installed release).
REPORTED = ("model_path", "tp_size", "host", "port", "speculative_algorithm",
            "speculative_draft_model_path", "speculative_num_steps",
            "speculative_eagle_topk", "speculative_num_draft_tokens", "disable_cuda_graph",
            "cuda_graph_max_bs", "max_running_requests", "device", "context_length",
            "dtype", "attention_backend", "trust_remote_code",
            "speculative_draft_model_revision", "revision", "quantization")


class _AnythingMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything

    def __getitem__(cls, item):
        return _Anything


class _Anything(metaclass=_AnythingMeta):
    """Stand-in for any triton object: callable, subscriptable, decorates as identity."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]
        return _Anything()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __getitem__(self, item):
        return _Anything()


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything


class _TritonStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "triton" or name.startswith("triton."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        m.__version__ = "0.0.0+eagle3lab-stub"
        return m

    def exec_module(self, module):
        pass


def check(argv: list[str]) -> dict:
    stubbed = []
    if importlib.util.find_spec("triton") is None:
        sys.meta_path.insert(0, _TritonStub())
        stubbed.append("triton")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            from sglang.srt.server_args import prepare_server_args
    except Exception as e:  # ImportError and whatever a half-installed sglang raises
        return {"status": "unavailable", "stubbed": stubbed, "parsed": None,
                "reason": f"cannot import sglang.srt.server_args: {type(e).__name__}: {e}",
                "messages": err.getvalue().splitlines()[-20:]}
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            args = prepare_server_args(list(argv))
    except SystemExit:  # argparse: the reason is on stderr
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {"status": "invalid", "stubbed": stubbed, "parsed": None,
                "reason": lines[-1] if lines else "argparse rejected the command",
                "messages": lines[-20:]}
    except Exception as e:
        return {"status": "invalid", "stubbed": stubbed, "parsed": None,
                "reason": f"{type(e).__name__}: {e}",
                "messages": err.getvalue().splitlines()[-20:]}
    parsed = {k: getattr(args, k) for k in REPORTED if hasattr(args, k)}
    return {"status": "ok", "stubbed": stubbed, "reason": None,
            "parsed": json.loads(json.dumps(parsed, default=str)),
            "messages": [ln for ln in err.getvalue().splitlines() if ln.strip()][-20:]}


def main(argv: list[str] | None = None) -> int:
    result = check(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
