"""vLLM 0.25.1, as read in its source, against the shipped drafters on the default target
(SmolLM2-135M-Instruct, LlamaForCausalLM, 30 layers). The planted faults go into a copy of
the SGLang-servable one (data/drafters/smollm2-135m-instruct-sglang: speculators format,
eagle3, aux ids [2, 15, 27], draft vocab 8192, TTT 5, norm flags false, with its
eagle3lab.json), whose flags, depth and SGLang conversion these tests are about; the default
drafter (data/drafters/smollm2-135m-instruct: the study's winner, norm flags true, TTT 3)
must pass as well. Each test checks the finding code and severity of `vllm serve TARGET
--speculative-config {...}`.

Config and safetensors headers only: no weights are loaded (a planted tensor fault writes
a new 20 MB file; otherwise the copy links the shipped weights)."""

from __future__ import annotations

import json

import pytest
from pfutil import shipped_copy, shipped_drafter, target_like

from eagle3lab.config import DEFAULT_TARGET, preset_dir
from eagle3lab.preflight import checks
from eagle3lab.preflight.command import parse_command
from eagle3lab.preflight.run import preflight

TARGET = preset_dir(DEFAULT_TARGET)
SGLANG = shipped_drafter(sglang=True)
pytestmark = pytest.mark.skipif(
    not (TARGET / "config.json").is_file() or not (shipped_drafter() / "config.json").is_file()
    or not (SGLANG / "config.json").is_file(),
    reason="the default target (make target) or a shipped drafter is missing")


def serve(draft, k: int | None = 3, *, env: str | None = None, target=TARGET, **kw):
    sc = {"method": "eagle3", "model": str(draft)}
    if k is not None:
        sc["num_speculative_tokens"] = k
    argv = ([env] if env else []) + ["vllm", "serve", str(target), "--speculative-config",
                                     json.dumps(sc)]
    return preflight(argv, engine_parser=False, **kw)


def problems(report):
    """(code, severity) of every error and warning."""
    return sorted((f.code, f.severity) for f in report.findings if f.severity != "info")


def one(report, code):
    [f] = [f for f in report.findings if f.code == code and f.severity != "info"]
    return f


@pytest.mark.parametrize("sglang", [False, True], ids=["default", "sglang"])
def test_the_shipped_drafter_passes_on_vllm_0251(sglang):
    r = serve(shipped_drafter(sglang=sglang))
    assert r.verdict == "ok" and problems(r) == [], r.table()
    assert r.capture["table"] == "vllm-0.25.1" and r.capture["status"] == "yes"
    assert r.aux["engine_capture_points"] == r.aux["training_capture_points"] == [2, 15, 27]
    assert "eagle3lab.json" in r.aux["training_source"]
    notes = " ".join(f.message for f in r.findings if f.severity == "info")
    assert "model runner: V2" in notes and "judged as vLLM 0.25.1" in notes


def test_aux_ids_written_in_sglangs_convention(tmp_path):
    """[1, 14, 26] are SGLang's ids for capture points [2, 15, 27]; vLLM 0.25.1 reads the
    top-level ids unshifted and captures [1, 14, 26]: the training record says otherwise."""
    d = shipped_copy(tmp_path / "d", sglang=True, config=lambda c: c.update(
        eagle_aux_hidden_state_layer_ids=[1, 14, 26]))
    f = one(serve(d), "aux-layers")
    assert f.severity == "error" and f.found == [1, 14, 26] and f.expected == [2, 15, 27]
    assert "does not shift" in f.message


def test_d2t_absent_maps_draft_ids_to_target_ids_0_to_n(tmp_path):
    d = shipped_copy(tmp_path / "d", sglang=True, state=lambda s: s.pop("d2t"))
    f = one(serve(d), "missing-keys")
    assert f.severity == "error" and "d2t" in f.message
    assert "draft_id_to_target_id at zeros" in f.message


def test_norm_before_residual_absent_is_true_in_vllm(tmp_path):
    """vLLM's speculators adapter defaults an absent norm_before_residual to True (algos.py);
    the SGLang-servable drafter was trained with False (its eagle3lab.json engine_profile): error.
    Without the record, what training used is not known: a warning."""
    drop = lambda c: c.pop("norm_before_residual")  # noqa: E731
    f = one(serve(shipped_copy(tmp_path / "rec", sglang=True, config=drop)), "norm-variant")
    assert f.severity == "error" and (f.expected, f.found) == (False, True)
    assert "eagle3lab.json" in f.message
    bare = shipped_copy(tmp_path / "bare", sglang=True, config=drop, sidecar=False)
    f = one(serve(bare), "norm-variant")
    assert f.severity == "warning" and (f.expected, f.found) == (False, True)
    explicit = shipped_copy(tmp_path / "true", sglang=True, config=lambda c: c.update(
        norm_before_residual=True))
    f = one(serve(explicit), "norm-variant")  # stated True, trained False (the record)
    assert f.severity == "error"


def test_num_speculative_tokens_beyond_the_trained_depth(tmp_path):
    """TTT 5 (speculators_config.proposal_methods[0].speculative_tokens): vLLM accepts any
    num_speculative_tokens > 0; 7 is served, with little acceptance at positions 6-7."""
    assert not [f for f in serve(SGLANG, 5).findings if f.code == "draft-tokens"]
    f = one(serve(SGLANG, 7), "draft-tokens")
    assert f.severity == "warning" and (f.expected, f.found) == (5, 7)
    recorded = shipped_copy(tmp_path / "d", sglang=True, config=lambda c: c[
        "speculators_config"]["proposal_methods"][0].update(speculative_tokens=3))
    f = one(serve(recorded, 4), "draft-tokens")
    assert (f.expected, f.found) == (3, 4)
    # The default drafter was trained with TTT 3 and records it: 4 gets the same warning.
    assert not [f for f in serve(shipped_drafter(), 3).findings if f.code == "draft-tokens"]
    f = one(serve(shipped_drafter(), 4), "draft-tokens")
    assert f.severity == "warning" and (f.expected, f.found) == (3, 4)


@pytest.mark.parametrize("k", [None, 0])
def test_num_speculative_tokens_missing_or_zero_refuses_to_start(k):
    f = one(serve(SGLANG, k), "draft-tokens")
    assert f.severity == "error" and "speculative.py" in f.message


def test_fc_built_for_one_layer(tmp_path):
    """A drafter trained on one layer's features (fc [H, H]): vLLM 0.25.1 builds fc for
    3 x H and its weight loader refuses the weight (the server does not start)."""
    d = shipped_copy(tmp_path / "d", sglang=True, state=lambda s: s.update(
        {"fc.weight": s["fc.weight"][:, :576]}))
    f = one(serve(d), "fc-dim")
    assert f.severity == "error" and (f.expected, f.found) == (1728, 576)
    assert "linear.py:369" in f.message


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """The SGLang-servable shipped drafter converted for SGLang 0.5.23 (flat config, ids
    [1, 14, 26] in eagle_config, as SGLang reads them)."""
    from eagle3lab.formats.convert import convert_checkpoint

    out = tmp_path_factory.mktemp("flat") / "sglang"
    return convert_checkpoint(SGLANG, out, to="sglang", target=TARGET,
                              engine="sglang-0.5.23").path


def test_sglang_format_on_vllm_depends_on_the_model_runner(flat):
    """The V2 runner (0.25.1's default for this dense target) ignores eagle_config's ids and
    captures its defaults, [2, 15, 27] = training, by coincidence: a warning; the V1 runner
    reads them unshifted, [1, 14, 26]: an error."""
    v2 = serve(flat)
    f = one(v2, "aux-layers")
    assert f.severity == "warning" and "V1 runner" in f.message and "[1, 14, 26]" in f.message
    v1 = serve(flat, env="VLLM_USE_V2_MODEL_RUNNER=0")
    f = one(v1, "aux-layers")
    assert f.severity == "error" and f.found == [1, 14, 26] and f.expected == [2, 15, 27]
    assert not [f for f in v2.findings if f.code == "keys-layout"]  # midlayer.* loads


def test_last_layer_drafter_starts_only_on_the_v1_runner(flat, tmp_path):
    """eagle_config.use_aux_hidden_state false (an EAGLE-1-style head on the last layer):
    the V2 runner feeds aux states anyway and the start fails (error); the V1 runner feeds
    the final hidden state (info, and no aux-layers check: no aux state is read)."""
    import shutil

    d = shutil.copytree(flat, tmp_path / "last")
    cfg = json.loads((d / "config.json").read_text())
    cfg["eagle_config"]["use_aux_hidden_state"] = False
    (d / "config.json").write_text(json.dumps(cfg))
    f = one(serve(d), "fc-dim")
    assert f.severity == "error" and "VLLM_USE_V2_MODEL_RUNNER=0" in f.message
    v1 = serve(d, env="VLLM_USE_V2_MODEL_RUNNER=0")
    assert v1.ok and problems(v1) == [], v1.table()
    assert any(f.code == "fc-dim" and "final (normed) hidden state" in f.message
               for f in v1.findings)


def test_use_aux_hidden_state_where_vllm_does_not_read_it(tmp_path):
    d = shipped_copy(tmp_path / "d", sglang=True,
                     config=lambda c: c.update(use_aux_hidden_state=False))
    f = one(serve(d), "fc-dim")
    assert f.severity == "warning" and "does not read it" in f.message


def test_seed_failure_checkpoint_loads_on_vllm(tmp_path):
    """specdec/failures.py's checkpoint (an SGLang config over speculators' layers.0.* keys)
    is dropped by SGLang's midlayer loader; vLLM 0.25.1 loads both prefixes."""
    from eagle3lab.specdec.failures import sglang_config_speculators_keys

    d = sglang_config_speculators_keys(SGLANG, tmp_path / "f", target=TARGET)
    assert serve(d).ok
    old = preflight(["python", "-m", "sglang.launch_server", "--model-path", str(TARGET),
                     "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                     str(d)], engine_version="0.5.9", engine_parser=False)
    assert any(f.code == "keys-layout" and f.severity == "error" for f in old.findings)


def test_unsupported_layer_type_refuses_to_start(tmp_path):
    d = shipped_copy(tmp_path / "d", sglang=True, config=lambda c: c[
        "transformer_layer_config"].update(model_type="mistral"))
    f = one(serve(d), "architecture")
    assert f.severity == "error" and "algos.py" in f.message


def test_engine_version_notes():
    newer = serve(SGLANG, engine_version="0.26.0")
    assert any("may differ" in f.message for f in newer.findings if f.severity == "info")
    exact = serve(SGLANG, engine_version="0.25.1")
    assert not any("0.25.1" in f.message and "not known" in f.message for f in exact.findings)


def test_model_runner_choice(tmp_path):
    dense = json.loads((TARGET / "config.json").read_text())
    spec = parse_command(["vllm", "serve", "T", "--speculative-config",
                          '{"method": "eagle3", "model": "D", "num_speculative_tokens": 3}'])
    assert checks.vllm_runner(spec, target_cfg=dense)[0] == "v2"
    moe = {**dense, "num_local_experts": 8, "architectures": ["MixtralForCausalLM"]}
    assert checks.vllm_runner(spec, target_cfg=moe)[0] == "v1"
    assert checks.vllm_runner(spec, target_cfg=moe,
                              env={"VLLM_USE_V2_MODEL_RUNNER": "1"})[0] == "v2"
    pp = parse_command(["env", "A=1", "vllm", "serve", "T", "-pp", "2"])
    assert pp.flags["env"] == {"A": "1"}
    assert checks.vllm_runner(pp, target_cfg=dense)[0] == "v1"


def test_a_moe_target_runs_v1_and_reads_eagle_config_ids(flat, tmp_path):
    moe = target_like({"target": TARGET}, tmp_path / "moe",
                      architectures=["MixtralForCausalLM"], num_local_experts=8)
    f = one(serve(flat, target=moe), "aux-layers")
    assert f.severity == "error" and f.found == [1, 14, 26]
