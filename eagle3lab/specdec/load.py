"""Build a decoding engine from paths: the target, and a drafter loaded the way a serving
engine would load it (a drafter path is opened once, formats/opened.py, and that one
object is checked, inspected and loaded).

Prevents decoding with a drafter that cannot fit the target: before any decoding the
checkpoint is inspected against the target with the doctor, and fit errors (hidden size,
fc width, vocab map, shapes, unreadable files) refuse the run with the doctor's finding
codes. Serving-path failures are NOT refused: `load_as="sglang"` on a speculators-layout
checkpoint is exactly the silent failure we want to reproduce offline.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from eagle3lab.errors import UserError
from eagle3lab.formats.doctor import inspect_checkpoint
from eagle3lab.formats.load_as import build_model
from eagle3lab.formats.load_as import load_as as emulate
from eagle3lab.formats.opened import drafter_from, open_drafter, owned
from eagle3lab.specdec.batched import BatchedEngine
from eagle3lab.specdec.drafting import Drafter
from eagle3lab.specdec.engine import SpecEngine
from eagle3lab.specdec.plain import PlainEngine
from eagle3lab.specdec.staticmodel import unsupported_reason

if TYPE_CHECKING:
    from eagle3lab.formats.opened import OpenedDrafter

#: Doctor codes that mean "this drafter cannot be run against this target at all".
FIT_CODES = ("unreadable", "format-unknown", "hidden-size", "fc-dim", "vocab-map", "shape")


def fit_errors(draft: str | os.PathLike | OpenedDrafter, *, target: str | os.PathLike,
               codes: tuple[str, ...] = FIT_CODES) -> tuple[str, list]:
    """(the engine that loads the checkpoint's format natively, the doctor's error findings
    with these codes for `draft` against `target` inspected for that engine; [] = fits).
    `draft`: a path or an `OpenedDrafter`, whose headers are not read again and which keeps
    the report."""
    with drafter_from(draft) as drafter:
        engine = drafter.native_engine  # headers only: which engine loads it natively
        report = inspect_checkpoint(drafter, target=target, engine=engine)
    return engine, [f for f in report.errors() if f.code in codes]


def check_draft(draft: str | os.PathLike | OpenedDrafter) -> OpenedDrafter:
    """Refuse a drafter path that does not exist or holds no drafter checkpoint (speculators'
    or SGLang's EAGLE-3 format), naming it, before anything slow (the target) is loaded.
    Returns the drafter opened (located, config and headers read; `draft` itself when it is
    an `OpenedDrafter`), for the steps after to share."""
    drafter = open_drafter(draft)
    given, p = drafter.given, drafter.path
    if not p.is_dir():
        raise UserError(f"The drafter {str(given)!r} " + (
            "is a file; a drafter checkpoint is a directory (config.json + weights)."
            if p.exists() else "does not exist.")
            + " Pass a speculators or SGLang EAGLE-3 checkpoint directory (--draft).")
    fmt, problems = drafter.format, drafter.problems  # config and headers only
    if problems or fmt == "unknown":
        why = ("; ".join(f"{x.file}: {x.message}" for x in problems) if problems else
               "its config.json and tensor names match neither speculators' format nor "
               "SGLang's (a target model passed as --draft?)")
        raise UserError(f"{given} is not a readable EAGLE-3 drafter checkpoint: {why}. "
                        f"`eagle3lab inspect {given}` gives the full report.")
    return drafter


def load_engine(*, target: Any = "smollm2-135m-instruct",
                draft: str | os.PathLike | OpenedDrafter | None = None,
                steps: int = 3, topk: int = 1, draft_tokens: int | None = None,
                features: str = "fused", load_as: str | None = None, device: str = "auto",
                dtype: str = "float32", seed: int = 0, engine: str = "eager",
                batch_size: int = 1, graphs: bool | None = None, compile: bool = False):
    """A PlainEngine (no draft) or a SpecEngine; with `engine="static"` a BatchedEngine
    (static KV caches, CUDA graphs on a GPU, `batch_size` prompts in flight; `compile`:
    torch.compile each captured step first, for fused kernels) of either kind;
    `engine="auto"`: static on a GPU where the target is supported, else eager.
    `load_as`: emulate that serving engine's loading of the drafter (default: the
    checkpoint's native engine, i.e. as trained). `draft`: a path or an `OpenedDrafter`
    (formats/opened.py): opened once here, or not at all, and shared by the checks, the
    doctor and the loader."""
    # lazy: a test patches eagle3lab.targets.adapter.load_target
    from eagle3lab.targets.adapter import Target, load_target

    opened = check_draft(draft) if draft is not None else None  # a bad path: before the target
    tgt = target if isinstance(target, Target) else load_target(target, device=device,
                                                                   dtype=dtype)
    engine_kind = resolve_engine(engine, tgt)
    if opened is None:
        if engine_kind == "static":
            return BatchedEngine(tgt, None, batch_size=batch_size, graphs=graphs,
                                 compile=compile)
        return PlainEngine(tgt)
    try:
        drafter, points = load_drafter(opened, target=tgt, load_as=load_as, seed=seed)
    finally:
        if owned(draft, opened):
            opened.close()
    if engine_kind == "static":
        return BatchedEngine(tgt, drafter, capture_points=points, steps=steps,
                             topk=topk, draft_tokens=draft_tokens, features=features,
                             batch_size=batch_size, graphs=graphs, compile=compile)
    return SpecEngine(tgt, drafter, capture_points=points, steps=steps,
                      topk=topk, draft_tokens=draft_tokens, features=features)


def load_drafter(draft: str | os.PathLike | OpenedDrafter, *, target: Any,
                 load_as: str | None = None, seed: int = 0) -> tuple[Drafter, list[int]]:
    """(the drafter as `load_as` would load it (default: as trained) on the loaded
    `target`'s device and dtype, its capture points): refused in one line when it does not
    fit the target. What `load_engine` decodes with; `BatchedEngine.swap_drafter` takes it
    to decode with another drafter on an engine already built."""
    opened = check_draft(draft)
    try:
        engine, misfit = fit_errors(opened, target=target.path)
        if misfit:
            raise UserError(
                f"The drafter {opened.path} does not fit the target {target.name}; refused "
                f"before decoding. " + " ".join(f"[{f.code}] {f.message}" for f in misfit)
                + f" (run `eagle3lab inspect {opened.path} --target {target.path}` for the "
                f"full report).")
        state = emulate(opened, load_as or engine, target=target.path, seed=seed)
    finally:
        if owned(draft, opened):
            opened.close()
    model = build_model(state).to(target.device, target.dtype)
    drafter = Drafter(model)
    if state.hot_token_ids is not None:
        drafter.hot_ids = state.hot_token_ids.to(target.device)
    return drafter, state.capture_points


#: the offline engine's implementations: HF eager with dynamic caches (any target, the CPU
#: default) or static caches + CUDA graphs + batching (Llama-family targets; GPU speed).
ENGINES = ("auto", "eager", "static")


def check_engine(engine: str) -> None:
    """Refuse an engine name that is not one of ENGINES (--engine)."""
    if engine not in ENGINES:
        raise UserError(f"engine (--engine) must be one of {', '.join(ENGINES)}; got "
                        f"{engine!r}.")


def resolve_engine(engine: str, target) -> str:
    """"eager" or "static"; "auto" is static on a GPU when the target is supported, else
    eager (the CPU path stays the one the tests pin)."""
    check_engine(engine)
    if engine == "auto":
        gpu = target.device.type == "cuda"
        ok = unsupported_reason(target.model.config, model=target.model) is None
        return "static" if gpu and ok else "eager"
    return engine
