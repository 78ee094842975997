"""`eagle3lab vocab`: the draft vocabulary map (d2t offsets, t2d mask) of a shard set (ours,
SpecForge's or speculators')."""

from __future__ import annotations

from eagle3lab.cli.common import add_command, aux_ids_option
from eagle3lab.data.foreign import DATA_FORMATS
from eagle3lab.targets.auxlayers import AUX_IDS_SYNTAX


def add_parser(sub) -> None:
    p = add_command(
        sub, "vocab", run,
        help="build the draft vocab map (d2t/t2d) from a shard set",
        description="Count the loss-masked target tokens in a shard set, keep the most "
        "frequent --draft-vocab-size, and save d2t (OFFSETS: target_id = i + d2t[i], as "
        "SGLang reads them) and t2d (bool mask over the target vocab) to "
        "vocab_map.safetensors next to the shards, with its sha256 in manifest.json. Do not "
        "rebuild the map of a drafter you fine-tune: its head is indexed by the old one.")
    p.add_argument("--data", required=True, help="shard directory (from `eagle3lab extract`), "
                   "or a SpecForge / speculators hidden-state directory")
    p.add_argument("--data-format", choices=DATA_FORMATS, default="auto",
                   help="format of --data (auto: detected)")
    p.add_argument("--target", default=None, help="a SpecForge / speculators set: the target "
                   "its states were captured from (asked once, then recorded in its "
                   "eagle3lab.manifest.json)")
    aux_ids_option(p, "--aux-ids",
                   help=f"a SpecForge / speculators set: the aux layer ids it was captured "
                   f"with, {AUX_IDS_SYNTAX}, in the tool's own convention (SpecForge: "
                   f"SGLang's, default [1, L//2-1, L-4]; speculators: vLLM's, default "
                   f"[2, L//2, L-3])")
    p.add_argument("--from-recorded", action="store_true",
                   help="a SpecForge / speculators set: take the map the tool recorded "
                   "(SpecForge's vocab_mapping/vocab_mapping.pt; speculators' token_freq.pt) "
                   "instead of counting the loss-masked tokens")
    p.add_argument("--draft-vocab-size", type=int, default=8192, help="draft vocabulary size")
    p.add_argument("--force", action="store_true", help="rebuild even if an equal map exists")
    p.add_argument("--no-verify", action="store_true",
                   help="skip checking the shards' recorded sha256s (cached by size and "
                   "mtime in sha256-cache.json, so a re-check of unchanged shards is instant)")


def run(args) -> int:
    from eagle3lab.data.vocab import build_shard_vocab

    v = build_shard_vocab(data=args.data, draft_vocab_size=args.draft_vocab_size,
                          force=args.force, verify=not args.no_verify,
                          data_format=args.data_format, target=args.target,
                          aux_ids=args.aux_ids,
                          source="recorded" if args.from_recorded else "counts")
    print(f"{args.data}/{v['file']}: {v['draft_vocab_size']} draft tokens cover "
          f"{v['coverage']:.1%} of {v['loss_tokens']:,} loss tokens "
          f"({v['distinct_loss_tokens']} distinct); sha256 {v['sha256'][:12]}...")
    return 0
