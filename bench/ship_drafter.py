"""Ship the study's winner as the default drafter (eagle3lab.study.ship: what it checks).

After a session's poll brought a run's final drafter back (results.tar.gz's
collected/winner/, packed with its winner.json) and the run's results are copied into the
study (data/studies/h200-grok/runs/RUN/), this replaces the shipped drafter directory with
it, if the run beats the drafter it replaces on the held-out prompts (the study's final
live tau at 5,1,6). The card (README.md) is kept: rewrite its numbers by hand, then the
tests that hold measured numbers of the shipped drafter (docs/study.md, "Next").

    python3 bench/ship_drafter.py --winner collected/winner \\
        [--study data/studies/h200-grok] [--dest data/drafters/smollm2-135m-instruct] [--force]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's eagle3lab

from eagle3lab.errors import UserError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from eagle3lab.workdir import default_drafter

    ap = argparse.ArgumentParser(
        prog="bench/ship_drafter.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--winner", required=True,
                    help="the packed drafter a poll brought back (collected/winner/)")
    ap.add_argument("--study", default=str(ROOT / "data/studies/h200-grok"),
                    help="the study's committed results, the winner's run among them "
                         "(default: this checkout's data/studies/h200-grok)")
    ap.add_argument("--dest", default=None,
                    help="the shipped drafter directory to replace (default: the default "
                         "target's shipped drafter)")
    ap.add_argument("--force", action="store_true",
                    help="ship it even if its run does not beat the drafter it replaces")
    args = ap.parse_args(argv)
    from eagle3lab.study.ship import ship_winner

    try:
        r = ship_winner(winner=args.winner, study=args.study,
                        dest=args.dest or default_drafter(), force=args.force)
    except UserError as e:
        print(f"bench/ship_drafter.py: error: {e}", file=sys.stderr)
        return 1
    was = (f"{r['replaced_run']} ({r['replaced_tau']:.3f})" if r["replaced_tau"] is not None
           else "a drafter of no run of this study")
    print(f"shipped {r['run']} (tau {r['tau']:.3f} at {r['setting']}) into {r['dest']}, "
          f"replacing {was}; SHA256SUMS: " + ", ".join(f"{n} {d[:12]}" for n, d in
                                                      r["sums"].items()))
    print(f"Next: rewrite {Path(r['dest']) / 'README.md'} (it still describes {was}), then "
          f"the tests that hold the shipped drafter's measured numbers.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
