"""eagle3lab.train: learns, resumes exactly, refuses mismatched shards, stops on NaN, and
saves a drafter that speculators' class reloads with identical outputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eagle3lab.errors import UserError
from eagle3lab.workdir import WorkDir


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _evals(run: Path) -> list[dict]:
    return [x for x in _lines(run) if x.get("eval")]


# --- learning ----------------------------------------------------------------------------
def test_learns_the_sharp_target(trained_run):
    """Learnable task: a target with sharp next-token distributions (logits x40). Its KL
    from the untrained drafter is > 10 nats; training must bring position 0 below 3.0 and
    its accuracy above 0.3 on held-out conversations."""
    ev = _evals(trained_run)
    first, last = ev[0], ev[-1]
    assert first["step"] == 0 and first["train"] is None
    assert first["eval"]["loss"][0] > 10.0
    assert last["eval"]["loss"][0] < 3.0, last["eval"]["loss"]
    assert last["eval"]["full_acc"][0] > 0.3, last["eval"]["full_acc"]
    assert all(last["eval"]["loss"][i] < first["eval"]["loss"][i] for i in range(3))
    # one line per step with the documented fields; raw counts kept
    steps = [x["step"] for x in _lines(trained_run)]
    assert steps == list(range(len(steps)))
    line = _lines(trained_run)[5]
    assert {"step", "epoch", "tokens", "wall_s", "lr", "train"} <= set(line)
    assert len(line["train"]["loss"]) == 3 and "counts" in line["train"]
    c = line["train"]["counts"]
    assert line["train"]["full_acc"][0] == c["full_acc_0_sum"] / c["full_acc_0_total"]


def test_run_dir_is_self_describing(trained_run, sharp_data):
    run = json.loads((trained_run / "run.json").read_text())
    assert run["status"] == "done" and run["summary"]["steps"] > 0
    aux = run["drafter"]["aux"]
    assert aux["capture_points"] == [2, 4, 5] and aux["written_ids"] == [2, 4, 5]
    assert aux["sglang_ids"] == [1, 3, 4] and aux["written_convention"] == "vllm"
    assert run["drafter"]["serve_engine"] == "sglang"
    assert run["data"]["train"]["vocab_map_sha256"]
    assert {"speculators", "torch", "transformers"} <= set(run["versions"])
    cfg = json.loads((trained_run / "final" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert cfg["norm_before_fc"] is False  # SGLang drops input_norm.weight
    assert cfg["draft_vocab_size"] == 64
    assert (trained_run / "final" / "eagle3lab.json").exists()
    assert sorted(p.name for p in (trained_run / "checkpoints").iterdir()) == ["step-20",
                                                                                "step-40"]


def test_saved_drafter_reloads_into_speculators_with_identical_outputs(trained_run,
                                                                       sharp_data):
    """speculators' own from_pretrained on final/ reproduces the final eval EXACTLY (every
    raw count equal), so the saved weights are the trained ones, bit for bit."""
    import torch
    from safetensors.torch import load_file
    from speculators.models.eagle3 import Eagle3DraftModel

    from eagle3lab.data.shards import ShardSet
    from eagle3lab.train import PackedData, evaluate, load_drafter

    model = load_drafter(trained_run / "final")
    assert isinstance(model, Eagle3DraftModel)
    saved = load_file(str(trained_run / "final" / "model.safetensors"))
    state = model.state_dict()
    assert all(torch.equal(saved[k], state[k]) for k in saved)
    ev = ShardSet(sharp_data["eval"])
    got = evaluate(model, PackedData(ev, range(len(ev)), 512), ttt_steps=3)
    assert got["counts"] == _evals(trained_run)[-1]["eval"]["counts"]


# --- resume ------------------------------------------------------------------------------
def test_resume_logs_exactly_what_an_uninterrupted_run_logs(tmp_path, sharp_data):
    from eagle3lab.train import train

    kw = dict(data=sharp_data["train"], eval_data=sharp_data["eval"], max_steps=9,
              epochs=100, max_tokens_per_batch=384, eval_every=4, checkpoint_every=3,
              lr=1e-3, warmup_steps=2, progress=False)
    train(out=str(tmp_path / "a"), **kw)
    stopped = train(out=str(tmp_path / "b"), stop_after_steps=5, **kw)
    assert stopped["status"] == "stopped"
    assert json.loads((tmp_path / "b" / "run.json").read_text())["status"] == "stopped"
    with pytest.raises(UserError, match="already holds a run"):
        train(out=str(tmp_path / "b"), **kw)
    train(out=str(tmp_path / "b"), resume=True, **kw)

    def strip(lines):
        return [{k: v for k, v in x.items() if k != "wall_s"} for x in lines]

    # stopped before its first checkpoint: resuming starts over, without duplicate lines
    train(out=str(tmp_path / "c"), stop_after_steps=2, **kw)
    train(out=str(tmp_path / "c"), resume=True, **kw)

    a, b = strip(_lines(tmp_path / "a")), strip(_lines(tmp_path / "b"))
    assert len(a) == 10 and a == b  # steps 0..9: model, optimizer, schedule, data order
    assert strip(_lines(tmp_path / "c")) == a
    wa = load_file_weights(tmp_path / "a" / "final")
    wb = load_file_weights(tmp_path / "b" / "final")
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    # a finished run resumed again is a no-op
    assert train(out=str(tmp_path / "b"), resume=True, **kw)["status"] == "done"
    with pytest.raises(UserError, match="other settings.*lr"):
        train(out=str(tmp_path / "b"), resume=True, **{**kw, "lr": 5e-4})


def test_sigterm_checkpoints_the_step_reached_and_resumes_exactly(tmp_path, sharp_data,
                                                                  monkeypatch):
    """A one-process run sent SIGTERM (the study's deadline stopping it) finishes its step,
    writes a checkpoint of that step beside the periodic ones and stops ("stopped"), so
    nothing since the last periodic checkpoint is lost; resumed, it logs and saves exactly
    what an uninterrupted run does. The handler is put back once training returns."""
    import signal

    from eagle3lab.train import train
    from eagle3lab.train.checkpoints import list_checkpoints

    kw = dict(data=sharp_data["train"], eval_data=sharp_data["eval"], max_steps=9,
              epochs=100, max_tokens_per_batch=384, eval_every=4, checkpoint_every=3,
              lr=1e-3, warmup_steps=2, progress=False)
    train(out=str(tmp_path / "a"), **kw)
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setenv("EAGLE3LAB_TEST_FAULT", "term:0:5")  # SIGTERM as step 5 starts
    stopped = train(out=str(tmp_path / "b"), **kw)
    monkeypatch.delenv("EAGLE3LAB_TEST_FAULT")
    assert stopped == {"run_dir": str(tmp_path / "b"), "status": "stopped", "step": 5,
                       "signal": "SIGTERM"}
    assert [c.name for c in list_checkpoints(tmp_path / "b")] == ["step-3", "step-5"]
    assert signal.getsignal(signal.SIGTERM) is before
    train(out=str(tmp_path / "b"), resume=True, **kw)

    def strip(lines):
        return [{k: v for k, v in x.items() if k != "wall_s"} for x in lines]

    assert strip(_lines(tmp_path / "b")) == strip(_lines(tmp_path / "a"))
    wa = load_file_weights(tmp_path / "a" / "final")
    wb = load_file_weights(tmp_path / "b" / "final")
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)


def load_file_weights(d: Path):
    from safetensors.torch import load_file

    return load_file(str(d / "model.safetensors"))


# --- refusals ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def other_aux_eval(tmp_path_factory, sharp_data, sharp_target_dir) -> str:
    """The held-out conversations extracted with other aux layers (capture points 1,4,6)."""
    from eagle3lab.data.extract import extract

    out = tmp_path_factory.mktemp("other-aux") / "eval"
    conv = WorkDir(Path(sharp_data["eval"]).parent.parent).responses("eval")
    extract(conversations=conv, out=out, target=str(sharp_target_dir), aux_ids=[0, 3, 5],
            progress=False, limit=6)
    return str(out)


def test_eval_shards_with_other_aux_layers_are_refused(tmp_path, sharp_data, other_aux_eval):
    from eagle3lab.train import train

    with pytest.raises(UserError) as e:
        train(data=sharp_data["train"], eval_data=other_aux_eval, out=str(tmp_path / "r"),
              max_steps=1, progress=False)
    msg = str(e.value)
    assert "aux capture points" in msg and "[1, 4, 6]" in msg and "[2, 4, 5]" in msg
    assert not (tmp_path / "r" / "run.json").exists()  # refused before training


def test_eval_shards_of_another_hidden_size_are_refused(tmp_path, sharp_data, tokenizer_dir):
    from eagle3lab.data.extract import extract
    from eagle3lab.train import train

    from testutil import make_tiny_llama

    small = make_tiny_llama(tmp_path / "h32", tokenizer_dir, hidden=32)
    conv = WorkDir(Path(sharp_data["eval"]).parent.parent).responses("eval")
    extract(conversations=conv, out=tmp_path / "ev32", target=str(small), progress=False,
            limit=3)
    with pytest.raises(UserError) as e:
        train(data=sharp_data["train"], eval_data=str(tmp_path / "ev32"),
              out=str(tmp_path / "r"), max_steps=1, progress=False)
    assert "hidden size: shards 32" in str(e.value) and "64" in str(e.value)


def test_resume_onto_reextracted_shards_is_refused(tmp_path, sharp_data, other_aux_eval):
    from eagle3lab.train import train
    from eagle3lab.data.vocab import build_shard_vocab

    data = tmp_path / "shards"
    shutil.copytree(sharp_data["train"], data)
    kw = dict(data=str(data), eval_fraction=0.1, out=str(tmp_path / "run"), max_steps=4,
              max_tokens_per_batch=512, checkpoint_every=1, progress=False)
    train(stop_after_steps=1, **kw)
    shutil.rmtree(data)
    shutil.copytree(other_aux_eval, data)  # re-extracted in place with other aux layers
    build_shard_vocab(data=data, draft_vocab_size=64)
    with pytest.raises(UserError) as e:
        train(resume=True, **kw)
    msg = str(e.value)
    assert "do not match the run" in msg and "[2, 4, 5]" in msg and "[1, 4, 6]" in msg


def test_init_from_a_drafter_of_other_layers_is_refused(tmp_path, trained_run, other_aux_eval):
    from eagle3lab.train import train
    from eagle3lab.data.vocab import build_shard_vocab

    build_shard_vocab(data=other_aux_eval, draft_vocab_size=64)
    with pytest.raises(UserError) as e:
        train(data=other_aux_eval, eval_fraction=0.2, out=str(tmp_path / "ft"), max_steps=1,
              init_from=str(trained_run / "final"), progress=False)
    msg = str(e.value)
    assert "aux layer ids" in msg and "shards [1, 4, 6]" in msg and "[2, 4, 5]" in msg


def test_unknown_config_key_is_refused(tmp_path, sharp_data):
    from eagle3lab.train import train

    with pytest.raises(UserError, match="unknown field.*lr_schedle"):
        train(data=sharp_data["train"], out=str(tmp_path / "r"), lr_schedle="cosine")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("bad, expected", [
    ({"lr_schedle": "cosine"}, "unknown field(s) lr_schedle (known fields: aux_convention, "
     "aux_ids, checkpoint_every, "),
    ({"epochs": "3"}, "field 'epochs' has value '3' (str); expected a valid integer."),
    ({"pad_batches": 1}, "field 'pad_batches' has value 1 (int); expected a valid boolean."),
    ({"lr": True}, "field 'lr' has value True (bool); expected a valid number."),
    ({"lr": 0}, "field 'lr' has value 0 (int); expected a value greater than 0."),
    ({"data_fraction": 1.5}, "field 'data_fraction' has value 1.5 (float); expected a value "
     "less than or equal to 1."),
    ({"eval_fraction": 1.0}, "field 'eval_fraction' has value 1.0 (float); expected a value "
     "less than 1."),
    ({"max_tokens_per_batch": 8}, "field 'max_tokens_per_batch' has value 8 (int); expected a "
     "value greater than or equal to 16."),
    ({"schedule": "cos"}, "field 'schedule' has value 'cos' (str); expected 'constant', "
     "'cosine' or 'linear'."),
    ({"eval_at_tokens": [100, "200"]}, "field 'eval_at_tokens[1]' has value '200' (str); "
     "expected a valid integer."),
    ({"epochs": 0, "ttt_steps": 0}, "field 'epochs' has value 0 (int); expected a value greater "
     "than or equal to 1; field 'ttt_steps' has value 0 (int); expected a value greater than or "
     "equal to 1."),
])
def test_bad_config_values_name_the_file_and_field(bad, expected):
    from eagle3lab.train import TrainConfig

    with pytest.raises(UserError) as e:
        TrainConfig.from_dict({"data": "d", "out": "o", **bad}, "cfg.json")
    assert str(e.value).startswith("cfg.json: " + expected), str(e.value)


def test_config_built_directly_is_checked_and_saves_in_field_order():
    from eagle3lab.train import TrainConfig

    with pytest.raises(UserError, match="^train config: field 'num_layers' has value 0"):
        TrainConfig(data="d", out="o", num_layers=0)
    with pytest.raises(UserError, match="^train config: field 'out' is required"):
        TrainConfig(data="d")
    cfg = TrainConfig(data="d", out="o", data_fraction=1, eval_at_tokens=[5])
    assert cfg.data_fraction == 1.0 and isinstance(cfg.data_fraction, float)
    saved = cfg.model_dump()
    assert list(saved) == list(TrainConfig.model_fields) and saved["eval_at_tokens"] == [5]
    assert TrainConfig.defaults() == {k: v for k, v in saved.items()
                                      if k not in ("data", "out", "data_fraction",
                                                   "eval_at_tokens")} | {
        "data": None, "data_fraction": 1.0, "eval_at_tokens": []}


def test_cli_config_file_errors_name_the_file_and_field(tmp_path, capsys):
    from eagle3lab.cli import main

    cfg = tmp_path / "train.json"
    for content, expected in [
            ({"data": "d", "lr": "fast"}, "field 'lr' has value 'fast' (str); expected a valid "
             "number"),
            ({"data": "d", "warmup_step": 5}, "unknown field(s) warmup_step"),
            ({"data": "d", "ttt_steps": 0}, "field 'ttt_steps' has value 0 (int); expected a "
             "value greater than or equal to 1")]:
        cfg.write_text(json.dumps(content))
        rc = main(["train", "--config", str(cfg), "--out", str(tmp_path / "run")])
        err = capsys.readouterr().err
        assert rc == 1 and err.startswith(f"eagle3lab train: error: train config {cfg} (with "
                                          f"the command-line options): {expected}"), err
    cfg.write_text(json.dumps(["--data", "d"]))
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "run")]) == 1
    assert f"--config file {cfg} holds a JSON array (a list), not an object" in \
        capsys.readouterr().err
    cfg.write_bytes(b"\xff\xfe{}")
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "run")]) == 1
    assert f"--config file {cfg} is not UTF-8 text" in capsys.readouterr().err
    assert main(["train", "--data", "d", "--out", str(tmp_path / "run"), "--lr", "-1"]) == 1
    assert "train options: field 'lr' has value -1.0 (float)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# --- NaN ---------------------------------------------------------------------------------
def test_nan_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, sharp_data):
    import torch
    from safetensors.torch import load_file, save_file

    from eagle3lab.data.shards import ShardSet, read_manifest, write_manifest
    from eagle3lab.fsutil import sha256_file
    from eagle3lab.train import PackedData, TrainingDiverged, train

    data = tmp_path / "shards"
    shutil.copytree(sharp_data["train"], data)
    s = ShardSet(data)
    victim = int(PackedData(s, range(len(s)), 512).batches(0, 0)[2][0])  # in step 3's batch
    k, j = s._locate(victim)
    path = data / s.shards[k]["file"]
    t = load_file(str(path))
    a, b = int(t["offsets"][j]), int(t["offsets"][j + 1])
    t["hidden_states"][a:b] = float("nan")
    save_file(t, str(path))
    # as if the target itself had produced the NaNs: extraction recorded this file's hash
    m = read_manifest(data)
    m["shards"][k].update(bytes=path.stat().st_size, sha256=sha256_file(path))
    write_manifest(data, m)

    out = tmp_path / "run"
    with pytest.raises(TrainingDiverged) as e:
        train(data=str(data), eval_data=sharp_data["eval"], out=str(out), epochs=2,
              max_tokens_per_batch=512, checkpoint_every=1, progress=False)
    msg = str(e.value)
    assert "step 3" in msg and f"[{victim}]" in msg and "not finite" in msg
    assert "checkpoints/step-2" in msg
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed" and "step 3" in run["error"]
    assert [x["step"] for x in _lines(out)] == [0, 1, 2]
    good = out / "checkpoints" / "step-2"
    assert torch.load(good / "trainer_state.pt", weights_only=False)["state"]["step"] == 2
    w = load_file(str(good / "model.safetensors"))
    assert all(torch.isfinite(v.float()).all() for v in w.values())
    assert not (out / "final").exists()


# --- TTT 7, the vLLM profile, the CLI ------------------------------------------------------
def test_ttt7_with_the_vllm_profile(tmp_path, sharp_data):
    from eagle3lab.train import train

    out = tmp_path / "run"
    train(data=sharp_data["train"], eval_data=sharp_data["eval"], out=str(out), max_steps=2,
          ttt_steps=7, ttt_step_loss_decay=0.8, serve_engine="vllm", eval_at_start=False,
          max_tokens_per_batch=256, progress=False)
    last = _lines(out)[-1]
    assert len(last["train"]["loss"]) == 7 and len(last["eval"]["cond_acc"]) == 7
    cfg = json.loads((out / "final" / "config.json").read_text())
    assert cfg["norm_before_fc"] is True and cfg["norm_before_residual"] is True
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 7
    assert json.loads((out / "run.json").read_text())["drafter"]["serve_engine"] == "vllm"


def test_cli_train(tmp_path, sharp_data, capsys):
    from eagle3lab.cli import main

    rc = main(["train", "--data", sharp_data["train"], "--eval-data", sharp_data["eval"],
               "--out", str(tmp_path / "run"), "--max-steps", "2", "--no-progress",
               "--no-eval-at-start", "--max-tokens-per-batch", "256", "--schedule",
               "constant"])
    assert rc == 0
    assert json.loads((tmp_path / "run" / "run.json").read_text())["config"]["schedule"] \
        == "constant"
    assert '"status": "done"' in capsys.readouterr().out
    rc = main(["train", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "x")])
    assert rc == 1
    err = capsys.readouterr().err
    assert err.startswith("eagle3lab train: error: ") and "Traceback" not in err


# --- the real default target -----------------------------------------------------------------
@pytest.mark.real
def test_real_default_target_run(tmp_path, default_target_dir):
    """A small real run on SmolLM2-135M shards: the drafter is built from the real 30-layer
    config (aux capture points [2, 15, 27], SGLang ids [1, 14, 26]) and its loss falls."""
    from eagle3lab.study.sweep import demo_data
    from eagle3lab.train import train

    d = demo_data(tmp_path / "data", target=str(default_target_dir), n_train=8, n_eval=3,
                  draft_vocab_size=256)
    out = tmp_path / "run"
    train(data=d["train"], eval_data=d["eval"], out=str(out), max_steps=12, epochs=100,
          max_tokens_per_batch=256, lr=1e-3, eval_every=3, progress=False)
    run = json.loads((out / "run.json").read_text())
    assert run["drafter"]["aux"]["written_ids"] == [2, 15, 27]
    assert run["drafter"]["aux"]["sglang_ids"] == [1, 14, 26]
    assert run["drafter"]["hidden_size"] == 576
    ev = _evals(out)
    assert ev[-1]["eval"]["loss"][0] < 0.8 * ev[0]["eval"]["loss"][0]
