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


def shipped_drafter(*, sglang: bool = False) -> Path:
    """The drafter shipped for the default target (data/drafters/smollm2-135m-instruct: the
    study's winner, normed, TTT 3, vLLM only), or with `sglang` the SGLang-servable one
    (data/drafters/smollm2-135m-instruct-sglang: no norms, TTT 5)."""
    from eagle3lab.config import DEFAULT_TARGET
    from eagle3lab.workdir import SGLANG_SUFFIX, drafters_dir

    return drafters_dir() / (DEFAULT_TARGET + (SGLANG_SUFFIX if sglang else ""))


def shipped_copy(dst: Path, *, config=None, state=None, sidecar: bool = True,
                 sglang: bool = False) -> Path:
    """A copy of the shipped drafter (`sglang`: the SGLang-servable one) with a planted fault:
    `config` edits config.json (a dict, in place), `state` the tensors (the edited tensors
    are written to a new file); otherwise model.safetensors is a symlink to the shipped file,
    which is never written. `sidecar`: keep its training record (eagle3lab.json)."""
    src = shipped_drafter(sglang=sglang)
    dst.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    if config is not None:
        config(cfg)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    if sidecar:
        shutil.copy(src / "eagle3lab.json", dst / "eagle3lab.json")
    if state is None:
        (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    else:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(src / "model.safetensors"))
        state(tensors)
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def hub_cache(monkeypatch, root: Path):
    """An empty Hugging Face cache under `root` for this test; returns `add(repo_id,
    config_dir)`, which caches that directory's config.json as repo_id's."""
    import huggingface_hub.constants as c

    cache = root / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))

    def add(repo_id: str, config_dir: Path) -> None:
        repo = cache / ("models--" + repo_id.replace("/", "--"))
        (repo / "snapshots" / "abc123").mkdir(parents=True)
        shutil.copy(Path(config_dir) / "config.json", repo / "snapshots" / "abc123")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("abc123")

    return add
