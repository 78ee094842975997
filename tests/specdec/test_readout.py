"""What an acceptance measurement says: the chain-model fit, the failure verdict, the speed
line, one position of one arm, and the key numbers, on a real measurement (tiny target,
untrained drafter and its failure arms) and on results with known numbers for each
branch of the verdict."""

import copy

import pytest

from eagle3lab.specdec.accept import measure_acceptance
from eagle3lab.specdec.arms import acceptance_arms
from eagle3lab.specdec.readout import (chain_fit, failure_verdict, position_text, speed_text,
                                       summary_numbers)


@pytest.fixture(scope="module")
def measured(tmp_path_factory, tiny_target, tiny_draft):
    plan = acceptance_arms(drafts=[tiny_draft], target=tiny_target.path,
                           workdir=tmp_path_factory.mktemp("arms"))
    result = measure_acceptance(target=tiny_target, arms=plan.arms, limit=2,
                                max_new_tokens=6, steps=2, progress=False)
    return plan, result


def _arm(name, tau, *, matches=2, speedups=(1.0, 1.0, 2.0)):
    return {"name": name, "matches_plain": matches, "speedup_measured": speedups[0],
            "speedup_predicted": speedups[1], "speedup_ceiling": speedups[2],
            "stats": {"tau": tau, "acceptance_cumulative": [0.5, 0.25],
                      "acceptance_conditional": [0.5, 0.5], "tokens_per_s": 10.0}}


def _known(temperature=0.0):
    return {"requests": 2, "settings": {"temperature": temperature},
            "plain": {"tokens_per_s": 8.0},
            "arms": [_arm("a", 2.5, speedups=(1.25, 1.5, 2.0)), _arm("b", 2.0),
                     _arm("last", 1.05), _arm("keys", 1.6)]}


def test_chain_fit_is_the_mean_conditional_of_the_longest_chain():
    points = [{"steps": 1, "tau": 1.5, "conditional": [0.5]},
              {"steps": 3, "tau": 2.0, "conditional": [0.8, 0.6, None]}]
    assert chain_fit(points) == pytest.approx(0.7)  # None: position never reached
    assert chain_fit([{"steps": 2, "tau": 1.0, "conditional": [None, None]}]) == 0.0
    assert chain_fit([]) == 0.0


def test_failure_verdict_on_a_real_measurement(measured):
    plan, r = measured
    text = failure_verdict(r, healthy=plan.healthy).splitlines()
    healthy = r["arms"][0]
    assert text[0].startswith(f"Healthy drafter: tau {healthy['stats']['tau']:.2f}, ")
    assert [line.split(":")[0] for line in text[1:3]] == [a.name for a in plan.arms[1:]]
    assert text[-1] == "Every arm reproduced the plain greedy output token for token."


def test_failure_verdict_branches_on_known_numbers():
    text = failure_verdict(_known(), healthy=2).splitlines()
    assert text[0] == ("Healthy drafter: tau 2.50, measured speedup x1.25 (predicted from tau "
                       "and step costs x1.50, ceiling x2.00).")
    assert text[1:3] == ["last: tau 1.05, 1.45 below the healthy drafter: acceptance "
                         "collapsed to ~1.0.",
                         "keys: tau 1.60, 0.90 below the healthy drafter: acceptance reduced."]
    assert text[3] == "Every arm reproduced the plain greedy output token for token."
    r = _known()
    r["arms"][2]["matches_plain"] = 1
    assert failure_verdict(r, healthy=2).endswith("Outputs differing from plain: ['last']")
    # Sampling: equal outputs are not claimed as greedy reproduction.
    assert failure_verdict(_known(temperature=0.7), healthy=2).endswith(
        "Outputs differing from plain: []")


def test_summary_numbers_are_the_first_arms_and_the_failures(measured):
    plan, r = measured
    n = summary_numbers(r, healthy=plan.healthy)
    first = r["arms"][0]
    assert (n["arm"], n["tau"]) == ("healthy", first["stats"]["tau"])
    assert n["acceptance_per_position"] == first["stats"]["acceptance_cumulative"]
    assert n["conditional_per_position"] == first["stats"]["acceptance_conditional"]
    assert n["plain_tokens_per_s"] == r["plain"]["tokens_per_s"]
    assert n["same_as_plain"] == "2/2"
    assert list(n["failure_arms_tau"]) == [a.name for a in plan.arms[1:]]
    assert n["fast_config"] is None and n["fast_tau"] is None
    known = summary_numbers(_known(), healthy=2)
    assert known["failure_arms_tau"] == {"last": 1.05, "keys": 1.6}
    assert known["speedup_measured"] == 1.25 and known["spec_tokens_per_s"] == 10.0


def test_speed_text_and_fast_numbers_on_known_numbers():
    speed = {"requests": 3, "settings": {"dtype": "bfloat16", "threads": 1,
                                         "max_new_tokens": 256, "steps": 3},
             "plain": {"tokens_per_s": 30.0, "step_s": 0.03},
             "arms": [{**_arm("healthy", 2.5, matches=3, speedups=(1.5, 1.6, 2.4)),
                       "verify_step_s": 0.035, "draft_per_verify_s": 0.015}]}
    assert speed_text(speed) == (
        "bfloat16, 1 thread(s), 3 prompts x 256 tokens, S=3: tau 2.50; plain 30.0 tok/s, "
        "speculative 10.0 tok/s: speedup x1.50 (predicted x1.60, ceiling x2.40); step costs: "
        "plain 30.0 ms, verify 35.0 ms, drafting 15.0 ms; 3/3 outputs identical to plain.")
    n = summary_numbers(_known(), speed=speed, healthy=2)
    assert (n["fast_config"], n["fast_tau"], n["fast_speedup_measured"]) == (
        "bfloat16, 1 thread(s)", 2.5, 1.5)


def test_position_text():
    r = _known()
    assert position_text(r, arm="a", position=2) == (
        "a: position 2: cumulative 0.250, conditional 0.500, tau 2.500")
    assert position_text(r, arm="a", position=3) is None
    r2 = copy.deepcopy(r)
    r2["arms"][0]["stats"]["acceptance_conditional"] = [0.5, None]
    assert "conditional nan" in position_text(r2, arm="a", position=2)
