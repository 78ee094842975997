"""The grokking-vs-more-data study on one GPU, in calls of at most ten minutes.

Prevents a study that a time-limited, bare machine cannot finish: every stage resumes
where the last call stopped (generation a chunk at a time, training from its newest
checkpoint, live decoding per run), a call stops its children cleanly before its deadline
(`--deadline-s`), the generated data travels as packed token ids (eagle3lab.data.tokpack),
and what a call finished comes back small (`collect`: plans, curves, live counts; never
shards or checkpoints).

Stages (each a subcommand; WORK is the study's work directory on the device):

    data    self-prompt N prompts (one process), split them, answer them greedily with the
            static engine in --procs processes at once, answer the first --sampled of
            them at temperature 0.8, answer the held-out prompts greedily; pack every
            finished file into WORK/pack (uint16 token ids, <= 15 MiB parts)
    unpack  rebuild the conversation files from carried packs (a later session)
    describe  the data record committed beside the packs (data.json), after unpack
    weak    rank the candidates of the config's `weak` block with its ranker (static
            engine, per-prompt tau) into WORK/study/weak-selection.json (before plan)
    plan    the pool, each arm's data and study.json from a config JSON
            (eagle3lab.study.atscale.AtScaleConfig)
    train   every unfinished arm, --jobs at a time on the one GPU, online; then each
            finished run's live acceptance (static engine), its step checkpoints deleted
    profile one planned run's first steps with a window under torch.profiler, into
            WORK/profile/NAME (train's profile_steps; after plan)
    reference decode a drafter trained elsewhere (the shipped one) as the runs are, into
            WORK/study/references/NAME/live.json (after plan)
    restore put a finished session's collected results back (a later session: the weak
            selection at once, the runs and references after plan)
    collect the small results into a folder (and a tar.gz for the device's file return)

    python -P bench/study_gpu.py data --work W --target T --prompts 90000 --deadline-s 560
    python -P bench/study_gpu.py weak --work W --device cuda --config CONFIG   (same as plan's)
    python -P bench/study_gpu.py plan --work W --config data/studies/h200-grok/config.json
    python -P bench/study_gpu.py train --work W --jobs 6 --live-jobs 5 --deadline-s 1080
    python -P bench/study_gpu.py collect --work W --dest $OUT/results

On a CPU, tiny sizes check every path (tests/test_bench_study_gpu.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout (-P)
#: Popen options putting a child in its own process group (so `stop` reaches what it
#: starts) but in this call's session: the device ends a call's session when the call
#: ends, so a child cannot outlive this script and train on beside the next call's.
OWN_GROUP = ({"process_group": 0} if sys.version_info >= (3, 11)
             else {"preexec_fn": os.setpgrp})


class Deadline:
    """Seconds left in this call; children are stopped `margin` seconds before it."""

    def __init__(self, seconds: float | None, margin: float = 20.0):
        self.end = time.time() + seconds - margin if seconds else None

    def left(self) -> float:
        return float("inf") if self.end is None else self.end - time.time()


def log(msg: str) -> None:
    print(f"[study_gpu {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_all(cmds: list[tuple[str, list[str]]], *, deadline: Deadline, logs: Path,
            env: dict | None = None) -> dict[str, int | None]:
    """Run the commands at once (each in its own process group, output in LOGS/NAME.log);
    at the deadline stop them (SIGTERM, then SIGKILL). Returns name -> exit code (None:
    stopped at the deadline: resumable)."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = {}
    for name, cmd in cmds:
        log(f"start {name}: {' '.join(cmd)}")
        f = open(logs / f"{name}.log", "a")
        procs[name] = (subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                        **OWN_GROUP, env=env), f)
    codes: dict[str, int | None] = {}
    while len(codes) < len(procs):
        for name, (p, f) in procs.items():
            if name not in codes and p.poll() is not None:
                codes[name] = p.returncode
                f.close()
                log(f"{name} exited {p.returncode}"
                    + ("" if p.returncode == 0 else f"; its log ends: "
                       f"{tail(logs / f'{name}.log')}"))
        if deadline.left() <= 0:
            left = [name for name in procs if name not in codes]
            stop(*(procs[name][0] for name in left))
            for name in left:
                codes[name] = None
                procs[name][1].close()
                log(f"{name} stopped at the deadline (a later call resumes it)")
        time.sleep(1.0)
    return codes


def stop(*procs: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM to every process group at once, `grace` seconds for them together, then
    SIGKILL to those left (one by one, the waits would add up past the call's limit)."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    end = time.time() + grace
    for p in procs:
        try:
            p.wait(timeout=max(end - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def tail(path: Path, n: int = 600) -> str:
    try:
        return path.read_text(errors="replace")[-n:].replace("\n", " | ")
    except OSError:
        return "(no log)"


#: seconds a run needs beyond its training steps: a start on inductor's warm cache (~21 s to
#: the first step, measured on the H200 beside five runs) and its final drafter's live decode
#: (three shapes, ~20 s each beside other runs); `finish_estimate`'s default margin
FINISH_MARGIN_S = 90.0


def _metrics_ends(metrics: Path) -> tuple[dict | None, dict | None]:
    """The first logged train line and the last line of a run's metrics.jsonl (None, None
    when there is none yet). A line cut by a write in progress is skipped."""
    if not metrics.is_file():
        return None, None
    first = last = None
    with open(metrics) as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if first is None and row.get("train"):
                first = row
            last = row
    return first, last


def observed_rate(metrics: Path, *, min_span_s: float = 30.0) -> float | None:
    """Tokens per second a run has made since its first logged train step (its start and
    compile left out); None until it has logged over `min_span_s` seconds past it."""
    first, last = _metrics_ends(metrics)
    if first is None or last is None:
        return None
    span = float(last["wall_s"]) - float(first["wall_s"])
    return (float(last["tokens"]) - float(first["tokens"])) / span if span >= min_span_s \
        else None


def finish_estimate(arm: dict, running: list[dict], *,
                    margin_s: float = FINISH_MARGIN_S) -> float | None:
    """Seconds `arm` (a study.json arm) would take to finish training and decode its final
    drafter if started now: its tokens left over the slowest rate the running runs of its
    kind (states cached on the GPU or not) make now (any running run's, when none is of its
    kind), plus `margin_s`. None when no running run has logged long enough to tell.
    Prevents starting a run that the deadline stops: its checkpoints do not travel, so its
    work is lost, and it slows every run beside it (the study's session 5 on the H200: two
    such runs held the candidate run back past the deadline)."""
    rates = [(bool(r["train"].get("states_cache")),
              observed_rate(Path(r["train"]["out"]) / "metrics.jsonl")) for r in running]
    rates = [(c, v) for c, v in rates if v]
    kind = bool(arm["train"].get("states_cache"))
    pool = [v for c, v in rates if c == kind] or [v for _, v in rates]
    if not pool:
        return None
    _, last = _metrics_ends(Path(arm["train"]["out"]) / "metrics.jsonl")
    left = float(arm["train"]["max_tokens"]) - float(last["tokens"] if last else 0)
    return max(left, 0.0) / min(pool) + margin_s


def eagle3lab(*args: str) -> list[str]:
    return [sys.executable, "-m", "eagle3lab", *args]


# --- data -----------------------------------------------------------------------------------
def split_lines(src: Path, parts: int) -> list[Path]:
    """src's lines in `parts` contiguous files (src-K.jsonl), written once."""
    lines = src.read_bytes().split(b"\n")  # JSONL: "\n" only (not str.splitlines)
    lines = [ln + b"\n" for ln in (lines[:-1] if lines[-1] == b"" else lines)]
    out = []
    per = -(-len(lines) // parts)
    for k in range(parts):
        dst = src.with_name(f"{src.stem}-{k}.jsonl")
        if not dst.exists():
            tmp = dst.with_name(dst.name + ".tmp")
            tmp.write_bytes(b"".join(lines[k * per:(k + 1) * per]))
            tmp.rename(dst)
        out.append(dst)
    return out


def finished(out: Path, prompts: int) -> bool:
    """A regenerate output holds an answer (or a skip) for each of its `prompts`."""
    from eagle3lab.data.regenerate import read_meta

    m = read_meta(out, "eagle3lab-conversations")
    return m is not None and m.get("records", 0) + len(m.get("skipped_too_long", [])) >= prompts


def pack_whole(src: Path, dest: Path, **kw) -> None:
    """tokpack.pack into DEST.partial, renamed to DEST once every part is written: a call
    killed mid-pack leaves no DEST that later calls would take as packed."""
    from eagle3lab.data import tokpack

    tmp = dest.with_name(dest.name + ".partial")
    tokpack.pack(src, tmp, **kw)  # removes the parts a killed pack left there
    tmp.rename(dest)


def stage_data(args) -> int:
    from eagle3lab.data.prompts import load_prompts
    from eagle3lab.data.regenerate import read_meta

    work, deadline = Path(args.work), Deadline(args.deadline_s)
    gen = work / "gen"
    gen.mkdir(parents=True, exist_ok=True)
    common = ["--target", args.target, "--dtype", args.dtype, "--device", args.device]
    prompts = gen / "prompts.jsonl"
    meta = read_meta(prompts, "eagle3lab-prompts") or {}
    if meta.get("counts", {}).get("kept", 0) < args.prompts:
        codes = run_all([("self-prompt", eagle3lab(
            "self-prompt", *common, "--out", str(prompts), "--num-prompts", str(args.prompts),
            "--batch-size", str(args.self_prompt_batch), "--seed", str(args.seed),
            "--no-progress"))], deadline=deadline, logs=work / "logs")
        if codes["self-prompt"] != 0:
            return 1 if codes["self-prompt"] else 0
    parts = split_lines(prompts, args.procs)
    gcommon = [*common, "--engine", args.engine, "--batch-size", str(args.batch_size),
               "--max-new-tokens", str(args.max_new_tokens), "--no-progress"]
    # name -> (output, its prompts, limit, extra options)
    outputs = {f"greedy-{k}": (gen / f"greedy-{k}.jsonl", p, None, [])
               for k, p in enumerate(parts)}
    if args.sampled:
        outputs["sampled"] = (gen / "sampled.jsonl", parts[0], args.sampled, [
            "--limit", str(args.sampled), "--temperature", str(args.temperature),
            "--seed", str(args.seed), "--engine", args.sampled_engine,
            "--batch-size", str(args.sampled_batch_size)])
    outputs["eval"] = (gen / "eval.jsonl", "eval", args.eval_limit,
                       ["--limit", str(args.eval_limit)] if args.eval_limit else [])
    want = {name: len(load_prompts(str(src), limit=lim))  # prompts each output answers
            for name, (_, src, lim, _) in outputs.items()}
    jobs = [(name, eagle3lab("regenerate", *gcommon, *extra, "--prompts", str(src),
                             "--out", str(out)))
            for name, (out, src, lim, extra) in outputs.items()
            if not finished(out, want[name])]
    codes = run_all(jobs, deadline=deadline, logs=work / "logs") if jobs else {}
    bad = {k: c for k, c in codes.items() if c}
    status = {}
    for name, (out, *_) in outputs.items():
        status[name] = finished(out, want[name])
        packed = work / "pack" / name
        if status[name] and not packed.is_dir() and deadline.left() > 30:
            pack_whole(out, packed, max_bytes=args.pack_bytes, target=args.target)
            log(f"packed {out.name} into {packed}")
    if not (work / "pack" / "prompts").is_dir():
        pack_whole(prompts, work / "pack" / "prompts", max_bytes=args.pack_bytes,
                   target=args.target)
    log(f"data finished: {status}" + (f"; failed: {bad}" if bad else ""))
    return 1 if bad else 0


# --- plan, train, live ----------------------------------------------------------------------
def study_config(args):
    """The study config (--config) with its data paths in the work directory, the study in
    WORK/study and --target, if given, as the target."""
    from eagle3lab.fsutil import read_json_object
    from eagle3lab.study.atscale import AtScaleConfig

    raw = read_json_object(Path(args.config), what="study config",
                           fix="Give a JSON object of AtScaleConfig fields "
                           "(data/studies/h200-grok/config.json is one).")
    work = Path(args.work)
    # paths in the config are relative to the work directory
    for k in ("greedy", "sampled"):
        raw[k] = [str(work / p) for p in raw.get(k, [])]
    if isinstance(raw.get("eval_conversations"), str):
        raw["eval_conversations"] = str(work / raw["eval_conversations"])
    raw["out"] = str(work / "study")
    raw["target"] = args.target or raw.get("target")
    return AtScaleConfig.from_dict(raw, where=f"{args.config}")


def stage_weak(args) -> int:
    """Rank the weak arms' candidates with the config's ranker (atscale.rank_weak): after
    unpack (and restore, which puts a committed selection back), before plan. Skipped when
    the selection exists for this config; a config without a `weak` block has nothing to
    rank."""
    from eagle3lab.study.atscale import rank_weak

    cfg = study_config(args)
    if cfg.weak is None:
        log(f"{args.config} has no `weak` block: nothing to rank")
        return 0
    dst = rank_weak(cfg, device=args.device, progress=True)
    log(f"weak-spots selection: {dst}")
    return 0


def stage_plan(args) -> int:
    from eagle3lab.study.atscale import prepare_study

    cfg = study_config(args)
    study = prepare_study(cfg)
    long = sum(a["kind"] == "long" for a in study["arms"])
    log(f"{len(study['arms']) - long} runs of {cfg.tokens_per_run:,} tokens "
        f"({study['steps_per_run']} steps)"
        + (f" and {long} long runs of " + " / ".join(
            f"{b.tokens_per_run:,}" for b in cfg.long) if long else "")
        + f"; pool {study['pool']['greedy']['tokens']:,} greedy "
        f"answer tokens, {study['pool']['sampled']['tokens']:,} sampled")
    if weak := [a for a in study["arms"] if a["kind"] == "weak"]:
        log(f"{len(weak)} weak-spots runs among them: "
            + ", ".join(f"{a['name']} ({a['data']['tokens']:,} unique answer tokens)"
                        for a in weak))
    return 0


def stage_train(args) -> int:
    import shutil

    from eagle3lab.study.atscale import live_complete, read_study, run_live_points
    from eagle3lab.train import SIGTERM_EXIT
    from eagle3lab.train.checkpoints import is_finished

    work, deadline = Path(args.work), Deadline(args.deadline_s)
    study_dir = work / "study"
    study = read_study(study_dir)
    arms = study["arms"][:args.limit_runs] if args.limit_runs else study["arms"]
    if args.only:
        from eagle3lab.errors import UserError

        names = [n for n in args.only.split(",") if n]
        known = {a["name"]: a for a in arms}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UserError(f"--only: no run named {', '.join(unknown)} in "
                            f"{study_dir / 'study.json'} ({len(known)} runs planned; their "
                            f"names are its arms' \"name\" fields).")
        arms = [known[n] for n in dict.fromkeys(names)]  # in the order given
    by_name = {a["name"]: a for a in arms}
    cfg_dir = work / "configs"
    cfg_dir.mkdir(exist_ok=True)
    running: dict[str, tuple[subprocess.Popen, object]] = {}
    # live decodes in flight: process, log file, early (the run still trains)
    living: dict[str, tuple[subprocess.Popen, object, bool]] = {}
    # --live-early: the points each running run's checkpoints have settled, decoded (or
    # started) while it trains; those decodes keep its checkpoints and never fail the stage
    early_done: dict[str, int] = {}
    early_check = 0.0
    def failed_before(a) -> bool:
        run = Path(a["train"]["out"]) / "run.json"
        return run.is_file() and json.loads(run.read_text()).get("status") == "failed"

    failed = [a["name"] for a in arms if failed_before(a)]
    if failed:
        log(f"not retried (failed earlier; delete the run directory to train again): "
            f"{', '.join(failed)}")
    undecoded = [a for a in arms if is_finished(a["train"]["out"])
                 and not live_complete(a["train"]["out"])]
    # a run finished in an earlier session whose live decode did not finish there: its
    # checkpoints never travel, so it has nothing left to decode (train it again to have
    # its live tau: --retrain-undecoded, or delete its run directory)
    gone = [a["name"] for a in undecoded
            if not (Path(a["train"]["out"]) / "checkpoints").is_dir()]
    if gone and args.retrain_undecoded:
        for a in undecoded:
            if a["name"] in gone:
                shutil.rmtree(a["train"]["out"])
        log(f"trained again for their live tau (--retrain-undecoded): {', '.join(gone)}")
    elif gone:
        log(f"finished without live tau and without checkpoints here (not decoded; delete "
            f"the run directory or pass --retrain-undecoded to train again): "
            f"{', '.join(gone)}")
    queue = [a for a in arms if not is_finished(a["train"]["out"])
             and a["name"] not in failed]
    to_live = [a["name"] for a in undecoded if a["name"] not in gone]
    log(f"{len(queue)} runs to train, {len(to_live)} to decode live")
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    # --warm-first: the first run compiles alone; the others start once it has logged a
    # step (inductor's disk cache is then warm), it has exited, or the wait is over
    warming: tuple[str, Path, int, float] | None = None

    def live(name: str, settled: int | None = None) -> None:
        """Start NAME's live decode in its own process; `settled` (an early decode, while
        it trains): how many points its checkpoints have settled so far."""
        early = settled is not None
        f = open(logs / f"live-{name}.log", "a")
        code = ("import sys; from eagle3lab.study.atscale import measure_live; "
                f"measure_live({str(study_dir)!r}, {name!r}, device={args.device!r}, "
                f"progress=True, early={early!r})")
        living[name] = (subprocess.Popen([sys.executable, "-c", code], stdout=f,
                                         stderr=subprocess.STDOUT, cwd=ROOT,
                                         **OWN_GROUP), f, early)
        log(f"live {name}" + (f" (early: {settled} point(s) settled)" if early else ""))

    started = False
    while queue or running or to_live or living:
        if warming is not None:
            name, metrics, size0, t_start = warming
            grown = metrics.is_file() and metrics.stat().st_size > size0
            waited = time.time() - t_start
            if grown or name not in running or waited >= args.warm_first:
                log(f"warm: {name} " + ("logged a step" if grown else "exited" if
                                        name not in running else "still compiling")
                    + f" after {waited:.0f} s; starting the other runs")
                warming = None
        while queue and len(running) < (1 if warming else args.jobs) and \
                deadline.left() > 60:
            a = queue.pop(0)
            need = finish_estimate(a, [by_name[n] for n in running],
                                   margin_s=args.finish_margin_s) \
                if deadline.end is not None and args.finish_margin_s >= 0 else None
            if need is not None and need > deadline.left():
                log(f"not started: {a['name']} would need ~{need:.0f} s (its tokens left at "
                    f"the rate runs like it make now, then its final decode); "
                    f"{deadline.left():.0f} s left")
                continue
            cfgp = cfg_dir / f"{a['name']}.json"
            resume = (Path(a["train"]["out"]) / "run.json").is_file()
            cfgp.write_text(json.dumps({**a["train"], "device": args.device,
                                        "resume": resume}))
            f = open(logs / f"train-{a['name']}.log", "a")
            p = subprocess.Popen(eagle3lab("train", "--config", str(cfgp)), stdout=f,
                                 stderr=subprocess.STDOUT, cwd=ROOT, **OWN_GROUP)
            running[a["name"]] = (p, f)
            log(f"train {a['name']}" + (" (resuming)" if resume else ""))
            if not started and args.warm_first > 0 and queue:
                metrics = Path(a["train"]["out"]) / "metrics.jsonl"
                warming = (a["name"], metrics,
                           metrics.stat().st_size if metrics.is_file() else 0, time.time())
            started = True
        for name, (p, f) in list(running.items()):
            if p.poll() is not None:
                f.close()
                del running[name]
                log(f"train {name} exited {p.returncode}"
                    + ("" if p.returncode == 0 else
                       " (SIGTERM: checkpointed, a later call resumes it)"
                       if p.returncode == SIGTERM_EXIT else
                       f": {tail(logs / f'train-{name}.log')}"))
                if p.returncode == 0:
                    to_live.append(name)
                elif p.returncode is not None and p.returncode > 0 and \
                        p.returncode != SIGTERM_EXIT:
                    failed.append(name)
        while len(living) < args.live_jobs and deadline.left() > 60:
            name = next((n for n in to_live if n not in living), None)
            if name is None:  # none waiting, or its early decode still runs
                break
            to_live.remove(name)
            live(name)
        if args.live_early and time.time() >= early_check:
            early_check = time.time() + args.live_early_every  # reads the checkpoints
            for name in running:
                if len(living) >= args.live_jobs or deadline.left() <= 60:
                    break
                if name in living:
                    continue
                n = len(run_live_points(study_dir, study, name, reached_only=True))
                if n > early_done.get(name, 0):
                    early_done[name] = n
                    live(name, settled=n)
        for name, (p, f, early) in list(living.items()):
            if p.poll() is None:
                continue
            del living[name]
            f.close()
            log(f"live {name}{' (early)' if early else ''} exited {p.returncode}"
                + ("" if p.returncode == 0 else f": {tail(logs / f'live-{name}.log')}"))
            if early:
                continue  # the decode after the run measures what this one did not
            if p.returncode:
                failed.append(f"live {name}")
            if p.returncode == 0 and not args.keep_checkpoints:
                shutil.rmtree(study_dir / "runs" / name / "checkpoints", ignore_errors=True)
        if deadline.left() <= 0:
            stop(*(p for p, _ in running.values()), *(p for p, *_ in living.values()))
            for name, (p, f) in running.items():
                f.close()
                log(f"train {name} stopped at the deadline (a later call resumes it)")
            for p, f, _ in living.values():
                f.close()
            break
        if not running and not living and (not queue or deadline.left() <= 60) and (
                not to_live or deadline.left() <= 60):
            break
        time.sleep(2.0)
    done = sum(is_finished(a["train"]["out"]) for a in arms)
    lived = sum(live_complete(a["train"]["out"]) for a in arms)
    log(f"{done}/{len(arms)} runs finished, {lived} decoded live"
        + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def _planned_arm(work: Path, name: str) -> dict:
    """The arm `name` of WORK's study.json (after plan)."""
    from eagle3lab.errors import UserError
    from eagle3lab.study.atscale import read_study

    arm = next((a for a in read_study(work / "study")["arms"] if a["name"] == name), None)
    if arm is None:
        raise UserError(f"--only: no run named {name} in {work / 'study' / 'study.json'}.")
    return arm


def _arm_config(work: Path, arm: dict, kind: str, settings: dict) -> Path:
    """WORK/configs/KIND-NAME.json: the planned run's (`arm`) train config with `settings`
    over it, not resumed (a run beside the study's, never in it)."""
    cfgp = work / "configs" / f"{kind}-{arm['name']}.json"
    cfgp.parent.mkdir(parents=True, exist_ok=True)
    cfgp.write_text(json.dumps({**arm["train"], "resume": False, **settings}))
    return cfgp


def stage_config(args) -> int:
    """One planned run's train config for the bench scripts that read one
    (bench/target_sdpa.py): WORK/configs/bench-NAME.json, on --device, its out under
    WORK/bench/NAME (never the study's run). Prints the path."""
    work = Path(args.work)
    cfgp = _arm_config(work, _planned_arm(work, args.only), "bench", {
        "device": args.device, "out": str(work / "bench" / args.only)})
    log(f"config {args.only}: {cfgp}")
    print(cfgp)
    return 0


def stage_profile(args) -> int:
    """One planned run's first steps, FIRST..LAST under torch.profiler (train's
    profile_steps), into WORK/profile/NAME (never the study's run): where an online run's
    step time goes (after plan). Prints its profile/summary.json; stops after LAST."""
    import shutil

    from eagle3lab.errors import UserError

    work = Path(args.work)
    arm = _planned_arm(work, args.only)
    first, last = args.steps
    over = {}
    for kv in args.set or []:
        key, eq, value = kv.partition("=")
        if not eq:
            raise UserError(f"--set {kv!r}: give KEY=VALUE (VALUE as JSON, e.g. prefetch=false).")
        try:
            over[key] = json.loads(value)
        except json.JSONDecodeError:
            over[key] = value
    label = "".join(f"+{k}={json.dumps(v)}" for k, v in over.items())
    out = work / "profile" / (args.only + label)
    shutil.rmtree(out, ignore_errors=True)  # a fresh run each time: the window from step 1
    cfgp = _arm_config(work, arm, "profile", {
        "device": args.device, "out": str(out), "profile_steps": [first, last],
        "stop_after_steps": last, "checkpoint_every": 0, "eval_at_tokens": [],
        "eval_every": 0, "eval_at_start": False, **over})
    log(f"profile {args.only}{label}: steps {first}-{last} into {out}")
    rc = subprocess.call(eagle3lab("train", "--config", str(cfgp)), cwd=ROOT)
    summary = out / "profile" / "summary.json"
    if rc or not summary.is_file():
        log(f"profile {args.only}{label}: train exited {rc}, no {summary}")
        return rc or 1
    print(summary.read_text())
    # the rate before the window (the profiler slows the host): its second half, compiled
    lines = {x["step"]: x for x in map(json.loads, (out / "metrics.jsonl").read_text()
                                           .splitlines()) if x.get("train") is not None}
    # the logged steps (log_every) in the second half before the window
    logged = [k for k in sorted(lines) if first // 2 <= k < first]
    if len(logged) >= 2:
        a, b = logged[0], logged[-1]
        rate = (lines[b]["tokens"] - lines[a]["tokens"]) / (lines[b]["wall_s"] - lines[a]["wall_s"])
        log(f"profile {args.only}{label}: steps {a + 1}-{b} unprofiled: {rate:,.0f} tokens/s")
    return 0


def stage_reference(args) -> int:
    """A drafter trained elsewhere (the shipped one) decoded as the runs are: the bar a run
    must clear to replace it (after plan: it reads the study's live settings)."""
    from eagle3lab.study.atscale import measure_reference

    dst = measure_reference(Path(args.work) / "study", drafter=args.drafter, name=args.name,
                            target=args.target, device=args.device, progress=True)
    log(f"reference {args.name}: {dst}")
    return 0


def stage_restore(args) -> int:
    """Put a finished session's collected results (`collect --dest DIR`) back into the
    study on a fresh machine, so that its finished runs are not trained again (their
    run.json says done) nor decoded again (live.json), and the weak arms' selection, so
    that `weak` does not rank again. The runs need the plan: run it after `plan` (before
    `weak` too, for the selection: the chain runs it twice)."""
    import shutil

    from eagle3lab.study.atscale import (RUN_FILES, WEAK_SELECTION, copy_references,
                                         read_study)

    work, src = Path(args.work), Path(args.results)
    sel = work / "study" / WEAK_SELECTION
    if (src / WEAK_SELECTION).is_file() and not sel.is_file():
        sel.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / WEAK_SELECTION, sel)
        log(f"restored the weak-spots selection from {src}")
    if not (work / "study" / "study.json").is_file():
        log(f"no plan in {work / 'study'} yet: finished runs are restored after `plan`")
        return 0
    names = {a["name"] for a in read_study(work / "study")["arms"]}
    restored = []
    for run in sorted((src / "runs").glob("*")) if (src / "runs").is_dir() else []:
        info = run / "run.json"
        if run.name not in names or not info.is_file():
            continue
        if json.loads(info.read_text()).get("status") != "done":
            continue  # an unfinished run's checkpoints did not come back: it starts over
        dst = work / "study" / "runs" / run.name
        dst.mkdir(parents=True, exist_ok=True)
        for f in RUN_FILES:
            if (run / f).is_file() and not (dst / f).is_file():
                shutil.copyfile(run / f, dst / f)
        restored.append(run.name)
    refs = copy_references(src, work / "study", overwrite=False)
    log(f"restored {len(restored)} finished runs from {src}"
        + (f" and the reference(s) {', '.join(refs)}" if refs else ""))
    return 0


def stage_collect(args) -> int:
    import tarfile

    from eagle3lab.study.atscale import collect

    work, dest = Path(args.work), Path(args.dest)
    r = collect(work / "study", dest, winner=args.winner)
    for name in ("logs",):
        if (work / name).is_dir() and args.with_logs:
            with tarfile.open(dest / "logs.tar.gz", "w:gz") as t:
                t.add(work / name, arcname=name)
    if args.winner == "auto":
        log("winner auto: " + (f"{r['winner_run']} (tau {r['winner_tau']:.3f} at "
                               f"{r['winner_setting']}), packed into {r['winner']}"
                               if r["winner"] else "no final drafter decoded on this "
                               "machine yet (not packed)"))
    elif args.winner:
        log(f"winner {args.winner}: " + (f"packed into {r['winner']}" if r["winner"] else
                                         "no final drafter yet (not packed)"))
    log(f"collected {len(r['runs'])} runs into {dest}")
    return 0


def stage_unpack(args) -> int:
    """Rebuild WORK/gen/NAME.jsonl from NAME.partNN.npz files anywhere under --packs (as
    they come back from the device, flat, or one folder per file)."""
    from eagle3lab.data import tokpack

    work = Path(args.work)
    groups: dict[str, list[Path]] = {}
    for f in sorted(Path(args.packs).rglob("*.part*.npz")):
        groups.setdefault(f.name.split(".part")[0], []).append(f)
    for name, files in groups.items():
        out = work / "gen" / f"{name}.jsonl"
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            tokpack.unpack(files, out, target=args.target)
            log(f"unpacked {out} ({len(files)} parts)")
    return 0


def stage_describe(args) -> int:
    """Write the data record committed beside the packs (`data.json`): each pack's bytes
    and sha256, each rebuilt file's bytes, sha256, records and generation parameters (from
    its meta file), the target, and the pool's counts when a plan exists (WORK/study)."""
    from eagle3lab.data.regenerate import meta_path
    from eagle3lab.fsutil import atomic_write_json, read_json_object, sha256_file

    work, packs = Path(args.work), Path(args.packs)
    out: dict = {"format": "eagle3lab-study-data", "version": 1, "made": args.made,
                 "target": None, "packs": {}, "files": {}}
    for f in sorted(packs.rglob("*.part*.npz")):
        out["packs"][f.name] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
    names = sorted({f.split(".part")[0] for f in out["packs"]})
    for name in names:
        f = work / "gen" / f"{name}.jsonl"
        if not f.is_file():
            from eagle3lab.errors import UserError

            raise UserError(f"{f} is missing: run `unpack --work {work} --packs {packs}` "
                            f"first (describe reads the rebuilt files).")
        m = meta_path(f)  # a conversations' or a prompts' meta file
        meta = read_json_object(m, what="meta file") if m.is_file() else {}
        out["target"] = out["target"] or meta.get("target")
        out["files"][f.name] = {"bytes": f.stat().st_size, "sha256": sha256_file(f),
                                "records": meta.get("records"), "params": meta.get("params"),
                                "last_run": meta.get("last_run")}
    plan = work / "study" / "study.json"
    if plan.is_file():
        out["pool"] = {k: v for k, v in json.loads(plan.read_text())["pool"].items()
                       if k in ("greedy", "sampled")}
    atomic_write_json(Path(args.dest), out)
    log(f"described {len(out['packs'])} packs, {len(out['files'])} files into {args.dest}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="stage", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--work", required=True, help="the study's work directory")
    common.add_argument("--deadline-s", type=float, default=None,
                        help="stop children this many seconds after the start (resumable)")
    common.add_argument("--device", default="auto")
    common.add_argument("--target", default=None, help="the target (dir or preset)")
    d = sub.add_parser("data", parents=[common], help="generate the pool")
    d.add_argument("--prompts", type=int, default=90000, help="self-written prompts in all")
    d.add_argument("--self-prompt-batch", type=int, default=4096)
    d.add_argument("--procs", type=int, default=2, help="greedy answer processes at once")
    d.add_argument("--engine", default="static", choices=["static", "hf"])
    d.add_argument("--batch-size", type=int, default=512, help="answers in flight per process")
    d.add_argument("--max-new-tokens", type=int, default=384)
    d.add_argument("--sampled", type=int, default=8000,
                   help="the first N prompts of part 0 are also answered by sampling")
    d.add_argument("--temperature", type=float, default=0.8)
    d.add_argument("--sampled-engine", default="hf", choices=["static", "hf"],
                   help="the static engine samples on the host, row by row: slower at scale")
    d.add_argument("--sampled-batch-size", type=int, default=2048)
    d.add_argument("--eval-limit", type=int, default=None, help="first N held-out prompts")
    d.add_argument("--seed", type=int, default=1234)
    d.add_argument("--dtype", default="bfloat16")
    d.add_argument("--pack-bytes", type=int, default=15 * 2**20)
    u = sub.add_parser("unpack", parents=[common], help="rebuild conversations from packs")
    u.add_argument("--packs", required=True, help="folder of packed sets (one folder each)")
    ds = sub.add_parser("describe", parents=[common], help="the data record (data.json) of "
                        "carried packs, after unpack (and plan, for the pool's counts)")
    ds.add_argument("--packs", required=True, help="folder of packed sets")
    ds.add_argument("--dest", required=True, help="where data.json goes")
    ds.add_argument("--made", required=True, help="when, where and by what the data was made")
    wk = sub.add_parser("weak", parents=[common], help="rank the weak arms' candidates "
                        "(before plan; the config's `weak` block)")
    wk.add_argument("--config", required=True)
    p = sub.add_parser("plan", parents=[common], help="pool, arm data, study.json")
    p.add_argument("--config", required=True)
    t = sub.add_parser("train", parents=[common], help="train and decode the arms")
    t.add_argument("--jobs", type=int, default=4, help="runs at once on the one GPU")
    t.add_argument("--live-jobs", type=int, default=2,
                   help="finished runs decoded live at once (each its own process)")
    t.add_argument("--live-early", action="store_true",
                   help="while a run trains, decode the live points its checkpoints have "
                   "settled (within --live-jobs), so a machine lost before it ends still "
                   "returns them; the decode after the run measures only the rest")
    t.add_argument("--live-early-every", type=float, default=20.0, metavar="SECONDS",
                   help="with --live-early: how often the running runs' checkpoints are read")
    t.add_argument("--limit-runs", type=int, default=None, help="only the first N planned runs")
    t.add_argument("--only", default=None,
                   help="comma-separated run names, started in this order (default: every "
                   "planned run, in the plan's order)")
    t.add_argument("--keep-checkpoints", action="store_true")
    t.add_argument("--warm-first", type=float, default=0.0, metavar="SECONDS",
                   help="start one run alone and the others once it has logged a step (or "
                   "after SECONDS): its compile fills inductor's disk cache for the rest, "
                   "instead of every run compiling the same kernels at once (0: all at once, "
                   "the default; on the H200 one run alone took 280 s to its first step, six "
                   "at once 245 s: the compile is serial per process, so waiting gains "
                   "nothing there)")
    t.add_argument("--finish-margin-s", type=float, default=FINISH_MARGIN_S,
                   metavar="SECONDS",
                   help="with --deadline-s, a run is started only if its tokens left, at the "
                   "rate the running runs of its kind make, plus this margin (its start and "
                   "final live decode) fit before the deadline; negative: start every run "
                   f"(default {FINISH_MARGIN_S:g})")
    t.add_argument("--retrain-undecoded", action="store_true",
                   help="train again the runs an earlier session finished but did not decode "
                   "live (their checkpoints did not travel), for their live tau")
    pf = sub.add_parser("profile", parents=[common], help="one planned run's first steps "
                        "with FIRST..LAST under torch.profiler, into WORK/profile/NAME")
    pf.add_argument("--only", required=True, help="the planned run (its name in study.json)")
    pf.add_argument("--steps", type=int, nargs=2, required=True, metavar=("FIRST", "LAST"))
    pf.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="a train setting changed (VALUE as JSON); the run goes to "
                    "WORK/profile/NAME+KEY=VALUE")
    cf = sub.add_parser("config", parents=[common], help="one planned run's train config "
                        "for a bench script, WORK/configs/bench-NAME.json (after plan)")
    cf.add_argument("--only", required=True, help="the planned run (its name in study.json)")
    rf = sub.add_parser("reference", parents=[common], help="decode a drafter trained "
                        "elsewhere as the runs are decoded (after plan)")
    rf.add_argument("--drafter", required=True, help="its checkpoint directory")
    rf.add_argument("--name", required=True, help="its name in the results (e.g. shipped)")
    r = sub.add_parser("restore", parents=[common], help="finished runs of an earlier "
                       "session back into the study")
    r.add_argument("--results", required=True, help="a folder `collect` wrote")
    c = sub.add_parser("collect", parents=[common], help="copy the small results")
    c.add_argument("--dest", required=True)
    c.add_argument("--winner", default=None,
                   help="also pack this run's final drafter into DEST/winner; 'auto': the "
                        "best final drafter decoded on this machine (by final live tau at "
                        "5,1,6, else the study's first shape), so a session's best weights "
                        "come back unasked")
    c.add_argument("--with-logs", action="store_true")
    args = ap.parse_args(argv)
    if args.stage == "data" and not args.target:
        ap.error("data needs --target")
    return {"data": stage_data, "unpack": stage_unpack, "describe": stage_describe,
            "weak": stage_weak, "plan": stage_plan, "reference": stage_reference,
            "train": stage_train, "profile": stage_profile, "config": stage_config,
            "restore": stage_restore,
            "collect": stage_collect}[args.stage](args)


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("study_gpu.py", main))
