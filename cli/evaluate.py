"""``fedsched evaluate``: compare policies on a cluster, print a table, write JSON and a plot."""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from fedsched.common.dataclass_flags import add_dataclass_flags, given
from fedsched.common.model.traces import load_nodes, load_pods, resolve_path
from fedsched.common.sim.evaluate import EvalSpec, evaluate, format_table, plot, write_json
from fedsched.common.sim.packing import MAX_TARGET_LOAD
from fedsched.common.sim.replay import ReplayConfig

DEFAULT_NODES = "builtin:openb_node_list_gpu_node.csv"
DEFAULT_PODS = "builtin:openb_pod_list_default.csv"
# Flag names from before the replay flags were derived from ReplayConfig (also fedsched train's).
REPLAY_ALIASES = {"target_load": "--replay-load", "time_compression": "--time-compression",
                  "start_quantile": "--start-quantile"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="evaluate policies in the simulator",
                       description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--nodes", default=DEFAULT_NODES,
                   help="nodes CSV (openb schema) or builtin:NAME")
    p.add_argument("--pods", default=DEFAULT_PODS, help="pods CSV (openb schema) or builtin:NAME")
    p.add_argument("--mode", choices=("packing", "replay"), default="packing")
    p.add_argument("--policy", action="append", dest="policies", metavar="NAME",
                   help="baseline name or checkpoint path (repeatable; default: kube-default)")
    p.add_argument("--seeds", type=int, default=10, help="number of seeds (42, 43, ...; at most 10,000)")
    p.add_argument("--first-seed", type=int, default=42)
    p.add_argument("--target-load", type=float, default=1.3,
                   help="packing: arrived requests as a multiple of capacity (in (0, 10])")
    p.add_argument("--split", choices=("hash", "none"), default="hash",
                   help="hash: statistics from the train part, workload from the test part; "
                        "none: the whole pod list for both (the published FGD protocol)")
    p.add_argument("--test-fraction", type=float, default=0.3)
    p.add_argument("--train-pods", help="explicit pods CSV for statistics (overrides --split)")
    p.add_argument("--allow-oversized", action="store_true",
                   help="keep pods larger than every node (they fail) instead of rejecting the file")
    # Every replay knob (ReplayConfig's fields) as --replay-NAME; unset ones keep its defaults.
    add_dataclass_flags(p, ReplayConfig, prefix="replay", aliases=REPLAY_ALIASES,
                        title="replay mode (ReplayConfig; unset fields keep its defaults)")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    p.add_argument("--json", dest="json_out", help="write results as JSON")
    p.add_argument("--plot", dest="plot_out", help="write a PNG plot")
    p.set_defaults(func=run)


MAX_SEEDS = 10_000  # seconds to minutes a run: more is days of work, or a typo


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.seeds <= MAX_SEEDS:
        raise ValueError(f"--seeds must be in [1, {MAX_SEEDS:,}], got {args.seeds}")
    if args.first_seed < 0:
        raise ValueError(f"--first-seed must be at least 0, got {args.first_seed}")
    if not 0 < args.target_load <= MAX_TARGET_LOAD:  # NaN fails this too
        raise ValueError(f"--target-load must be in (0, {MAX_TARGET_LOAD:g}], got {args.target_load}")
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    nodes = load_nodes(resolve_path(args.nodes))
    pods = load_pods(resolve_path(args.pods), nodes, allow_oversized=args.allow_oversized)
    train = (load_pods(resolve_path(args.train_pods), nodes, allow_oversized=args.allow_oversized)
             if args.train_pods else None)
    replay_options = given(ReplayConfig, args, prefix="replay")
    if replay_options and args.mode != "replay":
        raise ValueError(f"--replay-* options need --mode replay "
                         f"(given: {', '.join(sorted(replay_options))})")
    if replay_options:
        ReplayConfig(**replay_options).validate()  # bad values fail before any run starts
    spec = EvalSpec(
        nodes=nodes, pods=pods, policies=args.policies or ["kube-default"],
        seeds=list(range(args.first_seed, args.first_seed + args.seeds)), mode=args.mode,
        target_load=args.target_load,
        test_fraction=None if args.split == "none" else args.test_fraction, train_pods=train,
        replay_options=replay_options,
    )
    print(f"evaluating {', '.join(spec.policies)} on {len(nodes)} nodes / {len(pods)} pods, "
          f"{args.mode} mode, {len(spec.seeds)} seeds", file=sys.stderr)
    bar: tqdm | None = None

    def progress(done: int, total: int, out) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit="run", file=sys.stderr)
        bar.update(1)
        bar.set_postfix_str(f"{out.policy} seed {out.seed}")

    result = evaluate(spec, jobs=args.jobs, progress=progress)
    if bar is not None:
        bar.close()
    print(format_table(result))
    if args.json_out:
        write_json(result, args.json_out)
        print(f"wrote {args.json_out}", file=sys.stderr)
    if args.plot_out:
        plot(result, args.plot_out)
        print(f"wrote {args.plot_out}", file=sys.stderr)
    return 0
