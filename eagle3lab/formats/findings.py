"""Findings and the inspection report: stable codes, raw facts, a table a person can read.

Prevents a mismatch being noticed and then lost: every problem becomes a `Finding` with a
stable code (tests and users grep for them), a severity, the tensor it concerns and the raw
expected/found values, and the report says which checks were skipped and why, so "no
errors" never silently means "not checked". `CODES` explains each code and its usual fix
(the notebook shows them next to the findings).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]

#: code -> (what it means, how to fix it). The codes are a stable interface.
CODES: dict[str, tuple[str, str]] = {
    "unreadable": (
        "A weight file or config.json cannot be read or parsed (truncated, bad header, bad "
        "JSON, or a pickle that needs a full unpickle).",
        "Re-download or re-save the file; convert a pickle with a trusted loader once."),
    "format-unknown": (
        "Neither the speculators layout (layers.N.*) nor the EAGLE-3 layout (midlayer.*) was "
        "recognised.", "Check that this is an EAGLE-3 drafter, not a full model."),
    "keys-layout": (
        "The checkpoint's key or config layout is not the one the engine loads; e.g. SGLang "
        "releases with the midlayer loader drop layers.0.* silently and serve random weights.",
        "eagle3lab convert CKPT OUT --to sglang (or --to speculators for vLLM)."),
    "unknown-keys": (
        "Tensors the engine would drop (SGLang: silently) or refuse (vLLM: KeyError).",
        "Convert with eagle3lab convert, or remove keys that are not part of the drafter."),
    "missing-keys": (
        "Tensors the engine needs are absent; it would serve freshly initialised values.",
        "Re-export the checkpoint from the training run, including every drafter tensor."),
    "shape": (
        "A tensor's shape disagrees with the config (the engine fails to load, or loads a "
        "differently shaped model).", "Fix the config to match the trained weights."),
    "fc-dim": (
        "fc's input width is not num_aux x the target hidden size (1x: the draft was built "
        "for single-layer features; SGLang then skips fc without an error, vLLM refuses the "
        "weight at load), or a drafter that reads the target's last hidden state "
        "(eagle_config.use_aux_hidden_state false) meets a vLLM model runner that feeds it "
        "aux states (0.25.1's V2 runner: the start fails).",
        "Retrain with three aux layers, or serve with the matching target; a last-layer "
        "drafter on vLLM 0.25.1: a flat config with eagle_config.use_aux_hidden_state false "
        "and VLLM_USE_V2_MODEL_RUNNER=0."),
    "hidden-size": (
        "The draft hidden size differs from the target's and target_hidden_size does not "
        "account for it (or is null, which SGLang cannot build).",
        "Set target_hidden_size to the target's hidden_size in config.json."),
    "vocab-map": (
        "d2t/t2d disagree with each other, the draft vocabulary size or the target vocabulary.",
        "Use the vocab map the drafter was trained with (never regenerate it)."),
    "aux-layers": (
        "Aux layer ids missing, out of range, duplicated, or where the engine does not read "
        "them (SGLang reads only eagle_config and adds 1; vLLM 0.25.1 reads the top level, "
        "its V1 model runner also eagle_config, never shifted), or more/fewer captured "
        "states than the engine builds fc for.",
        "eagle3lab convert writes the ids where and how the engine reads them."),
    "architecture": (
        "architectures / model type is not what the engine expects for this format.",
        "Use the converter's config, e.g. LlamaForCausalLMEagle3 for SGLang."),
    "nonfinite": ("NaN or Inf in a tensor.", "Use an earlier checkpoint of the run."),
    "max-position": (
        "The draft's max_position_embeddings is below the target's (has crushed acceptance "
        "on long prompts).", "Set it to the target's value; RoPE needs no retraining for it."),
    "norm-before-fc": (
        "The draft needs an input norm (norm_before_fc / fc_norm) that the engine ignores.",
        "Retrain without it, serve with vLLM, or use an engine version that applies it."),
    "norm-variant": (
        "The draft was trained with a normalisation variant (norm_before_residual, "
        "norm_output) that the engine does not implement, or the engine reads another value "
        "than training used (vLLM 0.25.1 takes an ABSENT norm_before_residual of a "
        "speculators config as True; speculators' own loader as False).",
        "Retrain without the variant, serve with an engine that implements it, or write the "
        "trained value into config.json."),
    "dtype": ("Mixed dtypes, or float32 weights the engine will cast.",
              "Save in the serving dtype (bfloat16) to halve size and avoid surprises."),
    # Launch-level codes (eagle3lab preflight: the whole serving command, not only the drafter).
    "aux-capture": (
        "The engine version does not capture aux hidden states from the target's model class: "
        "SGLang 0.5.23 and vLLM refuse to start; older SGLang builds serve the last layer's "
        "state alone, fc is bypassed and accept length is ~1.00.",
        "Serve a target class the engine captures from (eagle3lab preflight lists the "
        "table), or an engine version that implements set_eagle3_layers_to_capture "
        "(SGLang) / SupportsEagle3 (vLLM) for it."),
    "launch-command": (
        "The launch command cannot be judged or would not start: not an SGLang/vLLM/eagle3lab "
        "serve command, no EAGLE-3 drafter in it, a value of the wrong type, or the engine's "
        "own argument parser refuses it.",
        "Fix the flag named in the message; run the engine's --help for its spelling."),
    "unresolved": (
        "The target or the drafter is a hub id with no cached config.json (or a URL), so the "
        "checks that need it were not run: the launch is NOT JUDGED (preflight exit 2).",
        "Download it first (huggingface-cli download ID) or pass a local directory."),
    "model-path": (
        "The target or the drafter is written as a local path (it starts with /, . or ~, or "
        "has more than one /) but is not a directory with a config.json: the engine takes "
        "it for a hub id, which it is not, and fails to start.",
        "Fix the path (a typo, a path relative to another directory, a drafter not yet "
        "trained or copied), or give a hub id."),
    "draft-tokens": (
        "Chain/tree settings the engine overrides or refuses: with topk 1 the draft is a chain "
        "and SGLang forces --speculative-num-draft-tokens to steps + 1; a tree needs more "
        "draft tokens than one; vLLM needs num_speculative_tokens > 0; or more draft steps "
        "than the drafter was trained to draft (its TTT depth: served, but the late "
        "positions are rarely accepted).",
        "Chain: pass --speculative-num-draft-tokens = steps + 1. Tree: topk > 1 and draft "
        "tokens between 2 and topk x steps + 1. Draft at most the trained depth."),
    "tp-heads": (
        "The tensor-parallel size does not divide the attention heads (or the key/value "
        "heads, or is not a multiple of them) of the target or of the drafter: the engine "
        "asserts at start.", "Choose a tp size that divides the head counts."),
    "context-length": (
        "The launch's context length exceeds what the drafter (max_position_embeddings) or the "
        "target supports: acceptance collapses on long prompts, or the engine refuses.",
        "Lower --context-length / --max-model-len, or raise the drafter's "
        "max_position_embeddings to the target's (RoPE needs no retraining for it)."),
    "launch-dtype": (
        "The serving dtype differs from the one the drafter or target was saved in "
        "(float16 over bfloat16 weights overflows; float32 doubles memory).",
        "Serve in the checkpoint's dtype (--dtype bfloat16 or auto)."),
    "startup-warning": (
        "A known start-up message this command will make the engine print, explained.",
        "Usually none: read the explanation; it says when to act."),
    "chat-template": (
        "The drafter's data was rendered with another chat template, template kwargs (e.g. "
        "enable_thinking), thinking setup or tokenizer than the launch serves with (a "
        "warning: acceptance drops); a --chat-template that does not exist or does not "
        "render (an error); or no rendering record, so it cannot be checked (an info, "
        "never a match).",
        "Regenerate with the serving template and retrain (eagle3lab regenerate "
        "--chat-template FILE --template-kwargs '{...}'), or serve with the one trained on "
        "(--chat-template PATH, --default-chat-template-kwargs '{...}')."),
}


#: The codes only `eagle3lab preflight` emits (planted-fault tests in tests/preflight/;
#: `chat-template` also `eagle3lab inspect --target`, against the target's own template).
LAUNCH_CODES = ("aux-capture", "launch-command", "unresolved", "model-path", "draft-tokens",
                "tp-heads", "context-length", "launch-dtype", "startup-warning", "chat-template")


@dataclasses.dataclass
class Finding:
    code: str
    severity: Severity
    message: str
    tensor: str | None = None
    expected: Any = None
    found: Any = None

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unknown finding code {self.code!r}")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"code": self.code, "severity": self.severity,
                             "message": self.message}
        for k in ("tensor", "expected", "found"):
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        return d


def error(code: str, message: str, **kw) -> Finding:
    return Finding(code, "error", message, **kw)


def warning(code: str, message: str, **kw) -> Finding:
    return Finding(code, "warning", message, **kw)


class FindingsVerdict:
    """`ok`, `codes`, `errors()` over a `findings` list (the doctor's and preflight's
    reports)."""

    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]


@dataclasses.dataclass
class Report(FindingsVerdict):
    """What `inspect` found. `ok` is True when no finding has severity error."""

    checkpoint: str
    format: str
    engine: str
    findings: list[Finding]
    tensors: list[dict[str, Any]]
    skipped: list[dict[str, str]]  # {"check", "reason"}
    config: dict[str, Any]  # the normalised draft config
    target: dict[str, Any] | None
    key_layout: str
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "format": self.format, "engine": self.engine,
                "ok": self.ok, "findings": [f.to_dict() for f in self.findings],
                "tensors": self.tensors, "skipped": self.skipped, "key_layout": self.key_layout,
                "config": self.config, "target": self.target,
                "seconds": round(self.seconds, 3)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def table(self, *, show_tensors: bool = False, width: int = 100) -> str:
        """Aligned human-readable report."""
        lines = [f"checkpoint  {self.checkpoint}",
                 f"format      {self.format} (keys: {self.key_layout})",
                 f"engine      {self.engine}",
                 f"target      {_target_line(self.target)}",
                 f"tensors     {len(self.tensors)}",
                 ""]
        lines += findings_lines(self.findings, width=width)
        for s in self.skipped:
            lines.append(f"skipped: {s['check']}: {s['reason']}")
        if show_tensors:
            lines.append("")
            name_w = max((len(t["name"]) for t in self.tensors), default=4)
            lines.append(f"{'TENSOR':<{name_w}}  {'DTYPE':<9}  SHAPE")
            for t in self.tensors:
                lines.append(f"{t['name']:<{name_w}}  {t['dtype']:<9}  {t['shape']}")
        n_err = len(self.errors())
        n_warn = sum(f.severity == "warning" for f in self.findings)
        lines.append("")
        lines.append(f"{'OK' if self.ok else 'NOT OK'}: {n_err} error(s), {n_warn} warning(s) "
                     f"for {self.engine} ({self.seconds:.2f} s)")
        return "\n".join(lines)


def findings_lines(findings: list[Finding], *, width: int = 100) -> list[str]:
    """Findings as aligned lines (errors first, then warnings, then infos)."""
    if not findings:
        return ["no findings"]
    sev_w = max([len("SEVERITY")] + [len(f.severity) for f in findings])
    code_w = max([len("CODE")] + [len(f.code) for f in findings])
    lines = [f"{'SEVERITY':<{sev_w}}  {'CODE':<{code_w}}  MESSAGE"]
    indent = " " * (sev_w + code_w + 4)
    for f in sorted(findings, key=lambda f: (f.severity != "error", f.severity != "warning")):
        msg = _wrap(f.message, width - len(indent))
        lines.append(f"{f.severity:<{sev_w}}  {f.code:<{code_w}}  {msg[0]}")
        lines += [indent + m for m in msg[1:]]
    return lines


def info(code: str, message: str, **kw) -> Finding:
    return Finding(code, "info", message, **kw)


def _target_line(t: dict[str, Any] | None) -> str:
    if not t:
        return "(none: target checks skipped)"
    return (f"{t.get('name')} ({t.get('num_layers')} layers, hidden {t.get('hidden_size')}, "
            f"vocab {t.get('vocab_size')})")


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, max(width, 30)) or [""]
