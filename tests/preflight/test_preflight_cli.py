"""`eagle3lab preflight -- COMMAND` (exit 0/1/2, --json) and the refusals of the launch
paths: the launcher's start(), the benchmark's arms, `eagle3lab serve`."""

from __future__ import annotations

import json

import pytest
from pfutil import hub_cache, sglang_cmd, target_like

from eagle3lab.cli import main
from eagle3lab.errors import UserError


def test_cli_exit_codes_and_json(pf, tmp_path, capsys):
    ok = ["preflight", "--no-engine-parser", "--engine-version", "0.5.23", "--",
          *sglang_cmd(pf["target"], pf["sglang"])]
    assert main(ok) == 0
    assert "OK: 0 error(s)" in capsys.readouterr().out
    glm = target_like(pf, tmp_path / "glm", architectures=["Glm4ForCausalLM"])
    bad = ["preflight", "--json", "--no-engine-parser", "--engine-version", "0.5.23", "--",
           *sglang_cmd(glm, pf["sglang"])]
    assert main(bad) == 1
    out = json.loads(capsys.readouterr().out)
    assert not out["ok"] and "aux-capture" in [f["code"] for f in out["findings"]]
    assert out["capture"]["entry"]["source"] == "sglang/srt/models/glm4.py"
    one_string = ["preflight", "--no-engine-parser", "--",
                  " ".join(sglang_cmd(pf["target"], pf["sglang"]))]
    assert main(one_string) == 0
    capsys.readouterr()


@pytest.mark.parametrize("argv", [
    ["preflight"],
    ["preflight", "--", "python", "train.py"],
    ["preflight", "--trained-aux-layers", "2,x", "--", "vllm", "serve", "T"],
])
def test_cli_not_judged_is_exit_2(argv, capsys):
    assert main(argv) == 2
    assert "eagle3lab preflight: error" in capsys.readouterr().err


def test_cli_hub_ids_not_cached_are_not_judged_exit_2(tmp_path, monkeypatch, capsys):
    """Known bug A, through the CLI: it printed "OK: 0 error(s), 2 warning(s)" and exited 0."""
    hub_cache(monkeypatch, tmp_path)
    launch = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--speculative-config",
              '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",'
              '"num_speculative_tokens":3}']
    assert main(["preflight", "--", *launch]) == 2
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("NOT JUDGED:") and "'meta-llama/Llama-3.1-8B-Instruct'" in last
    assert "'yuhuili/EAGLE3-LLaMA3.1-Instruct-8B'" in last
    assert main(["preflight", "--json", "--", *launch]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "not judged" and not out["judged"] and out["ok"]
    assert [u["who"] for u in out["unresolved"]] == ["target", "drafter"]


def test_cli_a_missing_local_drafter_is_exit_1(pf, capsys):
    """Known bug B, through the CLI: a warning and exit 0 before."""
    launch = ["vllm", "serve", str(pf["target"]), "--speculative-config",
              '{"method": "eagle3", "model": "/tmp/nope-eagle3lab", '
              '"num_speculative_tokens": 3}']
    assert main(["preflight", "--json", "--", *launch]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "not ok" and out["judged"]
    assert [f["severity"] for f in out["findings"] if f["code"] == "model-path"] == ["error"]


def test_trained_aux_layers_option(pf, tmp_path, capsys):
    argv = ["preflight", "--json", "--no-engine-parser", "--engine-version", "0.5.23",
            "--trained-aux-layers", "1,3,5", "--", *sglang_cmd(pf["target"], pf["sglang"])]
    assert main(argv) == 1  # the drafter captures [2, 4, 5]; "trained" on [1, 3, 5]
    out = json.loads(capsys.readouterr().out)
    assert out["aux"]["training_capture_points"] == [1, 3, 5]
    assert any(f["code"] == "aux-layers" and f["severity"] == "error"
               for f in out["findings"])


def _glm_launch(pf, tmp_path, **kw):
    from eagle3lab.engines.argv import LaunchConfig

    glm = target_like(pf, tmp_path / "glm", architectures=["Glm4ForCausalLM"])
    return LaunchConfig(target=str(glm), draft=str(pf["sglang"]), port=0,
                        sglang_version="0.5.23", **kw)


def test_launcher_refuses_on_a_preflight_error_before_any_process(pf, tmp_path, monkeypatch):
    from eagle3lab.preflight.run import PreflightRefused
    from eagle3lab.serving import launch

    monkeypatch.setattr(launch, "check_argv_with_sglang", lambda argv, **kw: {
        "status": "unavailable", "reason": "not checked in this test", "parsed": None,
        "stubbed": [], "messages": []})
    with pytest.raises(PreflightRefused, match=r"\[aux-capture\].*Glm4ForCausalLM") as e:
        launch.start(_glm_launch(pf, tmp_path), run_dir=tmp_path / "run")
    assert not e.value.report.ok and isinstance(e.value, UserError)
    assert not (tmp_path / "run" / "sglang.log").exists()


def _vllm_launch(target, draft):
    from eagle3lab.engines.argv import LaunchConfig

    return LaunchConfig(target=str(target), draft=str(draft), engine="vllm", port=0)


def test_launcher_starts_an_unresolved_or_cached_hub_id_and_refuses_a_missing_path(
        pf, tmp_path, monkeypatch):
    """`start()` refuses on `not report.ok`: a hub-id target is judged in full where it is
    cached, is only "not judged" (a warning, no refusal) where it is not, and a local path
    that does not exist is an error (refused before any process)."""
    from eagle3lab.preflight.run import PreflightRefused
    from eagle3lab.serving import launch

    started = []

    class Handle:  # what start() returns, without a process
        notes: list = []

    monkeypatch.setattr(launch, "start_command", lambda argv, **kw: started.append(
        (argv, kw["preflight"])) or Handle())
    cache = hub_cache(monkeypatch, tmp_path)
    cache("some-org/cached-target", pf["target"])
    launch.start(_vllm_launch("some-org/cached-target", pf["spec"]), run_dir=tmp_path / "run")
    report = started[-1][1]
    assert report["judged"] and report["ok"] and report["capture"]["status"] == "yes"
    launch.start(_vllm_launch("some-org/not-cached", pf["spec"]), run_dir=tmp_path / "run")
    assert started[-1][1]["verdict"] == "not judged"
    with pytest.raises(PreflightRefused, match=r"\[model-path\]"):
        launch.start(_vllm_launch(pf["target"], tmp_path / "no-such-drafter"),
                     run_dir=tmp_path / "run")
    assert len(started) == 2


def test_benchmark_records_a_refused_arm_and_runs_no_server(pf, tmp_path, monkeypatch):
    from eagle3lab.measure.bench import benchmark_arms
    from eagle3lab.serving import launch

    monkeypatch.setattr(launch, "check_argv_with_sglang", lambda argv, **kw: {
        "status": "unavailable", "reason": "not checked in this test", "parsed": None,
        "stubbed": [], "messages": []})
    res = benchmark_arms({"speculative": _glm_launch(pf, tmp_path)}, prompts=[],
                         run_dir=tmp_path / "run", log=lambda s: None)
    assert "Preflight refuses" in res.skipped["speculative"]
    assert res.stops == {} and not (tmp_path / "run" / "speculative.log").exists()


def test_eagle3lab_serve_refuses_before_loading_anything(pf, tmp_path, capsys):
    bad = target_like(pf, tmp_path / "t", architectures=["LlamaForCausalLM"],
                      vocab_size=64)  # the drafter's d2t and vocab no longer fit
    rc = main(["serve", "--target", str(bad), "--draft", str(pf["spec"]), "--port", "0"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "preflight refuses this launch" in err and "vocab-map" in err


@pytest.mark.slow
def test_sglangs_own_parser_runs_beside_the_checks(pf):
    """The real prepare_server_args (a subprocess importing sglang, ~20 s on a loaded CPU):
    a misspelt flag is a launch-command error; a good command parses."""
    import importlib.util

    from eagle3lab.preflight.run import preflight

    if importlib.util.find_spec("sglang") is None:  # only a missing sglang skips
        pytest.skip("sglang is not installed (pip install --no-deps -r "
                    "requirements-sglang-cpu.txt)")
    bad = preflight(sglang_cmd(pf["target"], pf["sglang"], "--speculative-num-stepz", "3"))
    assert bad.parser and bad.parser["status"] == "invalid", bad.parser  # not "unavailable"
    assert not bad.ok
    assert "unrecognized arguments: --speculative-num-stepz" in [
        f for f in bad.findings if f.code == "launch-command"][0].message
