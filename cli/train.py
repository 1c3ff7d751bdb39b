"""``fedsched train``: train a scheduling policy in the simulator.

Every field of the run (``TrainSpec``) and of the algorithms' hyper-parameter dataclasses
(``PPOConfig``, ``TD3Config``, ``BCConfig``, the reward weights ``RewardConfig`` and, in replay
mode, ``ReplayConfig``) has a flag, derived from the field: its name with dashes under the
dataclass's prefix (``--ppo-clip-coef``, ``--td3-policy-noise``, ``--bc-epochs``,
``--reward-oom``, ``--replay-max-pods``), its docstring as help and its default. A few shared
flags set the same field of several algorithms (``--seed``, ``--steps``, ``--lr``, ``--hidden``);
a dataclass's own flag wins over a shared one (``--seed 3 --ppo-seed 5`` seeds PPO with 5).

Continuous training: ``fedsched train --init CKPT --log DIR [--window N] [--lr LR] --out OUT``
fine-tunes CKPT on the newest N decisions of the decision log DIR (written by the online
agent, or by ``--algo bc --record-log DIR``), by behaviour cloning with a small learning rate.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import fields, replace
from typing import Any

from tqdm import tqdm

from fedsched.common.dataclass_flags import add_dataclass_flags, build, default_of, given
from fedsched.common.model.traces import load_nodes, load_pods, resolve_path
from fedsched.common.sim.packing import MAX_TARGET_LOAD

DEFAULT_NODES = "builtin:openb_node_list_gpu_node.csv"
DEFAULT_PODS = "builtin:openb_pod_list_default.csv"

# Dataclass -> flag prefix; TrainSpec's own fields have none.
PREFIXES = {"PPOConfig": "ppo", "TD3Config": "td3", "BCConfig": "bc", "RewardConfig": "reward",
            "ReplayConfig": "replay"}
# Flag names from before the flags were derived from the dataclasses, kept as aliases.
ALIASES: dict[str, dict[str, str]] = {
    "PPOConfig": {"num_steps": "--num-steps", "ent_coef": "--ent-coef", "critic_warmup": "--critic-warmup"},
    "ReplayConfig": {"target_load": "--replay-load", "time_compression": "--time-compression",
                     "start_quantile": "--start-quantile"},
}
# TrainSpec fields set otherwise: the data by path (--nodes, --pods), the nested dataclasses by
# their own flags, the time budget in minutes (--time-budget).
SPEC_EXCLUDE = ("nodes", "pods", "ppo", "td3", "bc", "reward", "replay", "time_budget_s")


def _classes() -> dict[str, type]:
    from fedsched.agent.learning.bc import BCConfig
    from fedsched.agent.learning.env import RewardConfig
    from fedsched.agent.learning.ppo import PPOConfig
    from fedsched.agent.learning.td3 import TD3Config
    from fedsched.agent.learning.training import TrainSpec
    from fedsched.common.sim.replay import ReplayConfig

    return {"TrainSpec": TrainSpec, "PPOConfig": PPOConfig, "TD3Config": TD3Config, "BCConfig": BCConfig,
            "RewardConfig": RewardConfig, "ReplayConfig": ReplayConfig}


def _default(cls: type, name: str) -> Any:
    return default_of(next(f for f in fields(cls) if f.name == name))


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's paragraphs; the flags' help already ends with its default."""


def register(sub: argparse._SubParsersAction) -> None:
    c = _classes()
    ppo, td3 = c["PPOConfig"], c["TD3Config"]
    p = sub.add_parser("train", help="train a policy in the simulator", description=__doc__,
                       formatter_class=_HelpFormatter)
    data = p.add_argument_group("data")
    data.add_argument("--nodes", default=DEFAULT_NODES,
                      help=f"nodes CSV (openb schema) or builtin:NAME (default: {DEFAULT_NODES})")
    data.add_argument("--pods", default=DEFAULT_PODS,
                      help=f"pods CSV (openb schema) or builtin:NAME (default: {DEFAULT_PODS})")
    data.add_argument("--allow-oversized", action="store_true",
                      help="keep pods that fit no node (default: refuse the file)")

    shared = p.add_argument_group(
        "shared by the algorithms",
        "Each sets a field of several dataclasses below; that dataclass's own flag wins over it.")
    shared.add_argument("--seed", type=int, metavar="INT",
                        help="--ppo-seed, --td3-seed and --bc-seed "
                             f"(default: theirs, {_default(ppo, 'seed')})")
    shared.add_argument("--steps", type=int, metavar="INT",
                        help="--ppo-total-steps and --td3-total-steps: pod decisions to train on "
                             f"(default: theirs, {_default(ppo, 'total_steps')} and "
                             f"{_default(td3, 'total_steps')})")
    shared.add_argument("--lr", type=float, metavar="FLOAT",
                        help="--ppo-learning-rate, --td3-actor-lr and --td3-critic-lr, and with --log the "
                             f"fine-tuning rate --bc-learning-rate (default: theirs, "
                             f"{_default(ppo, 'learning_rate')}; fine-tuning: "
                             f"{_finetune_lr()}; not --algo bc's)")
    shared.add_argument("--hidden", type=int, metavar="INT",
                        help=f"--ppo-hidden and --td3-hidden (default: theirs, {_default(ppo, 'hidden')})")

    run_group = p.add_argument_group("run (TrainSpec)")
    add_dataclass_flags(run_group, c["TrainSpec"], exclude=SPEC_EXCLUDE)
    run_group.add_argument("--time-budget", type=float, metavar="MINUTES",
                           help="stop after this much wall time, in minutes (default: no limit)")
    for name, title in (("PPOConfig", "ppo (PPOConfig)"), ("TD3Config", "td3 (TD3Config)"),
                        ("BCConfig", "bc and finetune (BCConfig)"),
                        ("RewardConfig", "reward weights (RewardConfig)"),
                        ("ReplayConfig", "replay mode (ReplayConfig; unset fields keep its defaults)")):
        add_dataclass_flags(p, c[name], prefix=PREFIXES[name], aliases=ALIASES.get(name), title=title)
    p.set_defaults(func=run)


def _finetune_lr() -> float:
    from fedsched.agent.learning.training import FINETUNE_LEARNING_RATE

    return FINETUNE_LEARNING_RATE


def _set(**values: Any) -> dict[str, Any]:
    """The shared flags that were given (None: not given)."""
    return {k: v for k, v in values.items() if v is not None}


def build_spec(args: argparse.Namespace, nodes: Any = None, pods: Any = None) -> Any:
    """The ``TrainSpec`` of the parsed flags (checks the combinations that cannot run)."""
    c = _classes()
    spec_given = given(c["TrainSpec"], args, exclude=SPEC_EXCLUDE)
    log = spec_given.get("log")
    algo = spec_given.get("algo") or ("finetune" if log else _default(c["TrainSpec"], "algo"))
    if "window" in spec_given and not log:
        raise ValueError("--window needs --log DIR (the decision log to fine-tune on)")
    if log and algo != "finetune":
        raise ValueError(f"--log fine-tunes --init on a decision log; it does not combine with --algo {algo}")
    if algo == "finetune":
        if not log:
            raise ValueError("--algo finetune needs --log DIR (the decision log to fine-tune on)")
        if not spec_given.get("init"):
            raise ValueError("--log fine-tunes an existing checkpoint: give it with --init CKPT")
        if spec_given.get("resume"):
            raise ValueError("--resume does not apply to --log fine-tuning")
    if spec_given.get("record_log") and algo != "bc":
        raise ValueError("--record-log records the teacher's decisions of --algo bc")

    def config(name: str, **shared: Any) -> Any:
        return build(c[name], args, prefix=PREFIXES[name], defaults=_set(**shared))

    ppo = config("PPOConfig", seed=args.seed, total_steps=args.steps, learning_rate=args.lr,
                 hidden=args.hidden)
    td3 = config("TD3Config", seed=args.seed, total_steps=args.steps, actor_lr=args.lr, critic_lr=args.lr,
                 hidden=args.hidden)
    bc_lr = (args.lr if args.lr is not None else _finetune_lr()) if algo == "finetune" else None
    bc = config("BCConfig", seed=args.seed, learning_rate=bc_lr)
    spec = build(c["TrainSpec"], args, exclude=SPEC_EXCLUDE, defaults=dict(
        nodes=nodes, pods=pods, algo=algo, ppo=ppo, td3=td3, bc=bc,
        reward=config("RewardConfig"),
        replay=given(c["ReplayConfig"], args, prefix=PREFIXES["ReplayConfig"]),
        time_budget_s=args.time_budget * 60 if args.time_budget is not None else None))
    for name, value in (("--steps", min(ppo.total_steps, td3.total_steps)), ("--num-envs", spec.num_envs),
                        ("--num-steps", ppo.num_steps)):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    check_numbers(spec)
    return spec


MAX_NUM_ENVS = 1024  # each holds a cluster and its caches: more only fills the memory
AT_LEAST_ONE = {"ppo": ("num_minibatches", "update_epochs", "hidden", "torch_threads"),
                "td3": ("total_steps", "buffer_size", "batch_size", "policy_delay", "hidden", "log_every",
                        "torch_threads"),
                "bc": ("samples", "epochs", "batch_size"), "": ("window",)}
AT_LEAST_ZERO = {"ppo": ("seed", "critic_warmup"), "td3": ("seed", "learning_starts"), "bc": ("seed",),
                 "": ("slice_nodes", "eval_every", "eval_nodes", "eval_seed", "checkpoint_every")}
FRACTIONS = {"ppo": ("gamma", "gae_lambda"), "td3": ("gamma", "tau")}
RATES = {"ppo": ("learning_rate",), "td3": ("actor_lr", "critic_lr"), "bc": ("learning_rate",)}


def check_numbers(spec: Any) -> None:
    """Numbers nothing can train with, refused with the flag's name before any data is read:
    a NaN or infinite value anywhere (a NaN discount used to end in a tensor dump), counts below
    1 (``--hidden 0`` trained a network of no width), seeds and sizes below 0 (numpy's message
    names no flag), discounts outside [0, 1], learning rates not above 0, and the target load,
    environments and time budget outside their ranges."""
    if spec.time_budget_s is not None and not 0 < spec.time_budget_s < math.inf:  # NaN too
        raise ValueError(f"--time-budget must be above 0 minutes, got {spec.time_budget_s / 60:g}")
    parts = {"": spec, "ppo": spec.ppo, "td3": spec.td3, "bc": spec.bc, "reward": spec.reward}

    def flag(part: str, name: str) -> str:
        return "--" + (f"{part}-" if part else "") + name.replace("_", "-")

    for part, cfg in parts.items():
        for f in fields(cfg):
            v = getattr(cfg, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{flag(part, f.name)} must be a finite number, got {v}")
    checks = [(AT_LEAST_ONE, lambda v: v >= 1, "must be at least 1"),
              (AT_LEAST_ZERO, lambda v: v >= 0, "must be at least 0"),
              (FRACTIONS, lambda v: 0 <= v <= 1, "must be in [0, 1]"),
              (RATES, lambda v: v > 0, "must be above 0")]
    for table, ok, says in checks:
        for part, names in table.items():
            for name in names:
                v = getattr(parts[part], name)
                if v is not None and not ok(v):
                    raise ValueError(f"{flag(part, name)} {says}, got {v}")
    if not 0 < spec.target_load <= MAX_TARGET_LOAD:
        raise ValueError(f"--target-load must be in (0, {MAX_TARGET_LOAD:g}], got {spec.target_load}")
    if spec.num_envs > MAX_NUM_ENVS:
        raise ValueError(f"--num-envs must be at most {MAX_NUM_ENVS}, got {spec.num_envs}")


def run(args: argparse.Namespace) -> int:
    from fedsched.agent.learning.training import run_training

    spec = build_spec(args)  # refuses bad combinations before the data is loaded
    nodes = load_nodes(resolve_path(args.nodes))
    pods = load_pods(resolve_path(args.pods), nodes, allow_oversized=args.allow_oversized)
    spec = replace(spec, nodes=nodes, pods=pods)
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

    if spec.algo == "finetune":
        print(f"fine-tuning {spec.init} on the newest {spec.window} decisions of {spec.log} "
              f"(lr {spec.bc.learning_rate:g}) -> {spec.out}", file=sys.stderr)
    else:
        amount = {"ppo": f"{spec.ppo.total_steps} steps", "td3": f"{spec.td3.total_steps} steps",
                  "bc": f"{spec.bc.samples} teacher decisions"}[spec.algo]
        print(f"training {spec.algo} on {len(nodes)} nodes / {len(pods)} pods ({spec.mode}), "
              f"{amount} -> {spec.out}", file=sys.stderr)
    summary = run_training(spec, progress=progress)
    if bar is not None:
        bar.close()
    print(json.dumps(summary, indent=2, default=float))
    return 0
