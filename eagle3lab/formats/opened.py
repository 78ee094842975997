"""One drafter, located and read once: its directory, format, config, tensor headers and
doctor reports in one object that the checks, the doctor and the loaders share.

Prevents the same checkpoint being located and its headers parsed again by every step that
looks at it: per `accept` arm the drafter was located 7 times and its safetensors headers
read 6 times (`check_draft` three times, `fit_errors`, `inspect_checkpoint`, `load_as`),
which costs seconds on a big sharded drafter and lets two steps judge different
directories (a speculators save_path whose best epoch changes between two locates).
`open_drafter` locates once (formats/locate.py) and reads config.json, the training record
beside it and every weight file's header on first use (formats/reader.py; no tensor data);
the doctor's report is computed on first request and kept per set of arguments. Every
function that took a drafter path (`check_draft`, `fit_errors`, `inspect_checkpoint`,
`load_as`, `load_engine`, `measure_acceptance`, preflight) also takes the opened object,
and `open_drafter` hands one back unchanged, so a caller opens once and passes it on.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from eagle3lab.formats import locate
from eagle3lab.formats.detect import parse_draft_config, read_sidecar
from eagle3lab.formats.reader import Checkpoint, load_draft_config

if TYPE_CHECKING:
    from eagle3lab.formats.detect import DraftConfig, Format
    from eagle3lab.formats.reader import Problem, TensorInfo


def native_engine(fmt: str) -> str:
    """The engine a checkpoint's own format is loaded by without any renaming."""
    return "speculators" if fmt == "speculators" else "sglang"


class OpenedDrafter:
    """A drafter checkpoint located once; config and headers read once, on first use.

    `given`: what the caller passed (messages name it); `path`: the directory it means
    (a speculators save_path -> its best epoch). Nothing is read until a property needs it,
    so a path that does not exist can still be opened and refused by the caller with its
    own message. `close()` drops the open file handles (a later use reads again)."""

    def __init__(self, given: str | os.PathLike, path: Path):
        self.given = given
        self.path = path
        self._checkpoint: Checkpoint | None = None
        self._parsed: DraftConfig | None = None
        self._reports: dict[tuple, Any] = {}

    # -- what was read -----------------------------------------------------------------
    @property
    def checkpoint(self) -> Checkpoint:
        """The reader over config.json, the weight files' headers and the tensors."""
        if self._checkpoint is None:
            self._checkpoint = Checkpoint(self.path)
        return self._checkpoint

    @property
    def config(self) -> dict[str, Any] | None:
        """config.json as a dict (None: missing or unreadable; `problems` says why)."""
        return self.checkpoint.config

    @property
    def problems(self) -> list[Problem]:
        return self.checkpoint.problems

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        """Name -> shape, dtype and file, from the headers (no tensor data)."""
        return self.checkpoint.tensors

    @property
    def format(self) -> Format:
        """speculators / eagle3 / unknown (formats/detect.py)."""
        return self.checkpoint.format

    @property
    def native_engine(self) -> str:
        """The engine that loads this format without renaming (what it was trained as)."""
        return native_engine(self.format)

    @property
    def parsed_config(self) -> DraftConfig:
        """config.json parsed with the training record beside it (eagle3lab.json); an
        unreadable config parses as an empty one (the doctor reports it as `unreadable`).
        Shared: copy it (dataclasses.replace) before changing a field."""
        if self._parsed is None:
            self._parsed = parse_draft_config(self.config, sidecar=read_sidecar(self.path))
        return self._parsed

    @property
    def draft_config(self) -> DraftConfig:
        """`parsed_config`, or the UserError `load_draft_config` gives for a missing or
        malformed config.json."""
        if self.config is None:
            return load_draft_config(self.path)  # raises, naming the file and the fault
        return self.parsed_config

    # -- results kept on the drafter ----------------------------------------------------
    def kept(self, key: tuple, compute: Callable[[], Any]) -> Any:
        """`compute()` once per `key`, then kept: the doctor (formats/doctor.py's
        `inspect_checkpoint`) keeps its report here per set of arguments, so a second
        request with the same arguments reads nothing."""
        if key not in self._reports:
            self._reports[key] = compute()
        return self._reports[key]

    # -- life cycle --------------------------------------------------------------------
    def close(self) -> None:
        """Drop the open file handles and the read headers (read again if used after);
        the parsed config and the reports already computed stay."""
        if self._checkpoint is not None:
            self._checkpoint.close()
            self._checkpoint = None

    def __enter__(self) -> OpenedDrafter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"OpenedDrafter({str(self.given)!r} -> {str(self.path)!r})"


def open_drafter(path: str | os.PathLike | OpenedDrafter, *, log=None) -> OpenedDrafter:
    """`path` located once (formats/locate.py `locate_checkpoint`: a speculators save_path
    -> its best epoch; a SpecForge checkpoint refused with the export command); an
    OpenedDrafter is returned unchanged. `log`: told which epoch a save_path means."""
    if isinstance(path, OpenedDrafter):
        return path
    return OpenedDrafter(path, locate.locate_checkpoint(path, log=log))


@contextlib.contextmanager
def drafter_from(draft: str | os.PathLike | OpenedDrafter) -> Iterator[OpenedDrafter]:
    """`open_drafter(draft)` for a `with` block: closed on leaving when it was opened here
    from a path; an OpenedDrafter handed in stays open (the caller's to close)."""
    drafter = open_drafter(draft)
    try:
        yield drafter
    finally:
        if owned(draft, drafter):
            drafter.close()


def owned(draft: Any, drafter: OpenedDrafter) -> bool:
    """Whether `drafter` was opened from `draft` here (so the caller closes it), rather
    than handed in opened."""
    return drafter is not draft


__all__ = ["OpenedDrafter", "drafter_from", "native_engine", "open_drafter", "owned"]
