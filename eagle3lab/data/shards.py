"""Shard + manifest format for extracted training data: written atomically, read lazily,
verified against the checksums and the target they were made from.

Prevents two silent failures: training on a half-written shard after a crash (a shard
enters the manifest only after it is completely written and renamed into place), and
training on features from a different target or different aux layers (the manifest
records the target's config hash, hidden size, aux capture points and their convention,
and `check_against` refuses a mismatch naming both values).

Layout of a shard set directory:
  manifest.json              what made the set, and one entry per COMPLETE shard
  shard-00000.safetensors    packed samples (tensor names as speculators' dataset uses):
      input_ids                   int32 [T]
      loss_mask                   uint8 [T]        1 = assistant token (trained on)
      hidden_states               DTYPE [T, A*H]   aux states concatenated low..high
      verifier_last_hidden_states DTYPE [T, H]     input of the target's final norm
      offsets                     int64 [n+1]      sample i is rows offsets[i]:offsets[i+1]
      sample_index                int64 [n]        line index in the conversations file
  vocab_map.safetensors      (optional) d2t int64 [N] offsets, t2d bool [V]
  sha256-cache.json          (optional) shards whose recorded sha256 was verified, by size
                             and mtime, so that re-verifying an unchanged set is instant
`ShardSet[i]` returns speculators' sample dict (hidden_states, input_ids,
verifier_last_hidden_states, loss_mask), so its CollateFn batches our samples directly.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

from eagle3lab.data.rendering import unknown
from eagle3lab.errors import UserError
from eagle3lab.fsutil import (atomic_path, atomic_write_json, read_json_object, sha256_bytes,
                              sha256_file)
from eagle3lab.targets.auxlayers import AuxLayers

FORMAT = "eagle3lab-shards"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
VOCAB_MAP = "vocab_map.safetensors"
VERIFY_CACHE = "sha256-cache.json"
#: A file modified less than this long before it was hashed is not cached: a second write
#: within the file system's timestamp granularity could leave size and mtime unchanged.
RACY_NS = 2_000_000_000


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def write_shard(path: Path, samples: list[dict[str, Any]], dtype) -> dict[str, Any]:
    """Pack samples (each: input_ids, loss_mask, hidden_states, last, sample_index) into one
    safetensors file, atomically. Returns the manifest entry (without timing)."""
    import torch

    lengths = [int(s["input_ids"].shape[0]) for s in samples]
    return write_packed_shard(path, {
        "input_ids": torch.cat([s["input_ids"].to(torch.int32) for s in samples]),
        "loss_mask": torch.cat([s["loss_mask"].to(torch.uint8) for s in samples]),
        "hidden_states": torch.cat([s["hidden_states"].to(dtype) for s in samples]).contiguous(),
        "verifier_last_hidden_states": torch.cat(
            [s["verifier_last_hidden_states"].to(dtype) for s in samples]).contiguous(),
        "offsets": offsets_of(lengths),
        "sample_index": torch.tensor([int(s["sample_index"]) for s in samples], dtype=torch.int64),
    })


def offsets_of(lengths: list[int]):
    """A shard's `offsets` tensor: sample k holds tokens offsets[k]:offsets[k+1]."""
    import torch

    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    return offsets


def write_packed_shard(path: Path, tensors: dict[str, Any]) -> dict[str, Any]:
    """Write one shard whose tensors are already packed (`write_shard`'s layout: samples
    concatenated along the tokens, `offsets`, `sample_index`), atomically. Returns the
    manifest entry (without timing)."""
    from safetensors.torch import save

    offsets = tensors["offsets"]
    # One metadata key only: safetensors writes a multi-key dict in hash order, which would
    # make identical shards differ byte for byte. Serialised in memory first (safetensors
    # holds the GIL only for that copy), then written, fsync'd and hashed from memory with
    # the GIL released: a shard written in the background does not stall the extraction
    # loop for the seconds a multi-GB file takes to reach the disk (save_file would).
    with atomic_path(path) as tmp:
        data = save(tensors, metadata={"format": f"{FORMAT}/{FORMAT_VERSION}"})
        with open(tmp, "wb") as f:
            f.write(data)
    digest = sha256_bytes(data)
    del data
    return {
        "file": path.name,
        "samples": int(offsets.numel() - 1),
        "tokens": int(offsets[-1]),
        "loss_tokens": int(tensors["loss_mask"].sum()),
        "sample_range": [int(tensors["sample_index"][0]), int(tensors["sample_index"][-1]) + 1],
        "bytes": path.stat().st_size,
        "sha256": digest,
    }


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    mpath = path / MANIFEST if path.is_dir() else path
    if not mpath.exists():
        raise UserError(
            f"{mpath} does not exist: {path} is not a shard set made by `eagle3lab extract` "
            f"(or its extraction never wrote a shard).")
    manifest = read_json_object(mpath, what="shard manifest",
                                fix="Re-extract the shard set (`eagle3lab extract`).")
    if manifest.get("format") != FORMAT:
        raise UserError(f"{mpath}: field 'format' is {manifest.get('format')!r}, expected "
                        f"{FORMAT!r}; this is not an eagle3lab shard manifest.")
    if manifest.get("version") != FORMAT_VERSION:
        raise UserError(f"{mpath}: format version {manifest.get('version')} is not supported "
                        f"(this eagle3lab reads version {FORMAT_VERSION}); re-extract.")
    return manifest


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    totals = {"samples": 0, "tokens": 0, "loss_tokens": 0, "bytes": 0}
    for s in manifest["shards"]:
        for k in totals:
            totals[k] += s[k]
    manifest["totals"] = totals
    atomic_write_json(directory / MANIFEST, manifest)


class ShardSet:
    """Read access to a shard set: lazy per-sample slices, checks, the vocab map."""

    def __init__(self, path: str | os.PathLike, *, verify: bool = False):
        self.path = Path(path)
        if not self.path.is_dir():
            raise UserError(f"Shard directory {str(self.path)!r} does not exist.")
        self.manifest = read_manifest(self.path)
        self.shards = self.manifest["shards"]
        self._starts: list[int] = []
        n = 0
        for s in self.shards:
            self._starts.append(n)
            n += s["samples"]
        self.num_samples = n
        self._handles: dict[int, Any] = {}
        if verify:
            self.verify()

    # --- facts recorded by extraction -------------------------------------------------
    @property
    def hidden_size(self) -> int:
        return int(self.manifest["target"]["hidden_size"])

    @property
    def aux(self) -> AuxLayers:
        return AuxLayers.from_dict(self.manifest["aux_layers"])

    @property
    def num_tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards)

    @property
    def rendering(self) -> dict[str, Any]:
        """How the text of these samples was rendered (`eagle3lab.data.rendering`): the
        manifest's record, else unknown (shards extracted before it was recorded)."""
        rec = self.manifest.get("rendering")
        return rec if isinstance(rec, dict) else unknown(
            f"the shard manifest in {self.path} records no rendering (extracted before "
            f"eagle3lab recorded it)")

    def __len__(self) -> int:
        return self.num_samples

    # --- checks --------------------------------------------------------------------------
    def verify(self, *, cache: bool = True) -> dict[str, int]:
        """Check every listed shard exists and matches its recorded sha256 (UserError naming
        the file and both hashes otherwise). cache: skip shards whose size and mtime equal
        those recorded in sha256-cache.json when they last matched, and record the ones
        hashed now (written atomically; skipped where the directory is read-only).
        Returns {"shards", "hashed", "cached"}."""
        known = self._read_cache() if cache else {}
        fresh: dict[str, dict[str, Any]] = {}
        hashed = 0
        for s in self.shards:
            p = self.path / s["file"]
            try:
                st = p.stat()
            except FileNotFoundError:
                raise UserError(f"Shard {p} is listed in {self.path / MANIFEST} but missing. "
                                f"Restore it, or delete the shard set and re-extract it "
                                f"(`eagle3lab extract`).") from None
            entry = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": s["sha256"]}
            if known.get(s["file"]) == entry:
                fresh[s["file"]] = entry
                continue
            started = time.time_ns()
            got = sha256_file(p)
            hashed += 1
            if got != s["sha256"]:
                size = (f"{st.st_size} bytes, the manifest recorded {s['bytes']}; "
                        if st.st_size != s.get("bytes") else "")
                raise UserError(
                    f"Shard {p} is corrupt ({size}sha256 {got}, the manifest recorded "
                    f"{s['sha256']}). Restore it, or delete the shard set and re-extract it "
                    f"(`eagle3lab extract`).")
            now = p.stat()
            if st.st_mtime_ns < started - RACY_NS and (now.st_size, now.st_mtime_ns) == (
                    st.st_size, st.st_mtime_ns):
                fresh[s["file"]] = entry
        if cache and fresh != known:
            self._write_cache(fresh)
        return {"shards": len(self.shards), "hashed": hashed,
                "cached": len(self.shards) - hashed}

    def _read_cache(self) -> dict[str, Any]:
        try:
            data = json.loads((self.path / VERIFY_CACHE).read_text(encoding="utf-8"))
            return dict(data["files"]) if data.get("format") == f"{FORMAT}-sha256-cache" else {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}  # a missing or damaged cache only means hashing again

    def _write_cache(self, files: dict[str, Any]) -> None:
        try:
            atomic_write_json(self.path / VERIFY_CACHE,
                              {"format": f"{FORMAT}-sha256-cache", "files": files})
        except OSError:
            pass  # a read-only shard set is verified in full each time

    def check_against(self, *, hidden_size: int | None = None, aux: AuxLayers | None = None,
                      vocab_size: int | None = None, config_sha256: str | None = None,
                      what: str = "the target") -> None:
        """Refuse a mismatch between these shards and a target/drafter, naming both values."""
        t = self.manifest["target"]
        problems = []
        if hidden_size is not None and hidden_size != t["hidden_size"]:
            problems.append(f"hidden size: shards {t['hidden_size']}, {what} {hidden_size}")
        if vocab_size is not None and vocab_size != t["vocab_size"]:
            problems.append(f"vocab size: shards {t['vocab_size']}, {what} {vocab_size}")
        if aux is not None and list(aux.capture_points) != list(self.aux.capture_points):
            problems.append(
                f"aux capture points (inputs of layers): shards {list(self.aux.capture_points)}"
                f" ({self.aux.convention}), {what} {list(aux.capture_points)} ({aux.convention})")
        if config_sha256 is not None and config_sha256 != t["config_sha256"]:
            problems.append(f"target config sha256: shards {t['config_sha256'][:12]}..., "
                            f"{what} {config_sha256[:12]}...")
        if problems:
            raise UserError(
                f"The shards in {self.path} do not match {what}: " + "; ".join(problems)
                + f". They were extracted from {t['name']} ({t['path']}); re-extract with the "
                f"right target and aux layers, or point at matching shards.")

    # --- samples -------------------------------------------------------------------------
    def _handle(self, k: int):
        from safetensors import safe_open

        if k not in self._handles:
            p = self.path / self.shards[k]["file"]
            try:
                self._handles[k] = safe_open(str(p), framework="pt")
            except Exception as e:  # missing, truncated, not safetensors
                raise UserError(f"Shard {p} (listed in {self.path / MANIFEST}) cannot be read: "
                                f"{e}. Re-extract the shard set, or run with verification "
                                f"on to check every shard's sha256 first.") from None
        return self._handles[k]

    def _locate(self, i: int) -> tuple[int, int]:
        import bisect

        if not 0 <= i < self.num_samples:
            raise IndexError(i)
        k = bisect.bisect_right(self._starts, i) - 1
        return k, i - self._starts[k]

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        k, j = self._locate(i)
        h = self._handle(k)
        offsets = h.get_tensor("offsets")
        a, b = int(offsets[j]), int(offsets[j + 1])
        return {
            "hidden_states": h.get_slice("hidden_states")[a:b],
            "input_ids": h.get_slice("input_ids")[a:b].to(torch.long),
            "verifier_last_hidden_states": h.get_slice("verifier_last_hidden_states")[a:b],
            "loss_mask": h.get_slice("loss_mask")[a:b].to(torch.bool),
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self.num_samples):
            yield self[i]

    def ids_and_masks(self) -> Iterator[tuple[Any, Any]]:
        """(input_ids, loss_mask as bool) of each shard: the token counts' input, read
        without the hidden states."""
        import torch

        for k in range(len(self.shards)):
            h = self._handle(k)
            yield (h.get_tensor("input_ids").to(torch.long),
                   h.get_tensor("loss_mask").to(torch.bool))

    def record(self, key: str, value: Any) -> None:
        """Set one manifest field (e.g. the vocab map entry) and save manifest.json."""
        manifest = read_manifest(self.path)
        manifest[key] = self.manifest[key] = value
        write_manifest(self.path, manifest)

    def lengths(self) -> list[int]:
        out: list[int] = []
        for k in range(len(self.shards)):
            off = self._handle(k).get_tensor("offsets")
            out.extend((off[1:] - off[:-1]).tolist())
        return out

    def vocab_map(self):
        """(d2t, t2d) from vocab_map.safetensors, after checking its recorded hash."""
        from safetensors.torch import load_file

        info = self.manifest.get("vocab_map")
        if not info:
            raise UserError(f"{self.path} has no vocab map; build one with `eagle3lab vocab "
                            f"--data {self.path}`.")
        p = self.path / info["file"]
        if not p.is_file():
            raise UserError(f"The vocab map {p} is listed in {self.path / MANIFEST} but "
                            f"missing; rebuild it with `eagle3lab vocab --data {self.path} "
                            f"--draft-vocab-size {info.get('draft_vocab_size', 'N')}`.")
        got = sha256_file(p)
        if got != info["sha256"]:
            raise UserError(f"{p} does not match the sha256 recorded in the manifest (sha256 "
                            f"{got}, recorded {info['sha256']}); rebuild it with `eagle3lab "
                            f"vocab --data {self.path} --force`.")
        t = load_file(str(p))
        return t["d2t"], t["t2d"]
