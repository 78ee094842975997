"""Atomic file writes and checksums: a crash never leaves a half-written artifact behind
under its final name, and every artifact can be verified against the sha256 recorded for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from eagle3lab.errors import UserError


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `final`; on success rename it over `final`.

    On any exception the temporary file is removed and `final` is left untouched.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp makes it private; the result is an ordinary file
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, final)
        _fsync_dir(final.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def read_appended_jsonl(path: str | os.PathLike, is_record: Callable[[dict], bool],
                        what: str = "record",
                        keep: Callable[[dict], Any] = lambda r: r) -> list[Any]:
    """`keep(record)` for each record of a JSONL file that a resumable job appends to (and
    may be killed while writing), read line by line. A torn last line (a crash mid-write) is
    cut off the file; a bad line followed by good ones is not a crash, so it is refused
    (naming the line) rather than cut, which would throw the good records after it away."""
    path = Path(path)
    if not path.exists():
        return []
    kept: list[Any] = []
    good = 0
    bad = None
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if bad is not None:
                raise UserError(f"{path}, line {bad}: not a {what}, and not the last line "
                                f"(so not a torn write). Fix or delete the line, or choose a "
                                f"new --out.")
            try:
                rec = json.loads(raw) if raw.endswith(b"\n") else None
            except (json.JSONDecodeError, UnicodeDecodeError):
                rec = None
            if not (isinstance(rec, dict) and is_record(rec)):
                bad = lineno
                continue
            kept.append(keep(rec))
            good += len(raw)
    if good != path.stat().st_size:
        with open(path, "rb+") as f:
            f.truncate(good)
    return kept


def read_json_object(path: str | os.PathLike, *, what: str = "JSON file",
                     fix: str = "Fix or delete it.") -> dict[str, Any]:
    """The JSON object in `path`; a missing, unreadable, non-UTF-8, malformed or non-object
    file raises a UserError naming the file, the line where known, and `fix`."""
    path = Path(path)
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise UserError(f"The {what} {path} does not exist. {fix}") from None
    except OSError as e:
        raise UserError(f"The {what} {path} cannot be read ({e.strerror or e}). {fix}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"The {what} {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} "
                        f"at offset {e.start}). {fix}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"The {what} {path} is not valid JSON (line {e.lineno}, column "
                        f"{e.colno}: {e.msg}). {fix}") from None
    if not isinstance(obj, dict):
        kind = {list: "array (a list)", str: "string", bool: "boolean", int: "number",
                float: "number"}.get(type(obj), "null")
        raise UserError(f"The {what} {path} holds a JSON {kind}, not an object "
                        f"({{\"key\": value, ...}}). {fix}")
    return obj


def atomic_write_text(final: str | os.PathLike, text: str) -> None:
    with atomic_path(final) as tmp:
        tmp.write_text(text)


def atomic_write_json(final: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(final, json.dumps(obj, indent=2, sort_keys=False) + "\n")


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory next to `final`; on success it replaces `final`."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the result is an ordinary directory
    try:
        yield tmp
        if final.exists():
            old = final.with_name(f".{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_writable_dir(path: str | os.PathLike, what: str = "output directory") -> Path:
    """Create `path` if needed and prove we can write there; raise UserError otherwise."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-", delete=True)
        probe.close()
    except OSError as e:
        raise UserError(
            f"The {what} {str(path)!r} is not writable ({e.strerror or e}). Choose another "
            f"directory with the output option, or fix its permissions."
        ) from None
    return path


def write_parts(dest: str | os.PathLike, name: str, data: bytes, *,
                part_bytes: int) -> list[Path]:
    """`data` as dest/name, or as dest/name.part00, .part01, ... of at most `part_bytes`
    each (the device returns files of at most 16 MiB), each written atomically; earlier
    files of that name (whole or parts) are removed first. Returns the paths in order."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob(name + "*"):
        old.unlink()
    if len(data) <= part_bytes:
        targets = [(dest / name, data)]
    else:
        targets = [(dest / f"{name}.part{i:02d}", data[o:o + part_bytes])
                   for i, o in enumerate(range(0, len(data), part_bytes))]
    for path, chunk in targets:
        with atomic_path(path) as tmp:
            tmp.write_bytes(chunk)
    return [p for p, _ in targets]


def ordered_parts(parts: list[Path], *, name: str, what: str) -> list[Path]:
    """One whole file, or the .partNN pieces `write_parts` cut, in order; a missing,
    doubled or stray part is named (`what`: "the cache", for the messages)."""
    import re

    parts = [Path(p) for p in parts]
    if len(parts) == 1 and not re.search(r"\.part\d+$", parts[0].name):
        return parts
    numbered: dict[int, Path] = {}
    for p in parts:
        m = re.search(r"\.part(\d+)$", p.name)
        if not m:
            raise UserError(f"{p}: {what} cut in parts is given as its parts alone "
                            f"({name}.part00, .part01, ...), not with {p.name}.")
        if int(m[1]) in numbered:
            raise UserError(f"{p}: part {m[1]} given twice ({numbered[int(m[1])]}).")
        numbered[int(m[1])] = p
    missing = [i for i in range(max(numbered) + 1) if i not in numbered]
    if missing:
        raise UserError(f"part{missing[0]:02d} of {what} is missing (given: "
                        f"{', '.join(sorted(p.name for p in parts))}); carry every part.")
    return [numbered[i] for i in sorted(numbered)]


@contextlib.contextmanager
def tar_of_parts(parts: list[Path], *, name: str,
                 what: str) -> Iterator[tuple["tarfile.TarFile", list[Path]]]:
    """The tar.gz that `write_parts` cut (one file, or its .partNN pieces), joined in a
    temporary file and opened: (the tar, the parts in order, `ordered_parts`). A missing
    file, or a tar that does not read (a part cut short or from another packing) while the
    body uses it, is one UserError."""
    import tarfile

    parts = ordered_parts(parts, name=name, what=what)
    for p in parts:
        if not p.is_file():
            raise UserError(f"{p}: no such file.")
    with tempfile.TemporaryDirectory(prefix="parts.") as tmp:
        whole = Path(tmp) / name
        with open(whole, "wb") as f:
            for p in parts:
                f.write(p.read_bytes())
        try:
            with tarfile.open(whole, "r:gz") as tar:
                yield tar, parts
        except (tarfile.TarError, EOFError, OSError) as e:
            raise UserError(f"{', '.join(p.name for p in parts)}: not a whole tar.gz "
                            f"({type(e).__name__}: {e}); a part is cut short or from "
                            "another packing.") from None
