"""`preflight(command)`: the whole launch judged before a GPU is spent -> `PreflightReport`.

Prevents starting a server that cannot work, and saying "fine" about what was not checked:
the command is parsed as the engine reads it (command.py; SGLang's own parser runs beside
the checks where sglang imports), the target and drafter are resolved (local directory,
prepared preset, or a hub id only where a cached config exists; otherwise `unresolved`
says so), the doctor (eagle3lab.formats.doctor) runs for that engine and version, the
capture tables answer for the target's class (capture.py), and the launch checks
(checks.py) and the chat template the drafter's data was rendered with against the one this
launch renders (rendering.py, `chat-template`) are added. Exit codes of the CLI: 0 no error, 1 errors, 2 not judged.

Not judged: a launch whose target, or (speculative) drafter, cannot be resolved, i.e. a hub
id without a cached config.json (preflight never downloads) or a remote URL: the checks
that need it did not run, so the report says NOT JUDGED (`PreflightReport.judged` is False,
`unresolved` names what and why) and the CLI exits 2, never "OK". `ok` keeps its meaning,
"no error finding": the launcher (eagle3lab/serving/launch.py `start`) refuses on `not ok`,
and an unresolved hub id is not an error there, since the engine downloads it (a hub-id
target cached on the launching machine is resolved and judged in full). A name that looks
local (it starts with `/`, `.` or `~`, or has more than one `/`) but is not a directory
with a config.json IS judged: the engine takes it for a hub id, which it is not, and fails
to start (`model-path` error, exit 1, the launcher refuses).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from eagle3lab import __version__
from eagle3lab.config import TARGET_PRESETS, preset_dir
from eagle3lab.engines.sglang_parser import check_argv_with_sglang
from eagle3lab.engines.versions import (PINNED_SGLANG, installed_sglang_version,
                                       installed_vllm_version, version_tuple)
from eagle3lab.errors import UserError
from eagle3lab.formats.doctor import inspect_checkpoint
from eagle3lab.formats.findings import (Finding, FindingsVerdict, error, findings_lines, info,
                                        warning)
from eagle3lab.formats.opened import drafter_from, open_drafter
from eagle3lab.formats.reader import read_config
from eagle3lab.preflight import checks
from eagle3lab.preflight.capture import capture_verdict, generated_versions
from eagle3lab.preflight.command import LaunchSpec, parse_command
from eagle3lab.preflight.rendering import rendering_findings, unread_args
from eagle3lab.targets.auxlayers import CONVENTIONS, check_aux_ids, ids_to_capture
from eagle3lab.workdir import drafter_or_default

#: The first SGLang release with the multi-layer drafter loader (`layers.N.*`, norms):
#: older ones load `midlayer.*` only (the doctor's portable "sglang" profile).
MULTI_LAYER_SGLANG = "0.5.23"


@dataclasses.dataclass
class PreflightReport(FindingsVerdict):
    command: list[str]
    engine: str
    version: str
    profile: str | None  # the doctor's engine profile
    spec: dict[str, Any]
    target: dict[str, Any]  # {"given", "path", "architectures", "text_architecture", ...}
    draft: dict[str, Any]
    parser: dict[str, Any] | None  # SGLang's prepare_server_args result
    capture: dict[str, Any] | None
    aux: dict[str, Any] | None  # the doctor's aux summary: where read, convention, points
    findings: list[Finding]
    skipped: list[dict[str, str]]
    seconds: float = 0.0
    #: what could not be resolved: {"who": target|drafter, "given", "why"}; non-empty = the
    #: launch was not judged (see the module docstring)
    unresolved: list[dict[str, str]] = dataclasses.field(default_factory=list)

    @property
    def judged(self) -> bool:
        """False when the target or the (speculative) drafter could not be resolved."""
        return not self.unresolved

    @property
    def verdict(self) -> str:
        """"not ok" (an error), "not judged" (no error, something unresolved) or "ok"."""
        return "not ok" if not self.ok else "not judged" if not self.judged else "ok"

    @property
    def exit_code(self) -> int:
        """The CLI's exit status: 1 an error, 2 not judged, 0 ok."""
        return {"not ok": 1, "not judged": 2, "ok": 0}[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["findings"] = [f.to_dict() for f in self.findings]
        d["ok"] = self.ok
        d["judged"] = self.judged
        d["verdict"] = self.verdict
        d["seconds"] = round(self.seconds, 3)
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def table(self, width: int = 100) -> str:
        aux = self.aux or {}
        lines = [f"engine      {self.engine} {self.version} (doctor profile {self.profile})",
                 f"target      {self.target.get('path') or self.target.get('given')} "
                 f"({self.target.get('architecture')})",
                 f"drafter     {self.draft.get('path') or self.draft.get('given')}",
                 f"capture     {(self.capture or {}).get('status', '-')} "
                 f"({(self.capture or {}).get('note', '')})"]
        if aux:
            lines.append(f"aux layers  engine reads {aux.get('engine_reads')} "
                         f"({aux.get('convention')} convention) -> capture points "
                         f"{aux.get('engine_capture_points')}; trained on "
                         f"{aux.get('training_capture_points')} ({aux.get('training_source')})")
        if self.parser:
            lines.append(f"parser      SGLang prepare_server_args: {self.parser.get('status')}"
                         + (f" ({self.parser.get('reason')})" if self.parser.get("reason")
                            else ""))
        lines += [""] + findings_lines(self.findings, width=width)
        lines += [f"skipped: {s['check']}: {s['reason']}" for s in self.skipped]
        n_warn = sum(f.severity == "warning" for f in self.findings)
        counts = f"{len(self.errors())} error(s), {n_warn} warning(s) ({self.seconds:.2f} s)"
        missing = "; ".join(f"the {u['who']} {u['given']!r} could not be resolved "
                            f"({u['why']})" for u in self.unresolved)
        if self.verdict == "not judged":
            lines += ["", f"NOT JUDGED: {missing}. {counts}"]
        else:
            lines += ["", f"{self.verdict.upper()}: {counts}"
                      + (f"; not judged: {missing}" if missing else "")]
        return "\n".join(lines)


def looks_local(given: str) -> bool:
    """A name the user meant as a path: it starts with `/`, `.` or `~`, or has more than one
    `/` (a hub id is `name` or `org/name`; huggingface_hub refuses anything else)."""
    return given.startswith(("/", ".", "~")) or given.count("/") > 1


def resolve_model(given: str | None, *, what: str) -> tuple[Path | None, str | None, bool]:
    """(local directory with config.json, None, False), or (None, why not, fatal): a
    directory, a prepared preset, or a hub id whose config.json is in the local Hugging Face
    cache. `fatal`: the engine cannot start with it (a local-looking path that is not a
    directory with a config.json), as opposed to a hub id it may download (not judged)."""
    if not given:
        return None, f"the command names no {what}", False
    if "://" in given:
        return None, "a URL; preflight reads local files only", False
    p = Path(given).expanduser()
    if p.is_dir():
        return (p, None, False) if (p / "config.json").is_file() else (
            None, "a directory without a config.json", True)
    if given in TARGET_PRESETS and (preset_dir(given) / "config.json").is_file():
        return preset_dir(given), None, False
    if looks_local(given):
        return None, ("a local path that " + ("is a file, not a model directory"
                                              if p.exists() else "does not exist")), True
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(given, "config.json")
    except Exception:  # an invalid repo id, an unreadable cache
        cached = None
    if isinstance(cached, str):
        return Path(cached).parent, None, False
    return None, "a hub id whose config.json is not in the local Hugging Face cache; " \
                 "preflight never downloads", False


def _read_config(d: Path | None) -> dict[str, Any] | None:
    return read_config(d) if d is not None else None


def doctor_engine(spec: LaunchSpec, version: str, draft_dir) -> str:
    """The doctor's engine profile for this launch. `draft_dir`: the drafter's directory,
    or its `OpenedDrafter` (eagle3lab.formats.opened: its headers are not read again)."""
    if spec.engine == "vllm":
        return "vllm"
    if spec.engine == "reference":
        if draft_dir is None:
            return "speculators"
        with drafter_from(draft_dir) as drafter:
            return drafter.native_engine
    return "sglang-0.5.23" if version_tuple(version) >= version_tuple(MULTI_LAYER_SGLANG) \
        else "sglang"


def resolve_version(spec: LaunchSpec, given: str | None) -> str:
    """The engine release judged for: given, else the installed/pinned SGLang, else the
    installed vLLM (its distribution's metadata; vllm is not imported), else "unknown"
    (judged with the newest vLLM table, and said so)."""
    if given:
        return given
    if spec.engine == "sglang":
        return installed_sglang_version() or PINNED_SGLANG
    if spec.engine == "vllm":
        return installed_vllm_version() or "unknown"

    return __version__


def preflight(command: str | list[str], *, engine_version: str | None = None,
              trained_aux_layers: list[int] | None = None, trained_convention: str = "vllm",
              check_values: bool = False, engine_parser: bool = True,
              parser_result: dict[str, Any] | None = None,
              parser_timeout_s: float = 120.0,
              env: dict[str, str] | None = None) -> PreflightReport:
    """Judge a launch command. `engine_version`: the engine release to judge for (default:
    the installed SGLang, else the pinned one; vLLM: the installed one, else unknown, judged
    as the newest table's release). `trained_aux_layers`: the ids training used, in
    `trained_convention`, when the drafter does not record them. `engine_parser`: also run
    SGLang's own parser (a subprocess, beside the checks); `parser_result`: its result when
    the caller already has it. `env`: the server's environment beyond the command's own
    NAME=VALUE prefix (vLLM's VLLM_USE_V2_MODEL_RUNNER picks its model runner)."""
    t0 = time.perf_counter()
    spec = parse_command(command)
    version = resolve_version(spec, engine_version)
    findings: list[Finding] = []
    skipped: list[dict[str, str]] = []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = None
    if spec.engine == "sglang" and engine_parser and parser_result is None:
        future = pool.submit(check_argv_with_sglang, spec.argv, timeout_s=parser_timeout_s)
    try:
        unread = unread_args(spec)  # the rendering flags are read by rendering.py
        findings += [warning("launch-command", f"Arguments this preflight does not read: "
                             f"{' '.join(unread)} (the engine's own parser judges "
                             f"them).", found=unread)] if unread and \
            spec.engine == "vllm" else []
        if spec.engine == "reference" and spec.flags.get("speculative") and not spec.draft:
            spec.draft = str(drafter_or_default(None, spec.target))
        tdir, ddir, unresolved = _resolve_launch(spec, findings)

        # the drafter located and read once: the profile choice and the doctor share it
        drafter = open_drafter(ddir) if ddir is not None and spec.speculative else None
        if not spec.speculative:
            findings.append(_not_speculative(spec))
        tcfg = _read_config(tdir)
        profile = doctor_engine(spec, version, drafter) if spec.speculative else None
        text = (tcfg or {}).get("text_config") if isinstance((tcfg or {}).get("text_config"),
                                                             dict) else tcfg
        arch = ((tcfg or {}).get("architectures") or [None])[0]
        text_arch = ((text or {}).get("architectures") or [None])[0] if text is not tcfg \
            else None
        text_arch = text_arch or ((text or {}).get("model_type") if text is not tcfg else None)
        capture = None
        if tcfg is not None and spec.speculative:
            v = capture_verdict(engine=spec.engine, version=version, architecture=arch)
            capture = v.to_dict()
            findings += checks.capture_findings(v, text_arch=text_arch)
        report, dcfg, runner = None, None, None
        if spec.engine == "vllm" and spec.speculative:
            runner = checks.vllm_runner(spec, target_cfg=tcfg, env=env)
            findings += _vllm_version_notes(version, runner)
        if drafter is not None:
            with drafter:
                report, dcfg, extra = _doctor(drafter, tdir, profile, check_values,
                                              trained_aux_layers, trained_convention, version,
                                              runner[0] if runner else None)
                # the drafter's recorded chat template (its record, already read) vs what
                # this launch renders
                extra += rendering_findings(drafter, target_dir=tdir, spec=spec)
            findings += report.findings + extra
            skipped += [s for s in report.skipped if tdir is not None or "target" not in
                        s["check"]]
        trained = dcfg.trained_steps() if dcfg else (None, None)
        findings += checks.draft_token_findings(spec, trained_steps=trained[0],
                                                trained_source=trained[1])
        findings += checks.tp_findings(spec, target_cfg=text, draft_cfg=_layer_cfg(dcfg),
                                       draft_mla=bool(dcfg and dcfg.mla))
        if text is not None or dcfg is not None:
            findings += checks.context_findings(
                spec, draft_max_pos=dcfg.max_position_embeddings if dcfg else None,
                target_max_pos=(text or {}).get("max_position_embeddings"))
            findings += checks.vocab_findings(
                draft_vocab=dcfg.draft_vocab_size if dcfg else None,
                target_vocab=(text or {}).get("vocab_size"))
            findings += checks.dtype_findings(
                spec, draft_dtype=dcfg.dtype if dcfg else None,
                target_dtype=(tcfg or {}).get("torch_dtype") or (tcfg or {}).get("dtype")
                or (text or {}).get("torch_dtype") or (text or {}).get("dtype"))
        findings += checks.startup_warning_findings(spec, draft_dir=str(ddir) if ddir else None,
                                                    target_cfg=tcfg)
        parser = parser_result or (future.result() if future is not None else None)
        findings += _parser_findings(spec, parser, engine_parser, skipped)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return PreflightReport(
        command=spec.argv, engine=spec.engine, version=version, profile=profile,
        spec=spec.to_dict(),
        target={"given": spec.target, "path": str(tdir) if tdir else None,
                "architecture": arch, "text_architecture": text_arch},
        draft={"given": spec.draft, "path": str(ddir) if ddir else None,
               "format": report.format if report else None,
               "architectures": dcfg.architectures if dcfg else None},
        parser=parser, capture=capture, aux=(report.config.get("aux") if report else None),
        findings=findings, skipped=skipped, seconds=time.perf_counter() - t0,
        unresolved=unresolved)


def _resolve_launch(spec: LaunchSpec, findings: list[Finding]
                    ) -> tuple[Path | None, Path | None, list[dict[str, str]]]:
    """The target's and the (speculative) drafter's directories; a `model-path` error for a
    local-looking name that is not a model directory, an `unresolved` warning (and an entry
    of the returned list: the launch is not judged) for one preflight cannot read."""
    tdir, twhy, tfatal = resolve_model(spec.target, what="target")
    ddir, dwhy, dfatal = resolve_model(spec.draft, what="drafter") if spec.speculative \
        else (None, None, False)
    unresolved: list[dict[str, str]] = []
    for who, given, why, fatal in (("target", spec.target, twhy, tfatal),
                                   ("drafter", spec.draft, dwhy, dfatal)):
        if not why or (who == "drafter" and not spec.speculative):
            continue
        if fatal:
            findings.append(error("model-path", f"The {who} {given!r}: {why}. "
                                  f"{_ENGINE[spec.engine]} takes a name that is not a model "
                                  f"directory for a hub id, which this is not: it does not "
                                  f"start.", found=given))
        else:
            findings.append(warning("unresolved", f"The {who} {given!r} was not judged: "
                                    f"{why}.", found=given))
            unresolved.append({"who": who, "given": str(given), "why": why})
    return tdir, ddir, unresolved


_ENGINE = {"sglang": "SGLang", "vllm": "vLLM", "reference": "eagle3lab serve"}


def _vllm_version_notes(version: str, runner: tuple[str, str]) -> list[Finding]:
    """Which vLLM the drafter checks describe (0.25.1's loader, read in its source) and
    which of its model runners this launch gets (it decides where aux ids are read and
    whether a last-layer drafter starts)."""
    newest = generated_versions("vllm")[-1]
    out = [info("launch-command", f"vLLM model runner: {runner[0].upper()} ({runner[1]}).")]
    if version == "unknown":
        out.append(info("launch-command", f"The vLLM version is not known here (not "
                        f"installed, no --engine-version): judged as vLLM {newest}, the "
                        f"release whose source the vLLM checks were read from."))
    elif version_tuple(version) != version_tuple(newest):
        out.append(info("launch-command", f"The drafter checks describe vLLM {newest}'s "
                        f"loader; vLLM {version} was not read and may differ."))
    return out


def _not_speculative(spec: LaunchSpec) -> Finding:
    if spec.draft and (spec.algorithm or "").lower() != "eagle3":
        return warning("launch-command", f"The speculative algorithm is "
                       f"{spec.algorithm!r}, not EAGLE-3: the drafter is not judged.",
                       expected="EAGLE3", found=spec.algorithm)
    return info("launch-command", "No EAGLE-3 drafter in the command (no speculative "
                "decoding): only the target and the flags are judged.")


def _layer_cfg(dcfg) -> dict[str, Any] | None:
    if dcfg is None:
        return None
    return {"num_attention_heads": dcfg.num_attention_heads,
            "num_key_value_heads": dcfg.num_key_value_heads}


def _doctor(drafter, tdir: Path | None, profile: str, check_values: bool,
            trained: list[int] | None, convention: str, version: str,
            vllm_runner: str | None = None):
    """The doctor's report for this engine, the parsed draft config (with its training
    record), and extra findings. `drafter`: an OpenedDrafter (eagle3lab.formats.opened),
    read once for both."""
    if trained is not None and convention not in CONVENTIONS:
        raise UserError(f"--trained-convention {convention!r}: use one of "
                        f"{', '.join(CONVENTIONS)}.")
    trained = check_aux_ids(trained, "trained_aux_layers (--trained-aux-layers)")
    points = ids_to_capture(trained, convention) if trained is not None else None
    report = inspect_checkpoint(drafter, target=tdir, engine=profile,
                                check_values=check_values, trained_capture=points,
                                vllm_runner=vllm_runner)
    dcfg = drafter.draft_config
    extra = []
    if profile == "sglang" and version_tuple(version) < version_tuple(MULTI_LAYER_SGLANG):
        extra.append(info("launch-command", f"SGLang {version} is judged with the doctor's "
                          f"portable profile (the midlayer loader, before "
                          f"{MULTI_LAYER_SGLANG}'s multi-layer loader)."))
    return report, dcfg, extra


def _parser_findings(spec: LaunchSpec, parser: dict | None, asked: bool,
                     skipped: list[dict[str, str]]) -> list[Finding]:
    if spec.engine == "vllm":
        skipped.append({"check": "vLLM's own argument parser",
                        "reason": "vLLM is not installed here; its flags were read by "
                                  "preflight's mirror (command.py)"})
        return []
    if spec.engine != "sglang":
        return []
    if parser is None:
        skipped.append({"check": "SGLang's prepare_server_args", "reason": "not asked" if
                        not asked else "no result"})
        return []
    if parser["status"] == "invalid":
        return [error("launch-command", f"SGLang's own parser refuses the command: "
                      f"{parser['reason']}.", found=parser["reason"])]
    if parser["status"] == "unavailable":
        skipped.append({"check": "SGLang's prepare_server_args", "reason": parser["reason"]})
    return []


class PreflightRefused(UserError):
    """A launch refused because its preflight found an error (`.report` has them all)."""

    def __init__(self, report: PreflightReport, name: str):
        self.report = report
        errs = " ".join(f"[{f.code}] {f.message}" for f in report.errors())
        super().__init__(f"Preflight refuses to start {name}: {errs} Fix the launch, or pass "
                         f"force=True (notebook 04: parameter `force`) to start it anyway.")


def preflight_launch(config, *, parser_result: dict[str, Any] | None = None
                     ) -> PreflightReport:
    """The preflight of a `LaunchConfig` (eagle3lab/engines/argv.py): its exact argv, for
    the SGLang release it targets; SGLang's parser result is passed in by the launcher,
    which runs it anyway (`check_argv_with_sglang`)."""
    return preflight(config.to_argv(),
                     engine_version=config.sglang_version if config.engine == "sglang" else None,
                     engine_parser=False, parser_result=parser_result, env=config.env or None)
