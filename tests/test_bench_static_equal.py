"""bench/static_equal.py on the CPU (the check a device session runs first on the GPU): the
static engine against the eager one, prompt by prompt, at a chain and a tree, greedy and
sampled; a planted difference is named; a tree asked to sample is skipped, not failed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "static_equal.py"


def _module():
    spec = importlib.util.spec_from_file_location("static_equal", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.full
def test_engines_agree_on_the_tiny_target(tiny_target_dir, tmp_path):
    from eagle3lab.formats.demo import make_speculators_draft

    draft = make_speculators_draft(tmp_path / "d", target=tiny_target_dir, draft_vocab=512)
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "--target", str(tiny_target_dir),
                        "--draft", str(draft), "--device", "cpu", "--limit", "3",
                        "--max-new-tokens", "8", "--batch-size", "2",
                        "--settings", "3,1,4", "2,3,6", "--temperature", "0", "0.9"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [x for x in r.stdout.splitlines() if x[:1].isdigit()]
    assert lines == ["3,1,4 temperature 0 (graphs off): equal 3/3",
                     "3,1,4 temperature 0 swapped back: equal 3/3",
                     "3,1,4 temperature 0.9 (graphs off): equal 3/3",
                     "3,1,4 temperature 0.9 swapped back: equal 3/3",
                     "2,3,6 temperature 0 (graphs off): equal 3/3",
                     "2,3,6 temperature 0 swapped back: equal 3/3",
                     "2,3,6 temperature 0.9: skipped (a tree is verified greedily only)"]


def test_first_difference_names_prompt_and_field():
    mod = _module()
    a = SimpleNamespace(output_ids=[1, 2], accept_histogram=[1, 1], verify_ct=2,
                        finish_reason="length", mismatches=[[0, [5], 6]])
    same = SimpleNamespace(**vars(a))
    other = SimpleNamespace(**{**vars(a), "mismatches": [[0, [5], 7]]})
    assert mod.first_difference([a, a], [same, same]) is None
    assert mod.first_difference([a, a], [same, other]) == "prompt 1: mismatches differs"
    assert mod.first_difference([a, a], [same]) == "1 results for 2 prompts"
