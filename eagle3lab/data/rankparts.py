"""The per-rank parts of a data stage run on many ranks, and their merge into the one
output the next stage reads.

Extraction. Prevents a shard set that reads differently depending on how many GPUs made it, and a
resumed run that extracts a conversation twice or never: the plan (recorded in the
manifest under `rank_plan` while the run is incomplete) gives each rank one contiguous
range of conversations, balanced by tokens (`contiguous_shares`), and the shard numbers
it writes, so the merged manifest lists the shards in sample order with no gap; each rank
lists its complete shards in its own part file (`manifest.rankNNNNN.json`, rewritten
atomically), so a killed run resumes each rank after its last complete shard; rank 0
merges only once every range is complete, and a resume on another number of ranks is
refused, naming both.

Regeneration. Prevents a prompt answered twice or a conversations file in another order
than a one-process run writes: rank r appends its answers to `OUT.rankNNNNN.part`
(fsynced a batch at a time, like OUT); rank 0 appends the records not yet in OUT in the
prompts' order, then deletes the parts; parts left by a killed run are merged first by the
next run (on any number of ranks), so their prompts are not answered again.
"""

from __future__ import annotations

import bisect
import glob
import json
import math
import os
from pathlib import Path
from typing import Any

from eagle3lab.data.shards import FORMAT, write_manifest
from eagle3lab.distributed import Ranks
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_write_json, read_appended_jsonl

PLAN_KEY = "rank_plan"
PART_FORMAT = f"{FORMAT}-rank-part"


def shard_part_path(out: Path, rank: int) -> Path:
    return out / f"manifest.rank{rank:05d}.json"


def contiguous_shares(weights: list[int], parts: int) -> list[tuple[int, int]]:
    """Split range(len(weights)) into `parts` consecutive [a, b) ranges of about equal total
    weight (each cut where the running total is nearest to k/parts of the whole)."""
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    cuts = [0]
    for k in range(1, parts):
        goal = prefix[-1] * k / parts
        j = bisect.bisect_left(prefix, goal, lo=cuts[-1])
        if j > cuts[-1] and j <= len(weights) and goal - prefix[j - 1] < prefix[j] - goal:
            j -= 1
        cuts.append(min(max(j, cuts[-1]), len(weights)))
    cuts.append(len(weights))
    return [(cuts[k], cuts[k + 1]) for k in range(parts)]


def make_plan(lengths: list[int], done: int, first_shard: int, world: int,
              samples_per_shard: int) -> dict[str, Any]:
    """Ranges [a, b) of the conversations after the `done` ones, one per rank, with about
    equal tokens (`lengths`: of those conversations), and each rank's first shard number."""
    ranges, first, k = [], [], first_shard
    for a, b in contiguous_shares(lengths, world):
        ranges.append([done + a, done + b])
        first.append(k)
        k += math.ceil((b - a) / samples_per_shard)
    return {"world_size": world, "ranges": ranges, "first_shard": first}


def resume_plan(old: dict[str, Any], out: Path, done: int, records: int,
                ranks: Ranks) -> dict[str, Any] | None:
    """The plan of an incomplete run on many ranks recorded in `old` (None if none), after
    checking that this run can continue it: same number of ranks, same conversations."""
    plan = old.get(PLAN_KEY)
    if not plan:
        return None
    n = plan["world_size"]
    if n != ranks.world_size:
        how = (f"torchrun --nproc-per-node {n} -m eagle3lab extract ..." if n > 1 else
               "one process")
        raise UserError(
            f"{out} holds an incomplete extraction started on {n} rank(s); this run has "
            f"{ranks.world_size}. Resume it on {n} rank(s) ({how}, the same options), or "
            f"delete {out} to start over.")
    if plan["ranges"][0][0] != done or plan["ranges"][-1][1] != records:
        raise UserError(
            f"{out}: its incomplete extraction covers conversations {plan['ranges'][0][0]}.."
            f"{plan['ranges'][-1][1] - 1}, but this run has {records} conversation(s) "
            f"({done} in merged shards). Resume with the same --limit, or delete {out}.")
    return plan


def read_shard_parts(out: Path, plan: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Each rank's complete shards (entries as in the manifest), checked against the plan."""
    parts = []
    for r, (rng, first) in enumerate(zip(plan["ranges"], plan["first_shard"])):
        p = shard_part_path(out, r)
        if not p.exists():
            parts.append([])
            continue
        try:
            part = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"{p} cannot be read as JSON ({e}); it is rank {r}'s list of "
                            f"complete shards. Delete {out} to start over.") from None
        if (part.get("format") != PART_FORMAT or part.get("range") != rng
                or part.get("first_shard") != first):
            raise UserError(f"{p} does not belong to the extraction planned in "
                            f"{out / 'manifest.json'} (range {part.get('range')}, planned "
                            f"{rng}). Delete {out} to start over.")
        parts.append(part["shards"])
    return parts


def write_shard_part(out: Path, plan: dict[str, Any], rank: int,
               shards: list[dict[str, Any]]) -> None:
    atomic_write_json(shard_part_path(out, rank), {
        "format": PART_FORMAT, "rank": rank, "world_size": plan["world_size"],
        "range": plan["ranges"][rank], "first_shard": plan["first_shard"][rank],
        "shards": shards})


def remove_shard_parts(out: Path) -> None:
    for p in out.glob("manifest.rank*.json"):
        p.unlink()


def merge_shards(out: Path, manifest: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """Rank 0, after every rank stopped: if every range is complete, list the ranks' shards
    in the manifest (in rank order = sample order), drop the plan and the part files.
    Returns the manifest, and the ranks' shards not merged yet (an incomplete run)."""
    parts = read_shard_parts(out, plan)
    complete = all(sum(s["samples"] for s in shards) == b - a
                   for shards, (a, b) in zip(parts, plan["ranges"]))
    if not complete:
        return {"manifest": manifest, "unmerged": [s for shards in parts for s in shards]}
    for shards in parts:
        manifest["shards"].extend(shards)
    manifest.pop(PLAN_KEY, None)
    if any(parts):
        manifest["params"]["world_size"] = plan["world_size"]
    write_manifest(out, manifest)
    remove_shard_parts(out)
    return {"manifest": manifest, "unmerged": []}


def jsonl_part_path(out: Path, rank: int) -> Path:
    return out.with_name(f"{out.name}.rank{rank:05d}.part")


def merge_jsonl_parts(out: Path, order: dict[str, int], what: str = "record") -> int:
    """Append to `out` the records (with an "id") of its rank part files that `out` does not
    hold yet, sorted by `order[id]` (ids not in it last, in file order); delete the parts.
    Returns how many records were appended."""
    parts = sorted(out.parent.glob(glob.escape(out.name) + ".rank*.part"))
    if not parts:
        return 0
    have = set(read_appended_jsonl(out, lambda r: "id" in r, what, keep=lambda r: r["id"]))
    new = []
    for part in parts:
        for rec in read_appended_jsonl(part, lambda r: "id" in r, what):
            if rec["id"] not in have:
                have.add(rec["id"])
                new.append(rec)
    new.sort(key=lambda r: order.get(r["id"], len(order)))
    with open(out, "a", encoding="utf-8") as f:
        for rec in new:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    for part in parts:
        part.unlink()
    return len(new)
