"""`train --online`: the target computes the states inside the loop. On the real default
target in fp32 it trains the same drafter as offline training on shards extracted from the
same conversations (same vocab map, aux layers and batches, same seed); it resumes
exactly; `states_cache` changes nothing computed; 2 gloo ranks train what one process
accumulating the same micro-batches trains; bad input is one line.

Bit-equality needs each conversation's states computed by a forward of the same padded
width online and offline (a state differs by rounding with the width: measured on the real
target, up to 5e-4 between a conversation alone and padded in a batch, fp32), so the equality
test runs one conversation per forward on both sides (`forward_tokens=1`, extract's
`max_tokens_per_batch=1`); with the default batching the drafters differ by rounding only
(the test bounds it: a tenth of one step's lr).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eagle3lab.errors import UserError
from eagle3lab.workdir import WorkDir


def _lines(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if k != "wall_s"}
            for x in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "final" / "model.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def _conversations(sharp_data, split: str) -> str:
    return str(WorkDir(Path(sharp_data["train"]).parent.parent).responses(split))


def _online_kw(sharp_data, sharp_target_dir, out: Path, **over) -> dict:
    """An online run on the sharp tiny target: 48 train / 12 held-out conversations."""
    return {"online": True, "conversations": _conversations(sharp_data, "train"),
            "eval_conversations": _conversations(sharp_data, "eval"),
            "target": str(sharp_target_dir), "out": str(out), "draft_vocab_size": 64,
            "max_tokens_per_batch": 256, "epochs": 100, "lr": 1e-3, "warmup_steps": 1,
            "eval_every": 4, "checkpoint_every": 3, "progress": False, "cpu_threads": 1,
            **over}


# --- online == offline, the real default target -------------------------------------------
def _real_conversations(path: Path, tokenizer, first: int, n: int) -> Path:
    """Shipped train prompts answered by 12-20 tokens of another prompt's text (fixed ids,
    no generation), in regenerate's record format."""
    from eagle3lab.data.prompts import chat_prompt_ids, conversation_record, load_prompts

    prompts = load_prompts("train", limit=first + 2 * n)
    with open(path, "w") as f:
        for k in range(n):
            p, other = prompts[first + k], prompts[-1 - k]
            answer = tokenizer(other.prompt).input_ids[:12 + k] + [tokenizer.eos_token_id]
            f.write(json.dumps(conversation_record(
                p, chat_prompt_ids(tokenizer, p.prompt), answer, "", "stop", None)) + "\n")
    return path


@pytest.mark.real
def test_online_trains_the_offline_drafter_on_the_real_target(tmp_path, default_target_dir,
                                                             real_target):
    import torch
    from safetensors.torch import load_file

    from eagle3lab.data.extract import extract
    from eagle3lab.data.shards import ShardSet
    from eagle3lab.data.vocab import build_shard_vocab
    from eagle3lab.train import train

    tok = real_target.tokenizer
    convs = {"train": _real_conversations(tmp_path / "train.jsonl", tok, 0, 8),
             "eval": _real_conversations(tmp_path / "eval.jsonl", tok, 20, 3)}
    for split, path in convs.items():  # fp32 target, fp32 shards, one conversation a forward
        extract(conversations=path, out=tmp_path / split, target=real_target, dtype="float32",
                model_dtype="float32", max_tokens_per_batch=1, progress=False)
    entry = build_shard_vocab(data=tmp_path / "train", draft_vocab_size=256)
    kw = dict(max_steps=4, epochs=100, max_tokens_per_batch=160, lr=1e-3, eval_every=2,
              progress=False)
    train(data=str(tmp_path / "train"), eval_data=str(tmp_path / "eval"),
          out=str(tmp_path / "offline"), **kw)
    online = dict(online=True, conversations=str(convs["train"]),
                  eval_conversations=str(convs["eval"]), target=str(default_target_dir),
                  draft_vocab_size=256, model_dtype="float32", states_dtype="float32", **kw)
    train(out=str(tmp_path / "online"), forward_tokens=1, **online)

    off, on = tmp_path / "offline", tmp_path / "online"
    a, b = _weights(off), _weights(on)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert len(_lines(off)) == 5 and _lines(off) == _lines(on)  # every loss, count, eval
    # the vocab map: the same bytes (sha256) as `eagle3lab vocab` on the shards
    ro, rn = (json.loads((r / "run.json").read_text())["data"] for r in (off, on))
    assert rn["train"]["vocab_map_sha256"] == entry["sha256"] == ro["train"]["vocab_map_sha256"]
    mine = load_file(str(on / "vocab_map.safetensors"))
    d2t, t2d = ShardSet(tmp_path / "train").vocab_map()
    assert torch.equal(mine["d2t"], d2t) and torch.equal(mine["t2d"], t2d)
    # recorded as a shard set records its data, plus the source
    for key in ("target", "aux_layers", "dtype", "conversations_sha256", "samples", "tokens",
                "final_state"):
        assert rn["train"][key] == ro["train"][key], key
        assert rn["eval"][key] == ro["eval"][key], key
    assert rn["train"]["aux_layers"]["capture_points"] == [2, 15, 27]
    assert rn["train"]["source"] == "online" and "source" not in ro["train"]
    shipped = json.loads((on / "final" / "eagle3lab.json").read_text())
    assert shipped["data"]["train"] == rn["train"]

    # several conversations a forward (the default): the states differ by rounding, which
    # Adam turns into at most a small share of a step (lr 1e-3; measured 1.5e-5)
    train(out=str(tmp_path / "batched"), **online)
    diff = _max_diff(a, _weights(tmp_path / "batched"))
    assert 0 < diff < 1e-4, diff


# --- resume, the states cache (tiny sharp target) --------------------------------------
def test_an_online_run_resumes_exactly(tmp_path, sharp_data, sharp_target_dir):
    """Stopped at step 5 (checkpoint 3) and resumed: the uninterrupted run's lines and
    weights, into the second epoch (13 steps an epoch). Prefetching the next step's batch
    (the default) changes nothing: a run without it, and a resume without it, alike."""
    from eagle3lab.train import train

    kw = _online_kw(sharp_data, sharp_target_dir, tmp_path / "a", max_steps=17)
    train(**kw)
    stopped = train(**{**kw, "out": str(tmp_path / "b"), "stop_after_steps": 5})
    assert stopped["status"] == "stopped"
    train(**{**kw, "out": str(tmp_path / "b"), "resume": True, "prefetch": False})
    train(**{**kw, "out": str(tmp_path / "c"), "prefetch": False})
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert len(_lines(a)) == 18 and _lines(a) == _lines(b) == _lines(c)
    wa, wb = _weights(a), _weights(b)
    assert _max_diff(wa, wb) == 0.0 and _max_diff(wa, _weights(c)) == 0.0
    run = json.loads((a / "run.json").read_text())
    assert run["data"]["train"]["source"] == "online" and run["config"]["online"] is True
    # what computed the target's attention (on the CPU torch's sdpa; on CUDA not cuDNN's)
    assert run["data"]["train"]["target_attention"] == {
        "implementation": "sdpa",
        "sdpa_backends_on_cuda": ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]}
    assert run["plan"]["total_steps"] == 17 and run["data"]["train_samples"] == 48


def test_a_compiled_target_trains_the_eager_runs_drafter(tmp_path, sharp_data,
                                                        sharp_target_dir, monkeypatch):
    """target_compile: the target's base model under torch.compile (dynamo with its eager
    backend here: inductor's states differ by rounding) captures the states the eager
    forward does, whatever the batch's shape (one graph), so the run trains the same
    drafter; the run records the compile, and resuming with it switched is refused."""
    import torch
    from torch._dynamo.utils import counters

    from eagle3lab.train import online, train

    monkeypatch.setattr(online, "TARGET_COMPILE_BACKEND", "eager")
    kw = _online_kw(sharp_data, sharp_target_dir, tmp_path / "eager", max_steps=6,
                    eval_every=0, checkpoint_every=3)
    train(**kw)
    torch._dynamo.reset()
    counters.clear()
    train(**{**kw, "out": str(tmp_path / "compiled"), "target_compile": True})
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    assert _lines(tmp_path / "eager") == _lines(tmp_path / "compiled")
    assert _max_diff(_weights(tmp_path / "eager"), _weights(tmp_path / "compiled")) == 0.0
    run = json.loads((tmp_path / "compiled" / "run.json").read_text())
    assert run["data"]["train"]["target_attention"]["compiled"] == "eager"
    assert run["config"]["target_compile"] is True
    with pytest.raises(UserError, match="target_compile: run True, now False"):
        train(**{**kw, "out": str(tmp_path / "compiled"), "resume": True})


def test_the_states_cache_computes_each_sample_once_and_changes_nothing(tmp_path, sharp_data,
                                                                       sharp_target_dir):
    """Cached states are the tensors first computed (no forward on a hit); a run with the
    cache trains the drafter of a run without it (one conversation per forward, so each
    state is computed alike whatever shares its micro-batch)."""
    from eagle3lab.train import train

    kw = _online_kw(sharp_data, sharp_target_dir, tmp_path / "off", max_steps=17,
                    forward_tokens=1)  # 4 steps into the second epoch: cache hits
    train(**kw)
    train(**{**kw, "out": str(tmp_path / "on"), "states_cache": True})
    assert _lines(tmp_path / "off") == _lines(tmp_path / "on")
    assert _max_diff(_weights(tmp_path / "off"), _weights(tmp_path / "on")) == 0.0


def test_a_run_with_the_states_cache_resumes_exactly(tmp_path, sharp_data, sharp_target_dir):
    """Several conversations a forward (the default) and the cache: stopped early in the
    second epoch (checkpoint 15 of 26) and resumed, the run refills its cache as it was
    filled, and trains the uninterrupted run's drafter (12 of the 48 conversations' states
    differ when grouped as the second epoch groups them: without the refill it does not)."""
    from eagle3lab.train import train

    kw = _online_kw(sharp_data, sharp_target_dir, tmp_path / "a", max_steps=26,
                    states_cache=True)
    train(**kw)
    train(**{**kw, "out": str(tmp_path / "b"), "stop_after_steps": 16})
    train(**{**kw, "out": str(tmp_path / "b"), "resume": True})
    assert _lines(tmp_path / "a") == _lines(tmp_path / "b")
    assert _max_diff(_weights(tmp_path / "a"), _weights(tmp_path / "b")) == 0.0


def test_a_cache_hit_is_the_first_tensors_and_a_resumed_cache_is_refilled_alike(
        sharp_data, sharp_target_dir):
    """OnlineSet with cache: a hit returns the tensors first computed and runs no forward;
    `warm_cache` refills a resumed run's cache micro-batch by micro-batch in the run's
    order, so every state equals the uninterrupted run's bit for bit, though a
    micro-batch's conversations share padded forwards (here 2-6 per forward)."""
    import torch

    from eagle3lab.distributed import Ranks
    from eagle3lab.targets.adapter import load_target
    from eagle3lab.targets.auxlayers import resolve_aux_layers
    from eagle3lab.train import PackedData, TrainConfig
    from eagle3lab.train.online import OnlineSet, warm_cache

    tgt = load_target(str(sharp_target_dir), device="cpu")
    aux = resolve_aux_layers(tgt.num_layers)

    def fresh():
        s = OnlineSet(_conversations(sharp_data, "train"), target=tgt, aux=aux,
                      states_dtype="float32", forward_tokens=512, cache=True)
        return s, PackedData(s, range(len(s)), 256)

    run, data = fresh()
    cfg = TrainConfig(online=True, conversations="c", target="t", out="o")
    steps = [data.steps(0, e) for e in (0, 1)]
    for step in steps[0] + steps[1][:3]:  # epoch 0, then 3 steps of epoch 1
        run.samples([int(i) for i in step[0]])
    assert run.computed == len(run) and run.forwards == len(steps[0]) < len(run)  # batched
    first = run.samples([0, 1])
    forwards = run.forwards
    again = run.samples([1, 0])
    assert run.forwards == forwards
    assert again[0]["hidden_states"] is first[1]["hidden_states"]
    assert again[1]["verifier_last_hidden_states"] is first[0]["verifier_last_hidden_states"]

    resumed, data2 = fresh()
    assert warm_cache(data2, cfg, Ranks(), {"epoch": 1, "batch": 3}) == len(resumed)
    for i in range(len(run)):
        a, b = run.samples([i])[0], resumed.samples([i])[0]
        assert torch.equal(a["hidden_states"], b["hidden_states"]), i
        assert torch.equal(a["verifier_last_hidden_states"], b["verifier_last_hidden_states"])
    assert resumed.samples([5])[0]["input_ids"].tolist() == json.loads(
        Path(_conversations(sharp_data, "train")).read_text().splitlines()[5])["input_ids"]


# --- torchrun: 2 gloo ranks, one target copy each ---------------------------------------
def test_two_ranks_online_equal_one_process_accumulating_the_same_micro_batches(
        tmp_path, sharp_data, sharp_target_dir):
    from test_train_distributed import assert_same_run, run_ranks

    from eagle3lab.train import train

    kw = _online_kw(sharp_data, sharp_target_dir, tmp_path / "accum2", max_steps=4,
                    eval_every=2, checkpoint_every=2, max_tokens_per_batch=128)
    train(**kw, grad_accum=2)
    res = run_ranks({**kw, "out": str(tmp_path / "ddp")})
    assert all(r and r["summary"]["status"] == "done" for r in res), res
    assert_same_run(tmp_path / "accum2", tmp_path / "ddp", steps=4)
    run = json.loads((tmp_path / "ddp" / "run.json").read_text())
    assert run["distributed"]["world_size"] == 2 and run["data"]["train"]["source"] == "online"


# --- bad input: one line -------------------------------------------------------------------
def test_online_settings_are_checked_before_anything_loads():
    from eagle3lab.train import TrainConfig

    def refused(**kw) -> str:
        with pytest.raises(UserError) as e:
            TrainConfig.from_dict({"out": "o", **kw}, "cfg.json")
        return str(e.value)

    msg = refused(online=True, target="t")
    assert msg.startswith("cfg.json: online training (--online)") and \
        "give conversations (--conversations)," in msg
    assert "conversations (--conversations) and target (--target)" in refused(online=True)
    assert "give data (--data SHARDS)" in refused()
    assert "drop data (--data)" in refused(online=True, conversations="c", target="t",
                                           data="d")
    assert "data_workers (--data-workers) at -1 or 0, not 2" in refused(
        online=True, conversations="c", target="t", data_workers=2)
    assert "conversations (--conversations), states_cache (--states-cache) are for online " \
        "training: add --online" in refused(data="d", conversations="c", states_cache=True)
    assert "target_compile (--target-compile) is for online training" in refused(
        data="d", target_compile=True)
    assert "field 'states_dtype' has value 'int8'" in refused(
        online=True, conversations="c", target="t", states_dtype="int8")
    cfg = TrainConfig(online=True, conversations="c", target="t", out="o", aux_ids="1,3,4")
    assert cfg.aux_ids == [1, 3, 4] and cfg.data is None


def test_bad_conversations_and_targets_are_one_line(tmp_path, sharp_data, sharp_target_dir,
                                                    capsys):
    from eagle3lab.cli import main
    from eagle3lab.train import train

    base = _online_kw(sharp_data, sharp_target_dir, tmp_path / "r", max_steps=1)
    with pytest.raises(UserError, match="missing.jsonl' does not exist"):
        train(**{**base, "conversations": str(tmp_path / "missing.jsonl")})
    bad = tmp_path / "bad.jsonl"
    lines = Path(base["conversations"]).read_text().splitlines()
    bad.write_text(lines[0] + "\n{not json\n")
    with pytest.raises(UserError, match=f"{bad}, line 2: not valid JSON"):
        train(**{**base, "conversations": str(bad)})
    with pytest.raises(UserError, match="Target .*nowhere.* does not exist"):
        train(**{**base, "target": str(tmp_path / "nowhere")})
    # regenerate's meta says another target wrote the answers
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(lines) + "\n")
    (tmp_path / "other.jsonl.meta.json").write_text(json.dumps({
        "kind": "eagle3lab-conversations", "target": {"path": "/models/another"},
        "params": {"target_config_sha256": "ab" * 32}}))
    with pytest.raises(UserError) as e:
        train(**{**base, "conversations": str(other)})
    assert "written by /models/another (config sha256 abababababab...," in str(e.value)
    assert f"not by the target {sharp_target_dir}" in str(e.value)
    assert not (tmp_path / "r" / "run.json").exists()
    # the CLI: one line, exit 1
    capsys.readouterr()
    assert main(["train", "--online", "--out", str(tmp_path / "c"), "--target",
                 str(sharp_target_dir)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("eagle3lab train: error: train options: online training") and \
        "--conversations R.jsonl" in err and "Traceback" not in err


def test_a_given_vocab_map_is_used_and_a_bad_one_refused(tmp_path, sharp_data,
                                                        sharp_target_dir):
    import torch
    from safetensors.torch import load_file

    from eagle3lab.data.shards import ShardSet
    from eagle3lab.train import train

    given = Path(sharp_data["train"]) / "vocab_map.safetensors"
    kw = _online_kw(sharp_data, sharp_target_dir, tmp_path / "r", max_steps=1,
                    vocab_map=str(given), draft_vocab_size=32)  # the size is the map's
    train(**kw)
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    shards = ShardSet(sharp_data["train"])
    assert run["data"]["train"]["vocab_map_sha256"] == shards.manifest["vocab_map"]["sha256"]
    assert torch.equal(load_file(str(tmp_path / "r" / "final" / "model.safetensors"))["d2t"],
                       shards.vocab_map()[0])
    assert not (tmp_path / "r" / "vocab_map.safetensors").exists()  # nothing built
    with pytest.raises(UserError, match="is not a vocab map"):
        train(**{**kw, "out": str(tmp_path / "x"), "vocab_map": kw["conversations"]})
    with pytest.raises(UserError, match="vocab_map .--vocab-map. .*nope.* does not exist"):
        train(**{**kw, "out": str(tmp_path / "x"), "vocab_map": str(tmp_path / "nope")})


def test_resuming_onto_other_conversations_is_refused(tmp_path, sharp_data, sharp_target_dir):
    from eagle3lab.train import train

    convs = tmp_path / "convs.jsonl"
    shutil.copy(_conversations(sharp_data, "train"), convs)
    kw = _online_kw(sharp_data, sharp_target_dir, tmp_path / "run", conversations=str(convs),
                    max_steps=4, checkpoint_every=1)
    train(**kw, stop_after_steps=1)
    vocab = (tmp_path / "run" / "vocab_map.safetensors").read_bytes()
    convs.write_text("".join(convs.read_text().splitlines(keepends=True)[:-1]))  # one less
    with pytest.raises(UserError) as e:
        train(**kw, resume=True)
    msg = str(e.value)
    assert msg.startswith(f"The conversations in {convs} do not match the run in ")
    assert "conversations sha256: the run in" in msg
    assert (tmp_path / "run" / "vocab_map.safetensors").read_bytes() == vocab  # untouched
    with pytest.raises(UserError, match="other settings.*aux_ids: run None, now"):
        train(**kw, resume=True, aux_ids=[0, 3, 5])
