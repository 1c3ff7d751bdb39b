"""Merge the checkpoints of several trainings of one recipe into one policy that scores with
the mean of their logits (``common.learning.nets.average_policies``: exact, one ordinary
node-scoring network of width K * hidden, served, judged and exported like any other; the
federation's members build the default width, so an ensemble is no federation start).

Why. One training of the online recipe is one draw: its training clusters, episodes and fit
seed move the gate's paired trouble score by as much as the goals ask for (a retraining with
another seed alone moved web's by +0.045 and flipped the gate's web verdict). The mean of K
independent trainings is a draw of smaller variance, a bagged regressor of the same credit.
Measured on the online recipe (the policies README): the ensemble of four trainings ties the
mean of its members on every profile, so no ensemble ships; the tool stays for judging and
serving a recipe rather than one lucky or unlucky draw. Each member multiplies the logits' time
(about 2x for two, 5x for four at 500 nodes).

    python -m fedsched.agent.learning.ensemble --out runs/online-ensemble/checkpoint.pt \\
        runs/online-seed1/checkpoint.pt runs/online-seed2/checkpoint.pt ...

The members must be node-scoring checkpoints of one shape (``average_policies`` refuses
mixed widths), scored alike (the same scoring
options and typical pods) and of one operating mode; each is named once. The merged file
keeps their shared metadata, lists the members (path, recipe, data hash, fit) under
``ensemble`` and holds no evidence: the gate judges the ensemble by its own (``fedsched
evidence``). May import ``fedsched.common``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import Any

from fedsched.common.learning.checkpoint import load_checkpoint, save_checkpoint, typical_from_dict
from fedsched.common.learning.kinds import NODE_SCORING, kind_of
from fedsched.common.learning.nets import average_policies
from fedsched.common.learning.scorers import SCORING_KEY, scoring_options

SHARED_KEYS = ("typical_pods", SCORING_KEY, "operating_mode")
"""Metadata every member must agree on: they decide how the merged logits are scored."""
MEMBER_KEYS = ("recipe", "data_hash", "created", "algorithm", "fit")
"""Metadata kept per member under ``ensemble``."""


def _weights_digest(policy: Any) -> str:
    h = hashlib.sha256()
    for name, t in sorted(policy.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def merge_checkpoints(paths: list[Path], out: Path) -> Path:
    """Write the ensemble of ``paths`` to ``out`` (module docstring); a ``ValueError`` naming the
    member and the fault for members that cannot be merged."""
    if len(paths) < 2:
        raise ValueError(f"an ensemble needs at least two checkpoints, got {len(paths)}")
    policies, metas, digests = [], [], {}
    for path in paths:
        policy, meta, _ = load_checkpoint(path)
        if kind_of(policy) != NODE_SCORING:
            raise ValueError(f"{path}: a {kind_of(policy)} policy; only node-scoring policies average")
        scoring_options(meta, NODE_SCORING)  # a malformed option is refused here, not when served
        digest = _weights_digest(policy)
        if digest in digests:
            raise ValueError(f"{path}: the same weights as {digests[digest]}; a member named twice "
                             "would count twice")
        digests[digest] = path
        for key in SHARED_KEYS:
            if metas and meta.get(key) != metas[0].get(key):
                raise ValueError(f"{path}: its {key!r} differs from {paths[0]}'s; members must be "
                                 "scored alike")
        policies.append(policy)
        metas.append(meta)
    merged = average_policies(policies)
    first = metas[0]
    algorithms = sorted({str(m.get("algorithm")) for m in metas})
    members = [{"checkpoint": str(p), **{k: m.get(k) for k in MEMBER_KEYS}}
               for p, m in zip(paths, metas, strict=True)]
    command = ("python -m fedsched.agent.learning.ensemble --out " + str(out) + " "
               + " ".join(str(p) for p in paths))
    extra = {key: first[key] for key in SHARED_KEYS if key in first and key != "typical_pods"}  # saved below
    extra |= {"recipe": command, "teacher": first.get("teacher"),
              "ensemble": {"size": len(paths), "members": members}}
    data = "+".join(sorted({part for m in metas for part in str(m.get("data_hash", "")).split("+") if part}))
    return save_checkpoint(out, merged, algorithm="+".join(algorithms) + f"-ensemble{len(paths)}",
                           hyperparameters={"members": [m.get("hyperparameters") for m in metas]},
                           typical=typical_from_dict(first.get("typical_pods")), data=data, extra=extra)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedsched.agent.learning.ensemble",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the merged checkpoint to write")
    ap.add_argument("checkpoints", type=Path, nargs="+", help="two or more node-scoring checkpoints")
    args = ap.parse_args(argv)
    try:
        path = merge_checkpoints(args.checkpoints, args.out)
    except ValueError as e:  # CheckpointError included
        ap.exit(2, f"{ap.prog}: error: {e}\n")
    print(f"wrote {path}: the mean of {len(args.checkpoints)} policies", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
