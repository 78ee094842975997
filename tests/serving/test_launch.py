"""LaunchConfig -> the exact argv; strictness; and the argv checked with SGLang's own
`prepare_server_args` where sglang is installed (skipped only where it is not: a check that
crashes or cannot import sglang fails)."""

import importlib.util
import sys

import pytest

from eagle3lab.engines.argv import LaunchConfig
from eagle3lab.engines.sglang_parser import check_argv_with_sglang
from eagle3lab.errors import UserError
from eagle3lab.serving.launch import start

EAGLE3 = dict(target="/models/Llama-3.1-8B-Instruct", draft="/ckpt/eagle3-llama", steps=3,
              topk=1, port=30001)


def test_sglang_argv_exact():
    cfg = LaunchConfig(**EAGLE3, cuda_graph=False, cuda_graph_max_bs=8,
                       max_running_requests=4, sglang_version="0.5.23",
                       extra_args=["--mem-fraction-static", "0.8"], python="python3")
    assert cfg.to_argv() == [
        "python3", "-m", "sglang.launch_server", "--model-path",
        "/models/Llama-3.1-8B-Instruct", "--tp-size", "1", "--host", "127.0.0.1",
        "--port", "30001", "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "/ckpt/eagle3-llama", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
        "--disable-cuda-graph", "--cuda-graph-max-bs-decode", "8",
        "--max-running-requests", "4", "--mem-fraction-static", "0.8"]
    assert cfg.url == "http://127.0.0.1:30001"


def test_baseline_argv_has_no_speculative_flags_and_old_release_flag():
    argv = LaunchConfig(target="/m", tp=2, cuda_graph_max_bs=16, sglang_version="0.4.6",
                        python="python3").to_argv()
    assert not [a for a in argv if a.startswith("--speculative")]
    assert argv[argv.index("--tp-size") + 1] == "2"
    assert argv[argv.index("--cuda-graph-max-bs") + 1] == "16"


def test_reference_argv():
    cfg = LaunchConfig(engine="reference", target="smollm2-135m-instruct", draft="/d",
                       steps=4, port=1234, device="cpu", python="py")
    assert cfg.to_argv() == ["py", "-m", "eagle3lab", "serve", "--target",
                             "smollm2-135m-instruct", "--host", "127.0.0.1", "--port", "1234",
                             "--device", "cpu", "--draft", "/d", "--steps", "4", "--topk", "1",
                             "--draft-tokens", "5"]


def test_strict_config():
    with pytest.raises(UserError, match="unknown field.*speculative_num_stepz"):
        LaunchConfig.from_dict({"target": "/m", "speculative_num_stepz": 3})
    with pytest.raises(UserError, match="'steps'"):
        LaunchConfig.from_dict({"target": "/m", "steps": "3"})
    with pytest.raises(UserError, match="draft_tokens=6 with topk=1"):
        LaunchConfig(**{**EAGLE3, "draft_tokens": 6})
    with pytest.raises(UserError, match="topk > 1"):
        LaunchConfig(**{**EAGLE3, "topk": 4})
    with pytest.raises(UserError, match="engine"):
        LaunchConfig(target="/m", engine="tensorrt-llm")  # vllm is one now
    with pytest.raises(UserError, match="tp"):
        LaunchConfig(target="/m", engine="reference", tp=2)
    cfg = LaunchConfig.from_dict({**EAGLE3, "env": {"NCCL_DEBUG": "INFO"},
                                  "extra_args": ["--enable-metrics"]})
    assert cfg.env == {"NCCL_DEBUG": "INFO"} and cfg.effective_draft_tokens == 4


@pytest.mark.parametrize("data, expected", [
    ({"target": "/m", "speculative_num_stepz": 3},
     "launch.yaml: unknown field(s) speculative_num_stepz (known fields: "),
    ({"target": "/m", "steps": "3"},
     "launch.yaml: field 'steps' has value '3' (str); expected a valid integer."),
    ({"target": "/m", "port": 70000},
     "launch.yaml: field 'port' has value 70000 (int); expected a value less than or equal "
     "to 65535."),
    ({"target": "/m", "topk": 0},
     "launch.yaml: field 'topk' has value 0 (int); expected a value greater than or equal to 1"),
    ({"target": "/m", "extra_args": ["--x", 3]},
     "launch.yaml: field 'extra_args[1]' has value 3 (int); expected a valid string."),
    ({"target": "/m", "env": {"NCCL_DEBUG": 1}}, "launch.yaml: field 'env.NCCL_DEBUG'"),
    ({"steps": 3}, "launch.yaml: field 'target' is required."),
    (["/m"], "launch.yaml: expected a mapping of fields, found list."),
])
def test_strict_config_errors_name_the_file_and_field(data, expected):
    with pytest.raises(UserError) as e:
        LaunchConfig.from_dict(data, "launch.yaml")
    assert str(e.value).startswith(expected)


def test_config_saves_as_before_and_copies_unvalidated_fields():
    """model_dump keeps the field order (the launch record's keys); start() picks a port
    with model_copy."""
    cfg = LaunchConfig(target="/m", port=0)
    assert list(cfg.model_dump())[:4] == ["target", "draft", "engine", "tp"]
    assert cfg.model_copy(update={"port": 1234}).url == "http://127.0.0.1:1234"
    assert cfg.port == 0


def _checked(argv):
    """SGLang's parser on argv. Only a missing sglang skips: any other "unavailable" (our
    sglang_check.py crashing, an sglang that does not import, a timeout) fails."""
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (pip install --no-deps -r "
                    "requirements-sglang-cpu.txt)")
    res = check_argv_with_sglang(argv)
    assert res["status"] != "unavailable", res
    return res


@pytest.mark.slow
def test_argv_checked_with_sglang_prepare_server_args():
    cfg = LaunchConfig(**EAGLE3, cuda_graph=False, cuda_graph_max_bs=8,
                       max_running_requests=4, python=sys.executable)
    res = _checked(cfg.to_argv())
    assert res["status"] == "ok", res
    p = res["parsed"]
    assert p["speculative_algorithm"] == "EAGLE3"
    assert p["speculative_draft_model_path"] == "/ckpt/eagle3-llama"
    assert (p["speculative_num_steps"], p["speculative_eagle_topk"],
            p["speculative_num_draft_tokens"]) == (3, 1, 4)
    assert (p["host"], p["port"], p["tp_size"], p["max_running_requests"]) == \
        ("127.0.0.1", 30001, 1, 4)


@pytest.mark.slow
def test_bad_argv_is_refused_before_launch(tmp_path, monkeypatch):
    from eagle3lab.serving import launch

    cfg = LaunchConfig(**EAGLE3, extra_args=["--speculative-num-stepz", "3"])
    res = _checked(cfg.to_argv())
    assert res["status"] == "invalid"
    assert "unrecognized arguments: --speculative-num-stepz" in res["reason"]
    monkeypatch.setattr(launch, "check_argv_with_sglang", lambda argv, **kw: res)
    with pytest.raises(UserError, match="unrecognized arguments: --speculative-num-stepz"):
        start(cfg, run_dir=tmp_path)
    assert not (tmp_path / "sglang.log").exists()
