"""Per-prompt acceptance from the offline engine: the raw counts of every prompt add up to
the arm's, and the rejected drafts the eager engine keeps are where the target refused
them (tiny random target, untrained drafter: real decoding, nothing stubbed)."""

import pytest

from eagle3lab.specdec.accept import Arm, measure_acceptance
from eagle3lab.specdec.load import load_engine


def test_per_prompt_counts_add_up_to_the_arm(tiny_target, tiny_draft):
    r = measure_acceptance(target=tiny_target, arms=[Arm("a", str(tiny_draft))], limit=3,
                           max_new_tokens=12, steps=3, progress=False)
    arm = r["arms"][0]
    per = arm["per_request"]
    assert len(per) == 3
    assert sum(p["verify_ct"] for p in per) == arm["stats"]["verify_ct"]
    assert sum(p["completion_tokens"] for p in per) == arm["stats"]["completion_tokens"]
    summed = [sum(col) for col in zip(*(p["accept_histogram"] for p in per))]
    assert summed == arm["stats"]["accept_histogram"]
    for p in per:
        assert p["text"] and p["prompt_tokens"] > 0 and p["category"]
        assert sum(p["accept_histogram"]) == p["verify_ct"]
        assert isinstance(p["target_text"], str) and p["target_text"]
        # a rejection per step that did not accept all 3 drafts, as long as it fell inside
        # the answer
        rejected_steps = p["verify_ct"] - p["accept_histogram"][3]
        assert len(p["mismatches"]) <= rejected_steps
        assert len(p["mismatches"]) >= rejected_steps - 1  # the last step may be cut short
        for shown, (pos, drafts, tok) in zip(p["mismatches_shown"], p["mismatches"]):
            assert shown["position"] == pos and isinstance(shown["draft"], str)


@pytest.mark.parametrize("topk", [1, 2])
def test_engine_mismatches_sit_where_the_target_refused_a_draft(tiny_target, tiny_draft, topk):
    from eagle3lab.data.prompts import chat_prompt_ids

    eng = load_engine(target=tiny_target, draft=str(tiny_draft), steps=3, topk=topk)
    ids = chat_prompt_ids(tiny_target.tokenizer, "Write a haiku about rain.")
    res = eng.generate(ids, max_new_tokens=16, seed=0)
    assert res.mismatches, "an untrained drafter is refused somewhere"
    positions = [m[0] for m in res.mismatches]
    assert positions == sorted(set(positions)) and positions[-1] < len(res.output_ids)
    for pos, drafts, target_tok in res.mismatches:
        assert res.output_ids[pos] == target_tok  # what the target said there
        assert drafts and target_tok not in (drafts[:1] if topk == 1 else drafts)
