"""SGLang's own benchmark request function, taken from the installed sglang's source.

`sglang.benchmark.serving` does not import on this CPU machine (it pulls in triton and
torchvision through sglang.srt), so the definitions the native-API client needs
(`RequestFuncInput`, `RequestFuncOutput`, `_create_bench_client_session`,
`get_auth_headers`, `get_request_headers`, `_record_server_prompt_len`,
`async_request_sglang_generate`, `_ROUTING_KEY_HEADER`) are read from
sglang/benchmark/serving.py with `ast` and executed as written, with the module-level
`args` it reads set here. The request payload and the SSE parsing under test are SGLang's
code, not a copy.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
from pathlib import Path

NAMES = {"RequestFuncInput", "RequestFuncOutput", "_create_bench_client_session",
         "get_auth_headers", "get_request_headers", "_record_server_prompt_len",
         "async_request_sglang_generate", "_ROUTING_KEY_HEADER"}


def serving_source() -> Path:
    spec = importlib.util.find_spec("sglang")
    return Path(spec.origin).parent / "benchmark" / "serving.py"


def load_sglang_client(**arg_overrides):
    """The namespace holding SGLang's definitions; `args` as its CLI defaults would set
    them (stream on, ignore_eos on, greedy), overridable."""
    import asyncio
    import dataclasses
    import os
    import sys
    import time
    import traceback
    import typing

    import aiohttp
    import orjson

    tree = ast.parse(serving_source().read_text())
    keep = []
    for node in tree.body:
        name = getattr(node, "name", None)
        if name is None and isinstance(node, ast.Assign):
            name = getattr(node.targets[0], "id", None)
        if name in NAMES:
            keep.append(node)
    found = {getattr(n, "name", None) or n.targets[0].id for n in keep}
    missing = NAMES - found
    assert not missing, f"sglang/benchmark/serving.py no longer defines {missing}"
    args = argparse.Namespace(temperature=0.0, disable_ignore_eos=False, top_p=1.0,
                              disable_stream=False, return_logprob=False,
                              return_routed_experts=False, logprob_start_len=-1,
                              top_logprobs_num=0, token_ids_logprob=None, header=None,
                              cache_report=False)
    for k, v in arg_overrides.items():
        setattr(args, k, v)
    ns = {"__name__": "sglang_bench_client", "args": args, "aiohttp": aiohttp,
          "orjson": orjson, "time": time, "sys": sys, "os": os, "traceback": traceback,
          "asyncio": asyncio, "dataclass": dataclasses.dataclass,
          "field": dataclasses.field, "tqdm": None,
          **{k: getattr(typing, k) for k in ("Any", "Dict", "List", "Optional", "Union")}}
    code = compile(ast.Module(body=keep, type_ignores=[]), str(serving_source()), "exec")
    exec(code, ns)
    return ns
