"""`eagle3lab serve`: the reference server (the offline engine over SGLang's native HTTP
API, with SGLang-format logs), for running the live-server tooling without a GPU; with
`--engine vllm|sglang`, a real engine started through eagle3lab's launcher (the launch's
preflight first, its own process group, its log in a run directory) and watched by its
watchdog to ready, hung or crashed, then kept up until Ctrl-C, which stops all of it."""

from __future__ import annotations

from eagle3lab.cli.common import add_command, device_option, target_option
from eagle3lab.engines.serve_args import add_serve_options, launch_config


def add_parser(sub) -> None:
    p = add_command(
        sub, "serve", run,
        help="serve the offline engine over SGLang's native HTTP API (CPU; reference)",
        description="Serve a target (and, with --speculative or --draft, the speculative "
        "engine; --speculative alone uses the default drafter) over the "
        "subset of SGLang's native API the benchmark client uses: /health, /generate (same "
        "request fields; meta_info with completion_tokens, spec_verify_ct, "
        "spec_accept_length, spec_accept_histogram; \"stream\": true sends SSE chunks as "
        "SGLang), /get_server_info (avg_spec_accept_length), the OpenAI /v1/completions and "
        "/v1/models as vLLM serves them, and /metrics (vLLM's spec-decode counters, SGLang's "
        "gauges). Logs SGLang-format start-up and `Decode batch` lines to stdout. Requests "
        "are queued and decoded one at a time (health and metrics keep answering): a "
        "reference for tests and notebooks, NOT a production server. SIGUSR1 dumps every "
        "thread's stack to the log.",
        parents=[target_option(), device_option()])
    add_serve_options(p)


def run_engine(args) -> int:
    """Start, watch to a verdict, keep it up until Ctrl-C / SIGTERM, stop it."""
    import datetime as dt
    import signal
    import sys
    import threading

    from eagle3lab.config import runs_dir
    from eagle3lab.preflight.run import PreflightRefused
    from eagle3lab.serverlogs.analyzer import analyse_log
    from eagle3lab.serving.launch import start
    from eagle3lab.serving.watch import print_progress

    cfg = launch_config(args)
    run_dir = args.run_dir or runs_dir() / (
        f"serve-{args.engine}-{dt.datetime.now():%Y%m%d-%H%M%S}")
    try:
        handle = start(cfg, run_dir=run_dir, name=args.engine, force=args.force)
    except PreflightRefused as e:
        print(e.report.table(), file=sys.stderr)
        print(f"eagle3lab serve: error: preflight refuses this launch; fix it or pass "
              f"--force.", file=sys.stderr)
        return 1
    print(f"eagle3lab serve: {' '.join(handle.argv)}\n  log: {handle.log_path}", flush=True)
    for note in handle.notes:
        print(f"  note: {note}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        st = handle.watchdog(silence_s=args.silence_s).wait(
            timeout_s=args.start_timeout_s, on_change=print_progress)
        if st["verdict"] != "ready":
            for c in st.get("causes", []):
                print(f"  likely cause: {c['cause']}\n  fix: {c['fix']}", file=sys.stderr)
            last = next((ln for ln in reversed(handle.log_path.read_text(
                errors="replace").splitlines()) if ln.strip() and not ln.startswith("#")), "")
            print(f"eagle3lab serve: error: {args.engine} did not become ready "
                  f"({st['verdict']}: {st['reason']}); its log ({handle.log_path}) ends: "
                  f"{last.strip()[:300]}", file=sys.stderr)
            return 1
        print(f"eagle3lab serve: {args.engine} is ready at {handle.url}; Ctrl-C stops it.",
              flush=True)
        while not stop.wait(1.0) and handle.running():
            pass
    finally:
        rep = handle.stop()
    log = analyse_log(handle.log_path, silence_s=1e9)
    print(f"eagle3lab serve: stopped ({', '.join(rep['signals']) or 'had exited'}); log "
          f"verdict {log['verdict']}, {len(log['decode'])} decode line(s).", flush=True)
    return 1 if log["verdict"] == "crashed" else 0


def run(args) -> int:
    if args.engine != "reference":
        return run_engine(args)
    if args.engine_args:
        import sys

        print("eagle3lab serve: error: arguments after -- are for --engine vllm or sglang; "
              "the reference server takes none.", file=sys.stderr)
        return 2
    from eagle3lab.refserver.server import serve
    from eagle3lab.serving.launch import exposure_note
    from eagle3lab.workdir import drafter_or_default

    draft = (drafter_or_default(args.draft, args.target)
             if args.speculative or args.draft else None)
    note = exposure_note(args.host)
    if note:
        print(f"eagle3lab serve: {note}", flush=True)
    draft_tokens = args.draft_tokens
    if draft and draft_tokens is None and args.topk == 1:
        draft_tokens = args.steps + 1
    if draft:
        refused = _preflight(args, draft, draft_tokens)
        if refused is not None:
            return refused
    return serve(target=args.target, draft=draft, steps=args.steps, topk=args.topk,
                 draft_tokens=draft_tokens, host=args.host, port=args.port,
                 device=args.device, served_model_name=args.served_model_name,
                 dtype=args.dtype, threads=args.threads)


def _preflight(args, draft, draft_tokens) -> int | None:
    """Judge this launch as `eagle3lab preflight` would; 1 (after printing the findings)
    when it finds an error and --force is not given."""
    import sys

    from eagle3lab.preflight.run import preflight

    argv = ["eagle3lab", "serve", "--target", args.target, "--draft", str(draft),
            "--steps", str(args.steps), "--topk", str(args.topk)]
    if draft_tokens is not None:
        argv += ["--draft-tokens", str(draft_tokens)]
    report = preflight(argv)
    if report.ok:
        return None
    if args.force:
        print(f"eagle3lab serve: preflight found {len(report.errors())} error(s); serving "
              f"anyway (--force).", file=sys.stderr, flush=True)
        return None
    print(report.table(), file=sys.stderr)
    print("eagle3lab serve: error: preflight refuses this launch; fix it or pass --force.",
          file=sys.stderr)
    return 1
