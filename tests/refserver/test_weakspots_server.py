"""The reference server writes SGLang 0.5.23's per-request speculative fields (and the
older histogram name), so per-prompt acceptance and weak spots work against it as against
SGLang; its vLLM route, like vLLM 0.25.1, has none, and says so in one line."""

import json

import pytest

from eagle3lab.errors import UserError
from eagle3lab.measure.client import http_json, per_request_spec
from eagle3lab.measure.weakspots import server_per_request, weak_spots


def test_meta_info_has_sglangs_per_request_fields(tiny_spec_server):
    status, out = http_json(tiny_spec_server.url + "/generate", {
        "input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 12,
                                                       "temperature": 0.0}})
    assert status == 200
    meta = out["meta_info"]
    full, grown = meta["spec_accept_histogram"], meta["spec_correct_drafts_histogram"]
    assert len(full) == 4 and sum(full) == meta["spec_verify_ct"]
    assert full[:len(grown)] == grown and not any(full[len(grown):])  # 0.5.23's length
    assert grown[-1] > 0 or len(grown) == 1
    assert meta["spec_num_proposed_drafts"] == 3 * meta["spec_verify_ct"]
    c = per_request_spec(out)
    assert c["accept_histogram"] == full and c["num_draft_tokens"] == 3
    assert c["accepted_drafts"] == meta["spec_num_correct_drafts"]
    assert meta["spec_accept_length"] == pytest.approx(c["completion_tokens"] / c["verify_ct"])


def test_weak_spots_from_the_server(tiny_spec_server, tiny_target_dir, tmp_path, capsys):
    url = tiny_spec_server.url
    saved = tmp_path / "results.json"
    r = server_per_request(url, prompts="eval", target=str(tiny_target_dir), limit=3,
                           max_new_tokens=10, save=saved)
    assert len(r["per_request"]) == 3
    assert all(p["verify_ct"] == sum(p["accept_histogram"]) for p in r["per_request"])
    w = weak_spots(saved, worst=2, export=tmp_path / "weak.jsonl")
    assert w.source["kind"] == "server" and len(w.ranking) == 3
    assert json.loads(saved.read_text())["kind"] == "eagle3lab-server-per-request"
    with pytest.raises(UserError) as e:  # like vLLM 0.25.1: no per-request counts
        server_per_request(url, target=str(tiny_target_dir), api="vllm", limit=1,
                           max_new_tokens=4)
    assert "\n" not in str(e.value) and "no per-request speculative stats" in str(e.value)

    from eagle3lab.cli import main

    assert main(["weak-spots", "--server", url, "--target", str(tiny_target_dir),
                 "--limit", "2", "--max-new-tokens", "8", "--worst", "1"]) == 0
    assert "worst 1:" in capsys.readouterr().out
    assert main(["weak-spots", "--server", url, "--api", "vllm", "--target",
                 str(tiny_target_dir), "--limit", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reports no per-request speculative stats" in err
