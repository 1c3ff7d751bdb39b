"""A training run: data split, training clusters, PPO, logs, checkpoints, evaluation.

``run_training`` is what ``fedsched train`` calls (and what a federated member reuses):

- the pod list is split by a stable hash of pod names into train, validation and test
  (the test part is exactly the one ``fedsched evaluate`` and the benchmarks judge on);
  training sees only the train part, the typical pods the fragmentation features use
  come from it, and model selection (``best.pt``) uses the validation part;
- each environment is a member cluster or a random slice of ``slice_nodes`` nodes of it
  (seeded), so episodes are short and the policy sees clusters of several shapes; the
  policy is size-independent, so it is then judged on the whole cluster;
- a held-out evaluation (a different slice, the *validation* pods, a fixed seed, greedy
  decisions) runs every ``eval_every`` updates beside BestFit, FGD and kube-default on the
  same workload;
- logs: ``progress.csv`` (one row per update: one rollout or collection step and its
  optimisation phase, the same unit in PPO and TD3), ``episodes.csv`` (finished training
  episodes), TensorBoard events under ``tb/`` (tagged as CleanRL's: ``losses/...``,
  ``charts/...``, and ``eval/...`` for the held-out evaluation); checkpoints:
  ``checkpoint.pt`` (latest, with the optimiser state for ``--resume``) every
  ``checkpoint_every`` updates and at the end, ``best.pt`` at the best evaluation.

Continuous training (``algo="finetune"``): the ``init`` checkpoint (either policy kind) is
fitted by behaviour cloning, with a small learning rate, to the newest ``window`` decisions of
a :class:`~fedsched.common.learning.decision_log.DecisionLog` (what the online agent records, or
``record_log`` of a bc run), and judged on the held-out run before and after.

A resumed run continues the update count, learning-rate schedule and optimiser state;
its environments start fresh episodes, so it is not bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fedsched.agent.learning.bc import BCConfig, collect, fit
from fedsched.agent.learning.env import EnvConfig, RewardConfig, SchedulingEnv
from fedsched.agent.learning.ppo import TB_TAGS as PPO_TB_TAGS
from fedsched.agent.learning.ppo import PPOConfig, PPOTrainer
from fedsched.agent.learning.td3 import TB_TAGS as TD3_TB_TAGS
from fedsched.agent.learning.td3 import TD3Config, TD3Trainer
from fedsched.common.learning.checkpoint import data_hash, load_checkpoint, save_checkpoint
from fedsched.common.learning.kinds import NODE_SCORING, WEIGHTS, kind_of
from fedsched.common.learning.scorers import scorer_for
from fedsched.common.model.cluster import NodeTable, PodTable
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.metrics import HIGHER_IS_BETTER
from fedsched.common.model.traces import fits_somewhere, slice_cluster, split_train_val_test
from fedsched.common.schedulers import SchedulerContext, make_scheduler
from fedsched.common.sim.evaluate import make_policy
from fedsched.common.sim.packing import run_packing

# The behaviour-cloning step size of fine-tuning on a decision log (--log) when none is given:
# smaller than BCConfig's, as it moves an already trained policy.
FINETUNE_LEARNING_RATE = 1e-4


@dataclass
class TrainSpec:
    """What to train on and how to run it (``fedsched train`` has a flag for each field)."""

    nodes: NodeTable
    """the cluster's nodes"""
    pods: PodTable
    """the workload (split into train, validation and test parts by a hash of pod names)"""
    out: Path
    """run directory: logs, checkpoints, summary"""
    mode: Literal["packing", "replay"] = "packing"
    """simulator: packing (pods arrive until the target load, none leave) or replay (the trace's timeline)"""
    algo: Literal["ppo", "td3", "bc", "finetune"] = "ppo"
    """ppo: node-scoring policy; td3: resource-weight policy; bc: imitate the teacher (a warm
    start for init); finetune: fit init to the decision log"""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """ppo: its hyper-parameters"""
    td3: TD3Config = field(default_factory=TD3Config)
    """td3: its hyper-parameters"""
    bc: BCConfig = field(default_factory=BCConfig)
    """bc and finetune: the behaviour-cloning hyper-parameters"""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """weights of the reward terms of the training environments"""
    teacher: str = "fgd"
    """bc: the scheduler to imitate (a baseline, or in replay mode the oracle)"""
    policy_kind: Literal["node-scoring", "weights"] = "node-scoring"
    """bc: which policy to fit: node-scoring (for ppo) or weights (the td3 actor)"""
    num_envs: int = 4
    """environments stepped in lockstep"""
    slice_nodes: int = 200
    """nodes per training cluster slice (0: whole cluster)"""
    target_load: float = 1.3
    """packing: arrived requests as a multiple of capacity"""
    test_fraction: float = 0.3
    """hash split: the test part, never trained on nor selected on"""
    val_fraction: float = 0.1
    """hash split: the validation part, for the held-out evaluation and model selection"""
    eval_every: int = 10
    """updates between held-out evaluations (0: never)"""
    eval_nodes: int = 400
    """nodes in the evaluation slice (0: whole cluster)"""
    eval_seed: int = 2024
    """workload seed of the evaluation run"""
    checkpoint_every: int = 10
    """updates between checkpoints"""
    resume: bool = False
    """continue from out/checkpoint.pt"""
    init: Path | None = None
    """start from this checkpoint's weights (e.g. a behaviour-cloning one)"""
    time_budget_s: float | None = None
    """stop after this much wall time, in seconds (default: no limit)"""
    replay: dict[str, Any] = field(default_factory=dict)
    """replay: ReplayConfig fields that differ from its defaults"""
    record_log: Path | None = None
    """bc: also append the teacher's decisions to this decision log directory"""
    log: Path | None = None
    """finetune: the decision log directory to fine-tune init on (bc settings)"""
    window: int = 5000
    """finetune: the most recent decisions of the log to fit"""


def eval_metric_name(nodes: NodeTable, mode: str) -> str:
    if mode == "replay":
        # The online metric of hot nodes (node-seconds above the threshold), not the legacy
        # count of threshold crossings that a policy piling pods onto hot nodes wins.
        return "hot_cpu_node_s"
    # The final allocation (the run ends at the target load): always defined, unlike the
    # artefact's binned value at exactly the target, which is empty on small clusters.
    return "alloc_gpu" if nodes.total_gpu_milli else "alloc_cpu"


class _CsvLog:
    def __init__(self, path: Path, append: bool) -> None:
        self.path, self.append, self.fields = path, append and path.exists(), None

    def write(self, row: dict[str, Any]) -> None:
        if self.fields is None:
            if self.append:
                with self.path.open() as f:
                    self.fields = next(csv.reader(f), None)
            if not self.fields:
                self.fields = list(row)
                with self.path.open("w", newline="") as f:
                    csv.writer(f).writerow(self.fields)
        with self.path.open("a", newline="") as f:
            csv.writer(f).writerow([row.get(k, "") for k in self.fields])


def tb_tag(column: str, tags: dict[str, str]) -> str:
    """The TensorBoard tag of a progress.csv column: the algorithm's CleanRL-style tag
    (``losses/...``, ``charts/...``), ``eval/...`` for the held-out evaluation and its
    references, ``charts/<column>`` otherwise."""
    if column in tags:
        return tags[column]
    if column.startswith(("eval_", "ref_")):
        return "eval/" + column.removeprefix("eval_")
    return f"charts/{column}"


def scheduler_for(policy: Any, typical: TypicalPods):
    """The scorer-interface adapter of a policy network of either kind."""
    return scorer_for(policy, typical)


def _held_out(spec: TrainSpec, train: PodTable, val: PodTable, typical: TypicalPods):
    """(metric name, policy -> metric on the held-out run, baseline values on it).

    The held-out run: another slice of the cluster, the validation pods, a fixed seed.
    """
    eval_nodes = slice_cluster(spec.nodes, spec.eval_nodes, spec.eval_seed)
    eval_pods = fits_somewhere(val, eval_nodes)
    metric = eval_metric_name(eval_nodes, spec.mode)

    def evaluate_policy(sched) -> float:
        if spec.mode == "replay":
            from fedsched.common.sim.replay import ReplayConfig, run_replay

            res = run_replay(eval_nodes, eval_pods, sched, config=ReplayConfig(**spec.replay),
                             seed=spec.eval_seed, typical=typical)
        else:
            res = run_packing(eval_nodes, eval_pods, sched, target_load=spec.target_load,
                              seed=spec.eval_seed, typical=typical)
        return float(res.metrics[metric])

    reference = {}
    if spec.eval_every:
        for name in ("best-fit", "fgd", "kube-default"):
            ctx = SchedulerContext(train_pods=train, rng=np.random.default_rng(spec.eval_seed))
            reference[name] = evaluate_policy(make_scheduler(name, ctx))
    return metric, evaluate_policy, reference


def _run_bc(spec: TrainSpec, out: Path, train: PodTable, val: PodTable, typical: TypicalPods,
            envs: list[SchedulingEnv], meta_common: dict[str, Any], progress: Any) -> dict[str, Any]:
    """Behaviour cloning of ``spec.teacher``: log its decisions, fit, evaluate, save."""
    import torch

    from fedsched.common.learning.nets import NodeScoringPolicy, PolicyConfig

    t_start = time.time()
    torch.manual_seed(spec.bc.seed)
    ctx = SchedulerContext(train_pods=train, rng=np.random.default_rng(spec.bc.seed))
    teacher = make_policy(spec.teacher, ctx, spec.mode)
    on_sample = ((lambda n: progress({"phase": "collect", "samples": n}, spec.bc.samples))
                 if progress else None)
    if spec.record_log is not None:
        from fedsched.agent.learning.bc import record
        from fedsched.common.learning.decision_log import DecisionLog

        log = record(envs, teacher, spec.bc.samples, DecisionLog(spec.record_log), progress=on_sample)
    else:
        log = collect(envs, teacher, spec.bc.samples, progress=on_sample)
    if spec.policy_kind == "weights":
        from fedsched.common.learning.nets import WeightPolicy, WeightPolicyConfig

        policy: Any = WeightPolicy(WeightPolicyConfig(hidden=spec.td3.hidden))
    elif spec.policy_kind == "node-scoring":
        policy = NodeScoringPolicy(PolicyConfig(hidden=spec.ppo.hidden))
    else:
        raise ValueError(f"unknown policy kind {spec.policy_kind!r}: expected node-scoring or weights")
    epochs: list[dict[str, float]] = []

    def on_epoch(stats: dict[str, float]) -> None:
        epochs.append(stats)
        if progress is not None:
            progress({"phase": "fit", **stats}, spec.bc.epochs)

    fit(policy, log, spec.bc, on_epoch=on_epoch)
    metric, evaluate_policy, reference = _held_out(spec, train, val, typical)
    value = evaluate_policy(scheduler_for(policy, typical)) if spec.eval_every else float("nan")
    meta = dict(meta_common, algorithm="bc")
    meta["hyperparameters"] = {**meta_common["hyperparameters"], **asdict(spec.bc), "teacher": spec.teacher,
                               "policy_kind": spec.policy_kind}
    best = {"value": value, "update": 0}
    extra = {"eval_metric": metric, "best_eval": best, "reference": reference, "teacher": spec.teacher,
             "trained_on_gpus": bool(spec.nodes.total_gpu_milli)}
    ckpt = save_checkpoint(out / "checkpoint.pt", policy, extra=extra, **meta)
    save_checkpoint(out / "best.pt", policy, extra=extra, **meta)
    with (out / "bc.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(epochs[0]))
        w.writeheader()
        w.writerows(epochs)
    summary = {"algorithm": "bc", "teacher": spec.teacher, "samples": len(log), "metric": metric,
               "best_eval": best, "reference": reference, "epochs": epochs,
               "wall_s": round(time.time() - t_start, 1), "checkpoint": str(ckpt)}
    if spec.record_log is not None:
        summary["decision_log"] = str(spec.record_log)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    return summary


def _check_finetune(spec: TrainSpec) -> None:
    """Refuse a fine-tuning run that cannot start (before anything is written)."""
    from fedsched.common.learning.decision_log import DecisionLog

    if spec.init is None:
        raise ValueError("--log fine-tunes an existing checkpoint: give it with --init CKPT")
    if spec.window < 1 or spec.bc.epochs < 1:
        raise ValueError(f"--window and --bc-epochs must be positive, got {spec.window} and {spec.bc.epochs}")
    log_dir = Path(spec.log)  # type: ignore[arg-type]
    if not log_dir.is_dir():
        raise ValueError(f"--log {log_dir}: no decision log there (expected a directory of chunk-*.npz)")
    if not len(DecisionLog(log_dir)):
        raise ValueError(f"--log {log_dir}: the decision log is empty")
    if not Path(spec.init).is_file():
        raise ValueError(f"--init {spec.init}: no such checkpoint")


def _run_finetune(spec: TrainSpec, out: Path, train: PodTable, val: PodTable, typical: TypicalPods,
                  data: str, progress: Any) -> dict[str, Any]:
    """Continuous training: behaviour cloning of ``spec.init`` on the newest ``spec.window``
    decisions of the decision log ``spec.log`` (small learning rate, ``spec.bc`` settings),
    evaluated on the held-out run before and after.

    ``checkpoint.pt`` holds the fine-tuned weights; ``best.pt`` the better of them and the
    initial weights on the held-out evaluation (the fine-tuned ones on a tie or without one).
    """
    import copy

    import torch

    from fedsched.common.learning.checkpoint import typical_from_dict
    from fedsched.common.learning.decision_log import DecisionLog, summarize

    t_start = time.time()
    log_dir = Path(spec.log)  # type: ignore[arg-type]  # checked by _check_finetune
    records = DecisionLog(log_dir).tail_records(spec.window)
    policy, init_meta, _ = load_checkpoint(spec.init)  # type: ignore[arg-type]
    # The policy's features (and the logged ones, written by the model in service) use the
    # checkpoint's typical pods; the simulator of the held-out run uses the training split's.
    policy_typical = typical_from_dict(init_meta.get("typical_pods"))
    if policy_typical is None:
        policy_typical = typical
    torch.manual_seed(spec.bc.seed)
    metric, evaluate_policy, reference = _held_out(spec, train, val, typical)
    evaluate = bool(spec.eval_every)
    before = evaluate_policy(scheduler_for(policy, policy_typical)) if evaluate else float("nan")
    init_policy = copy.deepcopy(policy)
    epochs: list[dict[str, float]] = []

    def on_epoch(stats: dict[str, float]) -> None:
        epochs.append(stats)
        if progress is not None:
            progress({"phase": "finetune", **stats}, spec.bc.epochs)

    fit(policy, [r.decision for r in records], spec.bc, on_epoch=on_epoch)
    after = evaluate_policy(scheduler_for(policy, policy_typical)) if evaluate else float("nan")
    higher_better = metric in HIGHER_IS_BETTER  # as the other algorithms select
    kept_init = bool(np.isfinite(before) and np.isfinite(after)
                     and (before > after if higher_better else before < after))
    best = {"value": before if kept_init else after, "update": 0,
            "weights": "init" if kept_init else "finetuned"}
    hyper = {"mode": spec.mode, "target_load": spec.target_load, "test_fraction": spec.test_fraction,
             "val_fraction": spec.val_fraction, "eval_nodes": spec.eval_nodes, "eval_seed": spec.eval_seed,
             **{k: v for k, v in asdict(spec.bc).items() if k != "samples"}, "window": spec.window,
             "policy_kind": kind_of(policy)}
    log_info = summarize(records)
    extra = {"eval_metric": metric, "best_eval": best, "reference": reference, "eval_before": before,
             "eval_after": after,
             "init_checkpoint": str(spec.init), "init_algorithm": init_meta.get("algorithm"),
             "init_data_hash": init_meta.get("data_hash"), "decision_log": str(log_dir),
             "window": spec.window, "log_decisions": log_info["decisions"],
             "log_model_versions": log_info["model_versions"]}
    meta = dict(algorithm="finetune", hyperparameters=hyper, typical=policy_typical, data=data)
    ckpt = save_checkpoint(out / "checkpoint.pt", policy, extra=extra, **meta)
    save_checkpoint(out / "best.pt", init_policy if kept_init else policy, extra=extra, **meta)
    with (out / "finetune.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(epochs[0]))
        w.writeheader()
        w.writerows(epochs)
    summary = {"algorithm": "finetune", "init": str(spec.init), "log": str(log_dir), "window": spec.window,
               **log_info, "learning_rate": spec.bc.learning_rate, "metric": metric,
               "eval_before": before, "eval_after": after, "best_eval": best, "reference": reference,
               "epochs": epochs, "wall_s": round(time.time() - t_start, 1), "checkpoint": str(ckpt),
               "best_checkpoint": str(out / "best.pt")}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    return summary


def run_training(spec: TrainSpec, progress: Any = None) -> dict[str, Any]:
    """Train a policy (PPO, TD3, BC) or fine-tune one on a decision log; returns a summary
    (also written to out/summary.json)."""
    if spec.algo not in ("ppo", "td3", "bc", "finetune"):
        raise ValueError(f"unknown algorithm {spec.algo!r}: expected ppo, td3, bc or finetune")
    if (spec.algo == "finetune") != (spec.log is not None):
        raise ValueError("fine-tuning on a decision log needs both algorithm finetune and --log DIR")
    if spec.record_log is not None and spec.algo != "bc":
        raise ValueError("--record-log records the teacher's decisions of --algo bc")
    if spec.algo == "finetune":
        _check_finetune(spec)
    seed = spec.td3.seed if spec.algo == "td3" else spec.ppo.seed
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    train, val, _test = split_train_val_test(spec.pods, spec.test_fraction, spec.val_fraction)
    typical = TypicalPods.from_pods(train)
    if spec.algo == "finetune":
        return _run_finetune(spec, out, train, val, typical, data_hash(train), progress)
    env_cfg = dict(mode=spec.mode, target_load=spec.target_load, replay=spec.replay, reward=spec.reward)
    clusters = [slice_cluster(spec.nodes, spec.slice_nodes, seed * 7919 + i) for i in range(spec.num_envs)]
    n_max = max(len(c) for c in clusters)
    envs = [SchedulingEnv(c, fits_somewhere(train, c), typical=typical,
                          config=EnvConfig(max_nodes=n_max, **env_cfg), seed=seed * 100 + i)
            for i, c in enumerate(clusters)]
    algo_cfg = spec.td3 if spec.algo == "td3" else spec.ppo
    hyper = {**asdict(algo_cfg), "num_envs": spec.num_envs, "slice_nodes": spec.slice_nodes,
             "mode": spec.mode, "target_load": spec.target_load, "test_fraction": spec.test_fraction,
             "val_fraction": spec.val_fraction, "reward": asdict(spec.reward), "replay": dict(spec.replay)}
    meta_common = dict(algorithm=spec.algo, hyperparameters=hyper, typical=typical, data=data_hash(train))

    if spec.algo == "bc":
        return _run_bc(spec, out, train, val, typical, envs, meta_common, progress)

    policy, resume_state = None, None
    ckpt = out / "checkpoint.pt"
    if spec.resume:
        if not ckpt.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {ckpt}")
        policy, meta, resume_state = load_checkpoint(ckpt)
        if meta.get("data_hash") != meta_common["data"]:
            raise ValueError(f"--resume: {ckpt} was trained on other data ({meta.get('data_hash')}); "
                             "use a new --out directory")
    elif spec.init is not None:
        policy, _, _ = load_checkpoint(spec.init)
    want = WEIGHTS if spec.algo == "td3" else NODE_SCORING
    if policy is not None and kind_of(policy) != want:
        raise ValueError(f"{spec.algo} trains a {want} policy; the given checkpoint holds a "
                         f"{kind_of(policy)} policy")
    trainer: Any = (TD3Trainer(envs, spec.td3, policy) if spec.algo == "td3"
                    else PPOTrainer(envs, spec.ppo, policy))
    tb_tags = TD3_TB_TAGS if spec.algo == "td3" else PPO_TB_TAGS
    if resume_state is not None:
        trainer.load_state_dict(resume_state)

    metric, evaluate_policy, reference = _held_out(spec, train, val, typical)

    tb = None
    try:
        from torch.utils.tensorboard import SummaryWriter

        tb = SummaryWriter(str(out / "tb"))
    except ImportError:  # tensorboard is optional at run time; CSV logs always exist
        pass
    prog_log = _CsvLog(out / "progress.csv", append=spec.resume)
    ep_log = _CsvLog(out / "episodes.csv", append=spec.resume)
    higher_better = metric in HIGHER_IS_BETTER
    best = {"value": -np.inf if higher_better else np.inf, "update": 0}
    if resume_state is not None and isinstance(meta.get("best_eval"), dict):
        best.update(meta["best_eval"])  # a resumed run replaces best.pt only when it beats it
    t_start = time.time()
    (out / "run.json").write_text(json.dumps({"spec": {k: str(v) for k, v in asdict(spec).items()
                                                        if k not in ("nodes", "pods")},
                                              "metric": metric, "reference": reference,
                                              "n_nodes": len(spec.nodes), "train_pods": len(train),
                                              "validation_pods": len(val)}, indent=2))

    def save(path: Path) -> None:
        save_checkpoint(path, trainer.policy, optimizer=trainer.state_dict(),
                        extra={"global_step": trainer.global_step, "update": trainer.update,
                               "eval_metric": metric, "best_eval": best, "reference": reference,
                               "trained_on_gpus": bool(spec.nodes.total_gpu_milli)},
                        **meta_common)

    def on_episode(m: dict[str, float]) -> None:
        row = {"global_step": m.get("global_step"), "env": m.get("env"),
               "episode_return": m.get("episode_return"), metric: m.get(metric),
               "failed_pods": m.get("failed_pods"), "wall_s": round(time.time() - t_start, 1)}
        ep_log.write(row)
        if tb is not None and m.get(metric) is not None:
            tb.add_scalar("charts/episodic_return", m["episode_return"], int(m["global_step"]))
            tb.add_scalar(f"charts/episodic_{metric}", m[metric], int(m["global_step"]))

    def on_update(stats: dict[str, float]) -> None:
        u = int(stats["update"])
        row = dict(stats)
        row["wall_s"] = round(time.time() - t_start, 1)
        # Fixed columns: evaluation cells stay empty on updates without an evaluation.
        row[f"eval_{metric}"] = ""
        row.update({f"ref_{k}": "" for k in reference})
        if spec.eval_every and (u % spec.eval_every == 0 or u == trainer.num_updates):
            value = evaluate_policy(scheduler_for(trainer.policy, typical))
            trainer.policy.train()
            row[f"eval_{metric}"] = value
            for k, v in reference.items():
                row[f"ref_{k}"] = v
            improved = value > best["value"] if higher_better else value < best["value"]
            better = bool(np.isfinite(value) and improved)
            if better:
                best.update(value=value, update=u)
                save(out / "best.pt")
        if u % spec.checkpoint_every == 0 or u == trainer.num_updates:
            save(ckpt)
        prog_log.write(row)
        if tb is not None:
            for k, v in row.items():
                numeric = isinstance(v, int | float) and not isinstance(v, bool)
                if numeric and k not in ("update", "global_step", "wall_s"):
                    tb.add_scalar(tb_tag(k, tb_tags), v, int(stats["global_step"]))
        if progress is not None:
            progress(row, trainer.num_updates)

    def stop() -> bool:
        return spec.time_budget_s is not None and time.time() - t_start > spec.time_budget_s

    trainer.train(on_update=on_update, on_episode=on_episode, stop=stop)
    save(ckpt)
    if tb is not None:
        tb.close()
    summary = {"metric": metric, "best_eval": best, "reference": reference,
               "global_step": trainer.global_step, "updates": trainer.update,
               "wall_s": round(time.time() - t_start, 1), "checkpoint": str(ckpt),
               "best_checkpoint": str(out / "best.pt") if (out / "best.pt").exists() else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    return summary
