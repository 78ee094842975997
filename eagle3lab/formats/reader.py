"""Read a drafter checkpoint lazily and safely: headers first, tensors on demand.

Prevents two failures: executing code from a checkpoint (released EAGLE-3 drafters ship
`pytorch_model.bin` pickles; they are opened with `torch.load(weights_only=True)` only, and
anything that needs a full unpickle is reported, never run), and a truncated or corrupt file
surfacing later as a confusing load error on a GPU machine (every safetensors header is
parsed and its offsets checked against the file size before anything else happens).
Tensors are read only when a check asks for them; `chunks()` streams big ones so a NaN scan
of an 8B-target drafter fits in a few seconds and little memory.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from pathlib import Path
from typing import Any, Iterator

from eagle3lab.data.rendering import record_rendering
from eagle3lab.errors import UserError
from eagle3lab.formats.detect import DraftConfig, detect_format, parse_draft_config, read_sidecar

#: safetensors dtype tag -> (torch dtype name, bytes per element)
ST_DTYPES = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2),
    "BF16": ("bfloat16", 2), "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U8": ("uint8", 1), "BOOL": ("bool", 1), "U16": ("uint16", 2), "U32": ("uint32", 4),
    "U64": ("uint64", 8),
}
DTYPE_BYTES = {name: width for name, width in ST_DTYPES.values()}
FLOAT_DTYPES = {"float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}
MAX_HEADER = 100 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch."
    file: str  # file name inside the checkpoint directory

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "file": self.file}


@dataclasses.dataclass
class Problem:
    """A file that cannot be read or parsed (becomes an `unreadable` finding)."""

    file: str
    message: str


def parse_safetensors_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and validate one safetensors header; raise ValueError naming what is wrong."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"file is {size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise ValueError(f"header length {n} does not fit in a {size}-byte file "
                             f"(truncated, or not a safetensors file)")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    data_len = size - 8 - n
    meta = header.pop("__metadata__", None) or {}
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        try:
            tag, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"tensor {name!r}: malformed header entry {entry!r}") from None
        if tag not in ST_DTYPES:
            raise ValueError(f"tensor {name!r}: unknown dtype {tag!r}")
        dtype, width = ST_DTYPES[tag]
        expected = math.prod(shape) * width
        if end - begin != expected:
            raise ValueError(f"tensor {name!r}: {end - begin} bytes for shape {shape} {tag} "
                             f"(expected {expected})")
        if end > data_len:
            raise ValueError(f"tensor {name!r} ends at byte {end} but the file holds "
                             f"{data_len} data bytes (truncated)")
        infos[name] = TensorInfo(name, tuple(int(s) for s in shape), dtype, path.name)
    return infos, meta


class Checkpoint:
    """A checkpoint directory: config, weight files, tensor index; data read on demand."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.config: dict[str, Any] | None = None
        self.problems: list[Problem] = []
        self.tensors: dict[str, TensorInfo] = {}
        self.files: list[str] = []
        self._st_handles: dict[str, Any] = {}
        self._bin_dicts: dict[str, dict[str, Any]] = {}
        self._read_config()
        self._index_weights()

    @property
    def format(self) -> str:
        """speculators / eagle3 / unknown, from the config and tensor names (no data read)."""
        return detect_format(list(self.tensors), self.config)

    # -- opening ---------------------------------------------------------------------------
    def _read_config(self) -> None:
        cfg = self.path / "config.json"
        if not cfg.is_file():
            self.problems.append(Problem("config.json", "config.json is missing"))
            return
        try:
            data = json.loads(cfg.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            self.problems.append(Problem("config.json", f"not valid JSON ({e})"))
            return
        if not isinstance(data, dict):
            self.problems.append(Problem("config.json", "not a JSON object"))
            return
        self.config = data

    def _weight_files(self) -> list[Path]:
        for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            p = self.path / index
            if p.is_file():
                try:
                    wm = json.loads(p.read_text())["weight_map"]
                    files = sorted(set(wm.values()))
                except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                    self.problems.append(Problem(index, f"unreadable index ({e})"))
                    return []
                missing = [f for f in files if not (self.path / f).is_file()]
                if missing:
                    self.problems.append(Problem(index, f"names missing shard(s) {missing}"))
                self._index_map = (index, wm)
                return [self.path / f for f in files if f not in missing]
        st = sorted(self.path.glob("*.safetensors"))
        if st:
            return st
        return sorted(self.path.glob("pytorch_model*.bin"))  # not training_args.bin & co

    def _index_weights(self) -> None:
        self._index_map: tuple[str, dict[str, str]] | None = None
        files = self._weight_files()
        if not files and not self.problems:
            self.problems.append(Problem(".", "no weight file (*.safetensors, a "
                                         "model.safetensors.index.json or pytorch_model.bin)"))
        for f in files:
            try:
                infos = self._open_file(f)
            except ValueError as e:
                self.problems.append(Problem(f.name, str(e)))
                continue
            self.files.append(f.name)
            for name, info in infos.items():
                if name in self.tensors:
                    self.problems.append(Problem(f.name, f"tensor {name!r} also appears in "
                                                 f"{self.tensors[name].file}"))
                self.tensors[name] = info
        if self._index_map is not None:
            index, wm = self._index_map
            for name, fname in wm.items():
                t = self.tensors.get(name)
                if fname in self.files and (t is None or t.file != fname):
                    self.problems.append(Problem(index, f"lists {name!r} in {fname}, which "
                                                 f"does not hold it"))

    def _open_file(self, f: Path) -> dict[str, TensorInfo]:
        if f.suffix == ".safetensors":
            infos, _ = parse_safetensors_header(f)
            return infos
        return self._open_bin(f)

    def _open_bin(self, f: Path) -> dict[str, TensorInfo]:
        import pickle

        import torch

        try:
            try:
                obj = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                obj = torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"needs a full unpickle, which eagle3lab never runs "
                             f"(weights_only load refused: {first[:200]})") from None
        except Exception as e:  # noqa: BLE001 - any other failure: corrupt/truncated file
            raise ValueError(f"cannot be read by torch.load(weights_only=True): "
                             f"{type(e).__name__}: {str(e)[:200]}") from None
        if not isinstance(obj, dict) or not all(
                isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
            raise ValueError("is not a flat {name: tensor} state dict")
        self._bin_dicts[f.name] = obj
        return {k: TensorInfo(k, tuple(v.shape), str(v.dtype).removeprefix("torch."), f.name)
                for k, v in obj.items()}

    # -- data ------------------------------------------------------------------------------
    @property
    def config_ok(self) -> bool:
        return self.config is not None

    def _st(self, fname: str):
        if fname not in self._st_handles:
            from safetensors import safe_open

            self._st_handles[fname] = safe_open(str(self.path / fname), framework="pt")
        return self._st_handles[fname]

    def tensor(self, name: str):
        """The whole tensor (memory-mapped where possible)."""
        info = self.tensors[name]
        if info.file in self._bin_dicts:
            return self._bin_dicts[info.file][name]
        return self._st(info.file).get_tensor(name)

    def chunks(self, name: str, max_bytes: int = 64 << 20) -> Iterator[Any]:
        """The tensor in row blocks of at most ~max_bytes (whole if 0-d or small)."""
        info = self.tensors[name]
        itemsize = DTYPE_BYTES.get(info.dtype, 8)
        if not info.shape or info.numel * itemsize <= max_bytes:
            yield self.tensor(name)
            return
        row = max(1, info.numel // info.shape[0]) * itemsize
        step = max(1, max_bytes // row)
        if info.file in self._bin_dicts:
            full = self._bin_dicts[info.file][name]
            for a in range(0, info.shape[0], step):
                yield full[a:a + step]
            return
        sl = self._st(info.file).get_slice(name)
        for a in range(0, info.shape[0], step):
            yield sl[a:a + step]

    def state_dict(self) -> dict[str, Any]:
        return {name: self.tensor(name) for name in self.tensors}

    def close(self) -> None:
        self._st_handles.clear()
        self._bin_dicts.clear()


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """A model directory's config.json as a dict (UserError if missing or malformed)."""
    p = Path(path) / "config.json"
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"{p} does not exist: expected a Hugging Face model directory.") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{p} cannot be read as JSON ({e}); fix or regenerate it.") from None
    if not isinstance(data, dict):
        raise UserError(f"{p} is not a JSON object.")
    return data


def drafter_rendering(directory: str | os.PathLike) -> dict[str, Any]:
    """How the data of the drafter in `directory` (or beside a weights file) was rendered
    (`eagle3lab.data.rendering`), from its record as the doctor reads it (config.json's
    `eagle3lab` block over eagle3lab.json); unknown when it records none. A drafter already
    opened: `record_rendering(opened.parsed_config.record, ...)`."""
    d = Path(directory)
    d = d if d.is_dir() else d.parent
    try:
        config = read_config(d)
    except UserError:  # no or a broken config.json: the record beside it may still say
        config = None
    return record_rendering(parse_draft_config(config, sidecar=read_sidecar(d)).record, str(d))


def load_draft_config(directory) -> DraftConfig:
    """A drafter directory's config.json parsed, with its eagle3lab.json record (the
    config's own `eagle3lab` block wins where both say something)."""
    return parse_draft_config(read_config(directory), sidecar=read_sidecar(directory))
