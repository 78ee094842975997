"""Offline acceptance: what accept length a drafter gives, per draft position, and what
speedup it buys, measured on a laptop before a GPU server is started.

Prevents the 'accept length 1.00 in production' surprise: the same prompts are decoded
plainly and speculatively in one run (the speculative output is checked against the plain
one at temperature 0), acceptance is kept as raw counts (eagle3lab.specdec.stats), and
arms that feed the drafter what a broken server would (`features="last_layer"`,
`load_as="sglang"`) can be measured side by side with the healthy one.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

from eagle3lab.config import DEFAULT_TARGET
from eagle3lab.data.prompts import chat_prompt_ids, load_prompts
from eagle3lab.data.rendering import TRAINED, Renderer, load_render_settings, record_rendering
from eagle3lab.errors import UserError
from eagle3lab.formats.opened import OpenedDrafter, owned
from eagle3lab.specdec.batched import check_batch_size
from eagle3lab.specdec.load import check_draft, check_engine, load_engine, resolve_engine
from eagle3lab.specdec.stats import AcceptStats, predicted_speedup


@dataclasses.dataclass
class Arm:
    """One drafter configuration to measure. `draft`: a path, or an `OpenedDrafter`
    (formats/opened.py) that arms sharing a drafter share."""

    name: str
    draft: str | OpenedDrafter | None
    features: str = "fused"
    load_as: str | None = None


def fastest_cpu_dtype() -> str:
    """The dtype that decodes fastest on this CPU: bfloat16 where the CPU has native bf16
    (avx512_bf16 / AMX; with one thread it is the fastest for plain decoding too, and its
    verify cost hardly grows with the tokens verified), else float32 (emulated bf16 is
    several times slower). Measured on a 2-core EPYC with avx512_bf16: plain step 28-30 ms
    in bf16 on one thread vs 42-48 ms in fp32; verifying 4 tokens 30 ms vs 68 ms."""
    try:
        flags = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return "float32"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def prompt_ids(tokenizer, prompts: Any, limit: int | None, max_prompt_tokens: int,
               renderer: Renderer | None = None) -> list:
    """Chat-templated prompt ids (rendered by `renderer`, default: the tokenizer's template,
    no system message); over-long prompts are truncated (kept: their end) with a warning,
    never an error. prompts: a prompts spec ('eval', a file) or loaded `Prompt`s."""
    out = []
    loaded = prompts if isinstance(prompts, list) else load_prompts(prompts, limit=limit)
    for p in loaded:
        ids = chat_prompt_ids(tokenizer, p.prompt, renderer=renderer)
        if len(ids) > max_prompt_tokens:
            print(f"warning: prompt {p.id} has {len(ids)} tokens, more than the "
                  f"{max_prompt_tokens} that fit; truncated to its last {max_prompt_tokens}.")
            ids = ids[-max_prompt_tokens:]
        out.append((p.id, ids))
    return out


def measure_acceptance(
    *, target: Any = DEFAULT_TARGET, draft: str | os.PathLike | OpenedDrafter | None = None,
    arms: list[Arm] | None = None, prompts: str | os.PathLike = "eval", limit: int | None = 24,
    max_new_tokens: int = 128, steps: int = 3, topk: int = 1, draft_tokens: int | None = None,
    temperature: float = 0.0, seed: int = 0, device: str = "auto", dtype: str = "float32",
    threads: int = 0, progress: bool = True, engine: str = "eager", batch_size: int = 1,
    compile: bool = False, render_as: Any = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Decode `prompts` plainly and with each arm; return raw counts, rates and speedups.

    draft: one drafter checkpoint (a single healthy arm); arms: several configurations.
    A drafter (a path, or an `OpenedDrafter`: eagle3lab.formats.opened) is located and its
    headers read once per measurement, however many arms share it.
    threads: torch CPU threads for this measurement (0: leave as is; restored after).
    engine: "eager" (HF forwards, dynamic caches: any target, the CPU path), "static"
    (static KV caches, CUDA graphs on a GPU: eagle3lab.specdec.batched) or "auto" (static
    on a GPU where the target is supported). batch_size (static engine): prompts in flight;
    above 1 the plain run and each arm decode all prompts batched, one after the other,
    and `result["batch"]` holds their throughput (a batch-B speedup); at 1 prompts are
    interleaved plain/arms and the speed figures are batch-1 figures. compile (static
    engine on a GPU): torch.compile each captured step (fused kernels; slower start).
    render_as: how the prompts are rendered, as serving will render them (a preset, a
    settings or Jinja file, `RenderSettings`: `eagle3lab.data.rendering.load_render_settings`;
    "trained": as the drafter's record says; None: the tokenizer's template, no system
    message); recorded as `result["rendering"]`.
    on_progress(counts): called as the measurement advances, with the cumulative raw counts
    so far (`progress_counts`), at batch size 1 after every prompt (plain and every arm
    decoded it): a caller that saves them keeps what was measured when the run is
    stopped (batched, the result only).
    Warm-up: `result["plain"]["capture_s"]` and each arm's `capture_s` are the seconds its
    static engine spent capturing step graphs (torch.compile included), `captures` how many
    (0 for the eager engine); they are left out of decode_s and tokens/s.
    """
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        out = _measure(target=target, draft=draft, arms=arms, prompts=prompts, limit=limit,
                       max_new_tokens=max_new_tokens, steps=steps, topk=topk,
                       draft_tokens=draft_tokens, temperature=temperature, seed=seed,
                       device=device, dtype=dtype, progress=progress, engine=engine,
                       batch_size=batch_size, compile=compile, render_as=render_as,
                       on_progress=on_progress)
    finally:
        torch.set_num_threads(before)
    out["settings"]["threads"] = threads or before
    return out


def _measure(*, target, draft, arms, prompts, limit, max_new_tokens, steps, topk,
             draft_tokens, temperature, seed, device, dtype, progress, engine,
             batch_size, compile, render_as=None, on_progress=None) -> dict[str, Any]:
    # Everything that can be checked without the target is checked before loading it.
    for name, value in (("max_new_tokens", max_new_tokens), ("steps", steps), ("topk", topk)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{name} (--{name.replace('_', '-')}) must be a whole number of at "
                            f"least 1, got {value!r}.")
    check_engine(engine)
    check_batch_size(batch_size)
    if str(render_as) != TRAINED:
        load_render_settings(render_as)  # a bad preset or file: before any loading
    if temperature < 0:
        raise UserError(f"temperature (--temperature) must be >= 0 (0 = greedy), got "
                        f"{temperature!r}.")
    if arms is None:
        if draft is None:
            raise UserError("Give a drafter checkpoint (draft=...) or a list of arms.")
        arms = [Arm("draft", draft if isinstance(draft, OpenedDrafter) else str(draft))]
    # Each distinct drafter is located and its headers read once, here; the checks, the
    # doctor and the loader of every arm on it share that object.
    opened: dict[Any, OpenedDrafter] = {}
    try:
        for arm in arms:
            if arm.draft is not None and _key(arm.draft) not in opened:
                opened[_key(arm.draft)] = check_draft(arm.draft)
        if str(render_as) == TRAINED:  # as the (first) drafter's data was rendered
            render_as = _trained_rendering(next(
                (opened[_key(a.draft)] for a in arms if a.draft is not None), None))
            load_render_settings(render_as)  # unknown, or not reproducible here: one line
        return _decode(arms=arms, opened=opened, target=target, prompts=prompts, limit=limit,
                       max_new_tokens=max_new_tokens, steps=steps, topk=topk,
                       draft_tokens=draft_tokens, temperature=temperature, seed=seed,
                       device=device, dtype=dtype, progress=progress, engine=engine,
                       batch_size=batch_size, compile=compile, render_as=render_as,
                       on_progress=on_progress)
    finally:
        _close_opened(arms, opened)


def rendering_of(tokenizer, render_as: Any = None, *, draft: Any = None) -> dict[str, Any]:
    """The rendering record `measure_acceptance(render_as=...)` reports as `rendering`,
    without decoding anything (`trained` read from `draft`'s provenance record), so a
    caller can tell two renderings apart before it measures the second."""
    if str(render_as) == TRAINED:
        d = check_draft(draft) if draft is not None else None
        try:
            render_as = _trained_rendering(d)
        finally:
            if d is not None and owned(draft, d):
                d.close()
    return Renderer.from_settings(tokenizer, render_as).record()


def _trained_rendering(drafter: OpenedDrafter | None) -> dict[str, Any]:
    """`--render-as trained`: the rendering in the drafter's provenance record."""
    if drafter is None:
        raise UserError(f"--render-as {TRAINED} needs a drafter.")
    return record_rendering(drafter.parsed_config.record, str(drafter.path))


def _close_opened(arms: list[Arm], opened: dict[Any, OpenedDrafter]) -> None:
    """Close (and forget) the drafters opened here from paths; those handed in opened are
    the caller's to close."""
    for arm in arms:
        d = opened.pop(_key(arm.draft), None) if arm.draft is not None else None
        if d is not None and owned(arm.draft, d):
            d.close()


def _key(draft: Any) -> Any:
    """Arms on the same drafter (the same object, or the same path as given) share it."""
    return draft if isinstance(draft, OpenedDrafter) else str(draft)


def _given(draft: Any) -> Any:
    """The drafter as the caller named it (the result's `draft`)."""
    return draft.given if isinstance(draft, OpenedDrafter) else draft


def _decode(*, arms, opened, target, prompts, limit, max_new_tokens, steps, topk,
            draft_tokens, temperature, seed, device, dtype, progress, engine, batch_size,
            compile, render_as=None, on_progress=None) -> dict[str, Any]:
    from tqdm.auto import tqdm

    # lazy: a test patches eagle3lab.targets.adapter.load_target
    from eagle3lab.targets.adapter import Target, load_target

    texts = load_prompts(prompts, limit=limit)
    tgt = target if isinstance(target, Target) else load_target(target, device=device,
                                                                   dtype=dtype)
    ctx = tgt.max_position_embeddings or 4096
    renderer = Renderer.from_settings(tgt.tokenizer, render_as)  # as serving will render
    plist = prompt_ids(tgt.tokenizer, texts, limit, max(16, ctx - max_new_tokens - 1),
                       renderer)
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature)
    t0 = time.time()

    kind = resolve_engine(engine, tgt)
    if kind == "eager" and batch_size > 1:
        raise UserError("batch size > 1 needs the static engine (--engine static); the eager "
                        "engine decodes one prompt at a time.")
    ekw = dict(engine=kind, batch_size=batch_size, compile=compile)
    plain = load_engine(target=tgt, **ekw)
    engines = [load_engine(target=tgt, draft=opened[_key(arm.draft)] if arm.draft is not None
                           else None, steps=steps, topk=topk,
                           draft_tokens=draft_tokens, features=arm.features, load_as=arm.load_as,
                           **ekw)
               for arm in arms]
    _close_opened(arms, opened)  # every engine holds its own copy of the weights now
    plain_results: list = []
    arm_results: list[list] = [[] for _ in arms]
    batch: dict[str, Any] | None = None
    if batch_size > 1:
        # Batched: all prompts plainly, then all with each arm; throughput = tokens / wall.
        ids_list = [ids for _, ids in plist]
        seeds = [seed + i for i in range(len(plist))]
        runs = []
        for name, eng, sink in [("plain", plain, plain_results)] + [
                (a.name, e, out) for a, e, out in zip(arms, engines, arm_results)]:
            with tqdm(total=len(plist), desc=f"decode {name} (batch {batch_size})",
                      disable=not progress) as bar:
                sink.extend(eng.generate_many(ids_list, seeds=seeds,
                                              on_done=lambda *_: bar.update(), **kw))
            runs.append({"name": name, **eng.last_run})
        for r in runs:
            # decoding throughput leaves the one-off graph captures out (as decode_s does);
            # prompts per minute is the whole measurement's rate
            busy = r["wall_s"] - r["capture_s"]
            r["tokens_per_s"] = r["completion_tokens"] / busy if busy > 0 else 0.0
            r["prompts_per_min"] = 60 * r["prompts"] / r["wall_s"] if r["wall_s"] else 0.0
            r["speedup"] = (r["tokens_per_s"] / runs[0]["tokens_per_s"]
                            if runs[0]["tokens_per_s"] else None)
        batch = {"size": batch_size, "runs": runs}
    else:
        # Interleaved: each prompt is decoded plainly, then by every arm, so that a change
        # in machine load affects all of them alike (the ratios are what matter). A static
        # engine sizes its KV cache once, for the longest prompt: grown prompt by prompt,
        # it would drop its captured graphs (and recompile each step with --compile).
        longest = max((len(ids) for _, ids in plist), default=0)
        for eng in [plain, *engines]:
            if plist and hasattr(eng, "reserve"):
                eng.reserve(longest, max_new_tokens)
        for i, (_, ids) in enumerate(tqdm(plist, desc="decode (plain + arms)",
                                          disable=not progress)):
            plain_results.append(plain.generate(ids, seed=seed + i, **kw))
            for j, eng in enumerate(engines):
                arm_results[j].append(eng.generate(ids, seed=seed + i, **kw))
            if on_progress is not None:
                on_progress(progress_counts(len(plist), ("plain", plain, plain_results),
                                            [(a.name, e, out) for a, e, out in
                                             zip(arms, engines, arm_results)]))
    plain_stats = AcceptStats.from_results(plain_results)
    plain_steps = sum(max(r.completion_tokens - 1, 1) for r in plain_results)
    plain_step_s = plain_stats.decode_s / plain_steps
    out: dict[str, Any] = {
        "target": tgt.describe(), "prompts": str(prompts), "requests": len(plist),
        "rendering": renderer.record(),
        "settings": {"steps": steps, "topk": topk, "draft_tokens": draft_tokens,
                     "temperature": temperature, "max_new_tokens": max_new_tokens,
                     "seed": seed, "dtype": str(tgt.dtype).replace("torch.", ""),
                     "engine": kind, "batch_size": batch_size,
                     "device": str(tgt.device)},
        "plain": {"completion_tokens": plain_stats.completion_tokens,
                  "decode_s": plain_stats.decode_s, "tokens_per_s": plain_stats.tokens_per_s,
                  "step_s": plain_step_s, **warmup(plain)},
        "arms": [],
    }
    if batch is not None:
        out["batch"] = batch
    for arm, eng, results in zip(arms, engines, arm_results):
        st = AcceptStats.from_results(results)
        verify_step = st.verify_s / st.verify_ct if st.verify_ct else 0.0
        draft_step = st.draft_s / st.verify_ct if st.verify_ct else 0.0
        same = sum(a.output_ids == b.output_ids for a, b in zip(results, plain_results))
        out["arms"].append({
            "name": arm.name, "draft": _given(arm.draft), "features": arm.features,
            "load_as": arm.load_as, "num_draft_tokens": eng.num_draft_tokens,
            "stats": st.to_dict(),
            "matches_plain": same,
            "speedup_measured": st.tokens_per_s / plain_stats.tokens_per_s
            if plain_stats.tokens_per_s else None,
            "speedup_predicted": predicted_speedup(
                tau=st.tau, plain_step_s=plain_step_s, verify_step_s=verify_step,
                draft_per_verify_s=draft_step),
            "speedup_ceiling": predicted_speedup(
                tau=steps + 1, plain_step_s=plain_step_s, verify_step_s=verify_step,
                draft_per_verify_s=draft_step),
            "verify_step_s": verify_step, "draft_per_verify_s": draft_step,
            **warmup(eng),
            "per_request": per_request_records(plist, texts, results, plain_results,
                                               tgt.tokenizer),
        })
    out["seconds"] = time.time() - t0
    return out


def warmup(engine) -> dict[str, Any]:
    """{"capture_s": seconds `engine` spent capturing step graphs so far (torch.compile
    included: its warm-up, left out of decode_s), "captures": how many}; 0 for an engine
    that captures nothing (the eager engine, or the static one off a GPU)."""
    g = getattr(engine, "graphs", None)
    return {"capture_s": getattr(g, "capture_s", 0.0), "captures": getattr(g, "captures", 0)}


def progress_counts(prompts: int, plain: tuple, arms: list[tuple]) -> dict[str, Any]:
    """A measurement's cumulative raw counts so far (what `on_progress` gets): plain and
    arms are (name, engine, results so far); tokens/s and the ratios are taken from the
    summed counts."""
    def side(name, eng, results) -> tuple[AcceptStats, dict[str, Any]]:
        st = AcceptStats.from_results(results)
        return st, {"name": name, "requests": st.requests,
                    "completion_tokens": st.completion_tokens, "verify_ct": st.verify_ct,
                    "decode_s": st.decode_s, "tokens_per_s": st.tokens_per_s, **warmup(eng)}

    _, p = side(*plain)
    out = {"prompts": prompts, "prompts_done": p["requests"], "plain": p, "arms": []}
    for arm in arms:
        st, a = side(*arm)
        a["tau"] = st.tau
        a["speedup_measured"] = (a["tokens_per_s"] / p["tokens_per_s"]
                                 if p["tokens_per_s"] else None)
        out["arms"].append(a)
    return out


#: decoded mismatches kept per request (all of them stay as ids in `mismatches`)
SHOWN_MISMATCHES = 5


def per_request_records(plist: list, texts: list, results: list, plain_results: list,
                        tokenizer) -> list[dict[str, Any]]:
    """One record per prompt: raw counts (completion tokens, verify steps, the accept
    histogram: acceptance per position follows from it), the prompt (text, category,
    length in tokens), what the target said (its plain output, decoded) and the rejected
    drafts (either engine keeps them): `mismatches` as ids and the
    first `SHOWN_MISMATCHES` decoded, draft tokens beside the target's tokens at that
    position (eagle3lab.measure.weakspots ranks and exports these)."""
    out = []
    for (pid, ids), p, r, plain in zip(plist, texts, results, plain_results):
        said = list(plain.output_ids)
        shown = []
        for pos, drafts, _tok in (r.mismatches or [])[:SHOWN_MISMATCHES]:
            shown.append({
                "position": pos,
                "before": tokenizer.decode(r.output_ids[max(0, pos - 12):pos]),
                "draft": tokenizer.decode(drafts),
                "target": tokenizer.decode(r.output_ids[pos:pos + max(1, len(drafts))])})
        out.append({"prompt": pid, "text": p.prompt, "category": p.category,
                    "prompt_tokens": len(ids), "completion_tokens": r.completion_tokens,
                    "verify_ct": r.verify_ct, "accept_length": r.accept_length,
                    "accept_histogram": r.accept_histogram,
                    "num_draft_tokens": r.num_draft_tokens,
                    "target_text": tokenizer.decode(said, skip_special_tokens=True),
                    "mismatches": r.mismatches, "mismatches_shown": shown})
    return out


def measure_chain_lengths(*, target: Any, arm: Arm, chain_lengths: list[int],
                          **settings: Any) -> list[dict[str, Any]]:
    """tau per chain length g: `arm` measured with chain drafting (top-k 1, g drafts per
    verify step) once per distinct g, shortest first; `settings` as for
    `measure_acceptance` (their steps/topk/draft_tokens are replaced). Each point:
    {"steps": g, "tau", "conditional": per-position conditional acceptance}."""
    points = []
    drafter = check_draft(arm.draft) if arm.draft is not None else None  # once for all g
    try:
        for g in sorted(set(chain_lengths)):
            r = measure_acceptance(target=target, arms=[dataclasses.replace(arm, draft=drafter)],
                                   **{**settings, "steps": g, "topk": 1, "draft_tokens": None},
                                   progress=False)
            st = r["arms"][0]["stats"]
            points.append({"steps": g, "tau": st["tau"],
                           "conditional": st["acceptance_conditional"]})
    finally:
        if drafter is not None and owned(arm.draft, drafter):
            drafter.close()
    return points


def measure_speed(*, target: Any, draft: str, dtype: str = "auto", threads: int = 1,
                  source: str | os.PathLike | None = None,
                  **settings: Any) -> dict[str, Any] | None:
    """`draft` against plain decoding in this machine's fastest configuration: on a CPU
    `dtype="auto"` is `fastest_cpu_dtype()` with `threads` torch threads, elsewhere the
    loaded target's dtype; another dtype reloads the target from `source` (default: its
    path). `dtype="none"` skips the measurement (None). `settings` as for
    `measure_acceptance`."""
    # lazy: a test patches eagle3lab.targets.adapter.load_target
    from eagle3lab.targets.adapter import load_target

    if dtype == "none":
        return None
    cpu, current = str(target.device) == "cpu", str(target.dtype).replace("torch.", "")
    chosen = (fastest_cpu_dtype() if cpu else current) if dtype == "auto" else dtype
    fast = target if chosen == current else load_target(source or target.path, dtype=chosen)
    return measure_acceptance(target=fast, arms=[Arm("healthy", draft)], **settings,
                              threads=threads if cpu else 0, progress=False)


def summary_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm: tau, per-position acceptance, tokens/s and speedups."""
    rows = []
    for a in result["arms"]:
        st = a["stats"]
        row = {"arm": a["name"], "features": a["features"], "load_as": a["load_as"] or "native",
               "tau": round(st["tau"], 3),
               "plain tok/s": round(result["plain"]["tokens_per_s"], 2),
               "spec tok/s": round(st["tokens_per_s"], 2),
               "speedup": round(a["speedup_measured"] or 0, 3),
               "predicted": round(a["speedup_predicted"], 3),
               "ceiling": round(a["speedup_ceiling"], 3),
               "same as plain": f"{a['matches_plain']}/{result['requests']}"}
        for k, v in enumerate(st["acceptance_cumulative"], 1):
            row[f"acc@{k}"] = round(v, 3)
        rows.append(row)
    return rows
