"""Weak spots: per-request speculative counts read from SGLang's and vLLM's answers (the
fixtures mirror their real fields, cited), prompts ranked by tau with groups as ratios of
sums, the weakest exported as a prompts file that load_prompts reads back, and bad input
as one line."""

import json

import pytest

from eagle3lab.data.prompts import load_prompts
from eagle3lab.errors import UserError
from eagle3lab.measure.client import per_request_spec
from eagle3lab.measure.weakspots import (length_bin, load_per_request, rank_prompts,
                                         tau_by, weak_spots)

#: An SGLang 0.5.23 `/generate` answer with speculation (3 steps, topk 1, so 3 drafts per
#: verify step), its meta_info keys as sglang/srt/managers/tokenizer_manager.py
#: `_calculate_spec_decoding_metrics` (0.5.23) writes them: spec_num_proposed_drafts =
#: verify steps x (speculative_num_draft_tokens - 1); the histogram grown only as far as
#: the largest count seen (schedule_batch.py `update_spec_correct_drafts_histogram`), so
#: no entry for 3 accepted here.
SGLANG_0523 = {
    "text": " Paris is the capital of France.", "output_ids": list(range(32)),
    "meta_info": {"id": "a3f9", "finish_reason": {"type": "length", "length": 32},
                  "prompt_tokens": 21, "weight_version": "default", "total_retractions": 0,
                  "completion_tokens": 32, "cached_tokens": 0, "e2e_latency": 0.41,
                  "spec_accept_rate": 18 / 42, "spec_accept_length": 32 / 14,
                  "spec_num_correct_drafts": 18, "spec_num_proposed_drafts": 42,
                  "spec_verify_ct": 14, "spec_correct_drafts_histogram": [3, 4, 7]}}

#: vLLM 0.25.1's `/v1/completions` answer (as the reference server writes it, routes.py):
#: `metrics` holds no speculative counts.
VLLM_0251 = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
             "choices": [{"index": 0, "text": "hi", "logprobs": None, "finish_reason": "length",
                          "stop_reason": None, "token_ids": [1, 2], "prompt_logprobs": None,
                          "prompt_token_ids": None, "routed_experts": None}],
             "service_tier": None, "system_fingerprint": None,
             "usage": {"prompt_tokens": 5, "total_tokens": 7, "completion_tokens": 2,
                       "prompt_tokens_details": None},
             "kv_transfer_params": None, "metrics": None}

#: A later vLLM with --per-request-spec-decode-metrics summary: the example of its docs
#: ("Per-Request Acceptance Metrics"; vllm/entrypoints/generate/base/protocol.py
#: `SpeculativeDecodingMetrics`, vLLM main after pull request #48915).
VLLM_SUMMARY = {**VLLM_0251, "usage": {"prompt_tokens": 5, "completion_tokens": 53,
                                       "total_tokens": 58},
                "metrics": {"speculative_decoding": {
                    "mean_acceptance_length": 1.2325581395348837,
                    "draft_acceptance_rate": 0.07751937984496124,
                    "acceptance_histogram": [39, 1, 0, 3], "num_spec_steps": 43,
                    "num_accepted_draft_tokens": 10, "num_draft_tokens": 129,
                    "num_spec_tokens": 3}}}


def test_sglang_meta_info_counts_padded_to_every_position():
    c = per_request_spec(SGLANG_0523)
    assert c["verify_ct"] == 14 and c["num_draft_tokens"] == 3
    assert c["accept_histogram"] == [3, 4, 7, 0]
    assert c["accepted_drafts"] == 18 == sum(k * n for k, n in enumerate(c["accept_histogram"]))
    assert c["completion_tokens"] / c["verify_ct"] == SGLANG_0523["meta_info"][
        "spec_accept_length"]
    old = {"meta_info": {**{k: v for k, v in SGLANG_0523["meta_info"].items()
                            if k != "spec_correct_drafts_histogram"},
                         "spec_accept_histogram": [3, 4, 7, 0]}}
    assert per_request_spec(old)["accept_histogram"] == [3, 4, 7, 0]


def test_vllm_counts_when_reported_and_one_line_when_not():
    c = per_request_spec(VLLM_SUMMARY)
    assert c["verify_ct"] == 43 and c["accepted_drafts"] == 10
    assert 1 + c["accepted_drafts"] / c["verify_ct"] == pytest.approx(
        VLLM_SUMMARY["metrics"]["speculative_decoding"]["mean_acceptance_length"])
    with pytest.raises(UserError) as e:
        per_request_spec(VLLM_0251, where="http://h:8000/v1/completions")
    msg = str(e.value)
    assert "\n" not in msg and "reports no per-request speculative stats" in msg
    assert "0.25.1" in msg and "http://h:8000" in msg
    with pytest.raises(UserError, match="no per-request speculative stats"):
        per_request_spec({"meta_info": {"completion_tokens": 4}})  # not speculating


def _rec(pid, hist, *, cat, tokens, text=None):
    return {"prompt": pid, "text": text or f"prompt {pid}", "category": cat,
            "prompt_tokens": tokens, "completion_tokens": sum(hist) + sum(
                k * c for k, c in enumerate(hist)), "verify_ct": sum(hist),
            "accept_histogram": hist}


def test_ranking_and_groups_are_ratios_of_sums():
    recs = [_rec("a", [1, 0, 0, 3], cat="code", tokens=20),   # tau 1 + 9/4
            _rec("b", [8, 0, 0, 0], cat="code", tokens=100),  # tau 1
            _rec("c", [2, 2, 0, 0], cat="chat", tokens=40)]   # tau 1.5
    r = rank_prompts(recs)
    assert list(r["prompt"]) == ["b", "c", "a"]
    assert r.loc[2, "tau"] == pytest.approx(3.25) and r.loc[2, "acc@3"] == pytest.approx(0.75)
    g = tau_by(r, "category").set_index("category")
    assert g.loc["code", "tau"] == pytest.approx(1 + 9 / 12)  # not the mean of 3.25 and 1
    assert [length_bin(t) for t in (20, 40, 100, 999, None)] == [
        "<=32", "<=64", "<=128", ">256", "unknown"]


@pytest.fixture(scope="module")
def accept_json(tmp_path_factory, tiny_target, tiny_target_dir):
    """A real `accept` output on the tiny target (4 prompts, an untrained drafter), as
    `--json` writes it."""
    from eagle3lab.formats.demo import make_speculators_draft
    from eagle3lab.specdec.accept import Arm, measure_acceptance

    d = tmp_path_factory.mktemp("ws")
    draft = make_speculators_draft(d / "draft", target=tiny_target_dir, draft_vocab=512)
    r = measure_acceptance(target=tiny_target, arms=[Arm("a", str(draft))], limit=4,
                           max_new_tokens=10, steps=3, progress=False)
    path = d / "accept.json"
    path.write_text(json.dumps(r, default=str))
    return path


def test_weak_spots_export_round_trips_through_load_prompts(accept_json, tmp_path):
    w = weak_spots(accept_json, worst=3, export=tmp_path / "weak.jsonl")
    assert len(w.ranking) == 4 and len(w.worst) == 3
    assert w.source["kind"] == "offline" and w.source["arm"] == "a"
    assert list(w.ranking["tau"]) == sorted(w.ranking["tau"])
    assert w.by_length["prompts"].sum() == 4 and w.by_category["prompts"].sum() == 4
    back = load_prompts(tmp_path / "weak.jsonl")
    per = {p["prompt"]: p for p in json.loads(accept_json.read_text())["arms"][0]["per_request"]}
    assert [p.id for p in back] == [f"weak-{x['prompt']}" for x in w.worst]
    assert [p.prompt for p in back] == [per[x["prompt"]]["text"] for x in w.worst]
    assert all(x["mismatches"] for x in w.worst)  # drafts beside the target's tokens
    meta = json.loads((tmp_path / "weak.jsonl.meta.json").read_text())
    assert meta["kind"] == "eagle3lab-weak-spots" and meta["prompts"] == 3


def test_bad_inputs_are_one_line(accept_json, tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(UserError, match="neither `eagle3lab accept --json` output"):
        load_per_request(bad)
    with pytest.raises(UserError, match="no arm 'zzz'; the arms are"):
        load_per_request(accept_json, arm="zzz")
    old = json.loads(accept_json.read_text())
    del old["arms"][0]["per_request"][1]["accept_histogram"]
    bad.write_text(json.dumps(old))
    with pytest.raises(UserError, match=r"per_request\[1\] lacks"):
        load_per_request(bad)
    with pytest.raises(UserError, match="must be a whole number"):
        weak_spots(accept_json, worst=0)


def test_cli_weak_spots(accept_json, tmp_path, capsys):
    from eagle3lab.cli import main

    assert main(["weak-spots", str(accept_json), "--worst", "2", "--export",
                 str(tmp_path / "w.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "tau by prompt length" in out and "worst 2:" in out and "drafted" in out
    assert len(load_prompts(tmp_path / "w.jsonl")) == 2
    assert main(["weak-spots", str(tmp_path / "missing.json")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
