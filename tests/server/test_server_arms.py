"""The live-server arm plan: baseline always; speculative only when a draft is given, with
the same launch settings; a note says why an arm is skipped."""

from eagle3lab.server.arms import plan_arms


def test_without_a_draft_only_the_baseline_runs():
    arms, notes = plan_arms(engine="reference", target="smollm2-135m-instruct", draft=None)
    assert list(arms) == ["baseline"] and "speculative arm is skipped" in notes[0]
    arms, notes = plan_arms(engine="sglang", target="/m", draft="/d", steps=4)
    assert list(arms) == ["baseline", "speculative"] and notes == []
    assert arms["speculative"].effective_draft_tokens == 5 and arms["baseline"].draft is None


def test_both_arms_share_every_launch_setting_but_the_draft():
    arms, _ = plan_arms(engine="sglang", target="/m", draft="/d", steps=2, topk=4,
                        draft_tokens=6, tp=2, cuda_graph=False, env={"A": "1"},
                        extra_args=["--mem-fraction-static", "0.8"])
    base, spec = arms["baseline"], arms["speculative"]
    for field in ("engine", "target", "tp", "cuda_graph", "device", "env", "extra_args"):
        assert getattr(base, field) == getattr(spec, field), field
    assert (spec.draft, spec.steps, spec.topk, spec.draft_tokens) == ("/d", 2, 4, 6)
    assert base.port == spec.port == 0  # picked free at start
