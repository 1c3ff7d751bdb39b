"""``fedsched federate``: the main job, a local multi-cluster federated training and evaluation."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    from fedsched.common.federation.run_config import app_defaults

    defaults = app_defaults()  # the Flower run config's, which FederateConfig also uses
    p = sub.add_parser("federate", help="federated training of member clusters (Flower simulation)",
                       description=__doc__)
    p.add_argument("--out", required=True, help="output directory (report.json, plots, logs)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test (under 2 minutes): the small 6-10-node members, 3 rounds, small "
                        "budgets, 2 seeds, FedAvg only; its verdicts are not a result")
    p.add_argument("--clusters", type=int, default=None,
                   help=f"number of member clusters (default: run config min-nodes = "
                        f"{defaults['min-nodes']})")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"federated rounds per strategy (default: run config num-server-rounds = "
                        f"{defaults['num-server-rounds']}; --quick: 3)")
    p.add_argument("--member-size", choices=("full", "small"), default=None,
                   help="the simulated members' clusters: full (40-100 nodes) or small (6-10-node smoke "
                        f"variants, never a result) (default: run config member-size = "
                        f"{defaults['member-size']})")
    p.add_argument("--eval-seeds", type=int, default=None,
                   help="replay seeds of each member's test evaluation (default 5; --quick: 2); the "
                        "intervals narrow as 1/sqrt(seeds), the evaluation's time grows with them")
    p.add_argument("--seed", type=int, default=None,
                   help=f"seed of the random starting model (--init random) (default: run config "
                        f"seed = {defaults['seed']})")
    p.add_argument("--training-seed", type=int, default=None,
                   help="seeds the members' rounds (replay windows, exploration, fits), federated and "
                        "alone: another value is another training run of the same configuration; pool "
                        "the reports of several with bench/federation_training_runs.py (default: run "
                        f"config training-seed = {defaults['training-seed']})")
    p.add_argument("--init", choices=("random", "shipped"), default=None,
                   help="the model every member, federated or alone, starts from: the shipped online "
                        "policy (what a fleet starts from: the gain of federated fine-tuning over "
                        "fine-tuning alone) or a seeded random model (learning from an untrained start) "
                        f"(default: run config init = {defaults['init']})")
    p.add_argument("--eta", type=float, default=None,
                   help=f"personalisation weight in [0, 1] (default: run config eta = {defaults['eta']})")
    p.add_argument("--kube-weight", type=float, default=None,
                   help="kube-default's score / 100 times this beside every model's logits, wherever a "
                        "model schedules (the members' collection and validation, the evaluation, the "
                        "hub's central evaluation), as the shipped online policy is served; 0: the logits "
                        f"alone (default: run config kube-weight = {defaults['kube-weight']})")
    p.add_argument("--reuse", action="store_true",
                   help="if --out holds a finished training with the same training settings, evaluate "
                        "its models again (e.g. with more --eval-seeds) instead of training again")
    p.add_argument("--app-dir", default=None, help="the Flower app directory (default: this checkout)")
    p.set_defaults(func=run)


def _stopping() -> None:
    print("federate: stopping (the local Flower runtime and the worker processes); a second Ctrl-C "
          "is ignored", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from fedsched.common.federation.run_config import APP_DIR
    from fedsched.experiment.config import FederateConfig
    from fedsched.experiment.federate import federate
    from fedsched.experiment.processes import stopped_by_signals
    from fedsched.experiment.report_text import format_report

    cfg = FederateConfig.quick() if args.quick else FederateConfig()
    if args.clusters is not None:
        if args.clusters < 2:
            raise ValueError("--clusters must be at least 2")
        cfg.clusters = args.clusters
    if args.rounds is not None:
        if args.rounds < 1:
            raise ValueError("--rounds must be at least 1")
        cfg.rounds = args.rounds
    if args.eval_seeds is not None:
        if args.eval_seeds < 2:
            raise ValueError("--eval-seeds must be at least 2 (one seed has no interval)")
        cfg.eval_seeds = args.eval_seeds
    if args.seed is not None:
        if not 0 <= args.seed < 2**63:  # torch's seed range (numpy's seeds are non-negative)
            raise ValueError(f"--seed must be in [0, 2**63), got {args.seed}")
        cfg.seed = args.seed
    if args.training_seed is not None:
        from fedsched.agent.federation.round import MAX_TRAINING_SEED

        if not 1 <= args.training_seed <= MAX_TRAINING_SEED:
            raise ValueError(f"--training-seed must be in [1, {MAX_TRAINING_SEED}], got {args.training_seed}")
        cfg.training_seed = args.training_seed
    if args.init is not None:
        cfg.init = args.init
    if args.member_size is not None:
        cfg.member_size = args.member_size
    if args.eta is not None:
        if not 0.0 <= args.eta <= 1.0:
            raise ValueError(f"--eta must be in [0, 1], got {args.eta}")
        cfg.eta = args.eta
    if args.kube_weight is not None:
        from fedsched.common.learning.scorers import MAX_KUBE_WEIGHT

        if not 0.0 <= args.kube_weight <= MAX_KUBE_WEIGHT:  # NaN fails too
            raise ValueError(f"--kube-weight must be in [0, {MAX_KUBE_WEIGHT:g}], got {args.kube_weight}")
        cfg.kube_weight = args.kube_weight
    app_dir = Path(args.app_dir) if args.app_dir else APP_DIR
    if not (app_dir / "pyproject.toml").exists():
        raise FileNotFoundError(f"{app_dir} is not the fedsched app directory (no pyproject.toml)")

    started = time.monotonic()

    def progress(msg: str) -> None:
        minutes, seconds = divmod(int(time.monotonic() - started), 60)
        print(f"federate [{minutes}:{seconds:02d}]: {msg}", file=sys.stderr, flush=True)

    # Ctrl-C and SIGTERM stop the job: the local Flower runtime and the workers it started too
    with stopped_by_signals(_stopping):
        report = federate(Path(args.out), cfg, app_dir, progress, reuse=args.reuse)
    print(format_report(report))
    print(f"wrote {Path(args.out) / 'report.json'} and {Path(args.out) / 'rounds.png'}", file=sys.stderr)
    return 0
