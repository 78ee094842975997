"""How a conversation's text was rendered into token ids: the chat template (its sha256 and
where it came from), the rendering settings (system prompt, generation prompt, template
kwargs such as `enable_thinking`) and the tokenizer's sha256.

Prevents the data side of train/serve drift: a drafter learns the target's answers as the
chat template rendered them. Served through another template (another system prompt,
thinking on instead of off, a newer template version) its acceptance drops and nothing
says why. Every stage that renders text records one `rendering_record` (conversations'
meta files, shard manifests, the drafter's `eagle3lab.json`); the checks compare it with
what serving will render. Data made elsewhere says `UNKNOWN`, never a match.

The record (a plain JSON object, `format` "eagle3lab-rendering"):

    {"format": "eagle3lab-rendering", "version": 1,
     "chat_template": {"sha256": HEX | None, "source": "tokenizer" | "file" | "server"
                       | "none", "path": str | None},
     "system_prompt": None | str,      # None: none given (the template's default applies)
     "add_generation_prompt": bool,
     "template_kwargs": {...},         # e.g. {"enable_thinking": False}; {} when none
     "tokenizer_sha256": HEX | None}

`unknown(why)` (`{"format": "eagle3lab-rendering", "version": 1, "unknown": True, "why": ...}`)
stands for a set or drafter that recorded none.

`Renderer` is the ONE way the stages turn a prompt into token ids (`prompts.chat_prompt_ids`,
self-prompt's user-turn prefix, `accept --render-as`), so what a stage records
(`Renderer.record()`) is what it rendered. Its settings (`RenderSettings`: a `--chat-template`
Jinja file, the system prompt, template kwargs) come from the stages' options or from a
settings file / preset (`load_render_settings`). System prompt: None renders no system
message (a template such as SmolLM2's then injects its default one); "" renders an empty
system message, which is not the same text. A template that does not render is one line
naming the file and the Jinja error.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator

from eagle3lab.config import PathStr, StrictConfig
from eagle3lab.errors import UserError
from eagle3lab.fsutil import read_json_object

FORMAT = "eagle3lab-rendering"
VERSION = 1
SOURCES = ("tokenizer", "file", "server", "none")


def unknown(why: str) -> dict[str, Any]:
    """The record of data or a drafter that says nothing about its rendering."""
    return {"format": FORMAT, "version": VERSION, "unknown": True, "why": why}


def is_unknown(record: dict[str, Any] | None) -> bool:
    return not isinstance(record, dict) or bool(record.get("unknown")) \
        or record.get("format") != FORMAT


def template_sha256(template: str | None) -> str | None:
    """sha256 of a chat template's text (UTF-8, exactly as given); None without one."""
    if template is None:
        return None
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


def tokenizer_template(tokenizer) -> str | None:
    """The template a tokenizer applies by default (a dict of named templates: 'default')."""
    t = getattr(tokenizer, "chat_template", None)
    if isinstance(t, dict):
        return t.get("default")
    return t or None


def tokenizer_sha256(tokenizer) -> str | None:
    """sha256 of the tokenizer's full serialization (a fast tokenizer's `to_str()`: vocab,
    merges, normalizer, pre-tokenizer, added tokens), else of its sorted vocabulary; the
    same for one tokenizer whether it came from tokenizer.json or a GGUF."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        text = backend.to_str()
    elif hasattr(tokenizer, "get_vocab"):
        text = json.dumps(sorted(tokenizer.get_vocab().items()))
    else:
        return None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def rendering_record(tokenizer, *, chat_template: str | None = None,
                     chat_template_path: str | None = None, source: str | None = None,
                     system_prompt: str | None = None, add_generation_prompt: bool = True,
                     template_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record of rendering with `tokenizer`: its own template, or `chat_template` (the
    text of a --chat-template file at `chat_template_path`, or a server's)."""
    if chat_template is None:
        text = tokenizer_template(tokenizer)
        src = source or ("tokenizer" if text is not None else "none")
    else:
        text = chat_template
        src = source or ("file" if chat_template_path else "server")
    if src not in SOURCES:
        raise ValueError(f"source {src!r} is not one of {SOURCES}")
    return {"format": FORMAT, "version": VERSION,
            "chat_template": {"sha256": template_sha256(text), "source": src,
                              "path": chat_template_path},
            "system_prompt": system_prompt,
            "add_generation_prompt": bool(add_generation_prompt),
            "template_kwargs": dict(template_kwargs or {}),
            "tokenizer_sha256": tokenizer_sha256(tokenizer)}


# --- rendering ---------------------------------------------------------------------------

#: apply_chat_template's own arguments: set by the renderer, never by template kwargs.
RESERVED_KWARGS = ("conversation", "messages", "tools", "documents", "chat_template",
                   "add_generation_prompt", "continue_final_message", "tokenize", "padding",
                   "truncation", "max_length", "return_tensors", "return_dict",
                   "return_assistant_tokens_mask", "tokenizer_kwargs")
#: `load_render_settings`' named settings (`accept --render-as PRESET`); "trained" (the
#: drafter's own record, `settings_from_record`) is resolved by the caller that has one.
PRESETS: dict[str, dict[str, Any]] = {
    "template": {},  # the tokenizer's template as is: no system message (its default applies)
    "empty-system": {"system_prompt": ""},  # an empty system message (no default one)
}
TRAINED = "trained"


def parse_template_kwargs(value: Any, where: str = "template_kwargs") -> dict[str, Any]:
    """Template kwargs from a JSON object text (the CLI's `--template-kwargs '{...}'`) or a
    mapping; anything else, or a key apply_chat_template sets itself, is one line."""
    if value is None:
        return {}
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: {value!r} is not valid JSON ({e.msg} at column "
                            f"{e.colno}); give an object such as "
                            f"'{{\"enable_thinking\": false}}'.") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise UserError(f"{where}: expected a JSON object of template variables such as "
                        f"{{\"enable_thinking\": false}}, got {value!r}.")
    if bad := sorted(set(value) & set(RESERVED_KWARGS)):
        raise UserError(f"{where}: {', '.join(bad)} {'is' if len(bad) == 1 else 'are'} set by "
                        f"the renderer itself, not a template variable; remove "
                        f"{'it' if len(bad) == 1 else 'them'}.")
    return dict(value)


def read_chat_template(path: str | os.PathLike) -> str:
    """The text of a `--chat-template` file (a Jinja template, as in tokenizer_config.json's
    `chat_template`); a missing, unreadable or non-UTF-8 file is one line."""
    p = Path(path).expanduser()
    try:
        text = p.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"Chat template file {str(path)!r} does not exist; give a Jinja "
                        f"template file (--chat-template FILE) or leave the option out to "
                        f"use the tokenizer's.") from None
    except IsADirectoryError:
        raise UserError(f"Chat template {str(path)!r} is a directory; give a Jinja "
                        f"template file.") from None
    except OSError as e:
        raise UserError(f"Cannot read chat template file {path}: {e.strerror or e}.") from None
    except UnicodeDecodeError as e:
        raise UserError(f"Chat template file {path} is not UTF-8 text (byte offset "
                        f"{e.start}); re-save it as UTF-8.") from None
    if not text.strip():
        raise UserError(f"Chat template file {path} is empty.")
    return text


def template_error(source: str, e: Exception) -> UserError:
    """The one line for a template that does not compile or render."""
    msg = " ".join(str(e).split()) or type(e).__name__
    return UserError(f"{source} does not render ({type(e).__name__}: {msg}). Fix the "
                     f"template (Jinja, as tokenizer_config.json's chat_template) or give "
                     f"another one.")


def check_chat_template(path: str | os.PathLike) -> str:
    """`read_chat_template`, and the template compiled as transformers compiles it (its
    Jinja environment and extensions): a syntax error is one line before any model is
    loaded; what only fails when rendered fails at the `Renderer`'s probe."""
    import jinja2

    text = read_chat_template(path)
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # another transformers layout: the Renderer's probe still checks
        return text
    try:
        _compile_jinja_template(text)
    except jinja2.TemplateError as e:
        raise template_error(f"chat template file {path}", e) from None
    return text


class RenderSettings(StrictConfig):
    """How prompts are rendered: a settings file's fields (`accept --render-as FILE`), and
    the stages' rendering options."""

    WHERE: ClassVar[str] = "render settings"

    chat_template: PathStr | None = Field(None, description="a Jinja chat template file "
                                          "(None: the tokenizer's own template)")
    system_prompt: str | None = Field(None, description="system message (None: none sent, "
                                      "the template's default applies; \"\": an empty one)")
    template_kwargs: dict[str, Any] = Field(default_factory=dict, description="variables "
                                            "passed to the template, e.g. "
                                            "{\"enable_thinking\": false}")
    add_generation_prompt: bool = True

    @field_validator("template_kwargs", mode="before")
    @classmethod
    def _kwargs(cls, v: Any) -> Any:
        return parse_template_kwargs(v)

    @field_validator("chat_template")
    @classmethod
    def _template(cls, v: Any) -> Any:
        if v is not None:
            check_chat_template(v)
        return v


def record_rendering(record: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """The rendering in a drafter's provenance record (`DraftConfig.record`: its config.json's
    `eagle3lab` block over its eagle3lab.json); unknown when it holds none (trained
    elsewhere, or before eagle3lab recorded it)."""
    found = (record or {}).get("rendering")
    if isinstance(found, dict):
        return found
    return unknown(f"the drafter in {where} records no rendering (no eagle3lab.json "
                   f"'rendering')")


def settings_from_record(record: dict[str, Any] | None, where: str = "the drafter"
                         ) -> RenderSettings:
    """The settings that render as `record` says (`accept --render-as trained`): its system
    prompt, kwargs and template (the tokenizer's, or its file when that file is still here
    with the recorded sha256); what cannot be reproduced is one line."""
    if is_unknown(record):
        why = record.get("why") if isinstance(record, dict) else None
        raise UserError(f"--render-as {TRAINED}: {where} records no rendering"
                        + (f" ({why})" if why else "") + "; give a preset ("
                        + ", ".join(PRESETS) + ") or a settings or template file instead.")
    t = record.get("chat_template") or {}
    path = None
    if t.get("source") == "file":
        path = t.get("path")
        if not path or not Path(path).expanduser().is_file() or \
                template_sha256(read_chat_template(path)) != t.get("sha256"):
            raise UserError(f"--render-as {TRAINED}: {where} was rendered with the chat "
                            f"template file {path} (sha256 {str(t.get('sha256'))[:12]}...), "
                            f"which is not here or has changed; give that template with "
                            f"--render-as FILE.")
    elif t.get("source") == "server":
        raise UserError(f"--render-as {TRAINED}: {where} was rendered with a server's chat "
                        f"template, which is not stored; give it with --render-as FILE.")
    return RenderSettings(chat_template=path, system_prompt=record.get("system_prompt"),
                          template_kwargs=record.get("template_kwargs") or {},
                          add_generation_prompt=record.get("add_generation_prompt", True))


def check_reproduces(renderer: "Renderer", record: dict[str, Any],
                     where: str = "the drafter") -> None:
    """Refuse a renderer that does not render as `record` (another tokenizer template or
    tokenizer than the one recorded: `--render-as trained` on a changed target)."""
    if not same_rendering(renderer.record(), record):
        raise UserError(f"--render-as {TRAINED}: this target renders with "
                        f"{describe(renderer.record())}, but {where} was trained on "
                        f"{describe(record)} (another template or tokenizer); give the "
                        f"template it was trained with as --render-as FILE.")


def load_render_settings(spec: str | os.PathLike | dict[str, Any] | RenderSettings | None
                         ) -> RenderSettings:
    """`accept --render-as`'s value: a preset name (`PRESETS`), a JSON settings file
    ({"chat_template": PATH | null, "system_prompt": ..., "template_kwargs": {...}}; a
    relative template path is relative to the file), a Jinja template file (any other
    file: that template, no system message), a mapping, or None (the tokenizer's template
    as is)."""
    if spec is None:
        return RenderSettings()
    if isinstance(spec, RenderSettings):
        return spec
    if isinstance(spec, dict):
        if spec.get("format") == FORMAT:  # a rendering record: render as it says
            return settings_from_record(spec)
        return RenderSettings.from_dict(spec)
    name = str(spec)
    if name == TRAINED:
        raise UserError(f"--render-as {TRAINED} renders as the drafter's record says; pass "
                        f"the record itself (`formats.reader.drafter_rendering(DRAFTER)`) where no drafter "
                        f"is at hand.")
    if name in PRESETS:
        return RenderSettings.from_dict(PRESETS[name], f"render preset {name!r}")
    path = Path(name).expanduser()
    if not path.is_file():
        raise UserError(f"--render-as {name!r} is neither a preset ({', '.join(PRESETS)}) nor "
                        f"a file: give a preset, a JSON settings file ({{\"chat_template\": "
                        f"PATH, \"system_prompt\": ..., \"template_kwargs\": {{...}}}}) or "
                        f"a Jinja chat template file.")
    if path.suffix.lower() != ".json":
        return RenderSettings(chat_template=str(path))
    data = read_json_object(path, what="render settings file",
                            fix='It holds {"chat_template": PATH or null, "system_prompt": '
                                'TEXT or null, "template_kwargs": {...}}.')
    t = data.get("chat_template")
    if isinstance(t, str) and not Path(t).expanduser().is_absolute():
        data = {**data, "chat_template": str(path.parent / t)}  # beside the settings file
    return RenderSettings.from_dict(data, str(path))


class Renderer:
    """A tokenizer plus the rendering settings: the one way prompts become token ids, and
    the record of exactly that (`record()`). chat_template: a Jinja file's path (None: the
    tokenizer's own); a file that does not render a probe conversation fails here, as one
    line naming the file and the Jinja error."""

    def __init__(self, tokenizer, *, chat_template: str | os.PathLike | None = None,
                 system_prompt: str | None = None,
                 template_kwargs: dict[str, Any] | str | None = None,
                 add_generation_prompt: bool = True):
        self.tokenizer = tokenizer
        self.path = str(chat_template) if chat_template is not None else None
        self.template = (check_chat_template(chat_template) if chat_template is not None
                         else tokenizer_template(tokenizer))
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise UserError(f"system_prompt must be text or None, got {system_prompt!r}.")
        self.system_prompt = system_prompt
        self.template_kwargs = parse_template_kwargs(template_kwargs)
        self.add_generation_prompt = bool(add_generation_prompt)
        if self.path is not None:
            self.render_text(self.messages("Hello."))  # a broken file fails now, once

    @classmethod
    def from_settings(cls, tokenizer, settings: Any = None) -> "Renderer":
        """From `RenderSettings`, a mapping of its fields, a preset, a settings file, or a
        rendering record (rendered as it says, refused where this tokenizer cannot: another
        template or tokenizer than recorded)."""
        s = load_render_settings(settings)
        r = cls(tokenizer, chat_template=s.chat_template, system_prompt=s.system_prompt,
                template_kwargs=s.template_kwargs, add_generation_prompt=s.add_generation_prompt)
        if isinstance(settings, dict) and settings.get("format") == FORMAT:
            check_reproduces(r, settings)
        return r

    @property
    def has_template(self) -> bool:
        return self.template is not None

    def describe_source(self) -> str:
        return (f"chat template file {self.path}" if self.path is not None
                else "the tokenizer's chat template")

    def messages(self, text: str) -> list[dict[str, str]]:
        """A single user turn, after the system message when one is set ("" included)."""
        system = ([{"role": "system", "content": self.system_prompt}]
                  if self.system_prompt is not None else [])
        return system + [{"role": "user", "content": text}]

    def _apply(self, messages, *, add_generation_prompt: bool, tokenize: bool):
        import jinja2

        try:
            return self.tokenizer.apply_chat_template(
                messages, chat_template=self.template,
                add_generation_prompt=add_generation_prompt, tokenize=tokenize,
                **self.template_kwargs)
        except (jinja2.TemplateError, TypeError) as e:
            raise template_error(self.describe_source(), e) from None

    def render_text(self, messages: list[dict[str, str]], *,
                    add_generation_prompt: bool | None = None) -> str:
        """The rendered text of `messages` (add_generation_prompt: the renderer's by
        default)."""
        if not self.has_template:
            raise UserError("This tokenizer has no chat template; give one with "
                            "--chat-template FILE.")
        agp = self.add_generation_prompt if add_generation_prompt is None \
            else add_generation_prompt
        return self._apply(messages, add_generation_prompt=agp, tokenize=False)

    def prompt_ids(self, text: str) -> list[int]:
        """Token ids of a single-turn chat up to the start of the assistant's answer (a
        tokenizer without a template: the plain text and a newline)."""
        if not self.has_template:
            return [int(i) for i in self.tokenizer(text + "\n").input_ids]
        ids = self._apply(self.messages(text), add_generation_prompt=self.add_generation_prompt,
                          tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def record(self, *, add_generation_prompt: bool | None = None) -> dict[str, Any]:
        """This renderer's `rendering_record`."""
        agp = self.add_generation_prompt if add_generation_prompt is None \
            else add_generation_prompt
        if self.path is not None:
            return rendering_record(self.tokenizer, chat_template=self.template,
                                    chat_template_path=self.path, source="file",
                                    system_prompt=self.system_prompt,
                                    add_generation_prompt=agp,
                                    template_kwargs=self.template_kwargs)
        return rendering_record(self.tokenizer, system_prompt=self.system_prompt,
                                add_generation_prompt=agp, template_kwargs=self.template_kwargs)


def render_prompt_ids(tokenizer, text: str, settings: Any = None) -> list[int]:
    """One prompt's ids rendered with `settings` (`Renderer.from_settings`)."""
    return Renderer.from_settings(tokenizer, settings).prompt_ids(text)


def same_rendering(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two records say the same rendering (template sha256, system prompt,
    generation prompt, template kwargs, tokenizer); an unknown one never matches."""
    if is_unknown(a) or is_unknown(b):
        return False
    keys = ("system_prompt", "add_generation_prompt", "template_kwargs", "tokenizer_sha256")
    return (a["chat_template"]["sha256"] == b["chat_template"]["sha256"]
            and all(a.get(k) == b.get(k) for k in keys))


def describe(record: dict[str, Any] | None) -> str:
    """One line: the template (sha256 prefix and source), system prompt, kwargs."""
    if is_unknown(record):
        why = record.get("why") if isinstance(record, dict) else None
        return "unknown" + (f" ({why})" if why else "")
    t = record["chat_template"]
    sha = (t.get("sha256") or "none")[:12]
    src = t.get("source") + (f" {t['path']}" if t.get("path") else "")
    sp = record.get("system_prompt")
    system = "template default" if sp is None else ("empty" if sp == "" else repr(sp))
    return (f"template {sha} ({src}), system prompt: {system}, template kwargs "
            f"{json.dumps(record.get('template_kwargs') or {}, sort_keys=True)}")
