"""Fixtures for the report tests: one tiny end-to-end report (every notebook under
papermill on a tiny random target), shared by the end-to-end, reuse and browser tests.

The report directory is kept as a CI artifact when EAGLE3LAB_CI_ARTIFACTS names a directory
(.ci/run sets reports/ci): executed notebooks, HTML, index.html and the browser screenshots.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see tests/conftest.py


def tiny_params(work_dir: Path, target: Path) -> dict:
    """Every stage and notebook at the smallest size that still exercises it."""
    return {
        "report": {"description": "tiny end-to-end test report", "timeout_s": 300},
        "pipeline": {
            "work_dir": str(work_dir), "target": str(target), "device": "cpu",
            "train_prompts": 6, "eval_prompts": 3, "max_new_tokens": 8, "batch_size": 6,
            "draft_vocab_size": 256,
            "train": {"epochs": 2, "max_tokens_per_batch": 256, "lr": 0.001, "eval_every": 2},
        },
        "common": {"max_new_tokens": 8},
        "01_extract": {"sample_count": 2, "batch_size": 2},
        "02_training_curves": {"plateau_window": 2},
        # 05 once, here, with every section on (tests/report/test_report.py checks them):
        # the chain-length curve, both failure arms, the speed section (short answers);
        # on the static engine with two rows in flight (one idle: one prompt)
        "05_acceptance": {"limit": 1, "max_new_tokens": 6, "chain_lengths": [1, 2],
                          "compare_failures": True, "speed_max_new_tokens": 16,
                          "engine": "static", "batch_size": 2},
        "04_live_server": {"prompt_count": 2, "steps": 2, "silence_s": 60.0,
                           "startup_timeout_s": 180.0},
        # 06: one seed per arm (2 runs, half the study's time); the standalone demo test
        # (tests/train/test_notebooks_training.py) runs 2 seeds and the seed-spread verdict
        "06_grokking_vs_data": {"data_fractions": [1.0, 0.5], "seeds": [0],
                                "budget_epochs": 1.0, "epoch_multipliers": [1.0],
                                "max_tokens_per_batch": 256},
    }


@pytest.fixture(scope="session")
def tiny_report(tmp_path_factory, tiny_target_dir):
    """Runs the whole plan once on the tiny target; returns (report dict, params, out)."""
    from eagle3lab.report.run import run_report

    artifacts = os.environ.get("EAGLE3LAB_CI_ARTIFACTS")
    if artifacts:
        out = Path(artifacts) / "tiny-report"
        shutil.rmtree(out, ignore_errors=True)
    else:
        out = tmp_path_factory.mktemp("tiny-report")
    params = tiny_params(tmp_path_factory.mktemp("tiny-work"), tiny_target_dir)
    report = run_report(params=params, out=out, progress=False)
    return report, params, Path(report["out"])
