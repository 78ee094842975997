"""eagle3lab.train.metrics: the run's JSONL as a DataFrame, and the importers for the logs that
speculators and SpecForge write (TensorBoard event files, MLflow dirs, JSONL exports)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from eagle3lab.errors import UserError
from eagle3lab.train.metrics import (combine, detect_trainer, load_metrics, read_metrics,
                               read_tfevents, step_counts, summarize_counts)


# --- a TensorBoard event-file writer, from the TFRecord + Event protobuf spec ------------
def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _field(num: int, wt: int, payload: bytes) -> bytes:
    key = _varint(num << 3 | wt)
    return key + (_varint(len(payload)) + payload if wt == 2 else payload)


def _event(step: int, tag: str, value: float, tensor: bool = False) -> bytes:
    if tensor:  # TF2 style: a TensorProto with dtype float and one packed float_val
        tp = _field(1, 0, _varint(1)) + _field(5, 2, struct.pack("<f", value))
        val = _field(1, 2, tag.encode()) + _field(8, 2, tp)
    else:  # torch SummaryWriter.add_scalar: simple_value
        val = _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", value))
    return (_field(1, 1, struct.pack("<d", 1.7e9)) + _field(2, 0, _varint(step))
            + _field(5, 2, _field(1, 2, val)))


def write_tfevents(path: Path, scalars: list[tuple[int, str, float]], *, torn: bool = False):
    path.parent.mkdir(parents=True, exist_ok=True)
    recs = [_field(1, 1, struct.pack("<d", 1.7e9)) + _field(3, 2, b"brain.Event:2")]
    recs += [_event(s, t, v, tensor=(i % 5 == 4)) for i, (s, t, v) in enumerate(scalars)]
    out = b""
    for r in recs:
        n = struct.pack("<Q", len(r))
        out += n + struct.pack("<I", _masked(_crc32c(n))) + r + struct.pack(
            "<I", _masked(_crc32c(r)))
    if torn:
        out += struct.pack("<Q", 500) + b"\x00" * 10
    path.write_bytes(out)


# --- eagle3lab runs ----------------------------------------------------------------------
def test_read_metrics_of_a_run(trained_run, tmp_path):
    df = read_metrics(trained_run)
    assert df.attrs["source"] == "eagle3lab" and df.attrs["loss_kind"] == "kl"
    for c in ("step", "epoch", "tokens", "wall_s", "lr", "train_loss_0", "train_full_acc_2",
              "train_cond_acc_1", "eval_loss_2", "eval_sim_accept_len", "eval_loss_mean"):
        assert c in df.columns, c
    assert df["tokens"].is_monotonic_increasing
    ev = df[df["eval_loss_0"].notna()]
    row = ev.iloc[-1]
    assert row["eval_sim_accept_len"] == pytest.approx(
        1 + row["eval_full_acc_0"] + row["eval_full_acc_1"] + row["eval_full_acc_2"])
    # a run killed mid-write: the torn last line is skipped
    torn = tmp_path / "metrics.jsonl"
    torn.write_text((trained_run / "metrics.jsonl").read_text() + '{"step": 99, "tra')
    assert len(read_metrics(torn)) == len(df)
    assert load_metrics(trained_run, name="mine").attrs["run"] == "mine"


def test_counts_undo_speculators_decay_and_keep_raw_sums():
    import torch

    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.bool)  # position i counts mask[:, i:]
    m = {"loss_0_sum": 2.0, "loss_1_sum": 0.8 * 3.0}  # speculators: loss_i * decay**i
    for i in range(2):
        m.update({f"full_acc_{i}_sum": 2.0 - i, f"full_acc_{i}_total": 4.0 - i,
                  f"cond_acc_{i}_sum": 2.0 - i, f"cond_acc_{i}_total": 4.0 - 2 * i})
    c = step_counts(m, mask, 2, 0.8)
    assert c["loss_0_n"] == 4 and c["loss_1_n"] == 3
    assert c["loss_1_sum"] == pytest.approx(3.0 * 3)
    s = summarize_counts(c, 2, 0.8)
    assert s["loss"] == pytest.approx([2.0, 3.0])
    assert s["objective"] == pytest.approx(2.0 + 0.8 * 3.0)
    assert s["full_acc"] == [0.5, 1 / 3] and s["cond_acc"] == [0.5, 0.5]


# --- other trainers ------------------------------------------------------------------------
def test_speculators_tensorboard_log(tmp_path):
    """Tags as speculators' trainer logs them (dicts flattened with '/'), loss_i already
    multiplied by decay**i, val metrics with the _epoch suffix, tokens from the profile."""
    scalars = []
    for step in range(4):
        for i in range(3):
            scalars += [(step, f"train/loss_{i}", (2.0 - 0.1 * step) * 0.8 ** i),
                        (step, f"train/full_acc_{i}", 0.5), (step, f"train/cond_acc_{i}", 0.6)]
        scalars += [(step, "lr", 1e-4), (step, "epoch", 0.0), (step, "global_step", step),
                    (step, "profile/tokens_per_s", 4000.0), (step, "profile/step_ms", 500.0)]
    scalars += [(3, "val/loss_0_epoch", 1.5), (3, "val/full_acc_0_epoch", 0.7),
                (3, "val/loss_epoch", 4.0)]
    write_tfevents(tmp_path / "logs" / "run1" / "events.out.tfevents.1.host", scalars,
                   torn=True)
    assert len(read_tfevents(tmp_path / "logs")) == len(scalars)
    df = load_metrics(tmp_path / "logs", decay=0.8)
    assert df.attrs == {"source": "speculators", "loss_kind": "kl", "run": "logs"}
    assert list(df["step"]) == [0, 1, 2, 3]
    assert df["train_loss_2"].tolist() == pytest.approx([2.0, 1.9, 1.8, 1.7])
    assert df["tokens"].tolist() == pytest.approx([2000, 4000, 6000, 8000])
    assert df.loc[3, "eval_loss_0"] == pytest.approx(1.5)
    assert df.loc[3, "eval_objective"] == pytest.approx(4.0)
    assert df["lr"].iloc[0] == pytest.approx(1e-4)
    assert df["train_sim_accept_len"].iloc[0] == pytest.approx(2.5)


def test_specforge_tensorboard_log(tmp_path):
    """SpecForge's tracker: OUTPUT/runs/events..., train/ploss_i (soft cross-entropy),
    train/acc_i, train/lr, eval/epochploss_i, eval/epochacc_i; no token counts."""
    scalars = [(s, f"train/ploss_{i}", 5.0 - s + i) for s in range(1, 4) for i in range(7)]
    scalars += [(s, f"train/acc_{i}", 0.1 * s) for s in range(1, 4) for i in range(7)]
    scalars += [(s, "train/lr", 5e-5) for s in range(1, 4)]
    scalars += [(3, f"eval/epochploss_{i}", 4.0) for i in range(7)]
    scalars += [(3, f"eval/epochacc_{i}", 0.25) for i in range(7)]
    write_tfevents(tmp_path / "out" / "runs" / "events.out.tfevents.2.host", scalars)
    df = load_metrics(tmp_path / "out", tokens_per_step=8 * 2048, name="specforge-8gpu")
    assert df.attrs["source"] == "specforge" and df.attrs["loss_kind"] == "soft_ce"
    assert df.attrs["run"] == "specforge-8gpu"
    assert df["train_loss_6"].tolist() == pytest.approx([10.0, 9.0, 8.0])
    assert df["train_full_acc_0"].tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert df.loc[df["step"] == 3, "eval_loss_4"].item() == pytest.approx(4.0)
    assert df["tokens"].tolist() == [2 * 16384, 3 * 16384, 4 * 16384]
    assert "train_sim_accept_len" not in df.columns  # SpecForge acc_i is not cumulative


def test_mlflow_and_jsonl_exports(tmp_path):
    run = tmp_path / "mlruns" / "0" / "abc"
    (run / "metrics" / "train").mkdir(parents=True)
    (run / "metrics" / "train" / "ploss_0").write_text("1700 3.5 1\n1701 3.0 2\n")
    (run / "metrics" / "train" / "acc_0").write_text("1700 0.2 1\n1701 0.3 2\n")
    df = load_metrics(run)
    assert df.attrs["source"] == "specforge" and df["train_loss_0"].tolist() == [3.5, 3.0]
    j = tmp_path / "history.jsonl"
    j.write_text("\n".join(json.dumps({"_step": s, "train/loss_0": 1.0 / s, "lr": 1e-3})
                           for s in (1, 2)) + "\n")
    df2 = load_metrics(j)
    assert df2.attrs["source"] == "speculators" and df2["train_loss_0"].tolist() == [1.0, 0.5]
    long = combine([df, df2])
    assert set(long["run"]) == {"abc", "history"} and set(long["loss_kind"]) == {"soft_ce",
                                                                                 "kl"}


def test_unknown_logs_are_refused(tmp_path):
    with pytest.raises(UserError, match="Cannot tell which trainer"):
        detect_trainer(["loss", "accuracy"])
    (tmp_path / "x").mkdir()
    with pytest.raises(UserError, match="holds no metrics"):
        load_metrics(tmp_path / "x")
    with pytest.raises(UserError, match="does not exist"):
        load_metrics(tmp_path / "nope")
