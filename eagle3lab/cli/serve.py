"""`eagle3lab serve`: the reference server (the offline engine over SGLang's native HTTP
API, with SGLang-format logs), for running the live-server tooling without a GPU."""

from __future__ import annotations

from eagle3lab.cli.common import add_command, device_option, target_option


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
    p.add_argument("--draft", default=None,
                   help="EAGLE-3 draft checkpoint (implies --speculative); without it and "
                   "without --speculative, plain decoding")
    p.add_argument("--speculative", action="store_true",
                   help="speculative decoding; without --draft, with the default drafter "
                   "(data/drafters/TARGET for a preset target, else the demo's trained one)")
    p.add_argument("--steps", type=int, default=3, help="draft steps per verify")
    p.add_argument("--topk", type=int, default=1, help="draft top-k (1 = chain)")
    p.add_argument("--draft-tokens", type=int, default=None,
                   help="tokens verified per step (default steps + 1 for a chain)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind; anything but loopback is reachable from outside")
    p.add_argument("--port", type=int, default=30000, help="port to listen on")
    p.add_argument("--served-model-name", default=None,
                   help="the model name /v1/models and /metrics report (default: --target, "
                   "as vLLM)")
    p.add_argument("--force", action="store_true",
                   help="serve even when the launch's preflight (eagle3lab preflight) finds "
                   "an error")


def run(args) -> int:
    from eagle3lab.server.launch import exposure_note
    from eagle3lab.server.reference import serve
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
                 device=args.device, served_model_name=args.served_model_name)


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
