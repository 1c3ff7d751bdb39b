"""``fedsched evidence``: replay a policy beside kube-default on a validation cluster of each
profile at realistic size, print the paired figures and the roll-out gate's verdict per profile,
and with ``--write`` store them in the checkpoint (the gate of ``fedsched serve`` reads them). A
baseline's evidence (``fedsched evidence fgd``) goes to the file shipped with the package
(``common/data/evidence/NAME.json``): the gate reads it where the packing check would serve that
baseline in the policy's place (``fedsched serve --packing-alternatives``).

``--search ARGS`` replays the decision-time search over the policy instead (what ``fedsched serve
--search ARGS`` runs) and stores its figures apart, under ``search_evidence``: the gate judges a
policy served with the search by these only."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from fedsched.common.model.profiles import PROFILES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evidence", help="the roll-out gate's evidence for a policy (paired replays)",
                       description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("policy", help="a checkpoint path (*.pt), a shipped policy name "
                                  "(learned, learned-td3, learned-online) or a baseline name (fgd, ...)")
    p.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated profiles")
    p.add_argument("--seeds", type=int, default=None,
                   help="replay seeds per profile (default: the profile's scenario's, 60)")
    p.add_argument("--quick", action="store_true",
                   help="the 8-10-node variants (a smoke test: the gate never admits on them)")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    p.add_argument("--write", action="store_true",
                   help="store the evidence in the checkpoint's metadata (a shipped name writes the "
                        "shipped file; a baseline, its shipped evidence file)")
    p.add_argument("--json", dest="json_out", help="also write the evidence as JSON here")
    p.add_argument("--search", help="the evidence of the decision-time search over the policy, as "
                                    "fedsched serve --search runs it ('default' or key=value,...)")
    p.add_argument("--run-cache", default=None,
                   help="where kube-default's runs are cached between evidence runs (default: "
                        "FEDSCHED_RUN_CACHE, else ~/.cache/fedsched/runs); one cached run is replayed "
                        "to check the rest; the least recently used go past FEDSCHED_RUN_CACHE_MAX_MB "
                        "(default 1000)")
    p.add_argument("--no-run-cache", action="store_true", help="replay kube-default every time")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fedsched.agent.serving.rollout_gate import gate
    from fedsched.cli.serve import search_args
    from fedsched.common.learning.checkpoint import load_checkpoint, update_metadata
    from fedsched.common.schedulers import BASELINES, SHIPPED, default_policy_path
    from fedsched.common.schedulers.lookahead import ARGS_PREFIX
    from fedsched.common.sim.evidence import baseline_evidence_path, collect
    from fedsched.common.sim.run_cache import RunCache

    profiles = [p for p in args.profiles.split(",") if p]
    baseline = args.policy in BASELINES
    search = search_args(args.search)
    spec = search.spec() if search is not None else None
    if baseline:
        path = baseline_evidence_path(args.policy)  # a clear error for kube-default, the reference
        if spec is not None:
            raise ValueError("--search is the search over a checkpoint's model; a baseline has none")
        replayed = args.policy
    else:
        path = default_policy_path(args.policy) if args.policy in SHIPPED else Path(args.policy)
        load_checkpoint(path)  # a clear error before any replay
        replayed = str(path) if spec is None else f"{ARGS_PREFIX}{spec}]:{path}"
    t0 = time.time()

    def progress(profile: str, k: int, n: int, o: Any) -> None:
        print(f"[{profile}] {k}/{n} {o.policy} seed {o.seed} ({time.time() - t0:.0f} s)", file=sys.stderr,
              flush=True)

    cache = None if args.no_run_cache else RunCache(args.run_cache)
    ev = collect(replayed, profiles, seeds=args.seeds, jobs=args.jobs, quick=args.quick, progress=progress,
                 cache=cache)
    recipe = [f"fedsched evidence {args.policy} --profiles {','.join(profiles)}"]
    recipe += [f"--seeds {args.seeds}"] if args.seeds is not None else []
    recipe += ["--quick"] if args.quick else []
    recipe += [f"--search {spec}"] if spec is not None else []
    ev |= {"policy": args.policy, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "recipe": " ".join(recipe)}
    if spec is None:
        meta = {"evidence": ev}
    else:
        ev["search"] = spec
        meta = {"search_evidence": ev}
    for profile, e in ev["profiles"].items():
        t = e["trouble_score"]
        verdict = gate(meta, profile, search=spec)
        print(f"{profile}: {e['nodes']} nodes, {len(e['seeds'])} seeds: trouble score {t['mean']:+.3f} ± "
              f"{t['ci95']:.3f} ({t['verdict']}); "
              + ", ".join(f"{m} {v['mean']:+.3f} ± {v['ci95']:.3f}" for m, v in e["log_ratio"].items())
              + f"\n  gate: {'active' if verdict.active else 'shadow'}: {verdict.reason}")
        if e.get("cached_runs"):
            where = cache.root if cache is not None else "?"
            print(f"  ({e['cached_runs']} runs from the run cache in {where}, one more replayed to check)",
                  file=sys.stderr)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(ev, indent=1, allow_nan=True))
    if args.write and baseline:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(ev, indent=1, allow_nan=True))
        tmp.replace(path)
        print(f"wrote the evidence to {path}")
    elif args.write:
        update_metadata(path, meta)
        print(f"wrote the evidence into {path}")
    print(f"({time.time() - t0:.0f} s)", file=sys.stderr)
    return 0
