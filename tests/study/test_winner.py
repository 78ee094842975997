"""The study's shipped drafter (data/drafters/smollm2-135m-instruct, from
data/studies/h200-grok's run long-speculators-all-64M-wd0.01-s0): intact, a seed of an arm
that beats the previous shipped drafter (now data/drafters/smollm2-135m-instruct-sglang),
its curve that run's, and passed by the doctor for the engine that serves it (vLLM),
refused for SGLang with the codes its README gives. The best run since session 24 (the
128M run) is not it: its weights stayed on the device, and the study's text says so."""

import json
from pathlib import Path

import pytest
from checksums import assert_checksums

from eagle3lab.study.atscale_read import against_reference, arm_name, load_results, shipped_run
from eagle3lab.workdir import default_drafter

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "data" / "studies" / "h200-grok"
SHIPPED = REPO / "data" / "drafters" / "smollm2-135m-instruct"
BEST = "long-speculators-all-64M-wd0.01-s0"
BEST_RUN = "long-speculators-all-128M-wd0.01-s0"


def test_the_shipped_drafter_is_intact_and_is_the_best_run_that_came_back():
    assert default_drafter() == str(SHIPPED)
    assert assert_checksums(SHIPPED) == {"config.json", "eagle3lab.json", "model.safetensors",
                                         "metrics.jsonl"}
    res = load_results(STUDY)
    ref = against_reference(res, shipped=SHIPPED)
    # the shipped drafter is the 64M arm's seed 0 (seed 1, session 19, measured 0.003 more,
    # within the two seeds' spread, and its weights did not travel)
    assert shipped_run(res, SHIPPED) == ref["shipped_run"] == BEST
    assert ref["shipped_tau"] > ref["reference_tau"] + 0.2
    # the best run is the 128M one (session 24), one seed, whose weights did not come back:
    # the text names both, so nobody reads 2.84 as the default's
    assert ref["replaces"] and ref["best_run"] == BEST_RUN
    assert ref["best_arm"] == arm_name(BEST_RUN) and list(ref["best_arm_runs"]) == [BEST_RUN]
    assert ref["best_tau"] > ref["shipped_tau"]
    assert ref["text"].endswith(
        f"The drafter that ships (smollm2-135m-instruct) is {BEST}'s "
        f"({ref['shipped_tau']:.3f}): {BEST_RUN}'s weights did not come back (only a run "
        "collected as the winner has its weights).")
    # the arm it ships from: two seeds, both past the previous drafter
    arm = res.live[(res.live["setting"] == ref["setting"]) & res.live["final"]
                   & (res.live["run"].map(arm_name) == arm_name(BEST))]
    assert sorted(arm["run"]) == [BEST, BEST[:-1] + "1"]
    assert (arm["tau"] > ref["reference_tau"] + 0.2).all()
    # a drafter trained elsewhere is no run's
    assert shipped_run(res, SHIPPED.with_name(SHIPPED.name + "-sglang")) is None
    assert BEST in (SHIPPED / "README.md").read_text()
    # its curve is the run's, and the run's recipe is what the drafter records
    run = STUDY / "runs" / BEST
    assert (SHIPPED / "metrics.jsonl").read_bytes() == (run / "metrics.jsonl").read_bytes()
    cfg = json.loads((SHIPPED / "config.json").read_text())
    assert (cfg["norm_before_fc"], cfg["norm_before_residual"], cfg["norm_output"]) == \
        (True, True, True)
    ttt = len(json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["eval"]["loss"])
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == ttt == 3


@pytest.mark.real
def test_the_doctor_serves_it_on_vllm_and_not_on_sglang(default_target_dir):
    from eagle3lab.formats.doctor import inspect_checkpoint

    vllm = inspect_checkpoint(SHIPPED, target=str(default_target_dir), engine="vllm")
    assert vllm.format == "speculators"
    assert not [f for f in vllm.findings if f.severity == "error"], vllm.to_json()
    sglang = inspect_checkpoint(SHIPPED, target=str(default_target_dir), engine="sglang")
    assert {"norm-before-fc", "norm-variant"} <= {f.code for f in sglang.findings}
    # SGLang gets the SGLang-servable shipped drafter, which has none of those norms (in
    # speculators' layout: SGLang needs it converted, `eagle3lab convert --to sglang`)
    sglang_default = Path(default_drafter(engine="sglang"))
    assert sglang_default == SHIPPED.with_name(SHIPPED.name + "-sglang")
    codes = {f.code for f in inspect_checkpoint(sglang_default, target=str(default_target_dir),
                                                engine="sglang").findings}
    assert not {"norm-before-fc", "norm-variant"} & codes, codes
