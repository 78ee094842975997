"""The catalogue of known SGLang start-up messages and hang shapes, as data.

Prevents two opposite failures: a researcher chasing a harmless warning in a 2,000-line
log (DeepGemm scale format, import-error noise for models they never load), and a real
cause being missed in the same noise (the speculative max-running-requests reset, an
attention-backend fallback). Each entry is a regular expression over one log message and
a plain explanation; `HANG_CAUSES` names the likely cause and fix of a start that went
silent, keyed by the last start-up phase reached (phases: `eagle3lab.serverlogs.analyzer`).

Message texts were read from the SGLang source (sgl-project/sglang, python/sglang/srt/):
`configs/model_config.py` (DeepGemm scale_fmt), `arg_groups/overrides.py` (attention
backend), `arg_groups/speculative_hook.py` (max running requests, draft tokens),
`models/registry.py` (import-error noise), `server_args.py` (deprecated flags),
`entrypoints/http_server.py` (/get_server_info deprecation), and from public SGLang logs.
"""

from __future__ import annotations

import re
from typing import Any

#: id -> (pattern over one log message, severity, plain explanation). Order = display order.
KNOWN_WARNINGS: list[dict[str, str]] = [
    {
        "id": "deepgemm-scale-fmt",
        "pattern": r"DeepGemm is enabled but the scale_fmt of checkpoint is not ue8m0",
        "severity": "info",
        "explanation": "The FP8 checkpoint stores its block scales as float32, not in the "
        "ue8m0 (power-of-two) format DeepGemm prefers on Blackwell. Loading works; on "
        "Blackwell GPUs numerics may differ slightly. Harmless for a drafter experiment; "
        "irrelevant on Hopper and for bf16/fp32 models.",
    },
    {
        "id": "attention-backend-default",
        "pattern": r"Attention backend not specified",
        "severity": "info",
        "explanation": "No --attention-backend was given, so SGLang picked its default for "
        "this GPU and model (named in the message). Normal. Pass --attention-backend "
        "explicitly only to compare backends or to work around a backend bug.",
    },
    {
        "id": "max-running-requests-reset",
        "pattern": r"Max running requests is reset to \d+ for speculative decoding",
        "severity": "warning",
        "explanation": "With speculative decoding SGLang caps concurrent requests (48 by "
        "default) because every request carries draft tokens and a verify tree. Throughput "
        "at high concurrency is then limited by this cap, not by the drafter; set "
        "--max-running-requests explicitly when benchmarking at large batch.",
    },
    {
        "id": "draft-tokens-adjusted",
        "pattern": r"speculative_num_draft_tokens is adjusted to speculative_num_steps \+ 1",
        "severity": "info",
        "explanation": "With --speculative-eagle-topk 1 the draft is a chain, so SGLang "
        "forces --speculative-num-draft-tokens to steps + 1 whatever you passed. The "
        "launch config already does this.",
    },
    {
        "id": "import-error-noise",
        "pattern": r"Ignore import error when loading sglang\.srt\.(?:models|multimodal|dllm)",
        "severity": "info",
        "explanation": "SGLang imports every model class it ships at start-up; classes whose "
        "optional dependencies are missing are skipped with this message. Harmless unless "
        "the module named is the architecture you are serving (then install its dependency).",
    },
    {
        "id": "disable-cuda-graph-deprecated",
        "pattern": r"'--disable-cuda-graph' is deprecated",
        "severity": "info",
        "explanation": "Newer SGLang releases spell this --cuda-graph-backend-{decode,"
        "prefill}=disabled; the old flag still works. CUDA graphs are off, so decode is "
        "slower than a production launch (fine for debugging a hang).",
    },
    {
        "id": "generation-config-missing",
        "pattern": r"Failed to load generation config",
        "severity": "info",
        "explanation": "The model (often the draft) has no generation_config.json; SGLang "
        "falls back to defaults. Harmless for a drafter.",
    },
    {
        "id": "deep-gemm-missing",
        "pattern": r"Failed to import deep_gemm",
        "severity": "info",
        "explanation": "The optional DeepGemm kernels are not installed, so SGLang uses its "
        "other FP8 GEMM kernels. Harmless for bf16 models.",
    },
    {
        "id": "server-info-deprecated",
        "pattern": r"Endpoint '/get_server_info' is deprecated",
        "severity": "info",
        "explanation": "The benchmark client reads /get_server_info for "
        "avg_spec_accept_length; newer SGLang serves the same data at /server_info. "
        "Harmless.",
    },
    {
        "id": "sigquit-from-child",
        "pattern": r"Received sigquit from a child process",
        "severity": "error",
        "explanation": "A scheduler or detokenizer subprocess died and told the launcher. "
        "The real error is the traceback printed just before, usually with a TPn tag.",
    },
]

#: phase reached last -> (likely cause, fix). Phases come from `analyzer.PHASES`.
HANG_CAUSES: dict[str, tuple[str, str]] = {
    "launch": (
        "NCCL deadlock at start: the ranks never finished their first collective (GPUs at "
        "0% utilisation, processes sleeping, log silent after the config warnings).",
        "Check the NCCL environment (NCCL_P2P_DISABLE, NCCL_IB_DISABLE, NCCL_SOCKET_IFNAME, "
        "NCCL_DEBUG=INFO to see where it stops) and that every GPU is visible; try "
        "--disable-cuda-graph and --tp 1 to isolate."),
    "init-distributed": (
        "NCCL deadlock at start: torch.distributed initialisation never completed.",
        "Check the NCCL environment (NCCL_P2P_DISABLE=1, NCCL_IB_DISABLE=1, "
        "NCCL_SOCKET_IFNAME, NCCL_DEBUG=INFO); check that no other job holds the GPUs or the "
        "port; try --disable-cuda-graph and --tp 1."),
    "load-weights": (
        "Weight loading is stuck or very slow (network or slow disk, or a rank waiting on "
        "another in a collective after loading).",
        "Check disk/network throughput and free memory; with --tp > 1 read every rank's "
        "lines (TPn tags): the silent rank is the stuck one; set NCCL_DEBUG=INFO."),
    "weights-loaded": (
        "Stuck between weight loading and KV-cache allocation: usually a collective "
        "(NCCL) among ranks, or the draft model loading.",
        "Set NCCL_DEBUG=INFO; check the draft path and its config; try --disable-cuda-graph."),
    "kv-cache": (
        "Stuck after KV-cache allocation, before or during CUDA-graph capture.",
        "Lower --cuda-graph-max-bs (--cuda-graph-max-bs-decode on SGLang >= 0.5.15; for "
        "example 8) or pass --disable-cuda-graph; lower "
        "--mem-fraction-static if memory is tight."),
    "cuda-graph-capture": (
        "CUDA-graph capture hung (capture with many batch sizes, speculative draft graphs, "
        "or an NCCL collective inside capture).",
        "Lower --cuda-graph-max-bs (--cuda-graph-max-bs-decode on SGLang >= 0.5.15; for "
        "example 8) or pass --disable-cuda-graph; with --tp > 1 also check the NCCL "
        "environment."),
    "cuda-graph-captured": (
        "Stuck after CUDA-graph capture, before the HTTP server came up (the draft worker's "
        "own capture or warm-up).",
        "Pass --disable-cuda-graph to see whether capture is involved; lower "
        "--cuda-graph-max-bs."),
    "http-server": (
        "The HTTP server is up but the warm-up request never finished: the scheduler is "
        "wedged (note /health can keep answering while it is).",
        "Dump stacks (done), check the scheduler's stack for an NCCL wait or a kernel "
        "compile; try --disable-cuda-graph."),
    "ready": (
        "The server was ready and then went silent: idle (normal) or wedged under load.",
        "Send a request; if it never returns, dump stacks and restart with "
        "--disable-cuda-graph."),
}

_COMPILED = [(w, re.compile(w["pattern"])) for w in KNOWN_WARNINGS]


def match_warning(message: str) -> dict[str, str] | None:
    """The catalogue entry whose pattern matches this log message, or None."""
    for entry, rx in _COMPILED:
        if rx.search(message):
            return entry
    return None


class WarningTally:
    """Counts catalogue matches over a log; keeps the first matching line of each."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, Any]] = {}

    def feed(self, message: str, lineno: int) -> None:
        entry = match_warning(message)
        if entry is None:
            return
        item = self._seen.get(entry["id"])
        if item is None:
            self._seen[entry["id"]] = {
                "id": entry["id"], "match": message.strip(), "line": lineno,
                "severity": entry["severity"], "explanation": entry["explanation"],
                "count": 1}
        else:
            item["count"] += 1

    def items(self) -> list[dict[str, Any]]:
        order = {w["id"]: i for i, w in enumerate(KNOWN_WARNINGS)}
        return sorted((dict(v) for v in self._seen.values()), key=lambda d: order[d["id"]])


def hang_cause(phase: str | None) -> tuple[str, str]:
    """(likely cause, fix) for a start that went silent in `phase`."""
    return HANG_CAUSES.get(phase or "launch", HANG_CAUSES["launch"])
