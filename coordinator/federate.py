"""The main job: a local multi-cluster federated training and evaluation on built-in data.

:func:`federate` runs Flower's own simulation runtime (``flwr run`` with a private
``FLWR_HOME`` and runtime dependency installation off) of the non-IID member clusters of
:func:`fedsched.agent.federation.task.member_cluster` (an openb GPU training slice, a CPU web
cluster with diurnal load, a small edge cluster, ...), once with FedAvg and once with
FedProx. Each run's final state is checked with ``flwr ls`` (``flwr run`` exits 0 even when
the run fails) and the local SuperLink it started is stopped afterwards.

Then, per member cluster, on that cluster's held-out pods (packing mode, several seeds):
kube-default, a local-only policy (the same PPO budget on the member alone, no
federation), the global FedAvg and FedProx models, and the personalised model
``eta * W_local + (1 - eta) * W_global`` of the FedAvg run. Bytes sent per round (INT8
uploads against their fp32 size) come from the members' reports. Writes
``DIR/report.json`` and ``DIR/rounds.png`` (central evaluation and members' reward per round).

Settings: :class:`FederateConfig`'s defaults are the Flower run config's (pyproject's
``[tool.flwr.app.config]``, via :mod:`fedsched.common.federation.run_config`); a run passes
the values it sets with ``flwr run --run-config`` (:meth:`FederateConfig.run_config`) and the
local-only baseline trains with the same run config's PPO settings.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedsched.agent.federation.task import MemberState, local_round, ppo_config
from fedsched.common.federation.codec import personalised_mix
from fedsched.common.federation.members import member_cluster
from fedsched.common.federation.run_config import Value, app_defaults, run_config_arg, with_defaults
from fedsched.common.federation.weights import load_npz, load_weights
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.schedulers import SchedulerContext, make_scheduler
from fedsched.common.sim.evaluate import mean_ci95
from fedsched.common.sim.packing import run_packing
from fedsched.coordinator.server_app import initial_weights

REPORT_METRICS = ("alloc_gpu", "alloc_cpu", "gpu_frag_amount", "frag_ratio", "failed_pods", "util_variance")


# The Flower app's run-config defaults: FederateConfig's defaults, never a second copy.
DEFAULTS = app_defaults()


@dataclass
class FederateConfig:
    """What the main job runs (``--quick`` shrinks it to about two minutes). The run-config
    fields default to pyproject's ``[tool.flwr.app.config]``."""

    clusters: int = int(DEFAULTS["min-nodes"])  # member clusters (non-IID profiles, cycled)
    rounds: int = int(DEFAULTS["num-server-rounds"])  # federated rounds per strategy
    local_steps: int = int(DEFAULTS["local-steps"])  # PPO decisions per member per round
    eta: float = float(DEFAULTS["eta"])  # personalisation: eta * W_local + (1 - eta) * W_global
    proximal_mu: float = float(DEFAULTS["proximal-mu"])  # FedProx
    openb_nodes: int = int(DEFAULTS["openb-nodes"])  # size of the openb member's slice
    eval_nodes: int = int(DEFAULTS["eval-nodes"])  # hub's held-out central evaluation slice
    init: str = str(DEFAULTS["init"])  # starting model: the shipped policy, or "random"
    seed: int = int(DEFAULTS["seed"])  # seed of a random starting model
    eval_seeds: int = 3  # seeds of the per-cluster evaluation (not a run-config setting)
    strategies: tuple[str, ...] = ("fedavg", "fedprox")

    @classmethod
    def quick(cls) -> FederateConfig:
        return cls(rounds=3, local_steps=128, openb_nodes=40, eval_nodes=60, eval_seeds=2)

    def run_config(self, strategy: str, run_dir: Path) -> dict[str, Value]:
        """The run-config values this job sets for one run of ``strategy`` into ``run_dir``."""
        return {"num-server-rounds": self.rounds, "strategy": strategy, "proximal-mu": self.proximal_mu,
                "min-nodes": self.clusters, "eta": self.eta, "local-steps": self.local_steps,
                "openb-nodes": self.openb_nodes, "eval-nodes": self.eval_nodes, "init": self.init,
                "seed": self.seed, "out-dir": str(run_dir / "hub"), "state-dir": str(run_dir / "state")}


def flwr_bin() -> str:
    """The flwr CLI of this environment (beside the running interpreter)."""
    candidate = Path(sys.executable).with_name("flwr")
    return str(candidate) if candidate.exists() else "flwr"


def _flwr(args: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> subprocess.CompletedProcess:
    with log_path.open("a") as log:
        return subprocess.run([flwr_bin(), *args], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              check=False)


def stop_local_superlink(flwr_home: Path, include_apps: bool = False) -> int:
    """Stop the detached local SuperLink (and its helpers) that ``flwr run`` started with this
    FLWR_HOME; ``include_apps`` also stops the simulation process running the apps (what a
    crashed hub looks like). Returns how many processes were signalled."""
    names = (b"flower-super", b"flwr-simulation", b"flwr-serverapp") if include_apps else (b"flower-super",)
    stopped = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            if not any(n in cmd for n in names):
                continue
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"FLWR_HOME={flwr_home}".encode() in env:
            try:
                os.kill(int(proc.name), signal.SIGTERM)
                stopped += 1
            except OSError:
                pass
    return stopped


def run_flower(app_dir: Path, out: Path, strategy: str, cfg: FederateConfig,
               progress: Callable[[str], None], *, name: str | None = None,
               extra: dict[str, Value] | None = None, fresh: bool = True) -> Path:
    """One ``flwr run`` of the federation into ``out/name`` (default: the strategy's name);
    ``extra`` adds run-config values; ``fresh=False`` keeps an earlier run's hub checkpoint
    (the hub then resumes from it)."""
    home = out / "flwr-home"
    home.mkdir(parents=True, exist_ok=True)
    run_dir = out / (name or strategy)
    if fresh and run_dir.exists():
        shutil.rmtree(run_dir)
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    run_config = run_config_arg({**cfg.run_config(strategy, run_dir), **(extra or {})})
    log_path = out / f"flwr-{name or strategy}.log"
    progress(f"flwr run ({name or strategy}: {strategy}, {cfg.clusters} clusters, {cfg.rounds} rounds); "
             f"log: {log_path}")
    try:
        _flwr(["run", str(app_dir), "--stream", "--federation-config",
               f"num-supernodes={cfg.clusters} client-resources-num-cpus=1", "--run-config", run_config],
              env, app_dir, log_path)
        listing = subprocess.run([flwr_bin(), "ls", "--format", "json"], cwd=app_dir, env=env,
                                 capture_output=True, text=True, check=False)
    finally:
        stop_local_superlink(home)
    try:
        runs = json.loads(listing.stdout)["runs"]
        status = max(runs, key=lambda r: r["pending-at"])["status"]
    except (ValueError, KeyError):
        raise RuntimeError(f"could not read the run's state (flwr ls said: {listing.stdout[-500:]!r}); "
                           f"see {log_path}") from None
    if status != "finished:completed":
        raise RuntimeError(f"the {strategy} run ended as {status!r}; see {log_path}")
    return run_dir


def local_only(member_id: int, cfg: FederateConfig, init: dict[str, np.ndarray], out: Path) -> dict:
    """The same PPO budget (the run config's PPO settings) on one member alone: eta = 1, no
    global model, every round kept."""
    run_config = with_defaults({"local-steps": cfg.local_steps})  # what a member of this job gets
    member = member_cluster(member_id, openb_nodes=cfg.openb_nodes)
    state = MemberState(out / "local-only" / member.name)
    weights = init
    for rnd in range(1, cfg.rounds + 1):
        ppo = ppo_config(run_config, mu=0.0, seed=1000 * rnd + member_id)
        local_round(member, state, weights, eta=1.0, ppo=ppo, upload_every=1, server_round=rnd,
                    norm_threshold=math.inf)
        weights = state.load("local")
    return weights


def evaluate_member(member_id: int, cfg: FederateConfig, policies: dict[str, Any]) -> dict[str, dict]:
    """Mean and CI of REPORT_METRICS per policy on the member's held-out pods."""
    member = member_cluster(member_id, openb_nodes=cfg.openb_nodes)
    typical = TypicalPods.from_pods(member.train)
    out: dict[str, dict] = {}
    for name, spec in policies.items():
        runs = []
        for seed in range(42, 42 + cfg.eval_seeds):
            if spec == "kube-default":
                sched = make_scheduler("kube-default", SchedulerContext(rng=np.random.default_rng(seed)))
            else:
                policy = NodeScoringPolicy()
                load_weights(policy, spec)
                sched = PolicyScheduler(policy, typical)
            runs.append(run_packing(member.nodes, member.test, sched, target_load=1.1, seed=seed,
                                    typical=typical).metrics)
        out[name] = {}
        for m in REPORT_METRICS:
            mean, ci = mean_ci95([r[m] for r in runs])
            out[name][m] = {"mean": mean, "ci95": ci}
    return out


def federate(out: Path, cfg: FederateConfig, app_dir: Path,
             progress: Callable[[str], None] = print) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    runs = {s: run_flower(app_dir, out, s, cfg, progress) for s in cfg.strategies}
    init = initial_weights(cfg.init, cfg.seed)  # the hub's starting model, for the local-only baseline too
    report: dict[str, Any] = {"config": cfg.__dict__ | {"strategies": list(cfg.strategies)},
                              "clusters": {}, "rounds": {}}
    for s, d in runs.items():
        report["rounds"][s] = json.loads((d / "hub" / "rounds.json").read_text())
    glob = {s: {k: v for k, v in load_npz(d / "hub" / "global.npz").items() if k != "__round__"}
            for s, d in runs.items()}
    main = cfg.strategies[0]
    for i in range(cfg.clusters):
        member = member_cluster(i, openb_nodes=cfg.openb_nodes)
        progress(f"evaluating {member.name}: local-only training and {cfg.eval_seeds} seeds per policy")
        local_w = MemberState(runs[main] / "state" / member.name).load("local")
        policies: dict[str, Any] = {"default": "kube-default", "local": local_only(i, cfg, init, out)}
        for s in cfg.strategies:
            policies[f"global_{s}"] = glob[s]
        policies["global"] = glob[main]
        policies["personalised"] = personalised_mix(local_w, glob[main], cfg.eta)
        report["clusters"][member.name] = evaluate_member(i, cfg, policies)
    ups = [r["train"] for r in report["rounds"][main] if "train" in r]
    report["bytes"] = {
        "int8": int(sum(t["bytes-up"] for t in ups) * cfg.clusters),
        "fp32": int(sum(t["bytes-up-fp32"] for t in ups) * cfg.clusters),
        "down": int(sum(t["bytes-down"] for t in ups) * cfg.clusters),
    }
    report["wall_s"] = round(time.time() - t0, 1)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    plot_rounds(report, out / "rounds.png")
    return report


def plot_rounds(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(report["clusters"])
    for s, hist in report["rounds"].items():
        rounds = [h["round"] for h in hist]
        axes[0].plot(rounds, [h["central"]["alloc_gpu"] for h in hist], marker="o", label=s)
        ls = "-" if s == next(iter(report["rounds"])) else "--"
        for pid, name in enumerate(names):
            axes[1].plot(rounds, [h.get("members", {}).get(str(pid), {}).get("mean-reward", float("nan"))
                                  for h in hist], ls=ls, marker=".", label=f"{name} ({s})")
    axes[0].set_title("hub: held-out GPU allocation %")
    axes[1].set_title("members: mean reward per round, per cluster")
    for ax in axes:
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_report(report: dict[str, Any]) -> str:
    lines = []
    for name, pols in report["clusters"].items():
        lines.append(f"\n{name} (held-out pods, packing)")
        lines.append(f"{'policy':18}" + "".join(f"{m:>18}" for m in REPORT_METRICS))
        for p, ms in pols.items():
            lines.append(f"{p:18}" + "".join(f"{ms[m]['mean']:>11.2f} ± {ms[m]['ci95']:<4.2f}"
                                              for m in REPORT_METRICS))
    b = report["bytes"]
    lines.append(f"\nbytes uploaded: int8 {b['int8']:,} vs fp32 {b['fp32']:,} "
                 f"({b['int8'] / max(b['fp32'], 1):.3f}x); downloaded {b['down']:,}")
    return "\n".join(lines)
