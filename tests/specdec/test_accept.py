"""Offline acceptance end to end: measure, refuse misfits, truncate long prompts, CLI.
(Notebook 05 runs once, in the tiny report: tests/report/test_report.py checks it.)"""

import json

import pytest

from eagle3lab.specdec.accept import (Arm, measure_acceptance, measure_chain_lengths,
                                      measure_speed, prompt_ids, summary_rows)
from eagle3lab.errors import UserError


def test_measure_acceptance_counts(tiny_target, tiny_draft):
    r = measure_acceptance(target=tiny_target, arms=[Arm("a", str(tiny_draft)),
                                                     Arm("last", str(tiny_draft), "last_layer")],
                           limit=3, max_new_tokens=10, steps=3, progress=False)
    assert r["requests"] == 3 and len(r["arms"]) == 2
    for a in r["arms"]:
        st = a["stats"]
        assert a["matches_plain"] == 3, "greedy speculative output equals plain output"
        assert sum(st["accept_histogram"]) == st["verify_ct"]
        assert len(st["accept_histogram"]) == 4
        assert st["tau"] == pytest.approx(st["completion_tokens"] / st["verify_ct"])
        assert a["speedup_ceiling"] > a["speedup_predicted"] > 0
    rows = summary_rows(r)
    assert rows[1]["features"] == "last_layer" and "acc@3" in rows[0]


def test_tree_setting(tiny_target, tiny_draft):
    r = measure_acceptance(target=tiny_target, draft=str(tiny_draft), limit=2,
                           max_new_tokens=8, steps=3, topk=2, draft_tokens=5, progress=False)
    assert r["arms"][0]["matches_plain"] == 2 and r["arms"][0]["num_draft_tokens"] == 4


@pytest.mark.real
def test_misfit_drafter_refused_with_doctor_codes(default_target_dir, tiny_draft):
    with pytest.raises(UserError, match=r"refused before decoding.*\[(hidden-size|fc-dim)\]"):
        measure_acceptance(target=str(default_target_dir), draft=str(tiny_draft), limit=1,
                           max_new_tokens=4, progress=False)


def test_long_prompts_truncated_with_warning(tiny_target, capsys):
    ids = prompt_ids(tiny_target.tokenizer, "eval", 3, 20)
    assert all(len(x) <= 20 for _, x in ids)
    assert "truncated to its last 20" in capsys.readouterr().out


def test_cli_accept_json(tiny_target_dir, tiny_draft, capsys):
    from eagle3lab.cli import main

    rc = main(["accept", "--target", str(tiny_target_dir), "--draft", str(tiny_draft),
               "--limit", "1", "--max-new-tokens", "6", "--steps", "2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arms"][0]["stats"]["verify_ct"] >= 1 and out["settings"]["steps"] == 2


def test_threads_are_set_for_the_measurement_and_restored(tiny_target_dir, tiny_draft):
    import torch

    from eagle3lab.specdec.accept import fastest_cpu_dtype, measure_acceptance

    before = torch.get_num_threads()
    r = measure_acceptance(target=str(tiny_target_dir), draft=str(tiny_draft), limit=1,
                           max_new_tokens=4, steps=2, threads=1, progress=False)
    assert r["settings"]["threads"] == 1 and r["settings"]["dtype"] == "float32"
    assert torch.get_num_threads() == before
    assert fastest_cpu_dtype() in ("bfloat16", "float32")


def test_cli_accept_without_a_draft_and_no_default_is_a_clear_error(tiny_target_dir, capsys):
    from eagle3lab.cli import main

    rc = main(["accept", "--target", str(tiny_target_dir), "--limit", "1"])
    err = capsys.readouterr().err
    assert rc == 1 and "No drafter given (--draft)" in err and "Pass --draft" in err


@pytest.mark.real
def test_cli_accept_uses_the_default_drafter(default_target_dir, capsys):
    from eagle3lab.cli import main
    from eagle3lab.workdir import default_drafter

    rc = main(["accept", "--limit", "1", "--max-new-tokens", "4", "--steps", "2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arms"][0]["draft"] == default_drafter() and out["arms"][0]["matches_plain"] == 1


def test_chain_lengths_are_measured_as_chains(tiny_target, tiny_draft):
    from eagle3lab.specdec.readout import chain_fit
    from eagle3lab.specdec.stats import chain_expected_tau

    points = measure_chain_lengths(target=tiny_target, arm=Arm("a", str(tiny_draft)),
                                   chain_lengths=[2, 1, 2], limit=1, max_new_tokens=6,
                                   steps=5, topk=3, draft_tokens=9)
    assert [p["steps"] for p in points] == [1, 2]  # distinct, shortest first
    assert [len(p["conditional"]) for p in points] == [1, 2]  # chains: g positions
    assert all(1.0 <= p["tau"] <= p["steps"] + 1 for p in points)
    a = chain_fit(points)
    assert 0.0 <= a <= 1.0 and 1.0 <= chain_expected_tau(a, 2) <= 3.0


def test_speed_in_another_dtype_leaves_the_loaded_target(tiny_target, tiny_draft):
    from eagle3lab.specdec.readout import speed_text

    assert measure_speed(target=tiny_target, draft=str(tiny_draft), dtype="none") is None
    speed = measure_speed(target=tiny_target, draft=str(tiny_draft), dtype="bfloat16",
                          threads=1, limit=1, max_new_tokens=5, steps=2)
    assert speed["settings"]["dtype"] == "bfloat16" and speed["settings"]["threads"] == 1
    assert str(tiny_target.dtype) == "torch.float32"  # reloaded, not converted in place
    assert [a["name"] for a in speed["arms"]] == ["healthy"] and speed["requests"] == 1
    assert speed_text(speed).startswith("bfloat16, 1 thread(s), 1 prompts x 5 tokens, S=2: ")
    same = measure_speed(target=tiny_target, draft=str(tiny_draft), dtype="float32",
                         threads=1, limit=1, max_new_tokens=5, steps=2)
    assert same["target"] == tiny_target.describe()  # the loaded target itself
