"""The target facts a checkpoint is checked against, from its config.json alone.

Prevents checking a drafter against a guess: layer count, hidden size, vocabulary and
context length come from the target's own config (a directory, or the prepared preset
directory), never from defaults, and weights are not loaded for it. `target_tensor`
reads only the embedding or head tensor, for `load_as` (engines that swap in the target's).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from eagle3lab.config import DEFAULT_TARGET, TARGET_PRESETS, preset_dir
from eagle3lab.errors import UserError
from eagle3lab.formats.reader import Checkpoint, read_config


@dataclasses.dataclass(frozen=True)
class TargetInfo:
    name: str
    path: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int | None
    architectures: tuple[str, ...]
    dtype: str | None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["architectures"] = list(self.architectures)
        return d


def target_dir(target: str | os.PathLike) -> Path:
    """A preset name -> its prepared directory; a directory -> itself (UserError otherwise)."""
    t = str(target)
    if t in TARGET_PRESETS:
        d = preset_dir(t)
        if not (d / "config.json").is_file():
            raise UserError(
                f"The target preset {t!r} is not prepared yet ({d / 'config.json'} is "
                f"missing). Run `eagle3lab prepare-target --name {t}` once, or pass a "
                f"directory with the target's config.json.")
        return d
    p = Path(t).expanduser()
    if not p.is_dir() or not (p / "config.json").is_file():
        raise UserError(
            f"Target {t!r} is not a directory with a config.json. Pass the target's Hugging "
            f"Face directory (weights are not needed) or the preset {DEFAULT_TARGET!r}.")
    return p


def target_info(target: str | os.PathLike) -> TargetInfo:
    d = target_dir(target)
    cfg = read_config(d)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    missing = [k for k in ("num_hidden_layers", "hidden_size", "vocab_size")
               if not isinstance(text.get(k), int)]
    if missing:
        raise UserError(f"{d / 'config.json'} lacks {', '.join(missing)}: is it a decoder "
                        f"model's config?")
    name = str(target) if str(target) in TARGET_PRESETS else d.name
    return TargetInfo(
        name=name, path=str(d.resolve()), num_layers=int(text["num_hidden_layers"]),
        hidden_size=int(text["hidden_size"]), vocab_size=int(text["vocab_size"]),
        max_position_embeddings=text.get("max_position_embeddings"),
        architectures=tuple(cfg.get("architectures") or ()),
        dtype=cfg.get("dtype") or cfg.get("torch_dtype") or text.get("dtype"))


_EMBED = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
          "embed_tokens.weight")
_HEAD = ("lm_head.weight", "model.lm_head.weight")


def target_tensor(target: str | os.PathLike, what: str):
    """The target's input embedding ("embed") or output head ("head", the embedding when
    tied) [vocab, hidden], read alone from its weight files."""
    d = target_dir(target)
    ck = Checkpoint(d)
    names = _HEAD + _EMBED if what == "head" else _EMBED
    for name in names:
        if name in ck.tensors:
            return ck.tensor(name)
    raise UserError(f"No {what} tensor ({names[0]}) in the target's weight files under {d}; "
                    f"pass a target directory with its weights.")
