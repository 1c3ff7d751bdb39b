"""Attempt (issue 25, robustness): does the hub's direction check catch sign-flipped updates when
every profile has peers? With one member per profile the honest updates are nearly orthogonal
and a flip cannot be told from them (``federation_robust_cosine.txt``). Here 20 members (the member
table four times over, other generator seeds) train from the shipped start with the robustness
bench's budgets (300 decisions a round, 60 for the scarce members, 3 local epochs), and four of them
(20%: partitions 1, 7, 13, 19: web, edge, the CPU-heavy GPU inventory and the late web cluster, each
with three honest peers of its profile) send their update sign-flipped, under the run config's
direction check (``cosine-floor`` -0.3, against the coordinate-wise median of the round's other
updates, applied in rounds whose median cosine is above 0). Detection only: no test replay.

    python bench/results/attempts/flip_peers.py [--clean] [--rounds 3] [--out runs/flip_peers] [--json OUT]

Prints, per round, whether the check applied, the flipped and honest updates' cosines and what was
rejected.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/, for federation
import federation

from fedsched.common.federation.members import member_spec
from fedsched.experiment.config import FederateConfig

FLIPPERS = ("1", "7", "13", "19")
COSINE_FLOOR = -0.3  # the run config's cosine-floor


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--out", default="runs/flip_peers")
    ap.add_argument("--clean", action="store_true", help="the same federation with no member flipping")
    ap.add_argument("--reuse", action="store_true", help="read a finished run in --out instead of running it")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    federation.REUSE = args.reuse
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.update(federation.private_superlink_ports())
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cfg = FederateConfig(rounds=args.rounds, local_decisions=300, scarce_decisions=60, late_round=2,
                         local_epochs=3, clusters=args.members, strategies=("fedavg",), member_size="full",
                         init="shipped")
    extra = {} if args.clean else {"poison-members": ",".join(FLIPPERS), "poison-kind": "flip"}
    name = "clean-peers" if args.clean else "flip-peers"
    rec = federation.flower(out, name, "fedavg", cfg, extra)
    rows = []
    for e in federation.history(out / name):
        cos = {int(k): v for k, v in e.get("cosines", {}).items()}
        flipped = {p: round(c, 3) for p, c in cos.items() if str(p) in FLIPPERS}
        honest = [c for p, c in cos.items() if str(p) not in FLIPPERS]
        # rounds.json names a rejection by node id; under this run's checks a member whose cosine is
        # below the floor in a checked round is the one rejected (the reasons are kept beside)
        below = sorted(p for p, c in cos.items() if e.get("direction_checked") and c < COSINE_FLOOR)
        n_rejected = len(e.get("rejected", []))
        rejected = below if len(below) == n_rejected else [f"{n_rejected} (see reasons)"]
        row = {"round": e["round"], "central": e["central"].get("trouble_score"),
               "direction_checked": e.get("direction_checked"),
               "median_cosine": round(statistics.median(cos.values()), 3) if cos else None,
               "flipped": flipped, "honest_min": round(min(honest), 3) if honest else None,
               "honest_median": round(statistics.median(honest), 3) if honest else None,
               "rejected": rejected, "reasons": [r["reason"] for r in e.get("rejected", [])],
               "flippers_rejected": [p for p in below if str(p) in FLIPPERS],
               "honest_rejected": [f"{p} ({member_spec(p).name})" for p in below if str(p) not in FLIPPERS],
               "cosines": {f"{p} ({member_spec(p).name})": round(c, 3) for p, c in sorted(cos.items())}}
        rows.append(row)
        print(json.dumps(row))
    result = {"config": {"members": args.members, "rounds": args.rounds, "flippers": FLIPPERS, **extra},
              "wall_s": rec.get("wall_s"), "rounds": rows}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
