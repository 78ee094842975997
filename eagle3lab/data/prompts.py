"""Prompt sets, chat templating and assistant-only loss masks.

Prevents training on the wrong tokens: a drafter trained on the system prompt and the
user's words learns to predict text the target never generates. Every conversation keeps
an explicit loss mask (1 on the assistant's tokens only), built from the same token ids
that are stored, never re-derived by re-tokenising text. Malformed prompt files fail with
the file and line named. `concat_jsonl` joins conversation files so that a changed mix is
rewritten (and so refused by the stale shards) instead of silently reused; its `.meta.json`
carries the parts' rendering record only where every part records the same one (otherwise
"unknown", with the reason), so a mix is never reported as one rendering it is not.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from eagle3lab import __version__
from eagle3lab.config import prompts_dir
from eagle3lab.data.rendering import Renderer, describe, is_unknown, same_rendering, unknown
from eagle3lab.errors import UserError
from eagle3lab.fsutil import (atomic_path, atomic_write_json, read_json_object, sha256_bytes,
                              sha256_file)

SPLITS = ("train", "eval")


@dataclasses.dataclass(frozen=True)
class Prompt:
    id: str
    prompt: str
    category: str | None = None
    length: str | None = None


def resolve_prompts_path(prompts: str | os.PathLike) -> Path:
    """'train' / 'eval' -> the shipped files; anything else is a path to a JSONL file."""
    if str(prompts) in SPLITS:
        return prompts_dir() / f"{prompts}.jsonl"
    path = Path(prompts).expanduser()
    if not path.is_file():
        raise UserError(
            f"Prompts file {str(prompts)!r} does not exist. Pass 'train' or 'eval' (the shipped "
            f"sets in {prompts_dir()}) or a JSONL file with one {{\"prompt\": ...}} per line.")
    return path


def read_lines(path: Path, what: str) -> list[str]:
    """The lines of a UTF-8 text file; an unreadable or non-UTF-8 file is a UserError naming
    the file and the line of the first bad byte."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"Cannot read {what} {path}: {e.strerror or e}.") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}, line {line}: not UTF-8 text (byte 0x{data[e.start]:02x} at "
                        f"offset {e.start}); a {what} must be UTF-8 JSONL. Re-save it as "
                        f"UTF-8.") from None
    # JSONL lines end at "\n" only: str.splitlines would also cut at U+2028, U+0085, \x0c
    # ..., which JSON text (ensure_ascii=False) may hold inside a string
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


def check_limit(limit: int | None, option: str = "limit (--limit)") -> None:
    """A count limit is None (no limit) or at least 1; 0 would silently mean 'one' or
    'nothing'."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise UserError(f"{option} must be a whole number of at least 1 (or unset for all), "
                        f"got {limit!r}.")


def load_prompts(prompts: str | os.PathLike = "train", limit: int | None = None) -> list[Prompt]:
    """Read a prompts JSONL file: one object per line with "prompt" (and optional "id",
    "category", "length"). Errors name the file and line."""
    check_limit(limit)
    path = resolve_prompts_path(prompts)
    out: list[Prompt] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(read_lines(path, "prompts file"), 1):
        if not line.strip():
            continue
        where = f"{path}, line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: not valid JSON ({e.msg} at column {e.colno}). Each line "
                            f"must be one JSON object such as {{\"id\": \"p1\", \"prompt\": "
                            f"\"...\"}}.") from None
        if not isinstance(obj, dict):
            raise UserError(f"{where}: expected a JSON object such as {{\"id\": \"p1\", "
                            f"\"prompt\": \"...\"}}, found a JSON "
                            f"{'array' if isinstance(obj, list) else type(obj).__name__}.")
        text = obj.get("prompt")
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"{where}: field 'prompt' is missing or empty (it must be a "
                            f"non-empty string).")
        pid = str(obj.get("id", f"{path.stem}-{lineno}"))
        if pid in seen:
            raise UserError(f"{where}: id {pid!r} repeats the id on line {seen[pid]}; ids must "
                            f"be unique so that resumed runs never duplicate a prompt.")
        seen[pid] = lineno
        out.append(Prompt(pid, text, obj.get("category"), obj.get("length")))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise UserError(f"Prompts file {path} holds no prompts.")
    return out


def prompts_fingerprint(prompts: str | os.PathLike) -> dict[str, Any]:
    path = resolve_prompts_path(prompts)
    return {"path": str(path), "sha256": sha256_file(path)}


def chat_prompt_ids(tokenizer, text: str, system: str | None = None, *,
                    renderer: Any = None) -> list[int]:
    """Token ids of a single-turn chat up to the start of the assistant's answer, rendered
    by `renderer` (an `eagle3lab.data.rendering.Renderer`: its template, system prompt and
    template kwargs) or, without one, by the tokenizer's template with `system` (None: no
    system message, the template's default applies; "": an empty system message)."""
    if renderer is None:
        renderer = Renderer(tokenizer, system_prompt=system)
    return renderer.prompt_ids(text)


def conversation_record(prompt: Prompt, prompt_ids: list[int], response_ids: list[int],
                        response_text: str, finish_reason: str, seed: int | None) -> dict:
    """One regenerated conversation; loss_mask is 1 exactly on the response tokens."""
    return {
        "id": prompt.id,
        "category": prompt.category,
        "prompt": prompt.prompt,
        "response": response_text,
        "input_ids": list(prompt_ids) + list(response_ids),
        "loss_mask": [0] * len(prompt_ids) + [1] * len(response_ids),
        "prompt_tokens": len(prompt_ids),
        "response_tokens": len(response_ids),
        "finish_reason": finish_reason,
        "seed": seed,
    }


def _check_ints(values: list, field: str, where: str, expected: str, lo: int,
                hi: int | None = None) -> None:
    """Every value an int in [lo, hi]; else a UserError naming the first bad one."""
    if all(type(v) is int for v in values) and (  # bool is not a token id either
            not values or (min(values) >= lo and (hi is None or max(values) <= hi))):
        return
    for k, v in enumerate(values):
        if type(v) is not int or v < lo or (hi is not None and v > hi):
            raise UserError(f"{where}: {field}[{k}] is {json.dumps(v)}, expected {expected}. "
                            f"Re-make the file with `eagle3lab regenerate` or fix the record.")


def read_conversations(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a conversations JSONL written by `regenerate`; errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"Conversations file {str(path)!r} does not exist; make it with "
                        f"`eagle3lab regenerate --out {path}`.")
    out = []
    for lineno, line in enumerate(read_lines(path, "conversations file"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}, line {lineno}: not valid JSON ({e.msg}).") from None
        if not isinstance(rec, dict):
            raise UserError(f"{path}, line {lineno}: expected a JSON object (a record written "
                            f"by `eagle3lab regenerate`), found {type(rec).__name__}.")
        ids, mask = rec.get("input_ids"), rec.get("loss_mask")
        if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask):
            raise UserError(f"{path}, line {lineno}: needs 'input_ids' and 'loss_mask' lists of "
                            f"equal length (found {type(ids).__name__} / "
                            f"{type(mask).__name__}).")
        _check_ints(ids, "input_ids", f"{path}, line {lineno}",
                    "a token id (a JSON integer >= 0, not a string)", 0)
        _check_ints(mask, "loss_mask", f"{path}, line {lineno}", "0 or 1", 0, 1)
        out.append(rec)
    if not out:
        raise UserError(f"Conversations file {path} is empty.")
    return out


def concat_jsonl(parts: list[str | os.PathLike], dst: str | os.PathLike) -> dict[str, Any]:
    """One conversations file from several (ids are distinct by construction), in order; a
    part whose last line has no newline gets one. Left untouched when it already holds
    exactly that (a resumed run extracts the same data); rewritten atomically when the parts
    changed, so that extract refuses its stale shards instead of silently training on the
    old mix. Beside it `<dst>.meta.json` (the stages' convention): the parts (path, sha256,
    records, rendering), their rendering record where every part records the same one, else
    `unknown` naming why (the parts differ, or a part records none), and the target where
    every part's meta names the same one. Returns the record count, whether the file was
    rewritten, the parts, the meta file and the rendering."""
    parts, dst = [Path(p) for p in parts], Path(dst)
    missing = [str(p) for p in parts if not p.is_file()]
    if not parts or missing:
        raise UserError(f"concat {dst}: " + (f"missing part(s) {', '.join(missing)}; make "
                        f"them first (`eagle3lab regenerate --out PART`)." if missing
                        else "no parts given."))
    chunks = [p.read_bytes() for p in parts]
    data = b"".join(c + b"\n" if c and not c.endswith(b"\n") else c for c in chunks)
    same = dst.is_file() and dst.read_bytes() == data
    if not same:
        with atomic_path(dst) as tmp:
            tmp.write_bytes(data)
    metas = [_part_meta(p) for p in parts]
    rendering = _concat_rendering(parts, [m.get("rendering") for m in metas])
    meta: dict[str, Any] = {
        "kind": "eagle3lab-conversations", "eagle3lab": __version__,
        "records": data.count(b"\n"), "rendering": rendering,
        "concat": [{"path": str(p), "sha256": sha256_bytes(c),
                    "records": c.count(b"\n") + (1 if c and not c.endswith(b"\n") else 0),
                    "rendering": m.get("rendering") or unknown(m["why"])}
                   for p, c, m in zip(parts, chunks, metas)]}
    targets = [m.get("target") for m in metas]
    if all(isinstance(t, dict) and t.get("config_sha256") for t in targets) and \
            len({t["config_sha256"] for t in targets}) == 1:  # who answered: online's check
        meta["target"] = targets[0]
    mpath = meta_path(dst)
    if not (mpath.is_file() and _json_or_none(mpath) == meta):
        atomic_write_json(mpath, meta)
    return {"out": str(dst), "records": data.count(b"\n"), "rewritten": not same,
            "parts": [str(p) for p in parts], "meta": str(mpath), "rendering": rendering}


def meta_path(out: Path) -> Path:
    """`<out>.meta.json`: the stages' meta file beside their output (regenerate, self-prompt,
    concat_jsonl; data.regenerate re-exports it)."""
    return out.with_name(out.name + ".meta.json")


def _json_or_none(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def _part_meta(part: Path) -> dict[str, Any]:
    """A part's meta file (its rendering and target), or {"why": ...} where it has none; a
    corrupt one is one line naming it."""
    mpath = meta_path(part)
    if not mpath.is_file():
        return {"why": f"{part.name} has no {mpath.name} (not written by eagle3lab)"}
    meta = read_json_object(mpath, what="meta file")
    rec = meta.get("rendering")
    return {"rendering": rec if isinstance(rec, dict) else None, "target": meta.get("target"),
            "why": f"{mpath.name} records no rendering (made before eagle3lab recorded it)"}


def _concat_rendering(parts: list[Path], records: list[dict[str, Any] | None]
                      ) -> dict[str, Any]:
    """The parts' common rendering record; `unknown` when a part records none or two parts
    were rendered differently (a mix is no one rendering)."""
    if none := [p.name for p, r in zip(parts, records) if is_unknown(r)]:
        return unknown(f"concatenated from parts of which {', '.join(none)} record"
                       f"{'s' if len(none) == 1 else ''} no rendering")
    if not all(same_rendering(records[0], r) for r in records[1:]):
        return unknown("concatenated from parts rendered differently: " + "; ".join(
            f"{p.name}: {describe(r)}" for p, r in zip(parts, records)))
    return records[0]
