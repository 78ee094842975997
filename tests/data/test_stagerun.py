"""The data stages on 2 ranks (gloo on the CPU: the real torchrun, or ranks forked with its
variables) equal one process: the extracted shard set sample by sample (after a resume per
rank), the regenerated records; the shares, the leftovers of a killed run, a device-mapped
target."""

from __future__ import annotations

import json

import pytest
import torch

from testutil import fork_ranks, torchrun, write_conversations
from eagle3lab.data.extract import extract
from eagle3lab.data.prompts import read_conversations
from eagle3lab.data.rankparts import contiguous_shares
from eagle3lab.data.regenerate import meta_path, regenerate
from eagle3lab.data.shards import MANIFEST, ShardSet
from eagle3lab.errors import UserError

PROMPTS = ["What is 2+2?", "Name a colour.", "Say hello.", "Count to three.",
           "Why is the sky blue?", "Write one word.", "Tell me a fact about cats."]


@pytest.fixture()
def prompts_file(tmp_path):
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n"
                         for i, t in enumerate(PROMPTS)))
    return p


def test_contiguous_shares_balance_tokens():
    assert contiguous_shares([10, 10, 10, 10], 2) == [(0, 2), (2, 4)]
    assert contiguous_shares([30, 5, 5, 5, 5, 10], 2) == [(0, 1), (1, 6)]
    assert contiguous_shares([1, 1], 4) == [(0, 1), (1, 1), (1, 2), (2, 2)]
    assert contiguous_shares([], 3) == [(0, 0)] * 3
    shares = contiguous_shares(list(range(1, 101)), 3)
    assert shares[0][0] == 0 and shares[-1][1] == 100
    assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
    totals = [sum(range(a + 1, b + 1)) for a, b in shares]
    assert max(totals) - min(totals) <= 100


@pytest.mark.slow
def test_two_ranks_extract_resume_and_equal_one_process(tiny_target, tiny_target_dir,
                                                          tmp_path):
    convs = write_conversations(tmp_path / "convs.jsonl", tiny_target.tokenizer, n=10)
    out = tmp_path / "two"
    cli = ["extract", "--conversations", convs, "--out", out, "--target", tiny_target_dir,
           "--samples-per-shard", 2, "--dtype", "float32", "--device", "cpu", "--no-progress"]
    r = torchrun(2, *cli, "--stop-after-shards", 1)  # as if killed after one shard each
    assert "incomplete (4 samples" in r.stdout
    m = json.loads((out / MANIFEST).read_text())
    plan = m["rank_plan"]
    assert m["shards"] == [] and plan["world_size"] == 2 and plan["ranges"][0][0] == 0
    parts = [json.loads((out / f"manifest.rank0000{k}.json").read_text()) for k in (0, 1)]
    assert [p["shards"][0]["file"] for p in parts] == [
        f"shard-{plan['first_shard'][k]:05d}.safetensors" for k in (0, 1)]
    with pytest.raises(UserError, match="started on 2 rank.*this run has 1"):
        extract(conversations=convs, out=out, target=tiny_target, samples_per_shard=2,
                dtype="float32", progress=False)

    r = torchrun(2, *cli)  # each rank resumes after its complete shard
    assert "6 conversation(s) to go (4 already" in r.stdout and "10 samples" in r.stdout
    one = tmp_path / "one"
    extract(conversations=convs, out=one, target=tiny_target, samples_per_shard=2,
            dtype="float32", progress=False)
    a, b = ShardSet(one, verify=True), ShardSet(out, verify=True)
    assert len(a) == len(b) == 10 and not list(out.glob("manifest.rank*"))
    assert "rank_plan" not in b.manifest and b.manifest["params"]["world_size"] == 2
    assert [s["file"] for s in b.shards] == [f"shard-{k:05d}.safetensors"
                                             for k in range(len(b.shards))]
    ranges = [s["sample_range"] for s in b.shards]
    assert ranges[0][0] == 0 and ranges[-1][1] == 10
    assert all(x[1] == y[0] for x, y in zip(ranges, ranges[1:]))
    assert b.manifest["totals"] == a.manifest["totals"] | {"bytes": b.manifest["totals"][
        "bytes"]}
    for i in range(10):
        x, y = a[i], b[i]
        assert torch.equal(x["input_ids"], y["input_ids"])
        assert torch.equal(x["loss_mask"], y["loss_mask"])
        for key in ("hidden_states", "verifier_last_hidden_states"):
            assert x[key].dtype == torch.float32
            torch.testing.assert_close(y[key], x[key], atol=1e-5, rtol=0)


def _cli_rank(rank: int, argv: list, log_dir) -> None:
    """One rank of `torchrun ... -m eagle3lab ARGV` (forked): the CLI's exit code and
    output, in log_dir/rankR.json."""
    import contextlib
    import io

    from eagle3lab.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main([str(a) for a in argv])
    (log_dir / f"rank{rank}.json").write_text(json.dumps({"rc": rc, "out": out.getvalue()}))


def test_two_ranks_regenerate_equal_one_process(tiny_target, tiny_target_dir, prompts_file,
                                                tmp_path):
    """The CLI's ranks forked with torchrun's variables (testutil.fork_ranks); the real
    torchrun launches the CLI in the extract test above."""
    one = tmp_path / "one.jsonl"
    regenerate(target=tiny_target, prompts=prompts_file, out=one, progress=False,
               max_new_tokens=5, batch_size=2)
    two = tmp_path / "two.jsonl"
    argv = ["regenerate", "--target", tiny_target_dir, "--prompts", prompts_file, "--out", two,
            "--max-new-tokens", 5, "--batch-size", 2, "--device", "cpu", "--no-progress"]
    fork_ranks(lambda rank: _cli_rank(rank, argv, tmp_path))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rc"] for r in ranks] == [0, 0]
    assert "7 records (7 new" in ranks[0]["out"]
    assert read_conversations(two) == read_conversations(one)
    assert not list(tmp_path.glob("two.jsonl.rank*"))
    meta = json.loads(meta_path(two).read_text())
    assert meta["records"] == 7 and meta["last_run"]["new_records"] == 7


def test_parts_of_a_killed_run_are_merged_not_answered_again(tiny_target, prompts_file,
                                                             tmp_path):
    kw = dict(target=tiny_target, prompts=prompts_file, max_new_tokens=4, batch_size=2,
              progress=False)
    full = tmp_path / "full.jsonl"
    regenerate(out=full, **kw)
    recs = [json.loads(x) for x in full.read_text().splitlines()]
    # a 2-rank run killed mid-way: OUT has p0, p1; rank 1 wrote p3 (and a torn line),
    # rank 0 wrote p2; the answers in the parts are marked to prove they are kept as is
    out = tmp_path / "r.jsonl"
    regenerate(out=out, limit=2, **kw)
    (tmp_path / "r.jsonl.rank00001.part").write_text(
        json.dumps(recs[3] | {"response": "from rank 1"}) + "\n" + '{"id": "p5", "pro')
    (tmp_path / "r.jsonl.rank00000.part").write_text(
        json.dumps(recs[2] | {"response": "from rank 0"}) + "\n")
    s = regenerate(out=out, **kw)
    got = read_conversations(out)
    assert s["new_records"] == 3 and s["records"] == 7
    assert [x["id"] for x in got] == [f"p{i}" for i in range(7)]
    assert [got[2]["response"], got[3]["response"]] == ["from rank 0", "from rank 1"]
    assert [x["input_ids"] for x in got[4:]] == [x["input_ids"] for x in recs[4:]]
    assert not list(tmp_path.glob("r.jsonl.rank*"))


def test_device_map_target_gives_the_same_states(tiny_target, tiny_target_dir, tmp_path):
    from eagle3lab.targets.adapter import load_target

    mapped = load_target(str(tiny_target_dir), device_map="auto")
    ids = torch.tensor([[1, 5, 9, 200, 31, 7]])
    for got, want in zip(mapped.features(ids), tiny_target.features(ids)):
        torch.testing.assert_close(got, want)
    convs = write_conversations(tmp_path / "convs.jsonl", tiny_target.tokenizer, n=3)
    s = extract(conversations=convs, out=tmp_path / "s", target=str(tiny_target_dir),
                device_map="auto", dtype="float32", progress=False)
    assert s["complete"] and s["samples"] == 3
    with pytest.raises(UserError, match="give one of them"):
        load_target(str(tiny_target_dir), device="cpu", device_map="auto")
    with pytest.raises(UserError, match="Unknown device map 'everywhere'"):
        load_target(str(tiny_target_dir), device_map="everywhere")
