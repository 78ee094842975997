"""Training on 2 ranks (gloo on the CPU): the same optimizer steps as one process that
accumulates the same micro-batches (DDP and FSDP2), a rank killed mid-run ends the job
under the real torchrun with the rank named and no process left, the run resumes after the
kill (at its own world size, and in one process with grad_accum 2), a NaN or a hung rank
on one rank stops every rank.

The ranks run the real torch.distributed code (process group from torchrun's variables,
DDP / fully_shard, all-reduces, DCP). Launches: the killed run goes through
`python -m torch.distributed.run ... -m eagle3lab train` (the CLI, torchrun's agent and its
summary); the other 2-rank runs are forked from this process with torchrun's variables set
(testutil.fork_ranks), so the libraries are not imported again per rank (~15 s of CPU
each on a small machine).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3lab.errors import UserError
from eagle3lab.distributed import free_port
from testutil import fork_ranks

#: 6 optimizer steps of 2 micro-batches of <= 128 tokens; eval at 3 and 6; checkpoints 2, 4.
KW = dict(max_steps=6, epochs=100, max_tokens_per_batch=128, eval_every=3,
          checkpoint_every=2, lr=1e-3, warmup_steps=1, progress=False, cpu_threads=1)


def _kw(sharp_data, out: Path, **over) -> dict:
    return {"data": sharp_data["train"], "eval_data": sharp_data["eval"], "out": str(out),
            **KW, **over}


def _rank(rank: int, kw: dict, results: str) -> None:
    from eagle3lab.train import train

    try:
        res = {"summary": train(**kw)}
    except Exception as e:  # noqa: BLE001 - the outcome of this rank, read by the test
        res = {"error": f"{type(e).__name__}: {e}"}
    Path(results, f"rank{rank}.json").write_text(json.dumps(res))


def run_ranks(kw: dict, *, world: int = 2, env: dict | None = None,
              wait_for: int | None = None, limit_s: float = 120) -> list[dict | None]:
    """Fork `world` ranks that each call train(**kw) under torchrun's variables; each
    rank's outcome ({"summary"} or {"error"}). wait_for=r: return once rank r is done and
    kill the others (a hung rank)."""
    results = Path(kw["out"] + ".ranks")
    results.mkdir(parents=True, exist_ok=True)
    fork_ranks(lambda rank: _rank(rank, kw, str(results)), world=world, env=env,
               limit_s=limit_s, stop_when=None if wait_for is None else
               (results / f"rank{wait_for}.json").exists)
    return [json.loads(f.read_text()) if (f := results / f"rank{r}.json").exists() else None
            for r in range(world)]


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same_run(a: Path, b: Path, rel: float = 1e-5, steps: int = KW["max_steps"]) -> None:
    """Equal metrics lines (every count, loss, grad norm, lr, eval) within fp32 tolerance,
    equal integers (steps, tokens), and equal final weights."""
    import torch
    from safetensors.torch import load_file

    def same(x, y, where):
        if isinstance(x, dict):
            assert x.keys() == y.keys(), where
            for k in x:
                same(x[k], y[k], f"{where}.{k}")
        elif isinstance(x, list):
            assert len(x) == len(y), where
            for i, (u, v) in enumerate(zip(x, y)):
                same(u, v, f"{where}[{i}]")
        elif isinstance(x, float) and not isinstance(y, bool):
            assert math.isclose(x, y, rel_tol=rel, abs_tol=1e-6), (where, x, y)
        else:
            assert x == y, (where, x, y)

    la = [{k: v for k, v in x.items() if k != "wall_s"} for x in _lines(a)]
    lb = [{k: v for k, v in x.items() if k != "wall_s"} for x in _lines(b)]
    assert [x["step"] for x in la] == list(range(steps + 1))
    same(la, lb, "metrics")
    wa = load_file(str(a / "final" / "model.safetensors"))
    wb = load_file(str(b / "final" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=rel, atol=1e-6), k


# --- the runs the tests compare ----------------------------------------------------------
@pytest.fixture(scope="module")
def accumulated(tmp_path_factory, sharp_data) -> Path:
    """One process, grad_accum 2: the reference every 2-rank run must equal."""
    from eagle3lab.train import train

    out = tmp_path_factory.mktemp("dist") / "accum2"
    train(**_kw(sharp_data, out, grad_accum=2))
    return out


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, sharp_data) -> Path:
    out = tmp_path_factory.mktemp("dist") / "ddp"
    res = run_ranks(_kw(sharp_data, out))
    assert all(r and r["summary"]["status"] == "done" for r in res), res
    return out


def test_two_rank_ddp_equals_one_process_accumulating_the_same_micro_batches(
        accumulated, ddp_run):
    import torch

    assert_same_run(accumulated, ddp_run)
    run = json.loads((ddp_run / "run.json").read_text())
    assert run["distributed"] == {"world_size": 2, "backend": "gloo", "fsdp": False,
                                  "grad_accum": 1, "micro_batches_per_step": 2}
    one = json.loads((accumulated / "run.json").read_text())
    assert one["distributed"]["world_size"] == 1 and one["distributed"]["backend"] is None
    assert one["plan"] == run["plan"] and one["data"] == run["data"]
    ck = ddp_run / "checkpoints" / "step-4"
    assert sorted(p.name for p in ck.glob("rng-rank*.pt")) == ["rng-rank0.pt", "rng-rank1.pt"]
    r0 = torch.load(ck / "rng-rank0.pt", weights_only=False)
    assert torch.equal(r0["torch"], torch.load(ck / "trainer_state.pt",
                                               weights_only=False)["rng"]["torch"])


def test_two_rank_fsdp_equals_one_process_accumulating_the_same_micro_batches(
        tmp_path, sharp_data, accumulated):
    out = tmp_path / "fsdp"
    res = run_ranks(_kw(sharp_data, out, fsdp=True))
    assert all(r and r["summary"]["status"] == "done" for r in res), res
    assert_same_run(accumulated, out)
    assert json.loads((out / "run.json").read_text())["distributed"]["fsdp"] is True
    assert (out / "checkpoints" / "step-4" / "sharded" / ".metadata").is_file()  # DCP


def test_grad_accum_on_two_ranks_ddp_and_fsdp(tmp_path, sharp_data):
    """2 ranks x grad_accum 2 (DDP no_sync / FSDP set_requires_gradient_sync on the first
    micro-step) = 1 process x grad_accum 4. An odd number of eval batches: under FSDP one
    rank runs a padding forward (its forward is a collective) whose counts are dropped."""
    from eagle3lab.data.shards import ShardSet
    from eagle3lab.train import PackedData, train

    short = dict(max_steps=3, eval_every=0, checkpoint_every=0, max_tokens_per_batch=112)
    ev = ShardSet(sharp_data["eval"])
    assert len(PackedData(ev, range(len(ev)), 112).batches(0, 0)) % 2 == 1
    train(**_kw(sharp_data, tmp_path / "accum4", grad_accum=4, **short))
    for fsdp in (False, True):
        out = tmp_path / f"fsdp{fsdp}"
        res = run_ranks(_kw(sharp_data, out, grad_accum=2, fsdp=fsdp, **short))
        assert all(r and r["summary"]["status"] == "done" for r in res), res
        assert_same_run(tmp_path / "accum4", out, steps=3)


# --- a rank killed mid-run, under the real torchrun ------------------------------------------
@pytest.fixture(scope="module")
def killed_run(tmp_path_factory, sharp_data):
    """The DDP run's command under torchrun, rank 1 SIGKILLed as it starts step 6 (after
    the step-4 checkpoint). (run dir, exit code, torchrun's output, seconds from the
    step-4 checkpoint to the job's end, processes left). torchrun's agent looks at its
    workers every second (default 0.1 s), so that rank 0 surely reports the lost peer
    before the agent stops it."""
    import psutil

    out = tmp_path_factory.mktemp("dist") / "killed"
    k = _kw(sharp_data, out, dist_timeout=30)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), "--monitor-interval", "1",
           "-m", "eagle3lab", "train",
           "--data", k["data"], "--eval-data", k["eval_data"], "--out", str(out),
           "--dist-timeout", "30", "--no-progress"]
    for key in ("max_steps", "epochs", "max_tokens_per_batch", "eval_every",
                "checkpoint_every", "lr", "warmup_steps", "cpu_threads"):
        cmd += ["--" + key.replace("_", "-"), str(k[key])]
    log = out.parent / "torchrun.log"
    env = {**os.environ, "EAGLE3LAB_TEST_FAULT": "kill:1:6", "OMP_NUM_THREADS": "1"}
    seen, t_ckpt = set(), None
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 240
        while proc.poll() is None and time.time() < deadline:
            try:
                seen |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
            except psutil.NoSuchProcess:
                pass
            if t_ckpt is None and (out / "checkpoints" / "step-4").exists():
                t_ckpt = time.time()
            time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
            pytest.fail("the torchrun job did not end")
    ended = time.time()
    left = [p for p in seen if psutil.pid_exists(p)
            and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    return out, proc.returncode, log.read_text(), ended - (t_ckpt or 0), left


@pytest.mark.slow
@pytest.mark.full
def test_a_killed_rank_ends_the_job_naming_it_and_the_last_checkpoint_loads(killed_run):
    import torch

    from eagle3lab.train import load_drafter

    out, rc, text, _, left = killed_run
    assert rc != 0 and not left, (rc, left)
    root = text.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in root and "SIGKILL" in root, text[-3000:]
    # rank 0's own message, once, saying where to resume from; it saw the dead peer's
    # closed connection at once, without waiting out --dist-timeout (a collective that
    # timed out says "within dist_timeout=")
    assert text.count("eagle3lab train: error: rank 0 of 2: at step 6") == 1, text[-3000:]
    assert "another rank closed its connection" in text, text[-3000:]
    assert "within dist_timeout=" not in text, text[-3000:]
    assert "checkpoints/step-4: rerun the same torchrun command with --resume" in text
    assert sorted(p.name for p in (out / "checkpoints").iterdir()
                  if not p.name.startswith(".")) == ["step-2", "step-4"]
    ck = out / "checkpoints" / "step-4"
    assert torch.load(ck / "trainer_state.pt", weights_only=False)["state"]["step"] == 4
    drafter = load_drafter(ck)
    assert all(torch.isfinite(p).all() for p in drafter.parameters())
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    assert max(x["step"] for x in _lines(out)) == 5  # step 5 logged, then the kill


@pytest.mark.slow
@pytest.mark.full
def test_resume_after_the_kill_equals_the_uninterrupted_run(tmp_path, killed_run, ddp_run,
                                                            sharp_data):
    from eagle3lab.train import train

    out = killed_run[0]
    same_size = tmp_path / "same"
    shutil.copytree(out, same_size)
    res = run_ranks(_kw(sharp_data, same_size, resume=True, dist_timeout=30))
    assert all(r and r["summary"]["status"] == "done" for r in res), res
    assert_same_run(ddp_run, same_size)
    # another world size with the same micro-batches per step: 1 process x grad_accum 2
    one = tmp_path / "one"
    shutil.copytree(out, one)
    with pytest.raises(UserError) as e:
        train(**_kw(sharp_data, one, resume=True))
    assert "world size 1 x grad_accum 1 = 1" in str(e.value)
    assert "world size 2 x grad_accum 1 = 2" in str(e.value) and "--grad-accum 2" in str(e.value)
    train(**_kw(sharp_data, one, resume=True, grad_accum=2))
    assert_same_run(ddp_run, one)


# --- a NaN on one rank, a hung rank ------------------------------------------------------
def test_a_nan_on_one_rank_stops_every_rank_at_that_step(tmp_path, sharp_data):
    from safetensors.torch import load_file, save_file

    from eagle3lab.data.shards import ShardSet, read_manifest, write_manifest
    from eagle3lab.fsutil import sha256_file
    from eagle3lab.train import PackedData

    data = tmp_path / "shards"
    shutil.copytree(sharp_data["train"], data)
    s = ShardSet(data)
    # rank 1's micro-batch of step 2 (2 ranks x grad_accum 1: slot 1 of 2)
    victim = int(PackedData(s, range(len(s)), 128).steps(0, 0, rank=1, world_size=2)[1][0][0])
    k, j = s._locate(victim)
    path = data / s.shards[k]["file"]
    t = load_file(str(path))
    t["hidden_states"][int(t["offsets"][j]):int(t["offsets"][j + 1])] = float("nan")
    save_file(t, str(path))
    m = read_manifest(data)  # as if extraction had written the NaNs (the sha256s verify)
    m["shards"][k].update(bytes=path.stat().st_size, sha256=sha256_file(path))
    write_manifest(data, m)

    out = tmp_path / "run"
    res = run_ranks({**_kw(sharp_data, out), "data": str(data)})
    msgs = [r["error"] for r in res]
    assert msgs[0] == msgs[1] and msgs[0].startswith("TrainingDiverged: ")
    assert "step 2 (epoch 0, rank 1 of 2)" in msgs[0] and f"[{victim}]" in msgs[0]
    assert "not finite" in msgs[0]
    assert [x["step"] for x in _lines(out)] == [0, 1]
    assert json.loads((out / "run.json").read_text())["status"] == "failed"


@pytest.mark.slow
@pytest.mark.full
def test_a_hung_rank_is_named_after_the_timeout(tmp_path, sharp_data):
    out = tmp_path / "run"
    t = time.monotonic()
    res = run_ranks(_kw(sharp_data, out, dist_timeout=10), env={
        "EAGLE3LAB_TEST_FAULT": "hang:1:3"}, wait_for=0)
    # rank 0 answered while rank 1 still hung (killed after, so it wrote nothing), once the
    # collective had waited its 10 s: the configured timeout, not the default 30 min
    assert res[1] is None and time.monotonic() - t >= 10, res
    msg = res[0]["error"]
    assert msg.startswith("RankFailure: rank 0 of 2: at step 3 a collective failed"), msg
    assert "within dist_timeout=10;" in msg, msg
    assert "rank 1 did not answer a check either: it hangs or died" in msg
    assert "checkpoints/step-2: rerun the same torchrun command with --resume" in msg


# --- data, refusals, the CLI's report ----------------------------------------------------
def test_an_epoch_covers_every_sample_once_across_ranks(sharp_data):
    import numpy as np

    from eagle3lab.data.shards import ShardSet
    from eagle3lab.train import PackedData

    s = ShardSet(sharp_data["train"])
    data = PackedData(s, range(len(s)), 128)
    assert [[list(b) for b in m] for m in data.steps(3, 1)] == [
        [list(b)] for b in data.batches(3, 1)]  # one process: today's batches
    for world, accum in ((2, 1), (2, 2), (3, 2)):
        steps = [data.steps(3, 1, rank=r, world_size=world, grad_accum=accum)
                 for r in range(world)]
        assert len({len(x) for x in steps}) == 1  # every rank takes the same step count
        got = np.concatenate([b for x in steps for step in x for b in step])
        assert len(got) == len(set(got.tolist()))  # no sample twice
        assert len(s) - world * accum < len(got) <= len(s)  # the sampler drops < W x K
    # the data of a step depends only on world x grad_accum
    two_ranks = [data.steps(0, 0, rank=r, world_size=2)[4][0] for r in (0, 1)]
    assert [list(b) for b in data.steps(0, 0, grad_accum=2)[4]] == [list(b) for b in two_ranks]


def test_fsdp_without_torchrun_is_refused(tmp_path, sharp_data):
    from eagle3lab.train import train

    with pytest.raises(UserError, match="torchrun --nproc-per-node N"):
        train(**_kw(sharp_data, tmp_path / "r", fsdp=True))
    assert not (tmp_path / "r").exists()


# --- throughput options: bf16 gradient reduction, DataLoader workers --------------------
def _rank_seeing_reductions(rank: int, kw: dict, results: str) -> None:
    """`_rank`, recording the dtype of every gradient reduce-scatter as the collective gets
    it (FSDP2 calls torch.distributed's reduce_scatter_single, reduce_scatter_tensor
    before torch 2.13)."""
    import torch.distributed as dist

    seen = []
    for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
        if hasattr(dist, name):
            def seeing(*a, _orig=getattr(dist, name), **k):
                seen.append(str((k["input"] if "input" in k else a[1]).dtype))
                return _orig(*a, **k)
            setattr(dist, name, seeing)
    _rank(rank, kw, results)
    Path(results, f"rank{rank}.reduced.json").write_text(json.dumps(sorted(set(seen))))


def test_bf16_gradient_reduction_on_two_ranks_ddp_and_fsdp(tmp_path, sharp_data, accumulated):
    """grad_reduce_dtype bfloat16: under FSDP2 (reduce_dtype) the gradients cross the ranks
    in bf16 (the dtype the reduce-scatter gets), and the steps are the fp32 reference's
    within bf16 rounding of the gradients, recorded in run.json; under DDP (PyTorch's
    bf16_compress_hook, NCCL only) refused on gloo, naming the fix."""
    short = dict(max_steps=3, eval_every=0, checkpoint_every=0, grad_reduce_dtype="bfloat16")
    # DDP's hook needs NCCL: on gloo a clear refusal on every rank, before any step
    res = run_ranks(_kw(sharp_data, tmp_path / "bf16-ddp", **short))
    assert all("needs NCCL (GPUs); this run uses gloo" in r["error"] for r in res), res
    for fsdp in (True,):
        out = tmp_path / f"bf16-fsdp{fsdp}"
        kw = _kw(sharp_data, out, fsdp=fsdp, **short)
        results = Path(kw["out"] + ".ranks")
        results.mkdir(parents=True)
        fork_ranks(lambda rank: _rank_seeing_reductions(rank, kw, str(results)))
        res = [json.loads((results / f"rank{r}.json").read_text()) for r in (0, 1)]
        assert all(r and r["summary"]["status"] == "done" for r in res), res
        for r in (0, 1):  # the option took effect: every reduction ran in bf16
            reduced = json.loads((results / f"rank{r}.reduced.json").read_text())
            assert reduced == ["torch.bfloat16"], (r, reduced)
        ref = {x["step"]: x for x in _lines(accumulated)}
        for line in _lines(out)[1:]:
            a, b = line["train"], ref[line["step"]]["train"]
            assert math.isclose(a["objective"], b["objective"], rel_tol=2e-2), (fsdp, a, b)
            assert a["counts"]["loss_0_n"] == b["counts"]["loss_0_n"]
        cfg = json.loads((out / "run.json").read_text())["config"]
        assert cfg["grad_reduce_dtype"] == "bfloat16"


def test_dataloader_workers_give_the_same_run(tmp_path, sharp_data, accumulated, monkeypatch):
    """data_workers=2 (torch DataLoader processes collating ahead, the CUDA default) trains
    exactly the run of in-process collation (data_workers=0, the CPU default), and the
    steps were collated in 2 worker processes (not here: the equality holds either way)."""
    from eagle3lab.train import data, train

    pids = tmp_path / "collated-by.txt"
    collate_step = data._CollatedSteps.__getitem__

    def seen(self, k):  # runs in the process that collates step k (forked: inherited)
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
        return collate_step(self, k)

    monkeypatch.setattr(data._CollatedSteps, "__getitem__", seen)
    out = tmp_path / "workers"
    train(**_kw(sharp_data, out, grad_accum=2, data_workers=2))
    assert_same_run(accumulated, out, rel=0.0)
    by = pids.read_text().split() if pids.exists() else []
    assert len(by) >= KW["max_steps"] and len(set(by)) == 2, by  # every step, 2 workers
    assert str(os.getpid()) not in by, by
