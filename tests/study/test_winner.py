"""The study's best drafter, committed with its results (data/studies/h200-grok/winner):
intact, named by `against_reference` as the run that beats the shipped drafter, and passed
by the doctor for the engine that serves it (vLLM), refused for SGLang with the codes its
README gives."""

from pathlib import Path

import pytest
from checksums import assert_checksums

from eagle3lab.study.atscale_read import against_reference, load_results

STUDY = Path(__file__).resolve().parents[2] / "data" / "studies" / "h200-grok"
WINNER = STUDY / "winner"


def test_the_winner_is_intact_and_is_the_best_run():
    assert assert_checksums(WINNER) == {"config.json", "eagle3lab.json", "model.safetensors"}
    ref = against_reference(load_results(STUDY))
    assert ref["replaces"] and ref["best_run"] == "long-speculators-all-32M-wd0.01-s0"
    assert ref["best_run"] in (WINNER / "README.md").read_text()
    assert ref["best_tau"] > ref["reference_tau"] + 0.2


@pytest.mark.real
def test_the_doctor_serves_it_on_vllm_and_not_on_sglang(default_target_dir):
    from eagle3lab.formats.doctor import inspect_checkpoint

    vllm = inspect_checkpoint(WINNER, target=str(default_target_dir), engine="vllm")
    assert vllm.format == "speculators"
    assert not [f for f in vllm.findings if f.severity == "error"], vllm.to_json()
    sglang = inspect_checkpoint(WINNER, target=str(default_target_dir), engine="sglang")
    assert {"norm-before-fc", "norm-variant"} <= {f.code for f in sglang.findings}
