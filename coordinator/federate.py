"""The main job: a local multi-cluster federated training and evaluation on built-in data.

:func:`federate` runs Flower's own simulation runtime (``flwr run`` with a private
``FLWR_HOME`` and runtime dependency installation off) of the non-IID member clusters of
:data:`fedsched.common.federation.members.MEMBERS` (GPU training, CPU web with a daily cycle,
edge, a CPU-heavy GPU inventory, a web cluster that joins late; two of them data-scarce), once
with FedAvg and once with FedProx, in online mode: each member learns from its own rewards in
its replay twin (:mod:`fedsched.agent.federation.online_round`). Each run's final state is
checked with ``flwr ls`` (``flwr run`` exits 0 even when the run fails) and the local SuperLink
it started is stopped afterwards.

Then, per member, on its held-out *test* pods (replay at its load, ``eval_seeds`` seeds, the
same seeds for every policy): kube-default, the best heuristic for the member (the load-aware
baseline with the lowest trouble score on the member's *validation* pods), the shipped starting
model, local-only (the same rounds and decision budget on the member alone: eta = 1, no global
model), the FedAvg and FedProx global models, and the personalised model
``eta * W_local + (1 - eta) * W_global`` of the FedAvg run at every eta of ``etas`` (eta = 0 is
the global model). Verdicts (:func:`verdicts`) compare, seed by seed, the run's personalised
model with local-only and kube-default on the trouble score and on failed pods; the late
member's rounds to local-only's final validation quality come from the members' per-round
reports. Bytes are what each member really sent in each round (its own report; 0 when it did
not upload). Writes ``DIR/report.json``, ``DIR/rounds.png`` (the hub's central trouble score and
each member's validation score per round, federated and local-only) and ``DIR/report.html``
(one self-contained file: the tables and the plot).

Settings: :class:`FederateConfig`'s defaults are the Flower run config's (pyproject's
``[tool.flwr.app.config]``, via :mod:`fedsched.common.federation.run_config`); a run passes
the values it sets with ``flwr run --run-config`` (:meth:`FederateConfig.run_config`) and the
local-only baseline trains with the same run config.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedsched.agent.federation.task import MemberState, joins_at, online_config, online_round
from fedsched.common.federation.codec import personalised_mix
from fedsched.common.federation.members import member_cluster, reference_typical
from fedsched.common.federation.run_config import Value, app_defaults, run_config_arg, with_defaults
from fedsched.common.federation.weights import load_npz
from fedsched.coordinator.server_app import initial_weights

ONLINE_METRICS = ("trouble_score", "hot_cpu_node_s", "throttled_cpu_core_s", "oom_kills_per_1k_starts",
                  "pending_p99_s", "failed_pods")
GPU_METRICS = ("gpu_frag_amount_avg",)
HEURISTICS = ("kube-default", "koordinator-load-aware", "load-variation-risk-balancing",
              "target-load-packing")

# The Flower app's run-config defaults: FederateConfig's defaults, never a second copy.
DEFAULTS = app_defaults()


@dataclass
class FederateConfig:
    """What the main job runs (``--quick``: 3 rounds, small budgets, 2 seeds, FedAvg only). The
    run-config fields default to pyproject's ``[tool.flwr.app.config]``."""

    clusters: int = int(DEFAULTS["min-nodes"])  # member clusters (non-IID profiles, cycled)
    rounds: int = int(DEFAULTS["num-server-rounds"])  # federated rounds per strategy
    local_decisions: int = int(DEFAULTS["local-decisions"])  # pods a member learns from per round
    scarce_decisions: int = int(DEFAULTS["scarce-decisions"])  # the same for the data-scarce members
    late_round: int = int(DEFAULTS["late-round"])  # the round the late member joins
    local_epochs: int = int(DEFAULTS["local-epochs"])  # passes of each round's credit regression
    local_learning_rate: float = float(DEFAULTS["local-learning-rate"])
    eta: float = float(DEFAULTS["eta"])  # personalisation: eta * W_local + (1 - eta) * W_global
    proximal_mu: float = float(DEFAULTS["proximal-mu"])  # FedProx
    # The starting model. The main job starts every member, federated or alone, from the same
    # seeded random model, so the gain of federating over learning alone is measured from an
    # untrained start; a fleet starts from the shipped policy (the run config's default, "shipped").
    init: str = "random"
    seed: int = int(DEFAULTS["seed"])  # seed of a random starting model
    eval_seeds: int = 5  # replay seeds of the per-member evaluation (not a run-config setting)
    etas: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 1.0)  # the personalisation sweep of the evaluation
    strategies: tuple[str, ...] = ("fedavg", "fedprox")
    workers: int = field(default_factory=lambda: max(1, min(2, os.cpu_count() or 1)))  # local processes

    @classmethod
    def quick(cls) -> FederateConfig:
        return cls(rounds=3, local_decisions=200, scarce_decisions=50, late_round=2, eval_seeds=2,
                   etas=(0.0, 0.2, 1.0), strategies=("fedavg",))

    def run_config(self, strategy: str, run_dir: Path) -> dict[str, Value]:
        """The run-config values this job sets for one run of ``strategy`` into ``run_dir``."""
        return {"num-server-rounds": self.rounds, "strategy": strategy, "proximal-mu": self.proximal_mu,
                "min-nodes": self.clusters, "eta": self.eta, "mode": "online",
                "local-decisions": self.local_decisions, "scarce-decisions": self.scarce_decisions,
                "late-round": self.late_round, "local-epochs": self.local_epochs,
                "local-learning-rate": self.local_learning_rate, "init": self.init,
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
    with local_flower_lock(progress):
        return _run_locked(app_dir, env, run_config, log_path, run_dir, strategy, cfg, progress, name)


LOCK_PATH = Path(tempfile.gettempdir()) / "fedsched-local-flower.lock"


@contextlib.contextmanager
def local_flower_lock(progress: Callable[[str], None]) -> Iterator[None]:
    """One local Flower simulation at a time on this machine: every ``flwr run`` starts its
    local SuperLink on Flower's fixed ports (127.0.0.1:39091 and :39093), so a second run beside
    the first would talk to the wrong SuperLink. Waits (and says so) for another process's run."""
    LOCK_PATH.touch(exist_ok=True)
    with LOCK_PATH.open("r+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another local Flower simulation on this machine to end ({LOCK_PATH})")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run_locked(app_dir: Path, env: dict[str, str], run_config: str, log_path: Path, run_dir: Path,
                strategy: str, cfg: FederateConfig, progress: Callable[[str], None],
                name: str | None) -> Path:
    home = Path(env["FLWR_HOME"])
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


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)


def local_only(member_id: int, cfg: FederateConfig, init: dict[str, np.ndarray], out: Path
               ) -> tuple[dict[str, np.ndarray], list[float]]:
    """The same rounds, decision budget and seeds on one member alone (eta = 1: the global model
    never enters after the shared start); returns its final weights and its validation score
    after every round."""
    run_config = with_defaults(cfg.run_config("fedavg", out))  # what a member of this job gets
    member = member_cluster(member_id)
    state = MemberState(out / "local-only" / member.name)
    if state.dir.exists():
        shutil.rmtree(state.dir)
    round_cfg = online_config(run_config, member, mu=0.0)
    scores = []
    for rnd in range(1, cfg.rounds + 1):
        r = online_round(member, state, init, eta=1.0, cfg=round_cfg, seed=1000 * rnd + member_id,
                         server_round=rnd)
        scores.append(r.val_score)
    weights = state.load("local")
    assert weights is not None
    return weights, scores


@functools.cache
def _member(member_id: int) -> Any:
    """The member's cluster, built once per worker process."""
    return member_cluster(member_id)


def _replay(args: tuple[int, Any, int, str]) -> dict[str, float]:
    """One replay of a member's ``split`` pods (test or val) under ``spec``: a baseline name or
    policy weights."""
    from fedsched.agent.federation.online_round import (
        VALIDATION_SEED,
        policy_of,
        replay_metrics,
    )
    from fedsched.common.learning.scorers import PolicyScheduler
    from fedsched.common.schedulers import SchedulerContext
    from fedsched.common.sim.evaluate import make_policy

    member_id, spec, seed, split = args
    member = _member(member_id)
    if isinstance(spec, str):
        sched = make_policy(spec, SchedulerContext(train_pods=member.train, rng=np.random.default_rng(seed)),
                            "replay")
    else:
        sched = PolicyScheduler(policy_of(spec), reference_typical())
    pods = member.test if split == "test" else member.val
    return replay_metrics(member, sched, pods, seed=seed if split == "test" else VALIDATION_SEED)


def best_heuristic(member_id: int, pool: Any) -> tuple[str, dict[str, float]]:
    """The load-aware baseline with the lowest trouble score on the member's validation pods
    (model selection never sees test pods); with the scores of every candidate."""
    from fedsched.common.model.metrics import trouble_score

    runs = list(pool.map(_replay, [(member_id, h, 0, "val") for h in HEURISTICS]))
    scores = {h: trouble_score(r, runs[0]) for h, r in zip(HEURISTICS, runs, strict=True)}
    return min(scores, key=lambda h: (scores[h], HEURISTICS.index(h))), scores


def evaluate_member(member_id: int, cfg: FederateConfig, policies: dict[str, Any], pool: Any,
                    has_gpus: bool) -> dict[str, dict]:
    """Per policy: mean and 95% CI over ``eval_seeds`` replays of the member's test pods of the
    online metrics (and GPU fragmentation on a GPU cluster), the trouble score taken seed by seed
    against kube-default's run with the same seed; ``runs`` keeps the per-seed values."""
    from fedsched.common.model.metrics import mean_ci95, trouble_score

    seeds = list(range(42, 42 + cfg.eval_seeds))
    names = ["kube-default", *[n for n in policies if n != "kube-default"]]
    jobs = [(member_id, policies.get(n, n), s, "test") for n in names for s in seeds]
    results = list(pool.map(_replay, jobs))
    per: dict[str, list[dict[str, float]]] = {n: results[i * len(seeds):(i + 1) * len(seeds)]
                                              for i, n in enumerate(names)}
    metrics = ONLINE_METRICS + (GPU_METRICS if has_gpus else ())
    out: dict[str, dict] = {}
    for n in names:
        runs = [{**r, "trouble_score": trouble_score(r, k)} for r, k in zip(per[n], per["kube-default"],
                                                                             strict=True)]
        out[n] = {m: dict(zip(("mean", "ci95"), mean_ci95([r[m] for r in runs]), strict=True))
                  for m in metrics}
        out[n]["runs"] = {m: [r[m] for r in runs] for m in metrics}
    return out


def _paired(a: list[float], b: list[float]) -> dict[str, Any]:
    """Mean and 95% CI of the seed-by-seed difference a - b (lower is better) and its verdict."""
    from fedsched.common.model.metrics import mean_ci95

    mean, ci = mean_ci95([x - y for x, y in zip(a, b, strict=True)])
    verdict = "better" if mean + ci < 0 else "worse" if mean - ci > 0 else "tie"
    return {"diff": mean, "ci95": ci, "verdict": verdict}


def verdicts(report: dict[str, Any], cfg: FederateConfig) -> dict[str, dict[str, Any]]:
    """Per member: the run's personalised model (eta = ``cfg.eta``) against local-only and
    kube-default, seed by seed, on the trouble score and failed pods; ``no_worse`` when neither
    comparison is significantly worse; for the late member, the rounds after joining its
    federated validation score took to reach local-only's final one."""
    out: dict[str, dict[str, Any]] = {}
    pers = f"personalised eta={cfg.eta:g}"
    for name, pols in report["clusters"].items():
        info = report["members"][name]
        row: dict[str, Any] = {"scarce": info["scarce"], "late": info["late"]}
        for other in ("local-only", "kube-default"):
            for m in ("trouble_score", "failed_pods"):
                row[f"{m} vs {other}"] = _paired(pols[pers]["runs"][m], pols[other]["runs"][m])
        row["no_worse"] = all(v["verdict"] != "worse" for k, v in row.items() if " vs " in k)
        if info["late"]:
            target = info["local_only_val"][-1]
            curve = info["federated_val"]
            join = info["joins_at"]
            reached = [r for r in range(join, cfg.rounds + 1)
                       if math.isfinite(curve[r - 1]) and curve[r - 1] <= target]
            row["rounds_to_local_only"] = (reached[0] - join + 1) if reached else None
            row["rounds_budget"] = max(1, cfg.rounds // 3)
        # The issue's goals, met or missed: no worse than both on every member; on a data-scarce
        # member better than local-only with an interval clear of 0; the late member at
        # local-only's final quality within a third of the rounds.
        goals = {"no worse than local-only and kube-default": row["no_worse"]}
        if info["scarce"]:
            goals["beats local-only (scarce member)"] = (
                row["trouble_score vs local-only"]["verdict"] == "better")
        if info["late"]:
            reached_in = row["rounds_to_local_only"]
            goals["reaches local-only within a third of the rounds (late member)"] = (
                reached_in is not None and reached_in <= row["rounds_budget"])
        row["goals"] = goals
        out[name] = row
    return out


def federate(out: Path, cfg: FederateConfig, app_dir: Path,
             progress: Callable[[str], None] = print) -> dict[str, Any]:
    from fedsched.coordinator.report_html import write_html

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    runs = {s: run_flower(app_dir, out, s, cfg, progress) for s in cfg.strategies}
    init = initial_weights(cfg.init, cfg.seed, "online")  # the hub's starting model, for local-only too
    report: dict[str, Any] = {"config": {**cfg.__dict__, "strategies": list(cfg.strategies),
                                         "etas": list(cfg.etas)},
                              "clusters": {}, "rounds": {}, "members": {}}
    for s, d in runs.items():
        report["rounds"][s] = json.loads((d / "hub" / "rounds.json").read_text())
    glob = {s: {k: v for k, v in load_npz(d / "hub" / "global.npz").items() if k != "__round__"}
            for s, d in runs.items()}
    main = cfg.strategies[0]
    run_config = with_defaults(cfg.run_config(main, out))
    members = [member_cluster(i) for i in range(cfg.clusters)]
    progress(f"local-only baselines: {cfg.clusters} members x {cfg.rounds} rounds on {cfg.workers} processes")
    with ProcessPoolExecutor(cfg.workers, initializer=_worker_init) as pool:
        local = list(pool.map(local_only, range(cfg.clusters), [cfg] * cfg.clusters, [init] * cfg.clusters,
                              [out] * cfg.clusters))
        for i, member in enumerate(members):
            progress(f"evaluating {member.name}: {cfg.eval_seeds} seeds of its test pods per policy")
            best, scores = best_heuristic(i, pool)
            local_w = MemberState(runs[main] / "state" / member.name).load("local")
            policies: dict[str, Any] = {"kube-default": "kube-default"}
            if best != "kube-default":
                policies[f"best heuristic ({best})"] = best
            policies["shipped start" if cfg.init == "shipped" else "random start"] = init
            policies["local-only"] = local[i][0]
            for s in cfg.strategies:
                policies[f"global {s}"] = glob[s]
            if local_w is not None:
                for eta in cfg.etas:
                    if eta > 0:
                        policies[f"personalised eta={eta:g}"] = personalised_mix(local_w, glob[main], eta)
            if f"personalised eta={cfg.eta:g}" not in policies:
                policies[f"personalised eta={cfg.eta:g}"] = (personalised_mix(local_w, glob[main], cfg.eta)
                                                             if local_w is not None else glob[main])
            has_gpus = member.nodes.total_gpu_milli > 0
            report["clusters"][member.name] = evaluate_member(i, cfg, policies, pool, has_gpus)
            fed_val = [float(h.get("members", {}).get(str(i), {}).get("val-score", math.nan))
                       for h in report["rounds"][main]]
            spec = member.spec
            report["members"][member.name] = {
                "profile": spec.profile if spec else "", "why": spec.why if spec else "",
                "scarce": bool(spec and spec.scarce), "late": bool(spec and spec.late),
                "joins_at": joins_at(member, run_config),
                "decisions_per_round": int(run_config["scarce-decisions" if spec and spec.scarce
                                                      else "local-decisions"]),
                "nodes": len(member.nodes), "gpus": bool(has_gpus), "best_heuristic": best,
                "heuristic_validation_scores": scores, "local_only_val": local[i][1],
                "federated_val": fed_val,
            }
    report["verdicts"] = verdicts(report, cfg)
    report["bytes"] = bytes_sent(report["rounds"])
    report["wall_s"] = round(time.time() - t0, 1)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    plot_rounds(report, out / "rounds.png")
    write_html(report, out / "rounds.png", out / "report.html", format_report(report))
    return report


def bytes_sent(rounds: dict[str, list[dict]]) -> dict[str, Any]:
    """What each member really sent and received, per strategy, summed over its rounds from its
    own reports (every reply, also one without an upload: it carries a zero update) and how
    many of its replies were uploads."""
    out: dict[str, Any] = {}
    for s, hist in rounds.items():
        per: dict[str, dict[str, int]] = {}
        for h in hist:
            for pid, m in h.get("members", {}).items():
                row = per.setdefault(pid, {"int8": 0, "fp32": 0, "down": 0, "uploads": 0})
                # A reply without an upload still carries its (zero) update: Flower wants one
                # ArrayRecord with the same keys in every reply, so those bytes were sent too.
                row["int8"] += int(m.get("bytes-up", 0))
                row["fp32"] += int(m.get("bytes-up-fp32", 0))
                row["down"] += int(m.get("bytes-down", 0))
                row["uploads"] += int(m.get("uploaded", 1)) == 1
        out[s] = {"members": per, "int8": sum(r["int8"] for r in per.values()),
                  "fp32": sum(r["fp32"] for r in per.values()), "down": sum(r["down"] for r in per.values())}
    return out


def plot_rounds(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for s, hist in report["rounds"].items():
        axes[0].plot([h["round"] for h in hist], [h["central"].get("trouble_score", math.nan) for h in hist],
                     marker="o", label=s)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (name, info) in enumerate(report["members"].items()):
        c = colours[k % len(colours)]
        n = len(info["federated_val"])
        axes[1].plot(range(1, n + 1), info["federated_val"], marker=".", color=c, label=f"{name} federated")
        axes[1].plot(range(1, len(info["local_only_val"]) + 1), info["local_only_val"], ls="--", color=c,
                     label=f"{name} local-only")
    axes[0].set_title("hub: held-out trouble score vs kube-default (lower is better)")
    axes[1].set_title("members: validation trouble score per round")
    for ax in axes:
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cell(v: dict[str, float]) -> str:
    mean, ci = v["mean"], v["ci95"]
    if abs(mean) >= 1000:
        return f"{mean:,.0f} ± {ci:,.0f}"
    return f"{mean:.3g} ± {ci:.2g}"


def table_rows(report: dict[str, Any], name: str) -> tuple[list[str], list[list[str]]]:
    """The member's evaluation table: a header and one row per policy (metrics that apply)."""
    pols = report["clusters"][name]
    metrics = [m for m in next(iter(pols.values())) if m != "runs"]
    return ["policy", *metrics], [[p, *(_cell(ms[m]) for m in metrics)] for p, ms in pols.items()]


def format_report(report: dict[str, Any]) -> str:
    lines = []
    for name in report["clusters"]:
        info = report["members"][name]
        tags = ", ".join(t for t, on in (("data-scarce", info["scarce"]),
                                         (f"joins at round {info['joins_at']}", info["late"])) if on)
        lines.append(f"\n{name}: {info['why']} ({info['nodes']} nodes, "
                     f"{info['decisions_per_round']} decisions per round{', ' + tags if tags else ''}); "
                     f"held-out test pods, replay, "
                     f"{report['config']['eval_seeds']} seeds, mean ± 95% CI, lower is better")
        header, rows = table_rows(report, name)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for r in [header, *rows]:
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(
                zip(r, widths, strict=True))))
    lines.append("\nverdicts (personalised vs local-only and kube-default, seed-by-seed differences):")
    for name, v in report["verdicts"].items():
        parts = [f"{k}: {d['verdict']} ({d['diff']:+.3g} ± {d['ci95']:.2g})" for k, d in v.items()
                 if isinstance(d, dict) and "verdict" in d]
        extra = ""
        if v.get("late"):
            extra = (f"; rounds to local-only's final validation score: {v['rounds_to_local_only']} "
                     f"(goal <= {v['rounds_budget']})")
        lines.append(f"  {name}: {'no worse' if v['no_worse'] else 'WORSE'}; " + "; ".join(parts) + extra)
        lines.append("    goals: " + "; ".join(f"{g}: {'met' if ok else 'MISSED'}"
                                             for g, ok in v["goals"].items()))
    for s, b in report["bytes"].items():
        lines.append(f"\nbytes sent ({s}, summed over each member's own reports): int8 {b['int8']:,} vs fp32 "
                     f"{b['fp32']:,} ({b['int8'] / max(b['fp32'], 1):.3f}x); received {b['down']:,}")
    return "\n".join(lines)
