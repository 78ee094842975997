"""The live-server notebook's arms: a baseline server (target only) and, when it can run,
a speculative one with the same launch settings.

Prevents a speed-up measured between servers that differ in more than speculation (both
arms share engine, target, tensor parallelism, CUDA graphs, device, dtype, threads,
environment and extra arguments; ports are picked free so a stale server never answers),
an arm that silently goes missing (when the speculative arm cannot run, no draft given, a
note says why), and a live speed-up measured in a slow configuration (`live_config`: the
reference server runs in the machine's fastest configuration when asked for "auto", as
notebook 05's speed section does; a live arm in float32 read x0.73 where the offline fast
configuration read x1.65 on the same machine).
"""

from __future__ import annotations

from typing import Any

from eagle3lab.engines.argv import LaunchConfig
from eagle3lab.errors import UserError

#: Dtypes the reference server takes (`eagle3lab serve --dtype`).
REFERENCE_DTYPES = ("float32", "bfloat16", "float16")


def live_config(*, engine: str, dtype: str = "float32", threads: int = 0,
                device: str = "auto", cuda_graph: bool = True) -> dict[str, Any]:
    """What both arms run in. The reference server: `dtype` ("auto": the machine's fastest,
    `fastest_cpu_dtype()` on a CPU (bfloat16 where the CPU has native bf16), bfloat16 on a
    GPU) and, on a CPU, `threads` torch threads (0: torch's default); SGLang and vLLM run
    their own defaults (bf16, CUDA graphs unless `cuda_graph` is off). Returns dtype and
    threads (None where the engine decides), `args` (the reference server's flags; none
    for float32 on torch's default threads, its defaults), `label` (for tables) and
    `fastest`: whether this is the machine's fastest configuration (on a CPU: the fastest
    dtype on one thread, as notebook 05's speed section measures it)."""
    if engine != "reference":
        return {"dtype": None, "threads": None, "args": [], "fastest": bool(cuda_graph),
                "label": f"{engine} defaults" + ("" if cuda_graph else ", no CUDA graphs")}
    if dtype != "auto" and dtype not in REFERENCE_DTYPES:
        raise UserError(f"dtype={dtype!r}: the reference server takes auto (the machine's "
                        f"fastest), {', '.join(REFERENCE_DTYPES)}.")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise UserError(f"threads={threads!r}: give a whole number of torch threads per "
                        f"server, 0 for torch's default.")
    import torch

    # lazy: a test patches eagle3lab.specdec.accept.fastest_cpu_dtype
    from eagle3lab.specdec.accept import fastest_cpu_dtype

    cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    best = fastest_cpu_dtype() if cpu else "bfloat16"
    chosen = best if dtype == "auto" else dtype
    args = [] if chosen == "float32" else ["--dtype", chosen]
    if not cpu:
        return {"dtype": chosen, "threads": None, "args": args, "fastest": chosen == best,
                "label": f"{chosen}, {device}"}
    args += ["--threads", str(threads)] if threads else []
    return {"dtype": chosen, "threads": threads or None, "args": args,
            "fastest": chosen == best and threads == 1,
            "label": f"{chosen}, {threads} thread(s)" if threads
            else f"{chosen}, torch's default threads"}


def plan_arms(*, engine: str, target: str, draft: str | None, steps: int = 3, topk: int = 1,
              draft_tokens: int | None = None, tp: int = 1, cuda_graph: bool = True,
              device: str = "auto", env: dict[str, str] | None = None,
              extra_args: list[str] | None = None, dtype: str = "float32",
              threads: int = 0) -> tuple[dict, list[str]]:
    """The notebook's arms: `baseline` (no draft) and, when a draft is given, `speculative`;
    plus notes saying why an arm is skipped. Ports are picked free. dtype / threads: the
    reference server's (`live_config`; "auto": the machine's fastest), the same for both."""
    run_in = live_config(engine=engine, dtype=dtype, threads=threads, device=device,
                         cuda_graph=cuda_graph)
    common = dict(engine=engine, target=target, tp=tp, cuda_graph=cuda_graph, port=0,
                  device=device, env=dict(env or {}),
                  extra_args=list(extra_args or []) + run_in["args"])
    arms = {"baseline": LaunchConfig(**common)}
    notes = []
    if not draft:
        notes.append("No draft checkpoint given (parameter `draft`): the speculative arm is "
                     "skipped and only the baseline runs. Set `draft` to an EAGLE-3 "
                     "checkpoint directory to compare.")
        return arms, notes
    arms["speculative"] = LaunchConfig(**common, draft=draft, steps=steps, topk=topk,
                                       draft_tokens=draft_tokens or None)
    return arms, notes
