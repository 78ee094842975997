"""Build a decoding engine from paths: the target, and a drafter loaded the way a serving
engine would load it.

Prevents decoding with a drafter that cannot fit the target: before any decoding the
checkpoint is inspected against the target with the doctor, and fit errors (hidden size,
fc width, vocab map, shapes, unreadable files) refuse the run with the doctor's finding
codes. Serving-path failures are NOT refused: `load_as="sglang"` on a speculators-layout
checkpoint is exactly the silent failure we want to reproduce offline.
"""

from __future__ import annotations

import os
from typing import Any

#: Doctor codes that mean "this drafter cannot be run against this target at all".
FIT_CODES = ("unreadable", "format-unknown", "hidden-size", "fc-dim", "vocab-map", "shape")


def native_engine(fmt: str) -> str:
    """The engine a checkpoint's own format is loaded by without any renaming."""
    return "speculators" if fmt == "speculators" else "sglang"


def fit_errors(draft: str | os.PathLike, *, target: str | os.PathLike,
               codes: tuple[str, ...] = FIT_CODES) -> tuple[str, list]:
    """(the engine that loads the checkpoint's format natively, the doctor's error findings
    with these codes for `draft` against `target` inspected for that engine; [] = fits)."""
    from eagle3lab.formats.inspect import inspect_checkpoint
    from eagle3lab.formats.locate import locate_checkpoint
    from eagle3lab.formats.reader import Checkpoint

    draft = locate_checkpoint(draft)
    ck = Checkpoint(draft)  # headers only: which engine loads this format natively
    fmt = ck.format
    ck.close()
    engine = native_engine(fmt)
    report = inspect_checkpoint(draft, target=target, engine=engine)
    return engine, [f for f in report.errors() if f.code in codes]


def check_draft(draft: str | os.PathLike) -> None:
    """Refuse a drafter path that does not exist or holds no drafter checkpoint (speculators'
    or SGLang's EAGLE-3 format), naming it, before anything slow (the target) is loaded."""
    from eagle3lab.errors import UserError
    from eagle3lab.formats.locate import locate_checkpoint
    from eagle3lab.formats.reader import Checkpoint

    p = locate_checkpoint(draft)
    if not p.is_dir():
        raise UserError(f"The drafter {str(draft)!r} " + (
            "is a file; a drafter checkpoint is a directory (config.json + weights)."
            if p.exists() else "does not exist.")
            + " Pass a speculators or SGLang EAGLE-3 checkpoint directory (--draft).")
    ck = Checkpoint(p)  # config and headers only
    try:
        fmt, problems = ck.format, ck.problems
    finally:
        ck.close()
    if problems or fmt == "unknown":
        why = ("; ".join(f"{x.file}: {x.message}" for x in problems) if problems else
               "its config.json and tensor names match neither speculators' format nor "
               "SGLang's (a target model passed as --draft?)")
        raise UserError(f"{draft} is not a readable EAGLE-3 drafter checkpoint: {why}. "
                        f"`eagle3lab inspect {draft}` gives the full report.")


def load_engine(*, target: Any = "smollm2-135m-instruct", draft: str | os.PathLike | None = None,
                steps: int = 3, topk: int = 1, draft_tokens: int | None = None,
                features: str = "fused", load_as: str | None = None, device: str = "auto",
                dtype: str = "float32", seed: int = 0, engine: str = "eager",
                batch_size: int = 1, graphs: bool | None = None, compile: bool = False):
    """A PlainEngine (no draft) or a SpecEngine; with `engine="static"` a BatchedEngine
    (static KV caches, CUDA graphs on a GPU, `batch_size` prompts in flight; `compile`:
    torch.compile each captured step first, for fused kernels) of either kind;
    `engine="auto"`: static on a GPU where the target is supported, else eager.
    `load_as`: emulate that serving engine's loading of the drafter (default: the
    checkpoint's native engine, i.e. as trained)."""
    from eagle3lab.errors import UserError
    from eagle3lab.formats.load_as import build_model, load_as as emulate
    from eagle3lab.target.adapter import Target, load_target
    from eagle3lab.specdec.drafter import Drafter
    from eagle3lab.specdec.engine import SpecEngine
    from eagle3lab.specdec.plain import PlainEngine

    if draft is not None:
        from eagle3lab.formats.locate import locate_checkpoint

        check_draft(draft)
        draft = locate_checkpoint(draft)
    tgt = target if isinstance(target, Target) else load_target(target, device=device,
                                                                   dtype=dtype)
    engine_kind = resolve_engine(engine, tgt)
    if draft is None:
        if engine_kind == "static":
            from eagle3lab.specdec.batched import BatchedEngine

            return BatchedEngine(tgt, None, batch_size=batch_size, graphs=graphs,
                                 compile=compile)
        return PlainEngine(tgt)
    engine, misfit = fit_errors(draft, target=tgt.path)
    if misfit:
        raise UserError(
            f"The drafter {draft} does not fit the target {tgt.name}; refused before decoding. "
            + " ".join(f"[{f.code}] {f.message}" for f in misfit)
            + f" (run `eagle3lab inspect {draft} --target {tgt.path}` for the full report).")
    state = emulate(draft, load_as or engine, target=tgt.path, seed=seed)
    model = build_model(state).to(tgt.device, tgt.dtype)
    drafter = Drafter(model)
    if state.hot_token_ids is not None:
        drafter.hot_ids = state.hot_token_ids.to(tgt.device)
    if engine_kind == "static":
        from eagle3lab.specdec.batched import BatchedEngine

        return BatchedEngine(tgt, drafter, capture_points=state.capture_points, steps=steps,
                             topk=topk, draft_tokens=draft_tokens, features=features,
                             batch_size=batch_size, graphs=graphs, compile=compile)
    return SpecEngine(tgt, drafter, capture_points=state.capture_points, steps=steps,
                      topk=topk, draft_tokens=draft_tokens, features=features)


#: the offline engine's implementations: HF eager with dynamic caches (any target, the CPU
#: default) or static caches + CUDA graphs + batching (Llama-family targets; GPU speed).
ENGINES = ("auto", "eager", "static")


def check_engine(engine: str) -> None:
    """Refuse an engine name that is not one of ENGINES (--engine)."""
    from eagle3lab.errors import UserError

    if engine not in ENGINES:
        raise UserError(f"engine (--engine) must be one of {', '.join(ENGINES)}; got "
                        f"{engine!r}.")


def resolve_engine(engine: str, target) -> str:
    """"eager" or "static"; "auto" is static on a GPU when the target is supported, else
    eager (the CPU path stays the one the tests pin)."""
    from eagle3lab.specdec.staticmodel import unsupported_reason

    check_engine(engine)
    if engine == "auto":
        gpu = target.device.type == "cuda"
        ok = unsupported_reason(target.model.config, model=target.model) is None
        return "static" if gpu and ok else "eager"
    return engine
