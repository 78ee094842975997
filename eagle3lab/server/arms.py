"""The live-server notebook's arms: a baseline server (target only) and, when it can run,
a speculative one with the same launch settings.

Prevents a speed-up measured between servers that differ in more than speculation (both
arms share engine, target, tensor parallelism, CUDA graphs, device, environment and extra
arguments; ports are picked free so a stale server never answers), and an arm that
silently goes missing: when the speculative arm cannot run (no draft given) a note
says why.
"""

from __future__ import annotations


def plan_arms(*, engine: str, target: str, draft: str | None, steps: int = 3, topk: int = 1,
              draft_tokens: int | None = None, tp: int = 1, cuda_graph: bool = True,
              device: str = "auto", env: dict[str, str] | None = None,
              extra_args: list[str] | None = None) -> tuple[dict, list[str]]:
    """The notebook's arms: `baseline` (no draft) and, when a draft is given, `speculative`; plus notes saying why an arm is skipped. Ports are picked free."""
    from eagle3lab.server.launch import LaunchConfig

    common = dict(engine=engine, target=target, tp=tp, cuda_graph=cuda_graph, port=0,
                  device=device, env=dict(env or {}), extra_args=list(extra_args or []))
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
