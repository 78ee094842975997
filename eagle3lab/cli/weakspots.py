"""`eagle3lab weak-spots`: the prompts a drafter fails on, ranked, grouped by prompt length
and kind, the worst shown with the drafts beside what the target said, exported as a
prompts file (eagle3lab.measure.weakspots)."""

from __future__ import annotations

import json

from eagle3lab.cli.common import add_command, json_option, target_option


def add_parser(sub) -> None:
    p = add_command(
        sub, "weak-spots", run,
        help="rank prompts by acceptance; show and export the ones the drafter fails on",
        description="Read per-prompt acceptance counts (an `eagle3lab accept --json` output, "
        "or the results of --server) and rank the prompts by tau = 1 + accepted drafts / "
        "verify steps (decode phase; groups as ratios of sums). Prints tau by prompt length "
        "(tokens) and by kind (the prompt's category), and the worst prompts with what the "
        "target said and, from the offline engine, the first rejected drafts beside the "
        "target's tokens. --export writes the weakest as a prompts JSONL for `self-prompt "
        "--seed-prompts` (more prompts like them) and `regenerate --prompts` (their answers). "
        "Rank a slice of prompts that is not your held-out eval set, or the eval set leaks "
        "into training. --server URL first asks a running SGLang (/generate meta_info), "
        "`eagle3lab serve` or vLLM with per-request speculative stats for each prompt's "
        "counts; a server that reports none is one line.",
        parents=[json_option(), target_option()])
    p.add_argument("source", metavar="RESULTS", nargs="?", default=None,
                   help="accept --json output or saved --server results (JSON)")
    p.add_argument("--arm", default=None, help="the accept arm to rank (default: the first)")
    p.add_argument("--worst", type=int, default=10, help="prompts shown (and exported)")
    p.add_argument("--export", default=None, metavar="OUT.jsonl",
                   help="write the weakest prompts here (prompts JSONL: id, prompt, category, "
                   "tau) and OUT.jsonl.meta.json")
    p.add_argument("--export-n", type=int, default=None,
                   help="prompts exported (default: --worst)")
    p.add_argument("--bins", default="32,64,128,256",
                   help="prompt-length bin edges in tokens, comma-separated")
    g = p.add_argument_group("from a running server")
    g.add_argument("--server", default=None, metavar="URL",
                   help="ask this server for each prompt's counts instead of reading RESULTS")
    g.add_argument("--api", choices=["sglang", "vllm"], default="sglang",
                   help="sglang: /generate (SGLang, eagle3lab serve); vllm: /v1/completions")
    g.add_argument("--prompts", default="eval", help="'eval', 'train' or a prompts JSONL")
    g.add_argument("--limit", type=int, default=None, help="number of prompts")
    g.add_argument("--max-new-tokens", type=int, default=128, help="tokens per answer")
    g.add_argument("--save", default=None, metavar="RESULTS.json",
                   help="keep the server's per-prompt counts here")


def run(args) -> int:
    import tempfile

    from eagle3lab.errors import UserError
    from eagle3lab.measure.weakspots import server_per_request, weak_spots, worst_text

    try:
        bins = tuple(int(x) for x in args.bins.split(",") if x.strip())
    except ValueError:
        raise UserError(f"--bins must be comma-separated whole numbers, got {args.bins!r}.") \
            from None
    if (args.source is None) == (args.server is None):
        raise UserError("Give RESULTS (an `eagle3lab accept --json` output) or --server URL, "
                        "one of them.")
    with tempfile.TemporaryDirectory() as tmp:
        source = args.source
        if args.server is not None:
            source = args.save or f"{tmp}/results.json"
            server_per_request(args.server, prompts=args.prompts, target=args.target,
                               api=args.api, limit=args.limit,
                               max_new_tokens=args.max_new_tokens, save=source)
        w = weak_spots(source, arm=args.arm, worst=args.worst, export=args.export,
                       export_n=args.export_n, bins=bins)
    if args.json:
        print(json.dumps(w.to_dict(), indent=2, default=str))
        return 0
    src = w.source
    print(f"{len(w.ranking)} prompts from {src['path']} ({src['kind']}"
          + (f", arm {src['arm']!r}" if src.get("arm") else "") + "); tau = 1 + accepted "
          "drafts / verify steps, groups as ratios of sums")
    cols = ["length", "prompts", "verify_ct", "tau", "tau_min", "tau_max"]
    print("\ntau by prompt length (tokens):")
    print(w.by_length[cols].round(3).to_string(index=False))
    print("\ntau by kind:")
    print(w.by_category[["category"] + cols[1:]].round(3).to_string(index=False))
    print(f"\nworst {len(w.worst)}:")
    print(worst_text(w))
    if w.exported:
        print(f"\nexported the {min(args.export_n or args.worst, len(w.ranking))} weakest "
              f"prompts to {w.exported}")
    return 0
