"""speculators' offline hidden-state files, read as a ShardSet (no copy).

The format, as speculators 0.9.0 writes and reads it:

  DATA/                        `scripts/prepare_data.py`: a `datasets` save_to_disk dataset
                               with columns input_ids, loss_mask, seq_len (rows from
                               `speculators.data_generation.preprocessing`
                               `build_speculator_training_dataset`)
  DATA/token_freq.pt           `save_token_frequency_distribution`
                               (speculators/train/vocab_mapping.py): torch.save of
                               {token_id: count} over the loss-masked tokens
  DATA/hidden_states/hs_{i}.safetensors
                               `scripts/data_generation_offline.py` (the file vLLM's
                               hidden-states connector writes, moved into place): sample i
                               = row i of DATA
      token_ids       int64 [S]
      hidden_states   DTYPE [S, n_layers, H]   vLLM layer ids [2, L//2, L-3] (vLLM
                                               convention: input of layer k) + [L]: the
                                               LAST slot is the final layer, before the
                                               final norm (`scripts/launch_vllm.py`)

`ArrowDataset._get_raw_data` (speculators/train/data.py) turns a file into the sample dict
this reader returns too: hidden_states[:, :-1] flattened, hidden_states[:, -1] as
verifier_last_hidden_states, the row's loss_mask; it skips a file whose token ids differ
from the row's, which this reader refuses, naming both.

Prevents, on top of `eagle3lab.data.foreign.base`: pairing a hidden-state file with the
wrong row's loss mask (token ids are compared), and loading tensors to list samples (the
list comes from the directory; lengths from the dataset's seq_len column; shapes from the
safetensors headers).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from eagle3lab.data.foreign.specforge import safe_load
from eagle3lab.errors import UserError
from eagle3lab.data.foreign.base import ForeignSet

HS_DIR = "hidden_states"
TOKEN_FREQ = "token_freq.pt"
_NAME = re.compile(r"hs_(\d+)\.safetensors")


def looks_like(path: Path) -> bool:
    """A speculators data dir: a saved dataset with a hidden_states/hs_*.safetensors dir."""
    hs = path / HS_DIR
    return (path / "dataset_info.json").is_file() and hs.is_dir() and any(
        _NAME.fullmatch(e.name) for e in os.scandir(hs))


class SpeculatorsSet(ForeignSet):
    TOOL = "speculators"
    FORMAT = "DATA (datasets) + hidden_states/hs_{i}.safetensors"
    FINAL_STATE = "pre_norm"
    DEFAULT_CONVENTION = "vllm"
    SOURCE = ("speculators 0.9.0 scripts/prepare_data.py, scripts/data_generation_offline.py,"
              " speculators/train/data.py (ArrowDataset)")

    def _rows(self):
        if getattr(self, "_dataset", None) is None:
            from datasets import load_from_disk

            try:
                ds = load_from_disk(str(self.path))
            except Exception as e:  # noqa: BLE001 (any failure: not a saved dataset)
                raise UserError(f"{self.path} is not a dataset saved by speculators' "
                                f"prepare_data.py ({type(e).__name__}: {e}).") from None
            missing = {"input_ids", "loss_mask"} - set(ds.column_names)
            if missing:
                raise UserError(f"The dataset in {self.path} lacks {sorted(missing)} "
                                f"(columns: {ds.column_names}); run speculators' "
                                f"prepare_data.py.")
            self._dataset = ds.with_format("torch")
        return self._dataset

    def _list(self) -> list[tuple[int, str]]:
        hs = self.path / HS_DIR
        if not hs.is_dir():
            raise UserError(f"{hs} does not exist: the hidden states of a speculators set "
                            f"are in DATA/hidden_states (data_generation_offline.py's "
                            f"default output).")
        found = sorted((int(m.group(1)), e.path) for e in os.scandir(hs)
                       if (m := _NAME.fullmatch(e.name)))
        rows = len(self._rows())
        beyond = [i for i, _ in found if i >= rows]
        if beyond:
            raise UserError(f"{hs} holds hs_{beyond[0]}.safetensors but the dataset in "
                            f"{self.path} has only {rows} rows: the hidden states belong to "
                            f"another prepared dataset.")
        return found

    def _default_aux_ids(self, num_layers: int) -> list[int]:
        return [2, num_layers // 2, num_layers - 3]

    def _open(self, i: int):
        from safetensors import safe_open

        path = self.files[i][1]
        try:
            h = safe_open(path, framework="pt")
            keys = set(h.keys())
        except Exception as e:  # noqa: BLE001 (truncated, not safetensors)
            raise UserError(f"{path} cannot be opened as safetensors ({e}); it is truncated "
                            f"(an interrupted copy). Delete it and regenerate it.") from None
        if not {"token_ids", "hidden_states"} <= keys:
            raise UserError(f"{path} lacks token_ids/hidden_states (it has {sorted(keys)}).")
        return h

    def _shapes(self) -> tuple[int, int, str]:
        h = self._open(0)
        sl = h.get_slice("hidden_states")
        shape = sl.get_shape()
        if len(shape) != 3:
            raise UserError(f"{self.files[0][1]}: hidden_states has shape {shape}, "
                            f"speculators writes [S, n_layers, H].")
        dtype = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}.get(
            sl.get_dtype(), sl.get_dtype())
        return (shape[1] - 1) * shape[2], shape[2], dtype

    def _read(self, i: int):
        import torch

        k, path = self.files[i]
        h = self._open(i)
        ids = h.get_tensor("token_ids")
        row = self._rows()[k]
        if not torch.equal(ids.long(), row["input_ids"].long()):
            raise UserError(f"{path}: its token ids differ from row {k} of the dataset in "
                            f"{self.path} ({ids.numel()} vs {row['input_ids'].numel()} "
                            f"tokens); the hidden states were generated from another "
                            f"prepared dataset. Regenerate them.")
        hs = h.get_tensor("hidden_states")
        return hs[:, :-1].flatten(1), hs[:, -1], ids, row["loss_mask"]

    def lengths(self) -> list[int]:
        rows = self._rows()
        col = ("seq_len" if "seq_len" in rows.column_names else None)
        if col is None:
            return super().lengths()
        seq = rows.with_format(None)[col]
        return [int(seq[k]) for k, _ in self.files]

    def ids_and_masks(self):
        rows = self._rows()
        for k, _ in self.files:
            r = rows[k]
            yield r["input_ids"].long(), r["loss_mask"].bool()

    def recorded_counts(self):
        """speculators' token_freq.pt as counts (int64 [target vocab]), or None."""
        import torch

        p = self.path / TOKEN_FREQ
        if not p.is_file():
            return None
        freq = safe_load(p)
        counts = torch.zeros(int(self.manifest["target"]["vocab_size"]), dtype=torch.int64)
        for tid, c in freq.items():
            if not 0 <= int(tid) < counts.numel():
                raise UserError(f"{p}: token id {tid} is outside the target's vocab "
                                f"(0..{counts.numel() - 1}); it was counted with another "
                                f"tokenizer.")
            counts[int(tid)] = int(c)
        return counts
