"""bench/vllm_check.py's pieces that run without a GPU: the planted faults (each a copy of
the SGLang-servable shipped drafter, the script's DRAFTER, changed in exactly the one way
it names; the shipped files untouched) and the exact vLLM argv and environment of an arm.
The whole script ran on an H200 (docs/vllm.md); its files are
tests/serverlogs/fixtures/vllm-0.25.1/."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def vc():
    spec = importlib.util.spec_from_file_location("_bench_vllm_check", BENCH / "vllm_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def _keys(d: Path) -> set[str]:
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        return set(f.keys())


@pytest.mark.real
def test_each_fault_changes_one_thing(vc, tmp_path, default_target_dir):
    src = vc.DRAFTER
    shipped_cfg, shipped_keys = json.loads((src / "config.json").read_text()), _keys(src)
    got = {}
    for kind in vc.FAULTS:
        d, steps, env = vc.plant(kind, src, tmp_path / kind, str(default_target_dir))
        got[kind] = (Path(d), steps, env)
    cfg = {k: json.loads((d / "config.json").read_text()) for k, (d, _, _) in got.items()
           if k != "missing-path"}
    assert cfg["aux-ids-sglang-convention"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert _keys(got["d2t-dropped"][0]) == shipped_keys - {"d2t"}
    assert _keys(got["t2d-dropped"][0]) == shipped_keys - {"t2d"}
    with safe_open(str(got["last-layer-features"][0] / "model.safetensors"), "pt") as f:
        assert list(f.get_slice("fc.weight").get_shape()) == [576, 576]
    assert "norm_before_residual" not in cfg["norm-before-residual-dropped"]
    assert {k for k in _keys(got["midlayer-keys"][0]) if k.startswith("midlayer.")} and \
        not {k for k in _keys(got["midlayer-keys"][0]) if k.startswith("layers.0.")}
    assert got["k8-vs-trained"][1] == 8 and _keys(got["k8-vs-trained"][0]) == shipped_keys
    assert cfg["sglang-format"]["architectures"] == ["LlamaForCausalLMEagle3"]
    assert got["sglang-format-v1"][2] == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert got["missing-path"][0] == Path("/tmp/nope")
    # the shipped drafter is as it was
    assert json.loads((src / "config.json").read_text()) == shipped_cfg
    assert _keys(src) == shipped_keys


def test_an_arm_is_the_exact_vllm_command(vc, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/root/e3l/site")
    ctx = vc.Ctx(engine="vllm", target="/t", run_dir=tmp_path, out=tmp_path, limit=4,
                 max_new_tokens=8, deadline=0.0, kv_bytes=3 << 30)
    arm = vc.Arm("x", "/d", 5, dtype="float32", eager=True, env={"VLLM_USE_V2_MODEL_RUNNER": "0"})
    cfg = vc.launch_config(ctx, arm)
    argv = cfg.to_argv()
    assert argv[:5] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "/t"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "eagle3", "model": "/d", "num_speculative_tokens": 5}
    assert "--enforce-eager" in argv and argv[argv.index("--dtype") + 1] == "float32"
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(3 << 30)
    assert cfg.env == {"PYTHONPATH": "/root/e3l/site", "VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert vc.same_outputs([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]]) == {
        "n": 2, "identical": 1, "first_difference_at": [1]}
