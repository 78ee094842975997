"""bench/gpu_pipeline.py at tiny sizes on the CPU (the code path of the H200 runs):
self-prompt -> greedy answers -> concat -> extract -> vocab -> train -> pack; a second
call reuses every data stage and trains a second, `--train-lm-head` run beside the first
(without the acceptance stage, measured once by the first call)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_pipeline.py"
TINY = ["--device", "cpu", "--limit", "2", "--samples", "0", "--greedy-train",
        "--self-prompts", "2", "--self-prompt-batch", "4", "--self-prompt-tokens", "48",
        "--max-new-tokens", "8", "--epochs", "1", "--eval-limit", "1",
        "--max-tokens-per-batch", "256", "--accept-limit", "1", "--accept-tokens", "4",
        "--ttt-steps", "2"]


def _run(out: Path, *extra: str) -> dict[str, dict]:
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "--out", str(out), *TINY, *extra],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return {line[1:line.index("]")]: json.loads(line[line.index("]") + 2:])
            for line in r.stdout.splitlines() if line.startswith("[")}


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.full
def test_cpu_smoke(tmp_path, default_target_dir, real_target):
    import torch
    from safetensors.torch import load_file

    from eagle3lab.data.prompts import load_prompts
    from eagle3lab.formats.doctor import inspect_checkpoint
    from eagle3lab.specdec.engine import SpecEngine
    from eagle3lab.specdec.load import load_engine

    out = tmp_path / "gp"
    st = _run(out)
    assert st["self_prompt"]["prompts"] == 2 and len(load_prompts(out / "prompts" /
                                                                  "self.jsonl")) == 2
    assert st["concat"]["records"] == 4 and st["concat"]["rewritten"] is True
    assert st["train"]["status"] == "done"
    acc = json.loads((out / "accept-train.json").read_text())
    assert [r["settings"]["steps"] for r in acc] == [2, 3]
    assert st["accept"]["tau_2_steps"] >= 1.0 and st["accept"]["same_as_plain_2_steps"] == "1/1"
    packed = out / "drafter-train"
    w = load_file(str(packed / "model.safetensors"))
    assert "embed_tokens.weight" not in w and w["fc.weight"].dtype == torch.bfloat16
    report = inspect_checkpoint(packed, target=str(default_target_dir), engine="vllm")
    assert report.ok, report.to_json()
    assert isinstance(load_engine(target=real_target, draft=str(packed)), SpecEngine)

    # the second call checks reuse and --train-lm-head; the accept stage ran above
    st = _run(out, "--train-name", "lmhead", "--train-lm-head", "--accept-limit", "0")
    assert "accept" not in st
    assert st["regenerate_self"]["new_records"] == 0 and st["concat"]["rewritten"] is False
    assert st["extract_train"]["new_shards"] == 0
    run = json.loads((out / "lmhead" / "run.json").read_text())
    assert run["config"]["train_lm_head"] is True
    w2 = load_file(str(out / "drafter-lmhead" / "model.safetensors"))
    assert not torch.equal(w["lm_head.weight"], w2["lm_head.weight"])
    assert sorted(p.name for p in out.glob("summary-*.json")) == ["summary-all-lmhead.json",
                                                                  "summary-all-train.json"]
