"""The chat template a drafter was trained on, against the one serving will render
(`chat-template`).

Prevents the data side of train/serve drift: a drafter learns the target's answers as the
chat template rendered them (system prompt or none, thinking on or off, template version).
Served through another rendering its acceptance drops and nothing says why. The drafter's
record (`eagle3lab.json`'s top-level `rendering`, eagle3lab/data/rendering.py) is compared
with what the server will render for a chat request:
- the template: the target's tokenizer's (what both engines use when no `--chat-template`
  is given), or `--chat-template`, read as each engine reads it (below);
- the default template kwargs: `--default-chat-template-kwargs` (JSON; both engines merge
  a request's `chat_template_kwargs` over it): a kwarg that differs is a finding only where
  the serving template renders differently with it (probe conversations rendered both ways);
- `--reasoning-parser`: a server set up for thinking output, serving a drafter trained with
  `enable_thinking` false while nothing on the launch turns thinking off;
- the tokenizer (sha256 of its serialization).
A drafter without a record is "cannot be checked" (an info), never a match. The system
prompt is the client's choice, so the trained setting is said in the text.

How the engines read the flags (sources read):
- SGLang 0.5.23 (installed here): sglang/srt/arg_groups/fields/serving.py `chat_template`
  ("the built-in chat template name or the path of the chat template file"),
  `hf_chat_template_name`, `reasoning_parser`, `default_chat_template_kwargs` (json.loads;
  serving_hook.py refuses a non-object); sglang/srt/parser/template_manager.py
  `_load_explicit_chat_template`: a registered name first, then a path that must exist
  (else RuntimeError at start), a `.jinja` file read as `"".join(readlines()).strip("\\n")`
  with `"\\\\n"` replaced by a newline, any other file parsed as a JSON conversation
  template (not Jinja); without the flag `_resolve_hf_chat_template` uses the tokenizer's
  (of a dict of named templates, `--hf-chat-template-name` or the first). Not modelled:
  `guess_chat_template_from_model_path` (conversation.py), which picks a registered
  template for some model paths (mostly multimodal ones).
- vLLM (cannot be installed here; read in vllm-project/vllm's source as stored by the code
  index, not the 0.25.1 wheel): vllm/entrypoints/openai/cli_args.py `BaseFrontendArgs`
  `chat_template` ("the file path to the chat template, or the template in single-line
  form"), `default_chat_template_kwargs` (json.loads); vllm/config/structured_outputs.py
  `reasoning_parser` (`--reasoning-parser`); vllm/entrypoints/chat_utils.py
  `validate_chat_template` / `_load_chat_template`: an existing file read verbatim, else a
  value with `{`, `}` or a newline is the template itself, else a name of vLLM's built-in
  templates (vllm/transformers_utils/chat_templates), else refused at start.
- The reference server (`eagle3lab serve`) has no chat endpoint: its clients render with
  the target's template (measure/workload.py), which is what is compared.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from eagle3lab.config import TARGET_PRESETS, preset_dir
from eagle3lab.data import rendering as rec
from eagle3lab.engines.serve_args import launch_config, serve_parser
from eagle3lab.errors import UserError
from eagle3lab.formats.findings import Finding, error, info, warning
from eagle3lab.formats.opened import OpenedDrafter
from eagle3lab.formats.reader import drafter_rendering
from eagle3lab.preflight.command import LaunchSpec, detect_engine, json_object_flag

CODE = "chat-template"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
#: the conversations rendered to decide whether two renderings differ in effect
PROBES: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "user", "content": "What is the capital of France?"},),
    ({"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Name a prime number."}),
    ({"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "Tell me a joke."}),
)
_JINJA_CHARS = "{}\n"  # vLLM: a --chat-template value with one of these is the template


@dataclasses.dataclass
class ServedRendering:
    """What a server will render a chat request with (as far as the launch says)."""

    engine: str  # sglang | vllm | reference | target (inspect --target: no launch)
    source: str  # tokenizer | file | inline | named | none
    where: str  # in words: "the target's tokenizer (DIR)", "--chat-template FILE", ...
    template: str | None = None  # the text the engine renders with, when known
    sha256: str | None = None
    raw_template: str | None = None  # the file's text as written (SGLang changes it)
    path: str | None = None  # the --chat-template file
    name: str | None = None  # a named template: its sha cannot be computed here
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    reasoning_parser: str | None = None
    tokenizer_sha256: str | None = None
    problems: list[str] = dataclasses.field(default_factory=list)  # each one line: error
    unchecked: str | None = None  # why the template's text is not known here
    tokenizer: Any = None  # loaded only when needed (a record, or a template file)

    def describe(self) -> str:
        sha = (self.sha256[:12] if self.sha256 else "none" if self.source == "none"
               else "?" if self.source == "named" else "not read")
        parser = f", reasoning parser {self.reasoning_parser}" if self.reasoning_parser \
            else ""
        return (f"template {sha} ({self.where}), template kwargs "
                f"{json.dumps(self.kwargs, sort_keys=True)}{parser}")


# --- the launch's flags --------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(f"The launch command does not parse: {message}.")


def _flag_parser(engine: str) -> _Parser:
    p = _Parser(add_help=False, prog=engine)
    p.add_argument("--chat-template")
    p.add_argument("--default-chat-template-kwargs")
    p.add_argument("--reasoning-parser")
    if engine == "sglang":
        p.add_argument("--hf-chat-template-name")
    return p


def engine_args(spec: LaunchSpec) -> list[str]:
    """The engine's own arguments of the launch (`eagle3lab serve --engine E ... -- ARGS`:
    those of the engine command it starts, engines/serve_args.py)."""
    kind, args = detect_engine(spec.argv)
    if kind == "reference" and spec.engine != "reference":
        args = detect_engine(launch_config(serve_parser().parse_args(args)).to_argv())[1]
    return args


def launch_flags(spec: LaunchSpec) -> dict[str, Any]:
    """The rendering flags of a launch: chat_template, default_chat_template_kwargs (the
    text as given), reasoning_parser, hf_chat_template_name (SGLang); None where absent."""
    out = {"chat_template": None, "default_chat_template_kwargs": None,
           "reasoning_parser": None, "hf_chat_template_name": None}
    if spec.engine not in ("sglang", "vllm"):
        return out
    args = engine_args(spec)
    if spec.engine == "vllm":  # FlexibleArgumentParser: --flag_name == --flag-name
        args = [a.split("=", 1)[0].replace("_", "-") + ("=" + a.split("=", 1)[1]
                                                         if "=" in a else "")
                if a.startswith("--") else a for a in args]
    ns, _ = _flag_parser(spec.engine).parse_known_args(args)
    out.update({k: v for k, v in vars(ns).items() if v is not None})
    return out


def unread_args(spec: LaunchSpec) -> list[str]:
    """The launch's arguments preflight's mirror did not read (`spec.unknown`), without the
    rendering flags read here."""
    if not spec.unknown or spec.engine not in ("sglang", "vllm"):
        return list(spec.unknown)
    return _flag_parser(spec.engine).parse_known_args(spec.unknown)[1]


# --- the serving side ----------------------------------------------------------------------

def has_tokenizer(directory: Path | None) -> bool:
    return directory is not None and any((Path(directory) / f).is_file()
                                         for f in TOKENIZER_FILES)


_TOKENIZERS: dict[tuple, Any] = {}


def load_tokenizer(directory: Path):
    """The target's tokenizer as the engines load it (AutoTokenizer), kept per directory
    and file stamps (preflight and inspect of one target load it once)."""
    d = Path(directory).resolve()
    key = (str(d),) + tuple((f, (d / f).stat().st_mtime_ns) for f in
                            TOKENIZER_FILES + ("chat_template.jinja",) if (d / f).is_file())
    if key not in _TOKENIZERS:
        from transformers import AutoTokenizer

        try:
            _TOKENIZERS[key] = AutoTokenizer.from_pretrained(str(d))
        except Exception as e:  # a broken tokenizer is an answer, not a traceback
            raise UserError(f"The target's tokenizer in {d} does not load "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else '?'})"
                            f"; the chat template cannot be checked.") from None
    return _TOKENIZERS[key]


def _read_text(path: Path) -> str:
    """A template file as the engines read it: text mode (universal newlines), UTF-8."""
    return path.read_text(encoding="utf-8")


def _syntax_problem(text: str, where: str) -> str | None:
    """One line when `text` is not a Jinja template that compiles (without a tokenizer to
    render it: the tags transformers adds, `{% generation %}`, are accepted)."""
    import jinja2
    import jinja2.ext

    class _Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    try:
        jinja2.Environment(extensions=["jinja2.ext.loopcontrols", _Generation]).parse(text)
    except jinja2.TemplateSyntaxError as e:
        return (f"{where} is not a Jinja template that compiles (line {e.lineno}: "
                f"{e.message}): every chat request would fail. Fix the file, or leave "
                f"--chat-template out to serve the tokenizer's template.")
    return None


def _template_flag(engine: str, value: str, where: str) -> ServedRendering:
    """`--chat-template VALUE` as `engine` reads it."""
    path = Path(value).expanduser()
    served = ServedRendering(engine=engine, source="file", where=where, path=value)
    if path.is_file():
        try:
            raw = path.read_bytes().decode("utf-8")
            text = _read_text(path)
        except (OSError, UnicodeDecodeError) as e:
            served.problems.append(f"{where}: the file cannot be read as UTF-8 text "
                                   f"({type(e).__name__}); the engine fails to load it.")
            return served
        if engine == "sglang":
            if not value.endswith(".jinja"):
                served.problems.append(
                    f"{where}: SGLang 0.5.23 reads a --chat-template file as Jinja only when "
                    f"its name ends in .jinja; it parses {path.name} as a JSON conversation "
                    f"template (parser/template_manager.py _load_json_chat_template), which "
                    f"fails or renders another template. Rename it to .jinja.")
                return served
            text = text.strip("\n").replace("\\n", "\n")  # _load_jinja_template
        served.template, served.sha256 = text, rec.template_sha256(text)
        served.raw_template = raw
        return served
    if path.exists():
        served.problems.append(f"{where}: {path} is not a file; the engine refuses to start.")
        return served
    if engine == "vllm" and any(c in value for c in _JINJA_CHARS):
        served.source, served.where = "inline", "--chat-template given inline"
        served.template, served.sha256 = value, rec.template_sha256(value)
        return served
    if "/" in value or value.endswith((".jinja", ".json")):
        served.problems.append(
            f"{where}: {value} does not exist; "
            + ("SGLang refuses it at start (RuntimeError: not a built-in template name or a "
               "valid chat template file path)" if engine == "sglang" else
               "vLLM refuses it at start (the chat template path does not exist)")
            + ". Fix the path, or leave --chat-template out to serve the tokenizer's.")
        return served
    served.source, served.name = "named", value
    served.where = f"{'SGLang' if engine == 'sglang' else 'vLLM'}'s named template {value}"
    return served


def _kwargs_flag(text: str | None, served: ServedRendering) -> None:
    try:
        value = json_object_flag("--default-chat-template-kwargs", text,
                                 '{"enable_thinking": false}',
                                 ": the engine refuses the command")
    except UserError as e:
        served.problems.append(str(e))
        return
    if text is not None:
        served.kwargs = value


def served_rendering(*, target_dir: Path | None, spec: LaunchSpec | None = None,
                     load: bool = True) -> ServedRendering:
    """What the launch `spec` (None: any engine's default, `inspect --target`) renders
    with. `load`: load the target's tokenizer (for the template's and tokenizer's sha256
    and the probe renderings; False when no record needs them)."""
    engine = spec.engine if spec is not None else "target"
    flags = launch_flags(spec) if spec is not None else {}
    if flags.get("chat_template"):
        served = _template_flag(engine, flags["chat_template"],
                                f"--chat-template {flags['chat_template']}")
    else:
        served = ServedRendering(engine=engine, source="tokenizer",
                                 where=f"the target's tokenizer ({target_dir})")
    served.engine = engine
    served.reasoning_parser = flags.get("reasoning_parser")
    _kwargs_flag(flags.get("default_chat_template_kwargs"), served)
    if not has_tokenizer(target_dir):
        served.unchecked = ("the target has no tokenizer files here" if target_dir else
                            "the target could not be read")
    elif load:
        try:
            tok = served.tokenizer = load_tokenizer(target_dir)
        except UserError as e:
            served.unchecked = str(e)
            return served
        served.tokenizer_sha256 = rec.tokenizer_sha256(tok)
        if served.source == "tokenizer":
            text = _tokenizer_template(tok, engine, flags.get("hf_chat_template_name"))
            served.template, served.sha256 = text, rec.template_sha256(text)
            served.source = "tokenizer" if text is not None else "none"
    return served


def _tokenizer_template(tok, engine: str, name: str | None) -> str | None:
    t = getattr(tok, "chat_template", None)
    if isinstance(t, dict) and engine == "sglang":  # _select_named_template
        return t.get(name) if name else next(iter(t.values()), None)
    return rec.tokenizer_template(tok)


# --- the comparison ------------------------------------------------------------------------

def _render(tok, template: str, conv, kwargs: dict[str, Any]) -> str:
    return tok.apply_chat_template(list(conv), chat_template=template, tokenize=False,
                                   add_generation_prompt=True, **kwargs)


def renders_alike(tok, a: tuple[str, dict], b: tuple[str, dict]) -> bool | None:
    """Whether (template, kwargs) `a` and `b` render every probe conversation to the same
    text; None when either does not render (a template error)."""
    import jinja2

    try:
        return all(_render(tok, a[0], c, a[1]) == _render(tok, b[0], c, b[1]) for c in PROBES)
    except (jinja2.TemplateError, TypeError, ValueError):
        return None


def render_problem(tok, template: str, kwargs: dict[str, Any], where: str) -> str | None:
    """One line when `template` does not render the probe conversations."""
    import jinja2

    try:
        for c in PROBES:
            _render(tok, template, c, kwargs)
    except (jinja2.TemplateError, TypeError, ValueError) as e:
        msg = " ".join(str(e).split()) or type(e).__name__
        return (f"{where} does not render a chat ({type(e).__name__}: {msg}): every chat "
                f"request would fail. Fix the template, or leave --chat-template out to "
                f"serve the tokenizer's.")
    return None


def system_prompt_text(record: dict[str, Any]) -> str:
    """The trained system-prompt setting and what clients must send for it (a launch cannot
    say what they send)."""
    sp = record.get("system_prompt")
    if sp is None:
        return ("Trained with the template's default system prompt (no system message "
                "sent): serve requests without a system message, or regenerate with the "
                "one clients send (eagle3lab regenerate --system-prompt TEXT).")
    if sp == "":
        return ("Trained with an empty system message: clients must send "
                "{\"role\": \"system\", \"content\": \"\"}, or regenerate with what they "
                "send.")
    shown = sp if len(sp) <= 80 else sp[:77] + "..."
    return (f"Trained with the system prompt {shown!r}: clients must send exactly that "
            f"system message, or regenerate with what they send (eagle3lab regenerate "
            f"--system-prompt TEXT).")


def compare(record: dict[str, Any] | None, served: ServedRendering) -> list[Finding]:
    """`chat-template` findings: `record` (the drafter's) against `served`."""
    tok = served.tokenizer
    problems = list(served.problems)
    if not problems and served.source in ("file", "inline"):  # the launch's own template
        problem = (render_problem(tok, served.template, served.kwargs, served.where)
                   if tok is not None else _syntax_problem(served.template, served.where))
        problems += [problem] if problem else []
    if problems:  # the launch's own template is unusable: that, and nothing to compare
        return [error(CODE, p, found=served.where) for p in problems]
    if record is None or rec.is_unknown(record):
        why = (record.get("why") if isinstance(record, dict) else None) or \
            "the drafter records no rendering"
        return [info(CODE, f"The chat template cannot be checked ({why}: made before "
                     f"eagle3lab recorded it, or by another trainer), so whether serving renders prompts as its data "
                     f"was rendered is unknown, not a match. Serving renders with "
                     f"{served.describe()}.",
                     found=served.describe())]
    t_sha = (record.get("chat_template") or {}).get("sha256")
    diffs: list[str] = []
    unchecked: list[str] = []
    notes: list[str] = []

    # the template
    if served.source == "named":
        unchecked.append(f"cannot be checked: named template {served.name} (its text is the "
                         f"engine's, not here)")
    elif served.source == "tokenizer" and served.template is None:
        unchecked.append(f"cannot be checked: {served.unchecked or 'no tokenizer'}, so the "
                         f"target's template is unknown")
    elif t_sha != served.sha256:
        raw_sha = rec.template_sha256(served.raw_template)
        same_file = t_sha is not None and t_sha == raw_sha
        alike = same_file and tok is not None and renders_alike(
            tok, (served.template, served.kwargs), (served.raw_template, served.kwargs))
        if alike:
            notes.append("SGLang strips the template file's edge newlines and unescapes "
                         "'\\n' when loading it; it renders the probe chats the same")
        else:
            diffs.append(f"template sha256 {_short(t_sha)} trained vs {_short(served.sha256)} "
                         f"served" + (" (the same file: SGLang strips its edge newlines and "
                                      "unescapes '\\n' when loading it, which changes the "
                                      "rendering)" if same_file else ""))

    # the template kwargs (the server's defaults; a request may override them)
    trained_kw = record.get("template_kwargs") or {}
    changed = sorted(k for k in set(trained_kw) | set(served.kwargs)
                     if trained_kw.get(k, _ABSENT) != served.kwargs.get(k, _ABSENT))
    if changed:
        alike = None
        if tok is not None and served.template is not None:
            alike = renders_alike(tok, (served.template, trained_kw),
                                  (served.template, served.kwargs))
        shown = ", ".join(f"{k}: {_kw(trained_kw, k)} trained vs {_kw(served.kwargs, k)} "
                          f"served" for k in changed)
        if alike:
            notes.append(f"template kwargs differ ({shown}) but the serving template renders "
                         f"the probe chats the same with both")
        else:
            diffs.append(f"template kwargs {shown}" + (
                "" if alike is False else " (not rendered to see whether the template reads "
                "them: no template text or tokenizer here)"))

    # thinking: a reasoning parser expects thinking output
    if served.reasoning_parser and trained_kw.get("enable_thinking") is False:
        if served.kwargs.get("enable_thinking") is False:
            notes.append(f"--reasoning-parser {served.reasoning_parser} is on; the launch's "
                         f"default kwargs keep thinking off as trained, but a request with "
                         f"chat_template_kwargs {{\"enable_thinking\": true}} renders "
                         f"otherwise")
        else:
            diffs.append(f"--reasoning-parser {served.reasoning_parser}: the server is set up "
                         f"for thinking output, but the drafter was trained with "
                         f"enable_thinking false and nothing on the launch turns thinking off")

    # the tokenizer
    t_tok = record.get("tokenizer_sha256")
    if t_tok and served.tokenizer_sha256 and t_tok != served.tokenizer_sha256:
        diffs.append(f"tokenizer sha256 {_short(t_tok)} trained vs "
                     f"{_short(served.tokenizer_sha256)} served (the same text becomes other "
                     f"token ids)")
    if record.get("add_generation_prompt") is False:
        notes.append("the record says add_generation_prompt false; the chat APIs of SGLang "
                      "and vLLM add the generation prompt by default")

    trained = rec.describe(record)
    system = system_prompt_text(record)
    tail = f" Note: {'; '.join(notes)}." if notes else ""
    if diffs:
        return [warning(CODE, f"The drafter was trained on another rendering than this launch "
                        f"serves: {'; '.join(diffs)}. Trained: {trained}. Serving "
                        f"({served.engine}): {served.describe()}. Acceptance drops where the "
                        f"prompts differ. Fix: regenerate the data with the serving template "
                        f"and retrain ({_regen_fix(served)}), or serve with the one trained "
                        f"on ({_serve_fix(record, served)}). {system}{tail}",
                        expected=trained, found=served.describe())]
    if unchecked:
        return [info(CODE, f"The chat template {'; '.join(unchecked)}; nothing else differs. "
                     f"Trained: {trained}. Serving ({served.engine}): {served.describe()}. "
                     f"{system}{tail}", expected=trained, found=served.describe())]
    return [info(CODE, f"The chat template matches what training rendered ({trained}). "
                 f"{system}{tail}", expected=trained, found=served.describe())]


_ABSENT = object()


def _kw(kwargs: dict[str, Any], key: str) -> str:
    return json.dumps(kwargs[key]) if key in kwargs else "unset (the template's default)"


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "none"


def _regen_fix(served: ServedRendering) -> str:
    parts = ["eagle3lab regenerate"]
    if served.source == "file":
        parts.append(f"--chat-template {served.path}")
    elif served.source == "inline":
        parts.append("--chat-template FILE (the inline template saved to a file)")
    elif served.source == "named":
        parts.append(f"--chat-template FILE (the text of {served.name})")
    if served.kwargs:
        parts.append(f"--template-kwargs '{json.dumps(served.kwargs, sort_keys=True)}'")
    return " ".join(parts + ["..."])


def _serve_fix(record: dict[str, Any], served: ServedRendering) -> str:
    t = record.get("chat_template") or {}
    parts = []
    if t.get("sha256") != served.sha256:
        if t.get("source") == "file" and t.get("path"):
            parts.append(f"--chat-template {t['path']}")
        elif t.get("source") == "tokenizer":
            parts.append("no --chat-template (the target's own template)")
        else:
            parts.append(f"--chat-template PATH (the template whose sha256 is "
                         f"{_short(t.get('sha256'))})")
    kw = record.get("template_kwargs") or {}
    if kw != served.kwargs:
        parts.append(f"--default-chat-template-kwargs '{json.dumps(kw, sort_keys=True)}'")
    if served.reasoning_parser and kw.get("enable_thinking") is False \
            and "--default-chat-template-kwargs" not in " ".join(parts):
        parts.append("--default-chat-template-kwargs '{\"enable_thinking\": false}'")
    return ", ".join(parts) or "the launch's rendering flags as trained"


# --- the entry point -----------------------------------------------------------------------

def rendering_findings(drafter, *, target_dir: str | Path | None,
                       spec: LaunchSpec | None = None) -> list[Finding]:
    """The `chat-template` findings of serving `drafter` (a directory, or an OpenedDrafter)
    on the target in `target_dir` (its tokenizer files), launched as `spec` (None: the
    engines' default rendering, `inspect --target`). The target's tokenizer is loaded only
    when the drafter records a rendering."""
    record = (rec.record_rendering(drafter.parsed_config.record, str(drafter.path))
              if isinstance(drafter, OpenedDrafter) else drafter_rendering(drafter))
    tdir = Path(target_dir) if target_dir is not None else None
    given = spec is not None and bool(launch_flags(spec).get("chat_template"))
    served = served_rendering(target_dir=tdir, spec=spec,
                              load=given or not rec.is_unknown(record))
    return compare(record, served)


def resolve_target_dir(target: str | None) -> Path | None:
    """`inspect --target`'s value as a directory: a directory, or a prepared preset."""
    if not target:
        return None
    p = Path(target).expanduser()
    if p.is_dir():
        return p
    if target in TARGET_PRESETS and preset_dir(target).is_dir():
        return preset_dir(target)
    return None
