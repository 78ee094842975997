"""SpecForge's offline hidden-state files, read as a ShardSet (no copy).

The format, as SpecForge 0.2.0 writes it (`scripts/prepare_hidden_states.py`,
`HiddenStatesGenerator`, with `OfflineCaptureLayout("eagle3", aux_feature=
"aux_hidden_state", last_hidden_feature="hidden_state", passthrough input_ids, loss_mask)`
from `specforge/algorithms/eagle3/providers.py`; read back by `OfflineEagle3Dataset` in
`specforge/data/preprocessing.py`):

  OUT/rows_{g}-{g+2000}/data_{i}.ckpt        one sample per file, `torch.save` of a dict:
                                             (data_{i}.ckpt.gz with --compress: gzip of it)
      input_ids          int64 [S]
      loss_mask          int64 [S]
      aux_hidden_state   DTYPE [1, S, 3*H]  the aux layers' states, concatenated
      hidden_state       DTYPE [1, S, H]    the final state AFTER the target's final norm
                                            (the logits processor's input in SGLang)
  OUT/vocab_mapping/vocab_mapping.pt         torch.save({"d2t": offsets, "t2d": bool mask})

Aux ids are not recorded in the files: SpecForge's default (`resolve_eagle_capture_layers`
in `specforge/algorithms/model_providers.py`) is `[1, L//2 - 1, L - 4]`, passed to SGLang,
which adds 1: capture points `[2, L//2, L-3]`, the same as speculators' and ours.

Prevents two failures on top of those of `eagle3lab.data.foreign.base`:
- running code from a data file: a `.ckpt` is a pickle, and SpecForge loads it with
  `weights_only=False`; this reader loads with `weights_only=True` only, so a crafted
  file is refused (naming it), never executed;
- opening a 100k-sample directory by loading 100k files: samples are listed from the
  directory entries alone; tensors are read one sample at a time (uncompressed files
  memory-mapped).
"""

from __future__ import annotations

import gzip
import io
import os
import re
from pathlib import Path

from eagle3lab.errors import UserError
from eagle3lab.data.foreign.base import ForeignSet

SUFFIXES = (".ckpt", ".ckpt.gz")
VOCAB_MAPPING = Path("vocab_mapping") / "vocab_mapping.pt"
_NAME = re.compile(r"data_(\d+)\.ckpt(\.gz)?")


def looks_like(path: Path) -> bool:
    """A SpecForge output directory: rows_* groups holding data_*.ckpt[.gz] files."""
    for d in sorted(path.glob("rows_*"))[:1]:
        return d.is_dir() and any(_NAME.fullmatch(e.name) for e in os.scandir(d))
    return False


def safe_load(path: Path) -> dict:
    """torch.load(weights_only=True) of a .ckpt / .ckpt.gz: tensors and plain containers
    only. Anything else in the pickle (a class, a callable) is refused, never run."""
    import pickle
    import torch

    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                obj = torch.load(io.BytesIO(f.read()), weights_only=True, map_location="cpu")
        else:
            try:
                obj = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                obj = torch.load(path, weights_only=True, map_location="cpu")  # legacy format
    except pickle.UnpicklingError as e:
        first = (str(e) or "?").splitlines()[0]
        raise UserError(f"{path} is not a plain dict of tensors: loading it with "
                        f"weights_only=True refused its pickle ({first}). A SpecForge "
                        f"sample holds tensors only; this file was crafted or damaged and "
                        f"is NOT loaded (SpecForge's own loader would run its code). Delete "
                        f"it, or re-capture the sample.") from None
    except (OSError, EOFError, RuntimeError, ValueError) as e:
        raise UserError(f"{path} cannot be read as a torch-saved file ({type(e).__name__}: "
                        f"{(str(e) or '?').splitlines()[0]}); it is truncated or not a "
                        f"SpecForge sample. Delete it, or re-capture the sample.") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} holds a {type(obj).__name__}, not SpecForge's dict of "
                        f"tensors.")
    return obj


class SpecForgeSet(ForeignSet):
    TOOL = "SpecForge"
    FORMAT = "rows_*/data_*.ckpt[.gz] (torch.save dicts)"
    FINAL_STATE = "normed"
    DEFAULT_CONVENTION = "sglang"
    SOURCE = ("SpecForge 0.2.0 scripts/prepare_hidden_states.py (HiddenStatesGenerator), "
              "specforge/data/preprocessing.py (OfflineEagle3Dataset)")
    KEYS = ("input_ids", "loss_mask", "aux_hidden_state", "hidden_state")

    def _list(self) -> list[tuple[int, str]]:
        found: dict[int, str] = {}  # str, not Path: 100k Path objects take seconds
        for group in os.scandir(self.path):
            if not (group.name.startswith("rows_") and group.is_dir()):
                continue
            for e in os.scandir(group.path):
                m = _NAME.fullmatch(e.name)
                if m:
                    i = int(m.group(1))
                    if i in found:
                        raise UserError(f"Sample {i} is there twice: {found[i]} and "
                                        f"{e.path}; delete one.")
                    found[i] = e.path
        return sorted(found.items())

    def _default_aux_ids(self, num_layers: int) -> list[int]:
        return [1, num_layers // 2 - 1, num_layers - 4]

    def _record(self, i: int) -> dict:
        path = Path(self.files[i][1])
        rec = safe_load(path)
        missing = [k for k in self.KEYS if k not in rec]
        if missing:
            raise UserError(f"{path} lacks {', '.join(missing)} (it has {sorted(rec)}): not "
                            f"an EAGLE-3 sample of SpecForge's prepare_hidden_states.py (a "
                            f"DFlash/Domino capture stores other keys).")
        return rec

    @staticmethod
    def _rows(t):
        return t[0] if t.dim() == 3 else t  # [1, S, W] as written; [S, W] accepted

    def _shapes(self) -> tuple[int, int, str]:
        rec = self._record(0)
        aux = self._rows(rec["aux_hidden_state"])
        return (int(aux.shape[-1]), int(rec["hidden_state"].shape[-1]),
                str(aux.dtype).replace("torch.", ""))

    def _read(self, i: int):
        rec = self._record(i)
        return (self._rows(rec["aux_hidden_state"]), self._rows(rec["hidden_state"]),
                rec["input_ids"].reshape(-1), rec["loss_mask"].reshape(-1))

    def ids_and_masks(self):
        for i in range(self.num_samples):
            rec = self._record(i)  # memory-mapped: the states are not read
            yield rec["input_ids"].reshape(-1), rec["loss_mask"].reshape(-1).bool()

    def recorded_map(self):
        """(d2t, t2d) of SpecForge's vocab_mapping/vocab_mapping.pt, or None."""
        p = self.path / VOCAB_MAPPING
        if not p.is_file():
            return None
        m = safe_load(p)
        if not {"d2t", "t2d"} <= set(m):
            raise UserError(f"{p} lacks d2t/t2d (it has {sorted(m)}).")
        return m["d2t"].long(), m["t2d"].bool()
