"""Helpers of the preflight tests: config-only targets under other classes, copies of the
fixture drafters with planted faults, and launch commands for each engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def target_like(pf, path: Path, *, architectures: list[str], text_config: bool = False,
                **text_overrides) -> Path:
    """A config-only target with the tiny target's shapes under another class (optionally
    nested in text_config, as multimodal checkpoints do)."""
    cfg = json.loads((pf["target"] / "config.json").read_text())
    cfg.update(text_overrides)
    path.mkdir(parents=True, exist_ok=True)
    if text_config:
        text = {k: v for k, v in cfg.items() if k != "architectures"}
        cfg = {"architectures": architectures, "model_type": "multimodal-wrapper",
               "text_config": text}
    else:
        cfg["architectures"] = architectures
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path


def copy_draft(pf, kind: str, dst: Path) -> Path:
    return Path(shutil.copytree(pf[kind], dst))


def sglang_cmd(target, draft, *extra: str, steps: int = 3, topk: int = 1,
               draft_tokens: int | None = 4) -> list[str]:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", str(target),
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk)]
    if draft_tokens is not None:
        argv += ["--speculative-num-draft-tokens", str(draft_tokens)]
    return argv + list(extra)


def vllm_cmd(target, draft, *extra: str, k: int = 3) -> list[str]:
    sc = json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": k})
    return ["vllm", "serve", str(target), "--speculative-config", sc, *extra]
