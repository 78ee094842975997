"""Prompt sets, chat templating and assistant-only loss masks.

Prevents training on the wrong tokens: a drafter trained on the system prompt and the
user's words learns to predict text the target never generates. Every conversation keeps
an explicit loss mask (1 on the assistant's tokens only), built from the same token ids
that are stored, never re-derived by re-tokenising text. Malformed prompt files fail with
the file and line named. `concat_jsonl` joins conversation files so that a changed mix is
rewritten (and so refused by the stale shards) instead of silently reused.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from eagle3lab.config import prompts_dir
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_path, sha256_file

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


def load_prompts(prompts: str | os.PathLike = "train", limit: int | None = None) -> list[Prompt]:
    """Read a prompts JSONL file: one object per line with "prompt" (and optional "id",
    "category", "length"). Errors name the file and line."""
    path = resolve_prompts_path(prompts)
    out: list[Prompt] = []
    seen: dict[str, int] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"Cannot read prompts file {path}: {e}.") from None
    for lineno, line in enumerate(lines, 1):
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
            raise UserError(f"{where}: expected a JSON object, found {type(obj).__name__}.")
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


def chat_prompt_ids(tokenizer, text: str, system: str | None = None) -> list[int]:
    """Token ids of a single-turn chat up to the start of the assistant's answer."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": text}]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    # A base model without a template: plain text, answered after a newline.
    return tokenizer(text + "\n").input_ids


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


def read_conversations(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a conversations JSONL written by `regenerate`; errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"Conversations file {str(path)!r} does not exist; make it with "
                        f"`eagle3lab regenerate --out {path}`.")
    out = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}, line {lineno}: not valid JSON ({e.msg}).") from None
        ids, mask = rec.get("input_ids"), rec.get("loss_mask")
        if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask):
            raise UserError(f"{path}, line {lineno}: needs 'input_ids' and 'loss_mask' lists of "
                            f"equal length (found {type(ids).__name__} / "
                            f"{type(mask).__name__}).")
        out.append(rec)
    if not out:
        raise UserError(f"Conversations file {path} is empty.")
    return out


def concat_jsonl(parts: list[str | os.PathLike], dst: str | os.PathLike) -> dict[str, Any]:
    """One conversations file from several (ids are distinct by construction), in order; a
    part whose last line has no newline gets one. Left untouched when it already holds
    exactly that (a resumed run extracts the same data); rewritten atomically when the parts
    changed, so that extract refuses its stale shards instead of silently training on the
    old mix. Returns the record count and whether the file was rewritten."""
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
    return {"out": str(dst), "records": data.count(b"\n"), "rewritten": not same,
            "parts": [str(p) for p in parts]}
