"""A real vLLM under eagle3lab: every prediction the workbench makes about serving, checked
against the engine, on one GPU, in one run per stage set.

Run on the H200 after the recipe (docs/vllm.md: bench/vllm_carry.py, bench/vllm_device.py):

    . /root/e3l/env.sh
    python3 -P bench/vllm_check.py --stages accept,faults,regen --out $OUT     # call 1
    python3 -P bench/vllm_check.py --stages startup,speed,load --out $OUT      # call 2

Every vLLM server is started through eagle3lab's launcher (`serving.launch.start`: the
launch's preflight first, its own process group, RUN/NAME.log) and watched by its watchdog
(`Watchdog.wait`: phases, ready/hung/crashed); every request goes through eagle3lab's
clients (`data.remote.ServerGenerator` for token ids in/out, `measure.loadgen` for the
concurrency sweep); /metrics through `measure.prometheus`; the offline side is the static
engine (`specdec.batched`) on the same GPU.

Stages:
- smoke:   one speculative server (k=3, eager), 8 prompts, /metrics: the recipe's check.
- accept:  greedy, the same held-out prompts, k=3 and k=5 (bf16) and k=3 (fp32): vLLM's
           per-position acceptance from two /metrics scrapes vs the offline engine's
           prediction for the same prompt ids (`measure.agreement`), outputs compared.
- faults:  planted faults, one server each: preflight's verdict of the exact command
           before the launch, the offline engine's prediction with the drafter loaded as
           vLLM loads it (`load_as="vllm"`), then vLLM: refused or served, and the served
           accept length.
- regen:   `eagle3lab regenerate --server` (the CLI) against vLLM vs in-process greedy.
- startup: servers with vLLM's defaults (torch.compile + CUDA graphs): start-up times
           beside the eager ones.
- speed:   batch 1, the same prompts and tokens: vLLM plain (graphs) vs the static
           engine's plain; vLLM speculative vs the engine's speculative.
- load:    `loadgen.sweep` at 1, 4 and 16 in flight, speculative vs plain.
Writes OUT/results.json (every number, with the commands and versions) and
OUT/servers.tar.gz (logs, launch and watch records, /metrics captures).
`--engine reference` runs the same orchestration against eagle3lab's reference server on
a CPU (a dry run of this script; its numbers are not vLLM's).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
#: The SGLang-servable shipped drafter (TTT 5, norm flags false): the one the recorded run
#: (tests/serverlogs/fixtures/vllm-0.25.1/) used; its faults convert it to SGLang's format
#: and drop its norm_before_residual, and its k=5 arm is within its trained depth. (The
#: default drafter, the study's winner, is normed, TTT 3 and not convertible to SGLang.)
DRAFTER = ROOT / "data" / "drafters" / "smollm2-135m-instruct-sglang"
T0 = time.monotonic()
_print_lock = threading.Lock()


def say(*a) -> None:
    with _print_lock:
        print(f"[{time.monotonic() - T0:6.1f} s]", *a, flush=True)


@dataclasses.dataclass
class Arm:
    """One server: the drafter (None: plain), num_speculative_tokens, dtype, eager or not."""

    name: str
    draft: str | None = None
    steps: int = 3
    dtype: str = "bfloat16"
    eager: bool = True
    extra: list[str] = dataclasses.field(default_factory=list)
    fault: str | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Ctx:
    engine: str
    target: str
    run_dir: Path
    out: Path
    limit: int
    max_new_tokens: int
    deadline: float
    kv_bytes: int
    results: dict = dataclasses.field(default_factory=dict)
    _tgt: dict = dataclasses.field(default_factory=dict)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(_clean(self.results), indent=1, default=_jsonable,
                                  allow_nan=False))
        tmp.rename(self.out / "results.json")

    def target_model(self, dtype: str):
        """The target, loaded once per dtype on this process's device."""
        if dtype not in self._tgt:
            from eagle3lab.targets.adapter import load_target

            device = "cuda" if self.engine == "vllm" else "cpu"
            self._tgt[dtype] = load_target(self.target, device=device, dtype=dtype)
        return self._tgt[dtype]


def _clean(x):
    """NaN -> null (valid JSON for every reader); containers walked."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _jsonable(x):
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


# --- servers ------------------------------------------------------------------------------
def launch_config(ctx: Ctx, arm: Arm):
    from eagle3lab.engines.argv import LaunchConfig

    if ctx.engine == "reference":
        return LaunchConfig(engine="reference", target=ctx.target, draft=arm.draft,
                            steps=arm.steps, port=0, device="cpu", env=arm.env,
                            extra_args=["--served-model-name", "smollm2"])
    extra = ["--dtype", arm.dtype, "--max-model-len", "2048", "--seed", "0",
             "--gpu-memory-utilization", "0.04", "--kv-cache-memory-bytes", str(ctx.kv_bytes),
             "--served-model-name", "smollm2", *arm.extra]
    env = {k: os.environ[k] for k in ("PYTHONPATH", "VLLM_USE_FLASHINFER_SAMPLER",
                                      "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK") if k in os.environ}
    env.update(arm.env)
    return LaunchConfig(engine="vllm", target=ctx.target, draft=arm.draft, steps=arm.steps,
                        cuda_graph=not arm.eager, port=0, python=sys.executable, env=env,
                        extra_args=extra)


def run_arm(ctx: Ctx, arm: Arm, work: Callable[[str], dict] | None) -> dict:
    """Preflight the exact launch, start it (forced: faults launch for real), watch it to a
    verdict, run `work(url)` when ready, stop it, read its log."""
    from eagle3lab.preflight.run import preflight_launch
    from eagle3lab.serverlogs.analyzer import analyse_log
    from eagle3lab.serving.launch import start

    cfg = launch_config(ctx, arm)
    rec: dict[str, Any] = {"arm": dataclasses.asdict(arm)}
    report = None
    if arm.draft:
        t = time.perf_counter()
        report = preflight_launch(cfg)
        errors = [f.code for f in report.findings if f.severity == "error"]
        warns = [f.code for f in report.findings if f.severity == "warning"]
        rec["preflight"] = {"ok": report.ok, "errors": errors, "warnings": warns,
                            "not_judged": bool(getattr(report, "not_judged", False)),
                            "messages": [f"{f.severity} [{f.code}] {f.message}"
                                         for f in report.findings
                                         if f.severity in ("error", "warning")],
                            "seconds": round(time.perf_counter() - t, 2)}
        say(f"{arm.name}: preflight {'OK' if report.ok else 'NOT OK'} errors={errors} "
            f"warnings={warns}")
    handle = start(cfg, run_dir=ctx.run_dir, name=arm.name, force=True, preflight=report)
    rec["argv"] = handle.argv
    try:
        st = handle.watchdog(silence_s=240, poll_s=0.5).wait(
            timeout_s=max(30.0, min(ctx.left() - 60, 420)))
        rec["watch"] = {"verdict": st["verdict"], "reason": st["reason"],
                        "phase": st["phase"], "startup_s": st["elapsed_s"],
                        "events": [e for e in st["events"] if e["event"].startswith(
                            ("phase", "verdict", "health"))]}
        say(f"{arm.name}: {st['verdict']} after {st['elapsed_s']:.0f} s ({st['reason']})")
        if st["verdict"] == "ready" and work is not None:
            try:
                rec["work"] = work(handle.url)
            except Exception as e:  # a failed workload is a result of this arm
                rec["work_error"] = f"{type(e).__name__}: {e}"
                rec["work_traceback"] = traceback.format_exc()[-2000:]
                say(f"{arm.name}: workload failed: {rec['work_error']}")
    finally:
        rec["stop"] = handle.stop(grace_s=20)
    time.sleep(0.5)
    log = analyse_log(handle.log_path, silence_s=1e9)
    rec["log"] = {k: log.get(k) for k in ("format", "verdict", "phase", "crash", "speculative")}
    rec["log"]["phases"] = [p["phase"] for p in log.get("phases", [])]
    rec["log"]["decode_rows"] = len(log.get("decode") or [])
    rec["log"]["spec_rows"] = [d for d in (log.get("decode") or [])
                               if d.get("accept_len") is not None][-3:]
    rec["log"]["findings"] = [(f["severity"], f["code"], f["message"][:300])
                              for f in log.get("findings", [])]
    rec["log"]["facts"] = log.get("facts")
    rec["log"]["tail"] = handle.log_path.read_text(errors="replace").splitlines()[-25:]
    return rec


def jobs_for(ctx: Ctx, limit: int, dtype: str = "bfloat16") -> tuple[list, set[int]]:
    """The held-out prompts as chat-templated ids (the same ids for server and engine)."""
    from eagle3lab.specdec.accept import prompt_ids

    tgt = ctx.target_model(dtype)
    plist = prompt_ids(tgt.tokenizer, "eval", limit, 2048 - ctx.max_new_tokens - 8)
    eos = tgt.model.generation_config.eos_token_id
    stops = set(eos if isinstance(eos, list) else [eos]) - {None}
    return plist, stops


def serve_requests(ctx: Ctx, url: str, plist: list, stops: set[int], *, max_new_tokens: int,
                   concurrency: int, name: str) -> dict:
    """Greedy token-id requests through `ServerGenerator`, two /metrics scrapes around
    them; outputs, the window and the raw scrapes (saved beside the logs)."""
    from eagle3lab.data.remote import ServerGenerator
    from eagle3lab.measure.prometheus import parse_metrics, scrape_text, window

    gen = ServerGenerator(url, api="openai", concurrency=concurrency, retries=1)
    gen.identity()
    before_text = scrape_text(url)
    before = {"t": time.monotonic(), **parse_metrics(before_text)}
    outs: dict[int, list[int]] = {}
    sp = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "top_p": 1.0, "seed": 0,
          "stop_token_ids": sorted(stops)}
    t = time.perf_counter()
    gen.generate_ordered([(pid, ids, sp) for pid, ids in plist],
                         lambda i, ids, finish: outs.__setitem__(i, ids))
    wall = time.perf_counter() - t
    time.sleep(1.0)  # the engine core publishes its stats to the API process each step
    after_text = scrape_text(url)
    after = {"t": time.monotonic(), **parse_metrics(after_text)}
    (ctx.run_dir / f"{name}.metrics.before.txt").write_text(before_text)
    (ctx.run_dir / f"{name}.metrics.after.txt").write_text(after_text)
    win = window(before, after)
    tokens = sum(len(v) for v in outs.values())
    say(f"{name}: {len(outs)} requests, {tokens} tokens in {wall:.1f} s; /metrics accept "
        f"length {win['accept_length']:.3f} per position {win['per_position']}")
    return {"outputs": [outs[i] for i in range(len(plist))], "window": win,
            "wall_s": wall, "completion_tokens": tokens, "requests": len(plist),
            "client": gen.stats}


# --- offline predictions ------------------------------------------------------------------
def offline(ctx: Ctx, *, draft: str | None, steps: int, dtype: str, plist: list,
            stops: set[int], max_new_tokens: int, batch_size: int = 16,
            load_as: str | None = None, topk: int = 1,
            draft_tokens: int | None = None) -> dict:
    """The static engine (eager engine on a CPU) on the same prompt ids: outputs and counts."""
    from eagle3lab.specdec.load import load_engine
    from eagle3lab.specdec.stats import AcceptStats

    tgt = ctx.target_model(dtype)
    kind = "static" if ctx.engine == "vllm" else "eager"
    eng = load_engine(target=tgt, draft=draft, steps=steps, topk=topk,
                      draft_tokens=draft_tokens, engine=kind,
                      batch_size=batch_size if kind == "static" else 1, load_as=load_as)
    ids = [p for _, p in plist]
    t = time.perf_counter()
    if kind == "static":
        res = eng.generate_many(ids, max_new_tokens=max_new_tokens, temperature=0.0,
                                seeds=list(range(len(ids))), stop_token_ids=stops)
    else:
        res = [eng.generate(p, max_new_tokens=max_new_tokens, temperature=0.0, seed=i,
                            stop_token_ids=stops) for i, p in enumerate(ids)]
    wall = time.perf_counter() - t
    st = AcceptStats.from_results(res)
    return {"outputs": [r.output_ids for r in res], "histogram": st.histogram,
            "verify_ct": st.verify_ct, "completion_tokens": st.completion_tokens,
            "tau": st.tau, "accept_length": 1 + st.mean_accepted,
            "cumulative": st.cumulative(), "wall_s": wall,
            "last_run": getattr(eng, "last_run", None)}


def same_outputs(a: list[list[int]], b: list[list[int]]) -> dict:
    """How many outputs are identical, and where the others first differ."""
    first = []
    for x, y in zip(a, b):
        if x != y:
            first.append(next((i for i, (u, v) in enumerate(zip(x, y)) if u != v),
                              min(len(x), len(y))))
    return {"n": len(a), "identical": len(a) - len(first),
            "first_difference_at": sorted(first)[:20]}


# --- stages -------------------------------------------------------------------------------
def stage_smoke(ctx: Ctx) -> dict:
    plist, stops = jobs_for(ctx, 8)
    return run_arm(ctx, Arm("smoke-k3", str(DRAFTER), 3), lambda url: serve_requests(
        ctx, url, plist, stops, max_new_tokens=64, concurrency=8, name="smoke-k3"))


def stage_accept(ctx: Ctx, pool, futures: dict, regen: bool) -> Callable[[], dict]:
    """Servers first (they start in the background), offline predictions meanwhile. With
    `regen`, the k=3 servers (bf16, fp32) also answer `eagle3lab regenerate --server`."""
    arms = [Arm("spec-k3", str(DRAFTER), 3), Arm("spec-k5", str(DRAFTER), 5),
            Arm("spec-k3-fp32", str(DRAFTER), 3, dtype="float32")]
    plist, stops = jobs_for(ctx, ctx.limit)

    def work(url: str, arm: Arm) -> dict:
        rec = serve_requests(ctx, url, plist, stops, max_new_tokens=ctx.max_new_tokens,
                             concurrency=64, name=arm.name)
        if regen and arm.steps == 3:
            rec["regen"] = stage_regen(ctx, arm.dtype, url)
        return rec

    for arm in arms:
        futures[arm.name] = pool.submit(run_arm, ctx, arm, lambda url, a=arm: work(url, a))

    def finish() -> dict:
        out, plain = {}, {}
        for arm in arms:
            say(f"offline prediction for {arm.name} ...")
            try:
                pred = offline(ctx, draft=str(DRAFTER), steps=arm.steps, dtype=arm.dtype,
                               plist=plist, stops=stops, max_new_tokens=ctx.max_new_tokens,
                               batch_size=32)
                if arm.dtype not in plain:
                    plain[arm.dtype] = offline(ctx, draft=None, steps=1, dtype=arm.dtype,
                                               plist=plist, stops=stops, batch_size=32,
                                               max_new_tokens=ctx.max_new_tokens)
            except Exception as e:
                out[arm.name] = {"offline_error": f"{type(e).__name__}: {e}",
                                 "traceback": traceback.format_exc()[-2000:]}
                continue
            say(f"offline {arm.name}: accept length {pred['accept_length']:.3f} "
                f"cumulative {[round(x, 3) for x in pred['cumulative']]}")
            out[arm.name] = {"offline": {k: v for k, v in pred.items() if k != "outputs"},
                             "offline_vs_plain": same_outputs(pred["outputs"],
                                                              plain[arm.dtype]["outputs"]),
                             "_pred": pred["outputs"], "_plain": plain[arm.dtype]["outputs"]}
        return out

    return finish


def compare_accept(served: dict[str, dict], predicted: dict[str, dict]) -> dict:
    from eagle3lab.measure.agreement import (compare, counts_from_histogram, counts_from_window,
                                             table)

    out = {}
    for name, rec in served.items():
        pred = predicted.get(name, {})
        row = {"server": {k: v for k, v in rec.items() if k != "work"},
               **{k: v for k, v in pred.items() if not k.startswith("_")}}
        work = rec.get("work")
        if work and "offline" in pred:
            cmp = compare(counts_from_histogram(pred["offline"]["histogram"]),
                          counts_from_window(work["window"]))
            row["comparison"] = cmp
            row["comparison_table"] = table(cmp)
            row["vllm_vs_offline_outputs"] = same_outputs(work["outputs"], pred["_pred"])
            row["vllm_vs_offline_plain_outputs"] = same_outputs(work["outputs"],
                                                                pred["_plain"])
            row["served"] = {k: v for k, v in work.items() if k not in ("outputs", "regen")}
            say(f"{name}:\n{row['comparison_table']}")
        out[name] = row
    return out


FAULTS = {
    "aux-ids-sglang-convention": "eagle_aux_hidden_state_layer_ids written for SGLang "
                                 "(layer outputs [1, 14, 26]) instead of vLLM's capture points",
    "d2t-dropped": "the d2t tensor removed from model.safetensors",
    "t2d-dropped": "the t2d tensor removed (vLLM skips t2d anyway)",
    "last-layer-features": "fc in-features = hidden (576): a drafter trained on the last "
                           "layer's state alone",
    "norm-before-residual-dropped": "norm_before_residual removed from config.json (vLLM "
                                    "then defaults it to true; trained false)",
    "midlayer-keys": "decoder keys renamed layers.0.* -> midlayer.* (SGLang's layout)",
    "k8-vs-trained": "num_speculative_tokens 8, beyond the 5 the drafter records",
    "sglang-format": "the drafter converted to SGLang's format (eagle3lab convert --to "
                     "sglang: midlayer keys, eagle_config ids [1, 14, 26])",
    "sglang-format-v1": "the same, served with VLLM_USE_V2_MODEL_RUNNER=0 (V1 runner)",
    "missing-path": "a drafter path that does not exist (/tmp/nope)",
}


def plant(kind: str, src: Path, dst: Path, target: str) -> tuple[str, int, dict]:
    """A copy of the shipped drafter with one fault: (drafter dir, num_speculative_tokens,
    environment for the server)."""
    from safetensors.torch import load_file, save_file

    if kind == "missing-path":
        return "/tmp/nope", 3, {}
    if kind.startswith("sglang-format"):
        from eagle3lab.formats.convert import convert_checkpoint

        convert_checkpoint(src, dst, to="sglang", target=target)
        return str(dst), 3, ({"VLLM_USE_V2_MODEL_RUNNER": "0"} if kind.endswith("-v1")
                             else {})
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    tensors = load_file(str(dst / "model.safetensors"))
    steps = 3
    if kind == "aux-ids-sglang-convention":
        cfg["eagle_aux_hidden_state_layer_ids"] = [1, 14, 26]
    elif kind == "d2t-dropped":
        tensors.pop("d2t")
    elif kind == "t2d-dropped":
        tensors.pop("t2d")
    elif kind == "last-layer-features":
        tensors["fc.weight"] = tensors["fc.weight"][:, :cfg["transformer_layer_config"][
            "hidden_size"]].contiguous()
    elif kind == "norm-before-residual-dropped":
        cfg.pop("norm_before_residual", None)
    elif kind == "midlayer-keys":
        tensors = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
                   for k, v in tensors.items()}
    elif kind == "k8-vs-trained":
        steps = 8
    else:
        raise ValueError(kind)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return str(dst), steps, {}


def stage_faults(ctx: Ctx, pool, futures: dict, kinds: list[str]) -> Callable[[], dict]:
    plist, stops = jobs_for(ctx, min(32, ctx.limit))
    max_new = min(128, ctx.max_new_tokens)
    tmp = Path(tempfile.mkdtemp(prefix="faults-", dir=ctx.run_dir))
    arms = []
    for kind in kinds:
        d, steps, env = plant(kind, DRAFTER, tmp / kind, ctx.target)
        arm = Arm(f"fault-{kind}", d, steps, fault=kind, env=env)
        arms.append(arm)
        futures[arm.name] = pool.submit(run_arm, ctx, arm, lambda url, a=arm: serve_requests(
            ctx, url, plist, stops, max_new_tokens=max_new, concurrency=32, name=a.name))

    def finish() -> dict:
        out = {}
        for arm in arms:
            rec: dict[str, Any] = {"what": FAULTS[arm.fault]}
            try:
                pred = offline(ctx, draft=arm.draft, steps=arm.steps, dtype="bfloat16",
                               plist=plist, stops=stops, max_new_tokens=max_new, load_as="vllm")
                rec["offline_as_vllm"] = {k: pred[k] for k in ("accept_length", "tau",
                                                                 "cumulative", "verify_ct")}
            except Exception as e:  # the offline engine refusing is a prediction too
                rec["offline_as_vllm"] = {"refused": f"{type(e).__name__}: {e}"[:600]}
            say(f"{arm.name}: offline as vLLM {rec['offline_as_vllm']}")
            out[arm.name] = rec
        return out

    return finish


def stage_regen(ctx: Ctx, dtype: str, url: str) -> dict:
    """`eagle3lab regenerate --server` (the CLI, as a user runs it) against `url` vs the
    same CLI in-process in `dtype`: the records compared field by field."""
    d = ctx.run_dir / f"regen-{dtype}"
    d.mkdir(exist_ok=True)
    base = [sys.executable, "-m", "eagle3lab", "regenerate", "--prompts", "eval",
            "--limit", str(min(16, ctx.limit)), "--max-new-tokens", str(ctx.max_new_tokens),
            "--target", ctx.target, "--no-progress"]
    t = time.perf_counter()
    srv = subprocess.run(base + ["--out", str(d / "server.jsonl"), "--server", url,
                                 "--api", "openai", "--concurrency", "16",
                                 "--server-model", "smollm2"],
                         capture_output=True, text=True, cwd=ROOT)
    t_srv = time.perf_counter() - t
    device = "cuda" if ctx.engine == "vllm" else "cpu"
    t = time.perf_counter()
    inp = subprocess.run(base + ["--out", str(d / "inproc.jsonl"), "--device", device,
                                 "--dtype", dtype, "--batch-size", "16"],
                         capture_output=True, text=True, cwd=ROOT)
    t_inp = time.perf_counter() - t
    rec: dict[str, Any] = {"server_rc": srv.returncode, "inproc_rc": inp.returncode,
                           "server_s": round(t_srv, 1), "inproc_s": round(t_inp, 1),
                           "server_tail": (srv.stdout + srv.stderr)[-800:],
                           "inproc_tail": (inp.stdout + inp.stderr)[-800:]}
    if srv.returncode == 0 and inp.returncode == 0:
        a = [json.loads(x) for x in (d / "server.jsonl").read_text().splitlines()]
        b = [json.loads(x) for x in (d / "inproc.jsonl").read_text().splitlines()]
        keys = sorted(set(a[0]) & set(b[0]))
        rec["fields"] = keys
        rec["identical_records"] = sum(x == y for x, y in zip(a, b))
        rec["records"] = len(a)
        rec["differing_fields"] = sorted({k for x, y in zip(a, b) for k in keys
                                          if x.get(k) != y.get(k)})
        ids_key = next((k for k in ("input_ids", "ids", "token_ids") if k in keys), None)
        if ids_key:
            rec["ids"] = same_outputs([x[ids_key] for x in a], [y[ids_key] for y in b])
        rec["server_meta"] = _read_json(d / "server.jsonl.meta.json")
        rec["inproc_meta"] = _read_json(d / "inproc.jsonl.meta.json")
    say(f"regen {dtype}: " + json.dumps({k: v for k, v in rec.items()
                                          if "tail" not in k and "meta" not in k}))
    return rec


def _read_json(p: Path):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


# --- call 2: startup, speed, load ---------------------------------------------------------
def stage_call2(ctx: Ctx, stages: set[str]) -> dict:
    """Servers with vLLM's defaults (compile + CUDA graphs), plain and k=3, started together;
    then, one thing at a time: batch-1 speed vs the static engine, and the load sweep."""
    from eagle3lab.measure.loadgen import sweep
    from eagle3lab.serverlogs.analyzer import analyse_log
    from eagle3lab.serving.launch import start

    out: dict[str, Any] = {}
    arms = [Arm("graphs-plain", None, eager=False), Arm("graphs-k3", str(DRAFTER), 3,
                                                        eager=False)]
    if "startup" in stages:  # the same start, eager, started beside them (same contention)
        arms += [Arm("eager-plain", None), Arm("eager-k3", str(DRAFTER), 3)]
    handles, states = {}, {}
    for arm in arms:
        handles[arm.name] = start(launch_config(ctx, arm), run_dir=ctx.run_dir, name=arm.name,
                                  force=True)
    watch = {n: h.watchdog(silence_s=300, poll_s=0.5) for n, h in handles.items()}
    with concurrent.futures.ThreadPoolExecutor(len(watch)) as ex:
        wait_s = max(60.0, min(ctx.left() - 200, 400))  # a start, then ~200 s of measuring
        for n, st in zip(watch, ex.map(lambda w: w.wait(timeout_s=wait_s), watch.values())):
            states[n] = st
            say(f"{n}: {st['verdict']} after {st['elapsed_s']:.0f} s")
    out["startup"] = {n: {"verdict": st["verdict"], "startup_s": st["elapsed_s"],
                          "phase": st["phase"], "reason": st["reason"],
                          "events": [e for e in st["events"] if e["event"].startswith(
                              ("phase", "verdict", "health"))]}
                      for n, st in states.items()}
    for n in [n for n in handles if n.startswith("eager-")]:  # only their start-up counts
        handles[n].stop(grace_s=20)
    try:
        ready = {n for n, st in states.items() if st["verdict"] == "ready"
                 and not n.startswith("eager-")}
        plist, stops = jobs_for(ctx, min(24, ctx.limit))
        max_new = min(128, ctx.max_new_tokens)
        if "speed" in stages:
            out["speed"] = speed(ctx, handles, ready, plist, stops, max_new)
        if "load" in stages and ready and ctx.left() > 60:
            reqs = [{"prompt_id": pid, "input_ids": ids}
                    for pid, ids in jobs_for(ctx, min(32, ctx.limit))[0]]
            loads = {}
            for n in sorted(ready):
                if ctx.left() < 45:
                    break
                levels, _ = sweep(handles[n].url, reqs, levels=(1, 4, 16), arm=n,
                                  api="openai", model="smollm2", max_new_tokens=max_new,
                                  log=say)
                loads[n] = levels.to_dict(orient="records")
            out["load"] = loads
    finally:
        for n, h in handles.items():
            h.stop(grace_s=20)
            log = analyse_log(h.log_path, silence_s=1e9)
            out.setdefault("logs", {})[n] = {
                "verdict": log.get("verdict"), "phases": [p["phase"] for p in
                                                          log.get("phases", [])],
                "findings": [(f["severity"], f["code"]) for f in log.get("findings", [])]}
    return out


def speed(ctx: Ctx, handles: dict, ready: set[str], plist: list, stops: set[int],
          max_new: int) -> dict:
    """Batch 1, greedy, the same prompts and tokens (24 and 128 on the GPU): vLLM (one
    request at a time) then the static engine (batch 1, plain and speculative), nothing
    else running."""
    res: dict[str, Any] = {}
    for n in ("graphs-plain", "graphs-k3"):
        if n not in ready:
            continue
        serve_requests(ctx, handles[n].url, plist[:2], stops, max_new_tokens=16,
                       concurrency=1, name=f"{n}-warmup")
        r = serve_requests(ctx, handles[n].url, plist, stops, max_new_tokens=max_new,
                           concurrency=1, name=f"{n}-speed")
        res[n] = {"tokens": r["completion_tokens"], "wall_s": r["wall_s"],
                  "tok_s": r["completion_tokens"] / r["wall_s"],
                  "accept_length": r["window"]["accept_length"]}
        say(f"vLLM {n} batch 1: {res[n]['tok_s']:.1f} tok/s")
    for name, draft, steps, topk, dtok in (("engine-plain", None, 1, 1, None),
                                          ("engine-3,1,4", str(DRAFTER), 3, 1, None),
                                          ("engine-4,4,12", str(DRAFTER), 4, 4, 12)):
        if ctx.left() < 60:
            break
        pred = offline(ctx, draft=draft, steps=steps, topk=topk, draft_tokens=dtok,
                       dtype="bfloat16", plist=plist, stops=stops, max_new_tokens=max_new,
                       batch_size=1)
        lr = pred["last_run"] or {}
        busy = pred["wall_s"] - lr.get("capture_s", 0.0)
        res[name] = {"tokens": pred["completion_tokens"], "wall_s": pred["wall_s"],
                     "capture_s": lr.get("capture_s"),
                     "tok_s": pred["completion_tokens"] / busy if busy > 0 else math.nan,
                     "accept_length": pred["accept_length"], "tau": pred["tau"]}
        say(f"{name} batch 1: {res[name]['tok_s']:.1f} tok/s (captures "
            f"{lr.get('capture_s')} s left out)")
    return res


STAGES = ("smoke", "accept", "faults", "regen", "startup", "speed", "load")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", default="accept,faults,regen",
                    help=f"comma-separated, of {', '.join(STAGES)}")
    ap.add_argument("--out", default=os.environ.get("OUT", "vllm-check-out"))
    ap.add_argument("--target", default=os.environ.get("E3L_TARGET"),
                    help="the target directory (default: $E3L_TARGET, set by env.sh)")
    ap.add_argument("--engine", choices=("vllm", "reference"), default="vllm")
    ap.add_argument("--limit", type=int, default=115, help="held-out prompts (accept)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--faults", default=",".join(FAULTS),
                    help=f"comma-separated, of {', '.join(FAULTS)}")
    ap.add_argument("--budget-s", type=float, default=560,
                    help="stop starting new work after this many seconds")
    ap.add_argument("--kv-gib", type=float, default=3.0, help="KV cache per vLLM server")
    args = ap.parse_args(argv)
    from eagle3lab.errors import UserError

    stages = set(filter(None, args.stages.split(",")))
    if stages - set(STAGES):
        raise UserError(f"--stages: unknown {sorted(stages - set(STAGES))}; use {STAGES}.")
    if not args.target:
        raise UserError("--target: give the target directory (or source env.sh).")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="vllm-check-"))
    ctx = Ctx(engine=args.engine, target=args.target, run_dir=run_dir, out=out,
              limit=args.limit, max_new_tokens=args.max_new_tokens,
              deadline=T0 + args.budget_s, kv_bytes=int(args.kv_gib * 2**30))
    ctx.results["meta"] = versions(args)
    try:
        if "smoke" in stages:
            ctx.results["smoke"] = stage_smoke(ctx)
            ctx.save()
        if stages & {"accept", "faults"}:
            run_call1(ctx, stages, [k for k in args.faults.split(",") if k])
        if stages & {"startup", "speed", "load"}:
            ctx.results["call2"] = stage_call2(ctx, stages)
            ctx.save()
    finally:
        ctx.results["meta"]["seconds"] = round(time.monotonic() - T0, 1)
        ctx.save()
        with tarfile.open(out / "servers.tar.gz", "w:gz") as tar:
            for p in sorted(run_dir.rglob("*")):
                if p.is_file() and p.suffix in (".log", ".json", ".txt", ".jsonl") and \
                        p.name != "metrics.jsonl":  # the fault copies' training curves
                    tar.add(p, arcname=str(p.relative_to(run_dir)))
    say(f"done: {out / 'results.json'}")
    return 0


def run_call1(ctx: Ctx, stages: set[str], faults: list[str]) -> None:
    """accept (+ regen on its k=3 servers) and faults: every server starts at once, the
    offline predictions run in this process meanwhile, then the served numbers are read
    against them."""
    futures: dict[str, concurrent.futures.Future] = {}
    n = (3 if "accept" in stages else 0) + (len(faults) if "faults" in stages else 0)
    pool = concurrent.futures.ThreadPoolExecutor(max(n, 1))
    finish_accept = finish_faults = None
    if "accept" in stages:
        finish_accept = stage_accept(ctx, pool, futures, regen="regen" in stages)
    if "faults" in stages:
        finish_faults = stage_faults(ctx, pool, futures, faults)
    predicted = finish_accept() if finish_accept else {}
    ctx.results["accept_offline"] = {k: {kk: vv for kk, vv in v.items()
                                         if not kk.startswith("_")}
                                     for k, v in predicted.items()}
    ctx.save()
    fault_pred = finish_faults() if finish_faults else {}
    ctx.results["faults_offline"] = fault_pred
    ctx.save()
    served = {}
    for name, fut in futures.items():
        try:
            served[name] = fut.result()
        except Exception as e:
            served[name] = {"error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc()[-2000:]}
    pool.shutdown()
    if "accept" in stages:
        ctx.results["accept"] = compare_accept(
            {k: v for k, v in served.items() if not k.startswith("fault-")}, predicted)
        ctx.results["regen"] = {k: (v.get("work") or {}).get("regen") for k, v in
                                served.items() if not k.startswith("fault-")}
    if "faults" in stages:
        table = {}
        for name, rec in served.items():
            if not name.startswith("fault-"):
                continue
            work = rec.get("work") or {}
            win = work.get("window") or {}
            table[name] = {**fault_pred.get(name, {}),
                           "preflight": rec.get("preflight"),
                           "verdict": (rec.get("watch") or {}).get("verdict"),
                           "reason": (rec.get("watch") or {}).get("reason"),
                           "startup_s": (rec.get("watch") or {}).get("startup_s"),
                           "served_accept_length": win.get("accept_length"),
                           "served_per_position": win.get("per_position"),
                           "log": rec.get("log"), "work_error": rec.get("work_error"),
                           "error": rec.get("error"), "argv": rec.get("argv")}
        ctx.results["faults"] = table
    ctx.save()


def versions(args) -> dict:
    from importlib import metadata

    v = {}
    for pkg in ("vllm", "torch", "transformers", "speculators", "eagle3lab"):
        try:
            v[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            v[pkg] = None
    gpu = None
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        pass
    return {"args": vars(args), "versions": v, "gpu": gpu,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("vllm_check.py", main))
