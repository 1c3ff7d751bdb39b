"""``fedsched train``: train a scheduling policy in the simulator.

Continuous training: ``fedsched train --init CKPT --log DIR [--window N] [--lr LR] --out OUT``
fine-tunes CKPT on the newest N decisions of the decision log DIR (written by the online
agent, or by ``--algo bc --record-log DIR``), by behaviour cloning with a small learning rate.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from fedsched.common.model.traces import load_nodes, load_pods, resolve_path

DEFAULT_NODES = "builtin:openb_node_list_gpu_node.csv"
DEFAULT_PODS = "builtin:openb_pod_list_default.csv"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except ``None`` ones (their help says what happens when not given)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a policy in the simulator", description=__doc__,
                       formatter_class=_HelpFormatter)
    p.add_argument("--algo", choices=("ppo", "td3", "bc", "finetune"), default=None,
                   help="ppo: node-scoring policy; td3: resource-weight policy; "
                        "bc: imitate --teacher (a warm start for --init); "
                        "finetune: fit --init to --log (default: finetune with --log, else ppo)")
    p.add_argument("--policy-kind", choices=("node-scoring", "weights"), default="node-scoring",
                   help="bc: which policy to fit (weights: the TD3 actor)")
    p.add_argument("--teacher", default="fgd", help="bc: scheduler to imitate")
    p.add_argument("--bc-samples", type=int, default=20_000, help="bc: teacher decisions to log")
    p.add_argument("--bc-epochs", type=int, default=8, help="bc, finetune: passes over the decisions")
    p.add_argument("--record-log", metavar="DIR",
                   help="bc: also append the teacher's decisions to the decision log DIR")
    p.add_argument("--log", metavar="DIR",
                   help="continuous training: fine-tune --init on this decision log")
    p.add_argument("--window", type=int, default=None,
                   help="with --log: the newest decisions to fit (default: 5000)")
    p.add_argument("--nodes", default=DEFAULT_NODES, help="nodes CSV (openb schema) or builtin:NAME")
    p.add_argument("--pods", default=DEFAULT_PODS, help="pods CSV (openb schema) or builtin:NAME")
    p.add_argument("--mode", choices=("packing", "replay"), default="packing")
    p.add_argument("--steps", type=int, default=200_000, help="pod decisions to train on")
    p.add_argument("--out", required=True, help="run directory (logs, checkpoints)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--init", help="start from this checkpoint's weights")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=256, help="decisions per env per rollout")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate of ppo/td3 (default: 3e-4) and of --log fine-tuning (default: 1e-4)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--ent-coef", type=float, default=0.003)
    p.add_argument("--critic-warmup", type=int, default=0,
                   help="ppo: updates that train only the critic (use with --init)")
    p.add_argument("--slice-nodes", type=int, default=200, help="nodes per training slice (0: all)")
    p.add_argument("--eval-nodes", type=int, default=400, help="nodes in the held-out eval slice (0: all)")
    p.add_argument("--eval-every", type=int, default=10, help="updates between evaluations (0: never)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="updates between checkpoints")
    p.add_argument("--target-load", type=float, default=1.3)
    p.add_argument("--replay-load", type=float, default=None,
                   help="replay: scale pod durations to this mean requested load (fraction)")
    p.add_argument("--time-compression", type=float, default=None, help="replay: trace s per sim s")
    p.add_argument("--start-quantile", type=float, default=None,
                   help="replay: start at the creation time of this quantile of pods")
    p.add_argument("--test-fraction", type=float, default=0.3)
    p.add_argument("--time-budget", type=float, default=None, help="stop after this many minutes")
    p.add_argument("--allow-oversized", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fedsched.agent.learning.bc import BCConfig
    from fedsched.agent.learning.ppo import PPOConfig
    from fedsched.agent.learning.td3 import TD3Config
    from fedsched.agent.learning.training import TrainSpec, run_training

    if args.steps < 1 or args.num_envs < 1 or args.num_steps < 1:
        raise ValueError("--steps, --num-envs and --num-steps must be positive")
    algo = args.algo or ("finetune" if args.log else "ppo")
    if args.window is not None and not args.log:
        raise ValueError("--window needs --log DIR (the decision log to fine-tune on)")
    if args.log and algo != "finetune":
        raise ValueError(f"--log fine-tunes --init on a decision log; it does not combine with --algo {algo}")
    if algo == "finetune":
        if not args.log:
            raise ValueError("--algo finetune needs --log DIR (the decision log to fine-tune on)")
        if not args.init:
            raise ValueError("--log fine-tunes an existing checkpoint: give it with --init CKPT")
        if args.resume:
            raise ValueError("--resume does not apply to --log fine-tuning")
    if args.record_log and algo != "bc":
        raise ValueError("--record-log records the teacher's decisions of --algo bc")
    lr = args.lr if args.lr is not None else 3e-4
    nodes = load_nodes(resolve_path(args.nodes))
    pods = load_pods(resolve_path(args.pods), nodes, allow_oversized=args.allow_oversized)
    replay_args = (("target_load", args.replay_load), ("time_compression", args.time_compression),
                   ("start_quantile", args.start_quantile))
    replay = {k: v for k, v in replay_args if v is not None}
    spec = TrainSpec(
        nodes=nodes, pods=pods, out=Path(args.out), mode=args.mode, algo=algo, teacher=args.teacher,
        bc=(BCConfig(samples=args.bc_samples, epochs=args.bc_epochs, seed=args.seed)
            if algo != "finetune" else
            BCConfig(epochs=args.bc_epochs, seed=args.seed,
                     learning_rate=args.lr if args.lr is not None else 1e-4)),
        policy_kind=args.policy_kind,
        td3=TD3Config(total_steps=args.steps, hidden=args.hidden, seed=args.seed,
                      actor_lr=lr, critic_lr=lr),
        ppo=PPOConfig(total_steps=args.steps, num_steps=args.num_steps, learning_rate=lr,
                      hidden=args.hidden, seed=args.seed, ent_coef=args.ent_coef,
                      critic_warmup=args.critic_warmup),
        num_envs=args.num_envs, slice_nodes=args.slice_nodes, target_load=args.target_load,
        test_fraction=args.test_fraction, eval_every=args.eval_every, eval_nodes=args.eval_nodes,
        checkpoint_every=args.checkpoint_every, resume=args.resume,
        init=Path(args.init) if args.init else None,
        time_budget_s=args.time_budget * 60 if args.time_budget else None,
        replay=replay,
        record_log=Path(args.record_log) if args.record_log else None,
        log=Path(args.log) if args.log else None,
        window=args.window if args.window is not None else 5000,
    )
    bar: tqdm | None = None

    def progress(row: dict, total: int) -> None:
        nonlocal bar
        if "phase" in row:  # behaviour cloning: collection then fitting
            print(f"bc {row['phase']}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                   for k, v in row.items() if k != "phase"), file=sys.stderr)
            return
        if bar is None:
            bar = tqdm(total=total, initial=int(row["update"]) - 1, unit="update", file=sys.stderr)
        bar.update(1)
        post = {"sps": f"{row['steps_per_s']:.0f}"}
        if "approx_kl" in row:
            post["kl"] = f"{row['approx_kl']:.3f}"
        if "q_mean" in row:
            post["q"] = f"{row['q_mean']:.2f}"
        for k, v in row.items():
            if k.startswith("eval_") and v != "":
                post["eval"] = f"{v:.2f}"
        bar.set_postfix(post)

    if algo == "finetune":
        print(f"fine-tuning {args.init} on the newest {spec.window} decisions of {args.log} "
              f"(lr {spec.bc.learning_rate:g}) -> {args.out}", file=sys.stderr)
    else:
        print(f"training {algo} on {len(nodes)} nodes / {len(pods)} pods ({args.mode}), "
              f"{args.steps} steps -> {args.out}", file=sys.stderr)
    summary = run_training(spec, progress=progress)
    if bar is not None:
        bar.close()
    print(json.dumps(summary, indent=2, default=float))
    return 0
