"""The live-server arm plan: baseline always; speculative only when a draft is given, with
the same launch settings; a note says why an arm is skipped; the reference server's dtype
and threads ("auto": the machine's fastest configuration) the same for both arms, flags
`eagle3lab serve` parses."""

import pytest

from eagle3lab.measure.arms import plan_arms


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


def test_auto_runs_the_reference_server_in_the_machines_fastest_configuration(monkeypatch):
    import eagle3lab.specdec.accept as accept
    from eagle3lab.errors import UserError
    from eagle3lab.measure.arms import live_config

    monkeypatch.setattr(accept, "fastest_cpu_dtype", lambda: "bfloat16")  # native bf16
    fast = live_config(engine="reference", dtype="auto", threads=1, device="cpu")
    assert (fast["dtype"], fast["threads"], fast["fastest"], fast["label"]) == (
        "bfloat16", 1, True, "bfloat16, 1 thread(s)")
    assert fast["args"] == ["--dtype", "bfloat16", "--threads", "1"]
    exact = live_config(engine="reference", dtype="float32", threads=0, device="cpu")
    assert (exact["args"], exact["fastest"]) == ([], False)  # the server's own defaults
    assert not live_config(engine="reference", dtype="auto", threads=2, device="cpu")["fastest"]
    monkeypatch.setattr(accept, "fastest_cpu_dtype", lambda: "float32")  # no native bf16
    auto = live_config(engine="reference", dtype="auto", threads=1, device="cpu")
    assert (auto["dtype"], auto["args"], auto["fastest"]) == ("float32", ["--threads", "1"], True)
    engine = live_config(engine="sglang", dtype="auto", threads=1, cuda_graph=False)
    assert (engine["args"], engine["fastest"], engine["label"]) == (
        [], False, "sglang defaults, no CUDA graphs")
    with pytest.raises(UserError, match="dtype='fp16'"):
        live_config(engine="reference", dtype="fp16")


def test_both_reference_arms_get_the_dtype_and_threads_and_serve_parses_them(monkeypatch):
    import eagle3lab.specdec.accept as accept
    from eagle3lab.engines.serve_args import serve_parser

    monkeypatch.setattr(accept, "fastest_cpu_dtype", lambda: "bfloat16")
    arms, _ = plan_arms(engine="reference", target="smollm2-135m-instruct", draft="/d",
                        device="cpu", dtype="auto", threads=1, extra_args=["--force"])
    for cfg in arms.values():
        argv = cfg.to_argv()
        assert argv[-5:] == ["--force", "--dtype", "bfloat16", "--threads", "1"]
        ns = serve_parser().parse_args(argv[argv.index("serve") + 1:])
        assert (ns.dtype, ns.threads, ns.force) == ("bfloat16", 1, True)
    plain, _ = plan_arms(engine="reference", target="smollm2-135m-instruct", draft=None)
    assert "--dtype" not in plain["baseline"].to_argv()  # default: as before, float32
