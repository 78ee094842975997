"""eagle3lab.train.checkpoints: a checkpoint names its frozen tensors, and one whose weights
left them out (as bench/run_carry.py carries it: their sha256 in left-out.json) resumes to
exactly the run a whole checkpoint resumes to, and is listed as no servable drafter; a
left-out tensor this drafter does not match, or one left out without its record, is
refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest

from eagle3lab.errors import UserError

KW = dict(max_steps=3, epochs=100, max_tokens_per_batch=256, lr=1e-3, eval_every=0,
          eval_at_start=False, progress=False, checkpoint_every=1)


def _leave_out(ckpt, keys, *, record: bool = True) -> dict:
    """CKPT's weights without `keys`, their sha256 in left-out.json (the carry's format)."""
    from safetensors.torch import load_file, save_file

    from eagle3lab.train.checkpoints import LEFT_OUT, LEFT_OUT_FORMAT, tensor_sha256

    w = load_file(str(ckpt / "model.safetensors"))
    rec = {"format": LEFT_OUT_FORMAT, "version": 1,
           "sha256": {k: tensor_sha256(w.pop(k)) for k in keys}}
    save_file(w, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    if record:
        (ckpt / LEFT_OUT).write_text(json.dumps(rec))
    return rec


def test_a_checkpoint_without_its_frozen_tensors_resumes_exactly(tmp_path, sharp_data):
    import torch
    from safetensors.torch import load_file

    from eagle3lab.train import train
    from eagle3lab.train.checkpoints import LEFT_OUT, list_checkpoints, tensor_sha256

    whole = tmp_path / "whole"
    kw = dict(data=sharp_data["train"], eval_data=sharp_data["eval"], **KW)
    assert train(out=str(whole), stop_after_steps=1, **kw)["status"] == "stopped"
    ckpt = list_checkpoints(whole)[-1]
    frozen = json.loads((ckpt / "checkpoint.json").read_text())["frozen"]
    # speculators' recipe: the target's embedding and the draft head stay as built
    assert {"embed_tokens.weight", "lm_head.weight"} <= set(frozen)
    weights = load_file(str(ckpt / "model.safetensors"))
    keys = sorted(set(frozen) & set(weights))
    slim = tmp_path / "slim"
    shutil.copytree(whole, slim)
    _leave_out(list_checkpoints(slim)[-1], keys)
    # no drafter to serve or decode live (the study's live points take a later one)
    from eagle3lab.study import runs

    table = {o: runs.list_checkpoints(o, source="eagle3lab").iloc[-1] for o in (whole, slim)}
    assert table[whole]["servable"] and not table[slim]["servable"]
    assert "carried without its frozen tensors (left-out.json)" in table[slim]["note"]
    for out in (whole, slim):
        assert train(out=str(out), resume=True, **kw)["status"] == "done"
    a, b = (load_file(str(o / "final" / "model.safetensors")) for o in (whole, slim))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    metrics = [(o / "metrics.jsonl").read_text().splitlines() for o in (whole, slim)]
    strip = [[{k: v for k, v in json.loads(x).items() if k != "wall_s"} for x in m]
             for m in metrics]
    assert strip[0] == strip[1] and len(strip[0]) == 3
    # the digest covers dtype and shape, not only the bytes
    t = weights["embed_tokens.weight"]
    assert tensor_sha256(t) != tensor_sha256(t.view(-1))
    assert tensor_sha256(t) != tensor_sha256(t.view(torch.int32))

    # a drafter built with other frozen weights (another target): refused
    bad = tmp_path / "bad"
    assert train(out=str(bad), stop_after_steps=1, **kw)["status"] == "stopped"
    c = list_checkpoints(bad)[-1]
    rec = _leave_out(c, keys)
    (c / LEFT_OUT).write_text(json.dumps({**rec, "sha256": {**rec["sha256"],
                                                            "lm_head.weight": "0" * 64}}))
    with pytest.raises(UserError, match="left out lm_head.weight .* not the one it trained "
                       "with"):
        train(out=str(bad), resume=True, **kw)
    (c / LEFT_OUT).write_text("{not json")
    with pytest.raises(UserError, match="left-out record .*left-out.json"):
        train(out=str(bad), resume=True, **kw)
    # left out without a record: a checkpoint that does not fit, as before
    lost = tmp_path / "lost"
    assert train(out=str(lost), stop_after_steps=1, **kw)["status"] == "stopped"
    _leave_out(list_checkpoints(lost)[-1], keys, record=False)
    with pytest.raises(UserError, match="does not fit this drafter"):
        train(out=str(lost), resume=True, **kw)
