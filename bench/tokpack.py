"""Carry conversations between device sessions as token ids: pack a JSONL (and its
.meta.json) into NAME.partNN.npz files that each fit a device call's returned-file limit,
and unpack them back to the same bytes (`eagle3lab.data.tokpack`).

Prevents regenerating the study's answers in every 30-minute device session: a call
returns at most 8 files of 16 MiB, and 20M answer tokens as JSON text are ~150 MB, as
uint16 ids ~40 MB before compression.

    # on the device, after `regenerate --out $OUT/greedy.jsonl`:
    python3 -P bench/tokpack.py pack /root/e3l/data/greedy.jsonl $OUT \\
        --target $E3L_TARGET [--max-bytes 15728640]
    # here, from the returned files (or on the next device call, from a carried folder):
    .venv/bin/python -P bench/tokpack.py unpack FILES_AT/greedy.part*.npz --out greedy.jsonl

A prompts file (self-prompt's) is packed as bytes (what a resumed regenerate checks by
sha256). Prints one JSON summary. A bench script, not an `eagle3lab` subcommand: carrying
is the device's logistics (as bench/vllm_carry.py), not a pipeline stage.
(-P keeps bench/ off sys.path.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from eagle3lab.config import DEFAULT_TARGET
    from eagle3lab.data.tokpack import MAX_BYTES

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pack", help="JSONL (+ .meta.json) -> OUT_DIR/NAME.partNN.npz")
    p.add_argument("jsonl")
    p.add_argument("out_dir")
    p.add_argument("--max-bytes", type=int, default=MAX_BYTES,
                   help=f"largest part (default {MAX_BYTES}: 15 MiB)")
    p.add_argument("--name", default=None, help="NAME of the parts (default: the file's)")
    p.add_argument("--mode", choices=("auto", "tokens", "bytes"), default="auto")
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help="whose tokenizer decodes the answers (preset or directory)")
    p = sub.add_parser("unpack", help="parts -> the JSONL (+ .meta.json), byte for byte")
    p.add_argument("parts", nargs="+", help="the part files, or one folder holding them")
    p.add_argument("--out", required=True)
    p.add_argument("--target", default=DEFAULT_TARGET)
    args = ap.parse_args(argv)

    from eagle3lab.data.tokpack import pack, unpack

    if args.what == "pack":
        s = pack(args.jsonl, args.out_dir, max_bytes=args.max_bytes, target=args.target,
                 name=args.name, mode=args.mode)
    else:
        parts = args.parts[0] if len(args.parts) == 1 and Path(args.parts[0]).is_dir() \
            else args.parts
        s = unpack(parts, args.out, target=args.target)
    print(json.dumps(s, indent=1))
    return 0


if __name__ == "__main__":
    from eagle3lab.cli import bench_main

    raise SystemExit(bench_main("tokpack.py", main))
