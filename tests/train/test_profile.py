"""eagle3lab.train.profile: a window of training steps under torch.profiler changes nothing
the run computes, writes RUN/profile/ once the window ends (nothing for a run stopped inside
it; a run resumed inside it starts it at its first step), the loop's regions once a step,
and its summary counts the device's busy time once where kernels overlap, and the
host's synchronising calls by name and, nested, once."""

from __future__ import annotations

import json

import pytest

from eagle3lab.errors import UserError


def _lines(run):
    return [{k: v for k, v in json.loads(x).items() if k != "wall_s"}
            for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_profiled_window_changes_nothing_and_writes_its_summary(tmp_path, sharp_data):
    from safetensors.torch import load_file

    from eagle3lab.train import train

    kw = dict(data=sharp_data["train"], eval_data=sharp_data["eval"], max_steps=8,
              epochs=100, max_tokens_per_batch=384, eval_every=4, lr=1e-3, warmup_steps=2,
              progress=False)
    train(out=str(tmp_path / "plain"), **kw)
    train(out=str(tmp_path / "prof"), profile_steps=[3, 5], **kw)
    a, b = _lines(tmp_path / "plain"), _lines(tmp_path / "prof")
    assert a == b
    wa = load_file(str(tmp_path / "plain" / "final" / "model.safetensors"))
    wb = load_file(str(tmp_path / "prof" / "final" / "model.safetensors"))
    assert all((wa[k] == wb[k]).all() for k in wa)
    s = json.loads((tmp_path / "prof" / "profile" / "summary.json").read_text())
    by_step = {x["step"]: x["tokens"] for x in b}
    assert s["steps"] == [3, 5] and s["n_steps"] == 3
    assert s["tokens"] == by_step[5] - by_step[2] > 0
    assert s["wall_s"] > 0
    assert s["tokens_per_s"] == pytest.approx(s["tokens"] / s["wall_s"], rel=1e-4)
    # the CPU: no device activity recorded, host figures present
    assert s["device_busy_s"] is None and s["device_busy_share"] is None
    assert s["host_sync_s"] <= sum(s["host_sync_by_call"].values()) + 1e-9
    # every region of the loop once a step (one micro-batch a step here), the step's batch
    # inside the window: the host's seconds in them within the wall, no device seconds
    from eagle3lab.train.profile import REGIONS

    assert list(s["regions"]) == list(REGIONS)
    assert [r["count"] for r in s["regions"].values()] == [3, 3, 3, 3]
    assert all(r["host_s"] > 0 and r["device_s"] is None for r in s["regions"].values())
    assert sum(r["host_s"] for r in s["regions"].values()) <= s["wall_s"]
    ops = (tmp_path / "prof" / "profile" / "ops.txt").read_text()
    assert "top ops by host time" in ops and "aten::" in ops
    assert not (tmp_path / "plain" / "profile").exists()
    run = json.loads((tmp_path / "prof" / "run.json").read_text())
    assert run["config"]["profile_steps"] == [3, 5]


def test_a_run_stopped_inside_the_window_writes_no_profile_and_resumes(tmp_path, sharp_data):
    from eagle3lab.train import train

    kw = dict(data=sharp_data["train"], eval_data=sharp_data["eval"], max_steps=6,
              epochs=100, max_tokens_per_batch=384, eval_every=3, checkpoint_every=2,
              lr=1e-3, warmup_steps=2, progress=False)
    out = tmp_path / "run"
    assert train(out=str(out), profile_steps=[2, 5], stop_after_steps=4,
                 **kw)["status"] == "stopped"
    assert not (out / "profile").exists()
    # profiling is free to change on resume (it computes nothing)
    assert train(out=str(out), resume=True, profile_steps=[5, 6], **kw)["status"] == "done"
    assert json.loads((out / "profile" / "summary.json").read_text())["steps"] == [5, 6]
    # a window the resume point is inside starts at the first step this run trains
    out2 = tmp_path / "run2"
    assert train(out=str(out2), stop_after_steps=4, **kw)["status"] == "stopped"
    assert train(out=str(out2), resume=True, profile_steps=[2, 5], **kw)["status"] == "done"
    s = json.loads((out2 / "profile" / "summary.json").read_text())
    assert s["steps"] == [5, 5] and s["n_steps"] == 1


@pytest.mark.parametrize("steps", [[3], [0, 2], [5, 4], [1, 2, 3]])
def test_a_bad_window_is_one_line(tmp_path, steps):
    from eagle3lab.train.config import TrainConfig

    with pytest.raises(UserError, match=r"profile_steps \(--profile-steps\) takes two step "
                                        r"numbers FIRST LAST with 1 <= FIRST <= LAST"):
        TrainConfig.from_dict({"data": "d", "out": str(tmp_path), "profile_steps": steps},
                              "test.train")


def test_busy_and_sync_time_count_overlaps_once():
    """summarize() on the profiler's own event class: two overlapping kernels and one apart
    (device), a stream synchronise twice, a scalar read holding the first, and an unrelated
    host op (CPU); device-side marks of record_functions are not counted as busy."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    from eagle3lab.train.profile import summarize

    def ev(i, name, a, b, dev=DeviceType.CPU):
        return FunctionEvent(i, name, 0, a, b, device_type=dev)

    events = [ev(1, "k1", 0, 100_000, DeviceType.CUDA), ev(2, "k2", 50_000, 150_000,
                                                            DeviceType.CUDA),
              ev(3, "k3", 400_000, 500_000, DeviceType.CUDA),
              ev(4, "cudaStreamSynchronize", 150_000, 350_000),
              ev(5, "cudaStreamSynchronize", 600_000, 700_000),
              ev(6, "aten::_local_scalar_dense", 140_000, 360_000),  # holds the first
              ev(7, "aten::mm", 0, 900_000),
              # a region of the loop and a compiled graph's call, marked on the device
              # too (user annotations): not device work
              ev(8, "e3l.batch", 0, 900_000, DeviceType.CUDA),
              FunctionEvent(9, "## Call CompiledFxGraph abc", 0, 0, 800_000,
                            device_type=DeviceType.CUDA, is_user_annotation=True)]
    s = summarize(events, wall_s=1.0, tokens=1000, steps=[2, 3], device=True)
    assert s["device_busy_s"] == pytest.approx(0.25)  # 0-150 ms and 400-500 ms
    assert s["device_busy_share"] == pytest.approx(0.25)
    assert s["host_sync_by_call"] == {"aten::_local_scalar_dense": pytest.approx(0.22),
                                      "cudaStreamSynchronize": pytest.approx(0.3)}
    # 140-360 ms and 600-700 ms: the nested synchronise counted once
    assert s["host_sync_s"] == pytest.approx(0.32)
    assert s["host_sync_share"] == pytest.approx(0.32) and s["n_steps"] == 2
    assert s["tokens_per_s"] == 1000
