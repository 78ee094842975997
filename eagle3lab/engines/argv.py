"""A typed launch config -> the exact command line of SGLang, vLLM or eagle3lab serve.

Prevents the launch failures that cost a GPU node minutes each and that a config can rule
out before any process starts: a flag misspelt or spelt for another release (each argv
item is written here, from the engines' own argument code; SGLang's renamed
`--cuda-graph-max-bs` picked by the release the argv is for), a chain draft whose
`--speculative-num-draft-tokens` SGLang silently overrides (with topk 1 it is forced to
steps + 1 by SGLang's server_args.py), a vLLM tree or an SGLang-only flag given to vLLM,
and a typo in a config key (`LaunchConfig` is strict). The launcher
(eagle3lab/serving/launch.py) starts it; preflight judges the same argv.
"""

from __future__ import annotations

import json
import sys
from typing import ClassVar, Literal

from pydantic import Field

from eagle3lab.config import StrictConfig
from eagle3lab.engines.versions import PINNED_SGLANG, installed_sglang_version, version_tuple

#: SGLang renamed --cuda-graph-max-bs to --cuda-graph-max-bs-decode (0.5.15 has the new
#: name; 0.5.23 rejects the old one as ambiguous). (first release with the name, flag).
CUDA_GRAPH_MAX_BS_FLAGS = [((0, 5, 15), "--cuda-graph-max-bs-decode"),
                           ((0, 0, 0), "--cuda-graph-max-bs")]


class LaunchConfig(StrictConfig):
    WHERE: ClassVar[str] = "launch config"

    target: str = Field(min_length=1, description="target model: HF directory (sglang) or "
                        "directory/preset name (reference)")
    draft: str | None = Field(None, description="EAGLE-3 draft checkpoint; None serves "
                              "without speculation")
    engine: Literal["sglang", "vllm", "reference"] = Field(
        "sglang", description="vllm: `python -m vllm.entrypoints.cli.main serve` (= `vllm serve`); "
        "reference: eagle3lab serve (CPU)")
    tp: int = Field(1, ge=1, description="tensor parallel size (sglang --tp-size); reference: "
                    "must be 1")
    speculative_algorithm: str = Field("EAGLE3", description="used only with a draft")
    steps: int = Field(3, ge=1, description="--speculative-num-steps: draft forward passes "
                       "per verify")
    topk: int = Field(1, ge=1, description="--speculative-eagle-topk: 1 = chain drafting")
    draft_tokens: int | None = Field(None, description="--speculative-num-draft-tokens; "
                                     "None: steps + 1")
    cuda_graph: bool = Field(True, description="False adds --disable-cuda-graph (debugging a "
                             "hang)")
    cuda_graph_max_bs: int | None = Field(None, description="lower it when CUDA-graph capture "
                                          "hangs or OOMs")
    max_running_requests: int | None = Field(None, description="SGLang resets it to 48 with "
                                             "speculation")
    host: str = Field("127.0.0.1", description="anything else makes the server reachable "
                      "from outside")
    port: int = Field(30000, ge=0, le=65535, description="0: pick a free port at start()")
    device: str = Field("auto", description="reference engine only: cpu, cuda or auto")
    extra_args: list[str] = Field(default_factory=list, description="appended verbatim, one "
                                  "argv item each")
    env: dict[str, str] = Field(default_factory=dict, description="e.g. NCCL_DEBUG: INFO")
    python: str | None = Field(None, description="interpreter that runs the server; None: "
                               "this one")
    sglang_version: str | None = Field(None, description="release the argv is for; None: "
                                       "installed/pinned")

    def check(self, where: str) -> None:
        if self.engine == "reference" and self.tp != 1:
            raise ValueError(f"tp={self.tp}; expected 1 for the reference engine (one "
                             f"process, one device)")
        if self.draft and self.topk == 1 and self.draft_tokens not in (None, self.steps + 1):
            raise ValueError(
                f"draft_tokens={self.draft_tokens} with topk=1: a chain verifies steps + 1 = "
                f"{self.steps + 1} tokens and SGLang overrides the value silently. Set "
                f"draft_tokens to {self.steps + 1} or leave it None")
        if self.engine == "vllm" and self.draft and self.topk != 1:
            raise ValueError(f"topk={self.topk} with engine vllm: vLLM's EAGLE-3 drafts a "
                             f"chain of num_speculative_tokens (= steps); set topk 1 (a "
                             f"tree needs speculative_token_tree in extra_args' config)")
        if self.engine == "vllm" and self.cuda_graph_max_bs is not None:
            raise ValueError("cuda_graph_max_bs is SGLang's flag; for vLLM pass your "
                             "release's capture-size flag in extra_args")
        if self.draft and self.topk > 1 and self.draft_tokens is None:
            raise ValueError("topk > 1 (tree drafting) needs draft_tokens, the number of tree "
                             "nodes verified per step (e.g. 8 or 16)")

    @property
    def effective_draft_tokens(self) -> int | None:
        if not self.draft:
            return None
        return self.steps + 1 if self.topk == 1 else self.draft_tokens

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def to_argv(self) -> list[str]:
        """The exact command line (the interpreter first)."""
        py = self.python or sys.executable
        if self.engine == "reference":
            argv = [py, "-m", "eagle3lab", "serve", "--target", self.target,
                    "--host", self.host, "--port", str(self.port), "--device", self.device]
            if self.draft:
                argv += ["--draft", self.draft, "--steps", str(self.steps), "--topk",
                         str(self.topk), "--draft-tokens", str(self.effective_draft_tokens)]
            return argv + list(self.extra_args)
        if self.engine == "vllm":
            return self._vllm_argv(py)
        argv = [py, "-m", "sglang.launch_server", "--model-path", self.target,
                "--tp-size", str(self.tp), "--host", self.host, "--port", str(self.port)]
        if self.draft:
            argv += ["--speculative-algorithm", self.speculative_algorithm,
                     "--speculative-draft-model-path", self.draft,
                     "--speculative-num-steps", str(self.steps),
                     "--speculative-eagle-topk", str(self.topk),
                     "--speculative-num-draft-tokens", str(self.effective_draft_tokens)]
        if not self.cuda_graph:
            argv.append("--disable-cuda-graph")
        if self.cuda_graph_max_bs is not None:
            argv += [_cuda_graph_max_bs_flag(self.sglang_version), str(self.cuda_graph_max_bs)]
        if self.max_running_requests is not None:
            argv += ["--max-running-requests", str(self.max_running_requests)]
        return argv + list(self.extra_args)


    def _vllm_argv(self, py: str) -> list[str]:
        """`python -m vllm.entrypoints.cli.main serve T ...`: the `vllm` script's own module
        (vllm-0.25.1.dist-info/entry_points.txt), run by `py`, so an install without
        scripts beside the interpreter (`pip install --target`, docs/vllm.md) works too.
        Flags from vllm/engine/arg_utils.py `EngineArgs`: --tensor-parallel-size,
        --speculative-config as JSON with method, model, num_speculative_tokens
        (vllm/config/speculative.py), --enforce-eager, --max-num-seqs; host/port from
        vllm/entrypoints/openai/cli_args.py."""
        argv = [py, "-m", "vllm.entrypoints.cli.main", "serve", self.target, "--host",
                self.host, "--port", str(self.port), "--tensor-parallel-size", str(self.tp)]
        if self.draft:
            argv += ["--speculative-config", json.dumps({
                "method": "eagle3", "model": self.draft,
                "num_speculative_tokens": self.steps})]
        if not self.cuda_graph:
            argv.append("--enforce-eager")
        if self.max_running_requests is not None:
            argv += ["--max-num-seqs", str(self.max_running_requests)]
        return argv + list(self.extra_args)


def _cuda_graph_max_bs_flag(version: str | None) -> str:
    v = version_tuple(version or installed_sglang_version() or PINNED_SGLANG)
    return next(flag for first, flag in CUDA_GRAPH_MAX_BS_FLAGS if v >= first)
