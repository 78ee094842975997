"""bench/study_carry.py on a real git checkout laid out as the study's: each state leaves
exactly the files its device call needs (the launch: the packs, the ranker's weights, each
finished run without its curve), and refuses (rc 1, one line) what would not travel, would
stop the chain or would lose a change."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "study_carry.py"
STUDY = "data/studies/h200-grok"
SGLANG = "data/drafters/smollm2-135m-instruct-sglang"
KIB = 1024


def _write(root: Path, rel: str, size: int = KIB, text: str | None = None) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if text is not None:
        path.write_text(text)
    else:
        path.write_bytes(b"x" * size)


@pytest.fixture
def checkout(tmp_path):
    """A git checkout with the study's layout: code, packs, runs, partial sessions, both
    drafters, the shipped reference, one chunk folder (ignored, as .vllm is)."""
    root = tmp_path / "repo"
    root.mkdir()
    _write(root, "eagle3lab/__init__.py", 4 * KIB)
    _write(root, ".gitignore", text=".vllm/\n")
    _write(root, f"{STUDY}/packs/greedy-0.part01.npz", 300 * KIB)
    _write(root, f"{STUDY}/runs/data-100k-wd0.01-s0/run.json", text='{"status": "done"}')
    _write(root, f"{STUDY}/runs/data-100k-wd0.01-s0/metrics.jsonl", 100 * KIB)
    _write(root, f"{STUDY}/runs/data-100k-wd0.01-s0/live.json", text="{}")
    _write(root, f"{STUDY}/runs/data-400k-wd0.01-s0/run.json", text='{"status": "running"}')
    _write(root, f"{STUDY}/runs/data-400k-wd0.01-s0/metrics.jsonl", 10 * KIB)
    _write(root, f"{STUDY}/session-14/logs/chain.log", 200 * KIB)
    _write(root, "data/drafters/smollm2-135m-instruct/model.safetensors", 200 * KIB)
    _write(root, f"{SGLANG}/model.safetensors", 200 * KIB)
    _write(root, f"{STUDY}/references/shipped/live.json", text="{}")
    _write(root, ".vllm/study/carry/01/part", 100 * KIB)
    for cmd in (["init", "-q"], ["add", "-A"],
                ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "layout"]):
        subprocess.run(["git", "-C", str(root), *cmd], check=True)
    return root


def _run(root: Path, state: str, limit_mib: float = 64.0):
    return subprocess.run([sys.executable, str(SCRIPT), state, "--root", str(root),
                           "--limit-mib", str(limit_mib)], capture_output=True, text=True)


def test_stash_then_launch_then_back(checkout):
    stash = _run(checkout, "stash")
    assert stash.returncode == 0, stash.stderr
    assert not any(p.is_file() for p in (checkout / "data").rglob("*"))
    assert (checkout / "eagle3lab/__init__.py").is_file()
    assert "bench/vllm_device.py stash .vllm/study/carry/01" in stash.stdout

    launch = _run(checkout, "launch")
    assert launch.returncode == 0, launch.stderr
    assert (checkout / f"{STUDY}/packs/greedy-0.part01.npz").is_file()
    assert (checkout / f"{STUDY}/runs/data-100k-wd0.01-s0/run.json").is_file()
    assert (checkout / f"{STUDY}/references/shipped/live.json").is_file()
    assert not (checkout / f"{STUDY}/session-14/logs/chain.log").exists()
    assert not (checkout / "data/drafters/smollm2-135m-instruct/model.safetensors").exists()
    # the ranker's weights (the weak stage hashes them) and the reference drafter stay
    assert (checkout / f"{SGLANG}/model.safetensors").is_file()
    # a finished run travels without its curve; a run not finished keeps it
    done, running = (checkout / f"{STUDY}/runs/{r}" for r in ("data-100k-wd0.01-s0",
                                                              "data-400k-wd0.01-s0"))
    assert (done / "run.json").is_file() and (done / "live.json").is_file()
    assert not (done / "metrics.jsonl").exists() and (running / "metrics.jsonl").is_file()
    assert launch.stdout.startswith("launch: 1 pack file(s) in, 3 file(s) left out (1 "
                                    "finished runs' metrics.jsonl among them); ")

    back = _run(checkout, "back")
    assert back.returncode == 0, back.stderr
    assert (checkout / f"{STUDY}/session-14/logs/chain.log").is_file()
    assert (done / "metrics.jsonl").is_file()


def test_launch_over_the_limit_names_the_largest_folders(checkout):
    launch = _run(checkout, "launch", limit_mib=0.4)
    assert launch.returncode == 1
    [line] = launch.stderr.splitlines()
    assert line == ("study_carry: error: the launch's tree is 0.5 MiB, over the 0.4 MiB a "
                    "call carries; largest: data/studies/h200-grok 0.3 MiB, data/drafters/"
                    "smollm2-135m-instruct-sglang 0.2 MiB, eagle3lab 0.0 MiB")


def test_stash_refuses_a_chunk_that_does_not_fit(checkout):
    stash = _run(checkout, "stash", limit_mib=0.05)
    assert stash.returncode == 1
    [line] = stash.stderr.splitlines()
    assert ".vllm/study/carry/01 with the tree is 0.1 MiB, over the 0.05 MiB" in line


def test_launch_without_packs_stops_before_the_call(checkout):
    subprocess.run(["git", "-C", str(checkout), "rm", "-rq", f"{STUDY}/packs"], check=True)
    subprocess.run(["git", "-C", str(checkout), "-c", "user.email=t@t", "-c", "user.name=t",
                    "commit", "-qm", "no packs"], check=True)
    launch = _run(checkout, "launch")
    assert launch.returncode == 1
    assert launch.stderr.strip() == (f"study_carry: error: no packs tracked under "
                                     f"{STUDY}/packs: the chain would stop at once")


@pytest.mark.parametrize("state", ["stash", "launch", "back"])
def test_a_change_not_committed_under_data_is_never_lost(checkout, state):
    run_json = checkout / f"{STUDY}/runs/data-100k-wd0.01-s0/run.json"
    run_json.write_text("edited")
    result = _run(checkout, state)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "study_carry: error: 1 tracked file(s) under data/ changed since the last commit "
        f"(e.g. {STUDY}/runs/data-100k-wd0.01-s0/run.json): commit them first, or this "
        "would lose them")
    assert run_json.read_text() == "edited"


def test_stash_without_chunks_leaves_the_checkout_as_it_was(checkout):
    shutil.rmtree(checkout / ".vllm")
    stash = _run(checkout, "stash")
    assert stash.returncode == 1
    assert stash.stderr.strip() == ("study_carry: error: no chunk folders under "
                                    ".vllm/study/carry: make them first (make study-carry)")
    assert (checkout / f"{STUDY}/packs/greedy-0.part01.npz").is_file()


def test_budget_is_what_a_chunk_may_take_beside_the_stash_tree(checkout):
    """`make study-carry` cuts the chunks to this in a fresh checkout, data/ in: the limit
    less the tree left once data/'s tracked files are out, less the 1 MiB margin; nothing
    moves."""
    before = sorted(p for p in checkout.rglob("*") if p.is_file())
    stash_tree = sum((checkout / rel).stat().st_size for rel in
                     ("eagle3lab/__init__.py", ".gitignore"))
    result = _run(checkout, "budget", limit_mib=8.0)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) == pytest.approx(8.0 - stash_tree / 2**20 - 1.0, abs=0.006)
    assert sorted(p for p in checkout.rglob("*") if p.is_file()) == before
    # an untracked file travels with every call, so it counts; data/'s tracked files do not
    _write(checkout, "notes.bin", 2 * 2**20)
    grown = _run(checkout, "budget", limit_mib=8.0)
    assert float(grown.stdout) == pytest.approx(float(result.stdout) - 2.0, abs=0.006)
    # too small a limit: one line naming what the tree holds
    small = _run(checkout, "budget", limit_mib=2.5)
    assert small.returncode == 1
    [line] = small.stderr.splitlines()
    assert line.startswith("study_carry: error: the stash calls' tree is 2.0 MiB: -0.5 MiB "
                           "left for a chunk of the 2.5 a call carries; largest: notes.bin "
                           "2.0 MiB")
