"""Conversations JSONL <-> compact packed parts (token ids as uint16), for carrying data
between time-limited device sessions.

Prevents regenerating 20M answer tokens in every device session (or losing them at its
end) when a call takes at most 64 MiB in and returns at most 8 files of 16 MiB: the
records travel as token ids, not as JSON text, cut into `NAME.partNN.npz` files of at most
`max_bytes` each, and come back as the very same file, byte for byte (checked by sha256,
so a resumed `regenerate` or `extract` on the other side sees the file it wrote).

A conversations file (regenerate's records, `conversation_record`) is packed as, per
record: id, category and prompt text, prompt ids and response ids (uint16; an id >= 65536
is refused), finish reason and seed; the response text is decoded again from its ids on
unpacking, as `regenerate` decodes it (a record whose text differs from that decode keeps
its text). Any other JSONL (self-prompt's prompts file: what a resumed regenerate checks
by sha256) is packed as its compressed bytes, cut at line ends. Each part is an
`np.savez_compressed` archive (zlib: numpy reads it anywhere) holding a JSON header: the
whole file's sha256 and size, this part's record range and the sha256 of its lines, the
`.meta.json` beside the file (verbatim, in the first part), and how the file was packed.
Unpacking refuses, naming the part, a missing part, an unreadable one, one from another
file, and records that do not rebuild to the packed bytes (a corrupt part, or another
tokenizer).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable

from eagle3lab.config import DEFAULT_TARGET
from eagle3lab.data import remote
from eagle3lab.data.prompts import Prompt, conversation_record
from eagle3lab.data.regenerate import meta_path
from eagle3lab.errors import UserError
from eagle3lab.fsutil import atomic_path, sha256_bytes

FORMAT = "eagle3lab-tokpack"
VERSION = 1
#: A part's default size limit: a device call returns files of at most 16 MiB.
MAX_BYTES = 15 * 2**20
#: Token ids are stored as uint16.
ID_LIMIT = 2**16
_PART = re.compile(r"^(?P<name>.+)\.part(?P<n>\d{2,})\.npz$")


def part_path(out_dir: Path, name: str, n: int) -> Path:
    return out_dir / f"{name}.part{n:02d}.npz"


def tokenizer_of(target: Any):
    """The tokenizer to decode with: a loaded Target's, a tokenizer itself, or that of a
    preset name / directory (tokenizer and config only, no weights)."""
    if target is None:
        target = DEFAULT_TARGET
    if hasattr(target, "decode") and hasattr(target, "convert_ids_to_tokens"):
        return target
    if hasattr(target, "tokenizer"):
        return target.tokenizer
    return remote.TargetInfo(str(target)).tokenizer


def _decode(tok, ids: list[int]) -> str:
    """A response's text exactly as `regenerate` writes it."""
    return tok.decode(ids, skip_special_tokens=True)


def _line(rec: dict) -> bytes:
    """A record's line exactly as `regenerate` writes it."""
    return (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")


# --- packing ---------------------------------------------------------------------------
def _as_conversations(path: Path, lines: list[bytes], target: Any
                      ) -> tuple[list[dict] | None, str]:
    """Per line the packed fields of a conversation record, or (None, why not) when a line
    is not one that `conversation_record` rebuilds exactly (the file is then packed as
    bytes). An id that does not fit uint16 is refused. The tokenizer is loaded at the
    first record."""
    rows, tok = [], None
    for n, raw in enumerate(lines, 1):
        try:
            rec = json.loads(raw)
            ids, p = rec["input_ids"], rec["prompt_tokens"]
            prompt = Prompt(rec["id"], rec["prompt"], rec["category"])
            if not (isinstance(ids, list) and isinstance(p, int)):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return None, f"line {n} is not a conversation record"
        bad = next((i for i in ids if not isinstance(i, int) or not 0 <= i < ID_LIMIT), None)
        if bad is not None:
            raise UserError(f"{path}, line {n}: token id {bad!r} does not fit uint16 (ids "
                            f"0..{ID_LIMIT - 1}); packing as token ids is for vocabularies "
                            f"of at most {ID_LIMIT} tokens.")
        pids, rids = ids[:p], ids[p:]
        text = rec.get("response")
        tok = tok or tokenizer_of(target)
        row = {"id": rec["id"], "category": rec["category"], "prompt": rec["prompt"],
               "text": None if _decode(tok, rids) == text else text,
               "prompt_ids": pids, "response_ids": rids,
               "finish": rec.get("finish_reason"), "seed": rec.get("seed")}
        if _line(_rebuild(prompt, row, text)) != raw:
            return None, f"line {n} does not rebuild from its ids"
        rows.append(row)
    return rows, ""


def _rebuild(prompt: Prompt, row: dict, text: str) -> dict:
    return conversation_record(prompt, row["prompt_ids"], row["response_ids"], text,
                               row["finish"], row["seed"])


def _tokens_arrays(rows: list[dict]) -> dict[str, Any]:
    import numpy as np

    strings = [[r["id"], r["category"], r["prompt"], r["text"], r["finish"], r["seed"]]
               for r in rows]
    return {
        "prompt_ids": np.array([i for r in rows for i in r["prompt_ids"]], dtype=np.uint16),
        "prompt_lens": np.array([len(r["prompt_ids"]) for r in rows], dtype=np.uint32),
        "response_ids": np.array([i for r in rows for i in r["response_ids"]],
                                 dtype=np.uint16),
        "response_lens": np.array([len(r["response_ids"]) for r in rows], dtype=np.uint32),
        "strings": np.frombuffer(json.dumps(strings, ensure_ascii=False).encode("utf-8"),
                                 dtype=np.uint8),
    }


def _write_part(dst: Path, header: dict, arrays: dict[str, Any]) -> int:
    import numpy as np

    blob = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    with atomic_path(dst) as tmp:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, header=blob, **arrays)
    return dst.stat().st_size


def pack(conversations: str | os.PathLike, out_dir: str | os.PathLike, *,
         max_bytes: int = MAX_BYTES, target: Any = None, name: str | None = None,
         mode: str = "auto") -> dict[str, Any]:
    """Pack a JSONL file (and its `.meta.json`) into `out_dir/NAME.partNN.npz` files of at
    most `max_bytes` each. NAME: the file's name without `.jsonl`. mode "auto": token ids
    for a conversations file whose every record rebuilds exactly, else the bytes; "tokens"
    refuses a file that is not one; "bytes" always packs the bytes. target: the tokenizer
    the responses are decoded with (a preset, a directory, a Target or a tokenizer;
    default the default target). Earlier parts of NAME in out_dir are removed first.
    Returns a summary (parts, sizes, mode, sha256)."""
    import numpy as np

    src, out_dir = Path(conversations), Path(out_dir)
    if mode not in ("auto", "tokens", "bytes"):
        raise UserError(f"pack: mode must be auto, tokens or bytes, got {mode!r}.")
    if not src.is_file():
        raise UserError(f"pack: {src} does not exist.")
    if max_bytes < 2**10:
        raise UserError(f"pack: max_bytes {max_bytes} is below 1 KiB; a part must hold its "
                        f"header and at least one record.")
    data = src.read_bytes()
    if data and not data.endswith(b"\n"):
        raise UserError(f"{src}: the last line has no newline (a torn write?); resume the run "
                        f"that writes it first, or add the newline.")
    lines = data.splitlines(keepends=True)
    name = name or (src.name[:-len(".jsonl")] if src.name.endswith(".jsonl") else src.name)
    mpath = meta_path(src)
    meta = mpath.read_bytes().decode("utf-8") if mpath.is_file() else None
    rows, why = None, "packed as bytes (mode bytes)"
    if mode != "bytes":
        rows, why = _as_conversations(src, lines, target)
        if rows is None and mode == "tokens":
            raise UserError(f"{src}: {why}; pack it with mode bytes.")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(f"{name}.part*.npz"):
        if _PART.match(old.name) and _PART.match(old.name)["name"] == name:
            old.unlink()
    # a part's records: as many as fit max_bytes after compression, estimated from the
    # previous part's ratio and checked (a part over the limit is written again, smaller;
    # one under 80% of it, with records left, again larger: few parts, each well filled)
    raw_size = [len(x) if rows is None else 2 * len(rows[k]["prompt_ids"] +
                                                    rows[k]["response_ids"]) + 64 +
                len(rows[k]["prompt"]) for k, x in enumerate(lines)]
    cum = np.concatenate([[0], np.cumsum(raw_size, dtype=np.int64)])
    header0 = {"format": FORMAT, "version": VERSION, "name": name, "source": src.name,
               "mode": "bytes" if rows is None else "tokens", "jsonl_sha256": sha256_bytes(data),
               "jsonl_bytes": len(data), "records": len(lines),
               "response_tokens": (None if rows is None else
                                   sum(len(r["response_ids"]) for r in rows)),
               "meta_name": mpath.name if meta is not None else None, "meta": meta}
    parts, start, ratio, n = [], 0, 1.0, 1
    while start < len(lines) or not parts:
        budget = 0.92 * max_bytes / ratio
        end = max(start + 1, int(np.searchsorted(cum, cum[start] + budget, side="right")) - 1)
        end, shrunk = min(end, len(lines)), False
        while True:
            chunk = b"".join(lines[start:end])
            arrays = ({"bytes": np.frombuffer(chunk, dtype=np.uint8)} if rows is None
                      else _tokens_arrays(rows[start:end]))
            header = {**header0, "part": n, "start": start, "end": end,
                      "part_sha256": sha256_bytes(chunk)}
            if n > 1:  # the meta file travels once, in the first part
                header["meta"] = None
            size = _write_part(part_path(out_dir, name, n), header, arrays)
            grow = start + int((end - start) * 0.92 * max_bytes / size)
            if size <= max_bytes and (shrunk or end == len(lines) or size >= 0.8 * max_bytes
                                      or grow <= end):
                break
            if size <= max_bytes:
                end = min(grow, len(lines))
                continue
            if end - start == 1:
                raise UserError(f"{src}, line {start + 1}: one record packs to {size} bytes, "
                                f"more than max_bytes {max_bytes}.")
            end, shrunk = start + max(1, int((end - start) * 0.9 * max_bytes / size)), True
        ratio = max(size / max(int(cum[end] - cum[start]), 1), 0.05)
        parts.append({"path": str(part_path(out_dir, name, n)), "bytes": size,
                      "records": end - start})
        start, n = end, n + 1
    return {"source": str(src), "mode": header0["mode"], "why_bytes": why or None,
            "records": len(lines), "response_tokens": header0["response_tokens"],
            "jsonl_bytes": len(data),
            "jsonl_sha256": header0["jsonl_sha256"], "meta": meta is not None,
            "parts": parts, "packed_bytes": sum(p["bytes"] for p in parts)}


# --- unpacking -------------------------------------------------------------------------
def find_parts(parts: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """The part files of ONE packed file: those named, or a directory's NAME.partNN.npz
    (refused when it holds parts of several files: name them)."""
    if isinstance(parts, (str, os.PathLike)) and Path(parts).is_dir():
        found = sorted(p for p in Path(parts).iterdir() if _PART.match(p.name))
        if not found:
            raise UserError(f"{parts}: no NAME.partNN.npz files there.")
    else:
        found = [Path(p) for p in ([parts] if isinstance(parts, (str, os.PathLike))
                                   else parts)]
        for p in found:
            if not _PART.match(p.name):
                raise UserError(f"{p}: not a part file (NAME.partNN.npz).")
            if not p.is_file():
                raise UserError(f"{p} does not exist.")
    if not found:
        raise UserError("unpack: no part files given.")
    names = sorted({_PART.match(p.name)["name"] for p in found})
    if len(names) > 1:
        raise UserError(f"the parts are of {len(names)} files ({', '.join(names)}); unpack "
                        f"one at a time, naming its parts.")
    return sorted(found, key=lambda p: int(_PART.match(p.name)["n"]))


def _read_part(path: Path) -> tuple[dict, dict[str, Any]]:
    import zipfile
    import zlib

    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        header = json.loads(arrays.pop("header").tobytes().decode("utf-8"))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise UserError(f"{path}: unreadable part ({type(e).__name__}: {e}); carry it "
                        f"again.") from None
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise UserError(f"{path}: not a {FORMAT} v{VERSION} part (format "
                        f"{header.get('format')!r}, version {header.get('version')!r}).")
    return header, arrays


def _tokens_lines(header: dict, arrays: dict[str, Any], tok) -> bytes:
    import numpy as np

    strings = json.loads(arrays["strings"].tobytes().decode("utf-8"))
    p_off = np.concatenate([[0], np.cumsum(arrays["prompt_lens"], dtype=np.int64)])
    r_off = np.concatenate([[0], np.cumsum(arrays["response_lens"], dtype=np.int64)])
    pids, rids = arrays["prompt_ids"].tolist(), arrays["response_ids"].tolist()
    out = []
    for k, (pid, category, prompt, text, finish, seed) in enumerate(strings):
        row = {"prompt_ids": pids[p_off[k]:p_off[k + 1]],
               "response_ids": rids[r_off[k]:r_off[k + 1]], "finish": finish, "seed": seed}
        if text is None:
            text = _decode(tok, row["response_ids"])
        out.append(_line(_rebuild(Prompt(pid, prompt, category), row, text)))
    return b"".join(out)


def unpack(parts: str | os.PathLike | Iterable[str | os.PathLike],
           out_jsonl: str | os.PathLike, *, target: Any = None) -> dict[str, Any]:
    """Rebuild the packed JSONL at `out_jsonl` (and its `.meta.json` beside it, as it was),
    byte for byte: every part present, readable, of the same file, and each part's lines
    and the whole file equal to the packed sha256s. parts: a directory holding one file's
    parts, or the part files. target: the tokenizer the responses are decoded with (as
    `pack`'s; default the default target). Written atomically: nothing is left under
    `out_jsonl` on a refusal. Returns a summary."""
    files = find_parts(parts)
    out = Path(out_jsonl)
    first, tok = None, None
    expect = 0
    h = hashlib.sha256()
    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        for path in files:
            header, arrays = _read_part(path)
            if first is None:
                first = header
            elif header["jsonl_sha256"] != first["jsonl_sha256"]:
                raise UserError(f"{path} is a part of another file (sha256 "
                                f"{header['jsonl_sha256'][:12]}..., not "
                                f"{first['jsonl_sha256'][:12]}... of {files[0].name}).")
            if header["start"] != expect:
                raise UserError(f"missing part(s) of {first['name']} before {path.name} "
                                f"(records {expect}..{header['start'] - 1}); carry every "
                                f"part.")
            if header["mode"] == "bytes":
                chunk = arrays["bytes"].tobytes()
            else:
                tok = tok or tokenizer_of(target)
                chunk = _tokens_lines(header, arrays, tok)
            if sha256_bytes(chunk) != header["part_sha256"]:
                why = ("" if tok is None else f", or the tokenizer "
                       f"({getattr(tok, 'name_or_path', '?')}) is not the one "
                       f"{first['source']} was packed with")
                raise UserError(f"{path}: its records do not rebuild to the packed bytes "
                                f"(sha256 differs): the part is corrupt{why}.")
            f.write(chunk)
            h.update(chunk)
            expect = header["end"]
        if first is not None and expect != first["records"]:
            raise UserError(f"missing part(s) of {first['name']} after {files[-1].name} "
                            f"(records {expect}..{first['records'] - 1} of "
                            f"{first['records']}); carry every part.")
        if h.hexdigest() != first["jsonl_sha256"]:
            raise UserError(f"{out}: the rebuilt file's sha256 differs from the packed "
                            f"{first['jsonl_sha256'][:12]}...; carry the parts again.")
    if first["meta"] is not None:
        with atomic_path(meta_path(out)) as tmp:
            tmp.write_bytes(first["meta"].encode("utf-8"))
    return {"out": str(out), "mode": first["mode"], "records": first["records"],
            "jsonl_bytes": first["jsonl_bytes"], "jsonl_sha256": first["jsonl_sha256"],
            "meta": first["meta"] is not None, "parts": len(files)}
