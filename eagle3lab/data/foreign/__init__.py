"""Hidden-state datasets written by the at-scale tools, read where eagle3lab reads its own
shards: SpecForge's offline `.ckpt` files (`specforge.py`) and speculators'
`hs_{i}.safetensors` (`speculators.py`), each a ShardSet with a synthesised manifest
(`base.py`).

`open_shards(path)` is what every consumer of shards calls (train, vocab, the study, the
notebooks): it detects the format from the directory, or takes `data_format`. Prevents
a foreign directory being read as ours (or refused as "no manifest.json") and a set being
opened with another format's reader.
"""

from __future__ import annotations

import os
from pathlib import Path

from eagle3lab.data.foreign import specforge, speculators
from eagle3lab.data.foreign.specforge import SpecForgeSet
from eagle3lab.data.foreign.speculators import SpeculatorsSet
from eagle3lab.data.shards import MANIFEST, ShardSet
from eagle3lab.errors import UserError

DATA_FORMATS = ("auto", "eagle3lab", "specforge", "speculators")


def detect_data_format(path: str | os.PathLike) -> str:
    """'eagle3lab' (manifest.json), 'specforge' (rows_*/data_*.ckpt[.gz]) or
    'speculators' (a saved dataset + hidden_states/hs_*.safetensors)."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"Data directory {str(p)!r} does not exist: --data takes a shard set "
                        f"(`eagle3lab extract`), or a SpecForge or speculators hidden-state "
                        f"directory.")
    if (p / MANIFEST).is_file():
        return "eagle3lab"
    if specforge.looks_like(p):
        return "specforge"
    if speculators.looks_like(p):
        return "speculators"
    raise UserError(f"{p} is not a hidden-state set eagle3lab reads: no manifest.json (`eagle3lab "
                    f"extract`), no rows_*/data_*.ckpt (SpecForge's prepare_hidden_states.py), "
                    f"no saved dataset with hidden_states/hs_*.safetensors (speculators' "
                    f"data_generation_offline.py).")


def open_shards(path: str | os.PathLike, *, verify: bool = False, data_format: str = "auto",
                target: str | None = None, aux_ids: list[int] | None = None,
                aux_convention: str | None = None):
    """A ShardSet over `path` in any supported format. For a foreign set, target / aux_ids
    (+ aux_convention: default the tool's own) are needed the first time, then recorded in
    its eagle3lab.manifest.json; for our own shards they must be left out."""
    if data_format not in DATA_FORMATS:
        raise UserError(f"Unknown data format {data_format!r}; use one of "
                        f"{', '.join(DATA_FORMATS)}.")
    fmt = detect_data_format(path) if data_format == "auto" else data_format
    if fmt == "eagle3lab":
        if aux_ids is not None:
            raise UserError(f"{path} is an eagle3lab shard set: its aux layers are recorded "
                            f"in its manifest; drop --aux-ids.")
        return ShardSet(path, verify=verify)

    cls = {"specforge": SpecForgeSet, "speculators": SpeculatorsSet}[fmt]
    return cls(path, verify=verify, target=target, aux_ids=aux_ids,
               aux_convention=aux_convention)
