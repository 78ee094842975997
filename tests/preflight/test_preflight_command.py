"""Launch commands parsed per engine: the values each engine will be asked for."""

from __future__ import annotations

import json

import pytest

from eagle3lab.errors import UserError
from eagle3lab.preflight.command import parse_command


def test_sglang_command_string_with_aliases_and_prefix_flags():
    s = parse_command("CUDA_VISIBLE_DEVICES=0,1 python3 -m sglang.launch_server \\\n"
                      " --model /m/T --speculative-algorithm EAGLE3 --speculative-draft-model "
                      "/m/D --tp 8 --speculative-num-steps 3 --speculative-eagle-topk 4 "
                      "--speculative-num-draft-tokens 5 --context-length 8192 --mem-fraction-"
                      "static 0.8")
    assert (s.engine, s.target, s.draft, s.tp) == ("sglang", "/m/T", "/m/D", 8)
    assert (s.steps, s.topk, s.draft_tokens, s.context_length) == (3, 4, 5, 8192)
    assert s.speculative and "--mem-fraction-static" in s.unknown
    serve = parse_command(["sglang", "serve", "--model-path", "T", "--tensor-parallel-size",
                           "2"])
    assert serve.engine == "sglang" and serve.tp == 2 and not serve.speculative


def test_vllm_serve_with_json_speculative_config():
    sc = {"method": "eagle3", "model": "/m/D", "num_speculative_tokens": 4,
          "draft_tensor_parallel_size": 1}
    v = parse_command(["vllm", "serve", "/m/T", "--speculative_config", json.dumps(sc),
                       "-tp", "4", "--max-model-len", "32k", "--dtype", "bfloat16"])
    assert (v.engine, v.target, v.draft, v.steps, v.tp, v.draft_tp) == \
        ("vllm", "/m/T", "/m/D", 4, 4, 1)
    assert v.context_length == 32000 and v.dtype == "bfloat16" and v.speculative
    api = parse_command(["python", "-m", "vllm.entrypoints.openai.api_server", "--model",
                         "/m/T"])
    assert api.target == "/m/T" and not api.speculative


def test_eagle3lab_serve_uses_its_own_parser():
    r = parse_command(["/usr/bin/python", "-m", "eagle3lab", "serve", "--target", "T",
                       "--draft", "D", "--steps", "2", "--topk", "1", "--draft-tokens", "3"])
    assert (r.engine, r.target, r.draft, r.steps, r.draft_tokens) == \
        ("reference", "T", "D", 2, 3)
    with pytest.raises(UserError, match="does not parse"):
        parse_command(["eagle3lab", "serve", "--stepz", "2"])


@pytest.mark.parametrize("argv,match", [
    (["python", "train.py"], "Not a serving command"),
    (["vllm", "serve", "T", "--speculative-config", "{method: eagle3}"], "not valid JSON"),
    (["vllm", "serve", "T", "--speculative-config", "[1]"], "JSON object"),
    (["python", "-m", "sglang.launch_server", "--tp-size", "eight"], "does not parse"),
    (["vllm", "serve", "T", "--max-model-len", "lots"], "not a number"),
])
def test_bad_commands_are_refused_clearly(argv, match):
    with pytest.raises(UserError, match=match):
        parse_command(argv)
