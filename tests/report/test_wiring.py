"""The report's wiring placeholders are the work dir's layout (eagle3lab.workdir.WorkDir):
every notebook parameter the plan derives fills in, and points where the stages write."""

from __future__ import annotations

from pathlib import Path

from eagle3lab.report.plan import PLAN, fill, wiring_context
from eagle3lab.workdir import WorkDir, default_drafter


def _ctx(tmp_path, target):
    wd = WorkDir(tmp_path / "work")
    return wd, wiring_context(work=wd, target=target, device="cpu", out=tmp_path / "out",
                              scratch=tmp_path / "scratch")


def test_every_placeholder_of_the_plan_fills(tmp_path):
    wd, ctx = _ctx(tmp_path, "smollm2-135m-instruct")
    by = {s.name: {k: fill(v, ctx) for k, v in {**s.locked, **s.soft}.items()} for s in PLAN}
    assert by["02_training_curves"]["run_dirs"] == [str(wd.train_run)]
    assert by["03_inspect_checkpoint"]["checkpoint"] == str(wd.sglang_copy)
    assert by["03_inspect_checkpoint"]["second_checkpoint"] == str(wd.final)
    assert by["03_inspect_checkpoint"]["token_counts"] == str(wd.shards_train)
    assert by["06_grokking_vs_data"]["train_data"] == str(wd.shards_train)
    assert by["06_grokking_vs_data"]["eval_data"] == str(wd.shards_eval)
    assert Path(by["06_grokking_vs_data"]["study_dir"]) == wd.study("grokking-vs-data")
    # the preset's shipped drafter next to the one the pipeline trains
    assert by["05_acceptance"]["drafts"] == [default_drafter(), str(wd.final)]
    assert by["04_live_server"]["draft"] == default_drafter()


def test_without_a_shipped_drafter_the_pipeline_drafter_is_the_default(tmp_path):
    wd, ctx = _ctx(tmp_path, str(tmp_path / "some-hf-target"))
    assert ctx["default_drafter"] == str(wd.final)  # trained later in the same report
    assert ctx["work"] == str(wd.root)
