"""TrainConfig.train_lm_head: speculators freezes the draft head (the target head's rows
picked by t2d); train_lm_head unfreezes it, and nothing else changes. Runs made before
the option existed resume as runs with the default."""

from __future__ import annotations

import json

import pytest

from eagle3lab.errors import UserError

KW = dict(max_steps=3, epochs=100, max_tokens_per_batch=256, lr=1e-3, eval_every=0,
          eval_at_start=False, progress=False)


def _weights(d):
    from safetensors.torch import load_file

    return load_file(str(d / "model.safetensors"))


def test_train_lm_head_trains_the_head_only_when_asked(tmp_path, sharp_data,
                                                       sharp_target_dir):
    import torch

    from eagle3lab.data.shards import ShardSet
    from eagle3lab.train import build_drafter, train

    shards = ShardSet(sharp_data["train"])
    d2t, t2d = shards.vocab_map()
    target = _weights(sharp_target_dir)  # tied: the head is the embedding
    head = target.get("lm_head.weight", target["model.embed_tokens.weight"])[t2d.bool()]
    torch.manual_seed(0)  # the run's seed: the same initial drafter
    init = build_drafter(target_path=str(sharp_target_dir), aux=shards.aux, d2t=d2t,
                         t2d=t2d).state_dict()
    assert torch.equal(init["lm_head.weight"], head)

    runs = {}
    for flag in (False, True):
        out = tmp_path / f"head-{flag}"
        train(data=sharp_data["train"], eval_data=sharp_data["eval"], out=str(out),
              train_lm_head=flag, **KW)
        runs[flag] = (_weights(out / "final"), json.loads((out / "run.json").read_text()))
    (frozen, run_f), (trained, run_t) = runs[False], runs[True]
    assert torch.equal(frozen["lm_head.weight"], head)
    assert not torch.equal(trained["lm_head.weight"], head)
    for k in ("fc.weight", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.up_proj.weight"):
        assert not torch.equal(frozen[k], init[k]) and not torch.equal(trained[k], init[k]), k
    assert torch.equal(trained["embed_tokens.weight"], init["embed_tokens.weight"])
    assert run_t["config"]["train_lm_head"] is True
    assert (run_t["drafter"]["trainable_params"] - run_f["drafter"]["trainable_params"]
            == head.numel())


def test_a_run_from_before_the_option_resumes(tmp_path, sharp_data):
    from eagle3lab.train import train

    out = tmp_path / "old"
    kw = dict(data=sharp_data["train"], eval_data=sharp_data["eval"], out=str(out), **KW)
    assert train(stop_after_steps=1, checkpoint_every=1, **kw)["status"] == "stopped"
    run = json.loads((out / "run.json").read_text())
    del run["config"]["train_lm_head"]  # as written by an older eagle3lab
    (out / "run.json").write_text(json.dumps(run))
    with pytest.raises(UserError, match="train_lm_head: run False, now True"):
        train(resume=True, checkpoint_every=1, train_lm_head=True, **kw)
    assert train(resume=True, checkpoint_every=1, **kw)["status"] == "done"
