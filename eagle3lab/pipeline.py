"""The demo pipeline on one run directory: target -> responses -> shards -> vocab map.

Each stage is skipped when its output is already complete (regeneration and extraction
resume themselves), so a second run takes seconds and an interrupted one continues.
Layout of a run directory (data/runs/default by default):
  responses/{train,eval}.jsonl (+ .meta.json)   regenerated conversations
  shards/{train,eval}/                           shards + manifest.json
  shards/train/vocab_map.safetensors             draft vocab map (train split only)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .config import DEFAULT_TARGET, runs_dir


def run_dir_paths(run_dir: str | Path) -> dict[str, Path]:
    run_dir = Path(run_dir)
    return {
        "run_dir": run_dir,
        "responses_train": run_dir / "responses" / "train.jsonl",
        "responses_eval": run_dir / "responses" / "eval.jsonl",
        "shards_train": run_dir / "shards" / "train",
        "shards_eval": run_dir / "shards" / "eval",
    }


def run_demo(
    *, run_dir: str | Path | None = None, target: str = DEFAULT_TARGET,
    train_prompts: int = 96, eval_prompts: int = 24, max_new_tokens: int = 160,
    batch_size: int = 16, draft_vocab_size: int = 8192, device: str = "auto",
    progress: bool = True,
) -> dict[str, Any]:
    """Prepare the target, regenerate train/eval responses, extract shards, build the map."""
    from .default_target import prepare_target
    from .config import TARGET_PRESETS
    from .extract import extract
    from .regenerate import regenerate
    from .target import load_target
    from .vocab import build_shard_vocab

    paths = run_dir_paths(run_dir or runs_dir() / "default")
    t0 = time.time()
    stages: dict[str, Any] = {}
    print(f"[1/4] target: {target}")
    if target in TARGET_PRESETS:
        prepare_target(name=target)
    tgt = load_target(target, device=device)
    for i, split, n in ((2, "train", train_prompts), (2, "eval", eval_prompts)):
        print(f"[{i}/4] regenerate {split}: {n} prompts, up to {max_new_tokens} new tokens each")
        stages[f"regenerate_{split}"] = regenerate(
            target=tgt, prompts=split, out=paths[f"responses_{split}"], limit=n,
            max_new_tokens=max_new_tokens, batch_size=batch_size, progress=progress)
    for split in ("train", "eval"):
        print(f"[3/4] extract {split}")
        stages[f"extract_{split}"] = extract(
            conversations=paths[f"responses_{split}"], out=paths[f"shards_{split}"],
            target=tgt, progress=progress)
    print(f"[4/4] draft vocab map ({draft_vocab_size} tokens) from the train shards")
    stages["vocab"] = build_shard_vocab(data=paths["shards_train"],
                                        draft_vocab_size=draft_vocab_size)
    stages["seconds"] = time.time() - t0
    stages["paths"] = {k: str(v) for k, v in paths.items()}
    return stages
