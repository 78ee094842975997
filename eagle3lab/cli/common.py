"""What the subcommands share: their registration, the options several of them take (each
defined once as an argparse parent parser, `parents=[...]`), and the options generated
from a strict config's fields (`add_config_options`).

Prevents one option drifting apart between commands (`--device` taking other values, or
`--no-progress` another meaning, in one command only): the name, type, default and help
of a shared option live here; a command may only add a note to its help. And prevents a
command's options drifting from the library's settings: `train` and the data stages
(`self-prompt`, `regenerate`, `extract`) generate their options from their config's
fields (name, type, choices, default, help from `Field(description=...)`, option group
from `json_schema_extra={"group": ...}`), so a field added to a config is an option.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Callable, Sequence

from pydantic_core import PydanticUndefined

from eagle3lab.config import DEFAULT_TARGET, StrictConfig

TARGET_HELP = "preset name, Hugging Face model directory, or hub id"


def add_command(sub, name: str, func: Callable[[argparse.Namespace], int], *, help: str,
                description: str, parents: Sequence[argparse.ArgumentParser] = (),
                show_defaults: bool = True) -> argparse.ArgumentParser:
    """Register subcommand `name` (its help lists each option's default unless
    show_defaults=False); `func(args)` returns the exit code."""
    kw = {"formatter_class": argparse.ArgumentDefaultsHelpFormatter} if show_defaults else {}
    p = sub.add_parser(name, help=help, description=description, parents=list(parents), **kw)
    p.set_defaults(func=func)
    return p


def _parent(*flags: str, **kw) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(*flags, **kw)
    return p


def target_option(note: str = "") -> argparse.ArgumentParser:
    """--target: the model a command runs (default: the embedded default target)."""
    return _parent("--target", default=DEFAULT_TARGET,
                   help=TARGET_HELP + (f" ({note})" if note else ""))


def device_option(note: str = "") -> argparse.ArgumentParser:
    """--device: where the model runs."""
    return _parent("--device", default="auto",
                   help="auto, cpu, cuda, cuda:1, ..." + (f" ({note})" if note else ""))


def dtype_option(help: str = "model dtype (bfloat16 on GPUs)") -> argparse.ArgumentParser:
    """--dtype: the dtype the model runs in."""
    return _parent("--dtype", default="float32", help=help)


def no_progress_option(help: str = "no progress bar") -> argparse.ArgumentParser:
    """--no-progress: no tqdm bars (args.no_progress)."""
    return _parent("--no-progress", action="store_true", help=help)


def json_option(help: str = "print one JSON object") -> argparse.ArgumentParser:
    """--json: machine-readable output instead of the table."""
    return _parent("--json", action="store_true", help=help)


def generation_options(target_note: str = "") -> argparse.ArgumentParser:
    """The options of the commands where the target writes text (regenerate, self-prompt):
    --target, --device, --dtype, --system-prompt, --no-progress."""
    p = argparse.ArgumentParser(add_help=False, parents=[
        target_option(target_note), device_option(), dtype_option(), no_progress_option()])
    p.add_argument("--system-prompt", default=None, help="system message (default: none "
                   "sent, so the template's default applies; --system-prompt '' sends an "
                   "empty one)")
    return p


def aux_ids_option(parser, flag: str, *, help: str) -> None:
    """An option of explicit aux layer ids in the one syntax (`AUX_IDS_SYNTAX`:
    comma-separated; for compatibility separate words, `1 14 26`, are read alike). The text
    given is kept (words joined with commas) and read by the library (`parse_aux_ids`,
    through the config field or the keyword argument), so every entry point accepts and
    refuses alike. A config's `AuxIds` field becomes this option too."""
    parser.add_argument(flag, nargs="+", action=_JoinedIds, default=None, metavar="IDS",
                        help=help)


class _JoinedIds(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, ",".join(values))


def _is_aux_ids(field) -> bool:
    """Whether a field is of the aux-ids type (`AuxIds` or `AuxIds | None`)."""
    from eagle3lab.targets.auxlayers import AuxIds

    marker = typing.get_args(AuxIds)[1]  # its validator
    return marker in field.metadata or any(
        marker in getattr(a, "__metadata__", ()) for a in typing.get_args(field.annotation))


def _plain(tp: Any) -> Any:
    """`int | None` -> int; Annotated[str, ...] -> str: the type argparse converts with."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
    return typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Annotated else tp


def _extra(field) -> dict[str, Any]:
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def add_config_options(parser: argparse.ArgumentParser, config: type[StrictConfig], *,
                       groups: dict[str, str] | None = None, from_file: bool = False) -> None:
    """One `--name` option per field of `config` (underscores as dashes; other flags from
    `json_schema_extra["flags"]`), with the field's description as help, its type (or its
    Literal's choices), and, with `groups` (title -> description, in help order), in the
    group its `json_schema_extra["group"]` names (no group: the command's own options). A
    field that has an option in `parser` already (the same dest: a shared option from a
    parent parser, one definition across commands) is left to it.

    from_file=False: options default to the fields' defaults (the help shows them), a
    required field is a required option, a bool that defaults to False is a flag.
    from_file=True (`train`, where --config fills what the command line leaves out): absent
    options stay unset (argparse.SUPPRESS), none is required, a bool is --x/--no-x, and
    the help states the field's default."""
    have = {a.dest for a in parser._actions}
    fields = {n: f for n, f in config.model_fields.items() if n not in have}
    named = {_extra(f).get("group") for f in fields.values()} - {None}
    if named and groups is None:
        groups = {}
    if bad := sorted(g for g in named if g not in groups):
        raise ValueError(f"{config.__name__}: option group(s) {bad} not among "
                         f"{list(groups)}")
    sections = {title: parser.add_argument_group(title, about)
                for title, about in (groups or {}).items() if title in named}
    for name, field in fields.items():
        group = _extra(field).get("group")
        _add_field_option(sections[group] if group else parser, name, field,
                          from_file=from_file)


def _add_field_option(p, name: str, field, *, from_file: bool) -> None:
    extra = _extra(field)
    default = field.get_default(call_default_factory=True)
    kw: dict[str, Any] = {"dest": name,
                          "help": (field.description or "").replace("%", "%%")}
    if from_file:
        kw["default"] = argparse.SUPPRESS
        if field.default is not PydanticUndefined and field.default is not None:
            kw["help"] += f" (default: {field.default})"
    elif field.is_required():
        kw["required"] = True
    else:
        kw["default"] = default
    flags = extra.get("flags") or ["--" + name.replace("_", "-")]
    if extra.get("metavar"):
        kw["metavar"] = extra["metavar"]
    if _is_aux_ids(field):
        p.add_argument(*flags, nargs="+", action=_JoinedIds, **{"metavar": "IDS", **kw})
        return
    tp = _plain(field.annotation)
    if tp is bool:
        if from_file:
            p.add_argument(*flags, action=argparse.BooleanOptionalAction, **kw)
        elif default is False:
            p.add_argument(*flags, action="store_true", **kw)
        else:
            raise ValueError(f"{name}: a bool option that defaults to {default!r} is not "
                             f"generated (a --no-{name.replace('_', '-')} flag would be)")
        return
    if typing.get_origin(tp) is typing.Literal:
        kw["choices"] = list(typing.get_args(tp))
    elif typing.get_origin(tp) is list:
        kw.update(nargs="*", type=typing.get_args(tp)[0])
    elif tp is dict or typing.get_origin(tp) is dict:  # JSON text, read by the field's validator
        kw["type"] = str
    else:
        kw["type"] = tp
    p.add_argument(*flags, **kw)


def config_from_args(config: type[StrictConfig], args: argparse.Namespace, command: str):
    """The config of a command whose options `add_config_options` generated (shared
    options included: every field is read from the option of its name); errors name the
    command's options."""
    values = {name: getattr(args, name) for name in config.model_fields if hasattr(args, name)}
    return config.from_dict(values, f"eagle3lab {command} options")
