"""eagle3lab.train.counts: raw per-position counts, and the run's metrics.jsonl as a
DataFrame (other trainers' logs: tests/study/test_importers.py)."""

from __future__ import annotations

import pytest

from eagle3lab.train.counts import read_metrics, step_counts, summarize_counts


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
