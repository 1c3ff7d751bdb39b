"""The main job: a local multi-cluster federated training and evaluation on built-in data.

:func:`federate` runs Flower's own simulation runtime (``flwr run`` with a private
``FLWR_HOME`` and runtime dependency installation off; :func:`run_flower`) of the non-IID member
clusters of :data:`fedsched.common.federation.members.MEMBERS` (GPU training, CPU web with a daily
cycle, edge, a CPU-heavy GPU inventory, a web cluster that joins late; two of them
data-scarce), once with FedAvg and once with FedProx, in online mode: each member learns from
its own rewards in its replay twin (:class:`fedsched.agent.federation.learners.ReplayCreditLearner`).
Each run's final state is checked with ``flwr ls`` (``flwr run`` exits 0 even when the run
fails) and the local SuperLink it started is stopped afterwards.

Then, per member, on its held-out *test* pods (replay at its load, ``eval_seeds`` seeds, the
same seeds for every policy; :mod:`fedsched.experiment.baselines`): kube-default, the best
heuristic for the member (the load-aware baseline with the lowest trouble score on the member's
*validation* pods), the shipped starting model, local-only (the same rounds and decision budget
on the member alone: eta = 1, no global model), the FedAvg and FedProx global models, and the
personalised model ``eta * W_local + (1 - eta) * W_global`` of the FedAvg run at every eta of
``etas`` (eta = 0 is the global model), every model scored as served (its logits plus
``kube_weight`` times kube-default's score / 100). Verdicts compare, seed by seed, the run's personalised
model with local-only and kube-default on the trouble score and on failed pods; the late
member's rounds to local-only's final validation quality come from the members' per-round
reports. Bytes are what each member really sent and received in each round (its own report),
both ways beside their float32 equivalent (:func:`bytes_sent`). Writes ``DIR/report.json``,
``DIR/rounds.png`` (the hub's central trouble score and
each member's validation score per round, federated and local-only) and ``DIR/report.html``
(one self-contained file: the tables and the plot, :mod:`fedsched.experiment.report_html`).
The replays are one queue for all members (:class:`fedsched.experiment.baselines.MemberEvaluation`);
with ``beside_flower`` (the default) the local-only baseline and the replays that need no
federated model (the heuristics, the starting model) run in the job's worker pool beside the
Flower runs, at the lowest CPU priority (:func:`fedsched.common.compute.background_worker`):
they fill what the runs leave idle (the runtime's start-up, a round's last member).

Settings: :class:`fedsched.experiment.config.FederateConfig`.

May import: ``fedsched.common``, ``fedsched.agent.federation``, ``fedsched.coordinator`` (the
hub's starting model) and the other ``fedsched.experiment`` modules.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from fedsched.agent.federation.learners import ReplayCreditLearner
from fedsched.agent.federation.round import MemberState
from fedsched.common.compute import background_worker, single_threaded_worker, worker_pool
from fedsched.common.federation.codec import personalised_mix
from fedsched.common.federation.members import member_cluster
from fedsched.common.federation.run_config import Value, run_config_arg
from fedsched.common.federation.weights import load_npz
from fedsched.coordinator.server_app import initial_weights
from fedsched.experiment.baselines import (
    MemberEvaluation,
    fleet_verdicts,
    load_local_only,
    local_only,
    verdicts,
)
from fedsched.experiment.config import FederateConfig
from fedsched.experiment.report_html import write_html
from fedsched.experiment.report_text import format_report


def flwr_bin() -> str:
    """The flwr CLI of this environment (beside the running interpreter)."""
    candidate = Path(sys.executable).with_name("flwr")
    return str(candidate) if candidate.exists() else "flwr"


def _flwr(args: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> subprocess.CompletedProcess:
    with log_path.open("a") as log:
        return subprocess.run([flwr_bin(), *args], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              check=False)


def _runtime_pids(flwr_home: Path, names: tuple[bytes, ...] | None) -> list[int]:
    """The processes whose environment has this ``FLWR_HOME`` (every process of the local runtime
    ``flwr run`` started with it carries it), whose command line names one of ``names`` (None:
    any), other than this one."""
    marker, pids = f"FLWR_HOME={flwr_home}".encode(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if names is not None:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
                if not any(n in cmd for n in names):
                    continue
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in env:
            pids.append(int(proc.name))
    return pids


def _signal(pids: list[int], sig: int) -> int:
    sent = 0
    for pid in pids:
        try:
            os.kill(pid, sig)
            sent += 1
        except OSError:
            pass
    return sent


def stop_local_superlink(flwr_home: Path, include_apps: bool = False) -> int:
    """Stop the detached local SuperLink (and its helpers) that ``flwr run`` started with this
    FLWR_HOME; ``include_apps`` also stops the simulation process running the apps (what a
    crashed hub looks like). Returns how many processes were signalled."""
    names = (b"flower-super", b"flwr-simulation", b"flwr-serverapp") if include_apps else (b"flower-super",)
    return _signal(_runtime_pids(flwr_home, names), signal.SIGTERM)


def stop_local_runtime(flwr_home: Path, grace_s: float = 10.0) -> int:
    """Stop every process of the local runtime started with this FLWR_HOME: the SuperLink and
    its helpers, the simulation, Ray's processes and the apps' actors (what a run interrupted
    before its end leaves running: they would go on computing, and hold Flower's fixed ports for
    the next run). Ray's processes retitle themselves over their environment, so they are found
    by session: the SuperLink and the SuperExec each lead a session of their own, which
    everything they start joins. SIGTERM, then SIGKILL for what is still there after
    ``grace_s`` seconds (Ray's agents ignore SIGTERM once their raylet is gone). Returns how many
    processes were signalled."""
    marked = _runtime_pids(flwr_home, None)
    sessions = runtime_sessions(flwr_home, marked)
    signalled: set[int] = set()
    deadline = time.monotonic() + grace_s
    while True:
        pids = session_members(sessions) | {p for p in marked if _alive(p)}
        if not pids:
            return len(signalled)
        if time.monotonic() >= deadline:
            _signal(sorted(pids), signal.SIGKILL)
            return len(signalled | pids)
        _signal(sorted(pids - signalled), signal.SIGTERM)  # also what started since the last look
        signalled |= pids
        time.sleep(0.2)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM are ignored inside (in the main thread; elsewhere this process's signal
    handlers are not this code's to change): a second Ctrl-C, or a job runner's SIGTERM again,
    while the runtime is being stopped would cut the stop short and leave the federation running.
    The stop is bounded (:func:`stop_local_runtime`'s grace), so nothing waits long."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat``'s fields after the command name (state, ppid, pgrp, session, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _session(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[3]) if fields else None


def runtime_sessions(flwr_home: Path, marked: list[int] | None = None) -> set[int]:
    """The sessions of the local runtime started with this FLWR_HOME (of the processes carrying
    it, ``marked`` when already listed), but this process's own."""
    own = os.getsid(0)
    pids = _runtime_pids(flwr_home, None) if marked is None else marked
    return {sid for pid in pids if (sid := _session(pid)) is not None and sid != own}


def session_members(sessions: set[int]) -> set[int]:
    """The live processes of ``sessions`` (zombies excluded), but this one."""
    if not sessions:
        return set()
    return {int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and _session(int(p.name)) in sessions and _alive(int(p.name))} - {os.getpid()}


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its parent counts as gone)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


RAY_WORKER_NICENESS = "RAY_worker_niceness"  # Ray's setting of its workers' niceness (default 15)


def run_flower(app_dir: Path, out: Path, strategy: str, cfg: FederateConfig,
               progress: Callable[[str], None], *, name: str | None = None,
               extra: dict[str, Value] | None = None, fresh: bool = True) -> Path:
    """One ``flwr run`` of the federation into ``out/name`` (default: the strategy's name);
    ``extra`` adds run-config values; ``fresh=False`` keeps an earlier run's hub checkpoint
    (the hub then resumes from it)."""
    # flwr runs in the app directory: every path it is given must not depend on the job's own
    out = out.absolute()
    home = out / "flwr-home"
    home.mkdir(parents=True, exist_ok=True)
    run_dir = out / (name or strategy)
    if fresh and run_dir.exists():
        shutil.rmtree(run_dir)
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    # Ray starts its workers (the members' ClientApp actors) at nice 15, below the job's own
    # processes; here they are the job's critical path, and the pool beside them
    # (background_worker) is what must yield. A value the user set is kept.
    env.setdefault(RAY_WORKER_NICENESS, "0")
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
    ended = False
    try:
        started = _flwr(["run", str(app_dir), "--stream", "--federation-config",
                         f"num-supernodes={cfg.clusters} client-resources-num-cpus=1",
                         "--run-config", run_config], env, app_dir, log_path)
        listing = subprocess.run([flwr_bin(), "ls", "--format", "json"], cwd=app_dir, env=env,
                                 capture_output=True, text=True, check=False)
        ended = True
    finally:
        if ended:
            stop_local_superlink(home)
        else:  # interrupted (Ctrl-C, SIGTERM): the runtime would go on running the federation
            with signals_held():
                stop_local_runtime(home)
    if started.returncode != 0:  # refused before any run started (a bad option, no SuperLink)
        raise RuntimeError(f"flwr run ({name or strategy}) exited with status {started.returncode}: "
                           f"{log_tail(log_path)} (see {log_path})")
    try:
        runs = json.loads(listing.stdout)["runs"]
        status = max(runs, key=lambda r: r["pending-at"])["status"]
    except (ValueError, KeyError):
        raise RuntimeError(f"could not read the run's state (flwr ls said: {listing.stdout[-500:]!r}); "
                           f"see {log_path}") from None
    if status != "finished:completed":
        raise RuntimeError(f"the {strategy} run ended as {status!r}; see {log_path}")
    return run_dir


def log_tail(path: Path, lines: int = 6) -> str:
    """The last ``lines`` lines of ``path`` with text (colour codes and box-drawing frames
    stripped), joined by ' | '."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    kept = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip(" \u2502\u256d\u256e\u2570\u256f\u2500") for ln in text]
    return " | ".join([ln for ln in kept if ln][-lines:]) or "(empty log)"


TRAINED = "trained.json"  # what the finished training of a job in its directory was (reuse's key)


def training_key(out: Path, cfg: FederateConfig, extra: dict[str, Value] | None) -> dict[str, Any]:
    """Everything the job's training depends on (the members, every strategy's run config, which
    names its directories, and the extra run-config values; not the evaluation's settings) and
    what it left: the SHA-256 of each strategy's final global model (a hub resumed since is
    another training). The directories are absolute: ``out`` spelled relatively or not is one training."""
    out = out.absolute()
    digests = {}
    for s in cfg.strategies:
        path = out / s / "hub" / "global.npz"
        digests[s] = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
    return {"clusters": cfg.clusters, "strategies": list(cfg.strategies),
            "run_config": {s: {**cfg.run_config(s, out / s), **(extra or {})} for s in cfg.strategies},
            "global_sha256": digests}


def reusable(out: Path, cfg: FederateConfig, extra: dict[str, Value] | None) -> bool:
    """Whether ``out`` holds a finished training with exactly this job's training settings."""
    path = out / TRAINED
    try:
        return path.exists() and json.loads(path.read_text()) == json.loads(
            json.dumps(training_key(out, cfg, extra)))
    except ValueError:
        return False


def federate(out: Path, cfg: FederateConfig, app_dir: Path,
             progress: Callable[[str], None] = print,
             extra: dict[str, Value] | None = None, reuse: bool = False) -> dict[str, Any]:
    """The main job into ``out``; ``extra`` adds run-config values to every run (e.g.
    ``{"download-codec": "fp32"}``). ``reuse``: when ``out`` holds a finished training with the
    same training settings (:func:`training_key`; the runs are deterministic, so a rerun would
    train the same models), evaluate its models again (e.g. with more ``eval_seeds``) instead of
    training them again; otherwise train as without it."""
    out = out.absolute()  # one spelling of the directory: the training key and flwr (in the app directory)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    reused = reuse and reusable(out, cfg, extra)
    phases: dict[str, float] = {}  # wall seconds of each phase of this invocation
    init = initial_weights(cfg.init, cfg.seed, "online")  # the hub's starting model, for local-only too
    main = cfg.strategies[0]
    member_cfg = cfg.member_config(out)
    members = [member_cluster(i, size=cfg.member_size) for i in range(cfg.clusters)]
    n = cfg.clusters
    # a failed or interrupted run ends the job now, not after the queue (worker_pool)
    # Beside the Flower runs the pool's workers run at the lowest priority: they fill what the
    # runs leave idle instead of slowing the runs' rounds.
    with worker_pool(cfg.workers, initializer=background_worker if cfg.beside_flower
                     else single_threaded_worker) as pool:
        queued = None
        if cfg.beside_flower:
            queued = _queue_what_needs_no_federated_model(pool, members, cfg, init, out, reused, progress)
        if reused:
            progress(f"reusing the finished training in {out} ({TRAINED}): evaluation only")
            runs = {s: out / s for s in cfg.strategies}
        else:
            (out / TRAINED).unlink(missing_ok=True)
            runs = {}
            for s in cfg.strategies:
                t = time.time()
                runs[s] = run_flower(app_dir, out, s, cfg, progress, extra=extra)
                phases[f"federation {s}"] = round(time.time() - t, 1)
        if queued is None:
            queued = _queue_what_needs_no_federated_model(pool, members, cfg, init, out, reused, progress)
        local, local_futures, evaluation = queued
        if local_futures:
            t = time.time()
            local = [local_futures[i].result() for i in range(n)]
            left = "local-only (what was left)" if cfg.beside_flower else "local-only"
            phases[left] = round(time.time() - t, 1)
            (out / TRAINED).write_text(json.dumps(training_key(out, cfg, extra), indent=2))
        report: dict[str, Any] = {"config": {**cfg.__dict__, "strategies": list(cfg.strategies),
                                             "etas": list(cfg.etas), "run_config_extra": dict(extra or {}),
                                             "reused_training": reused},
                                  "clusters": {}, "rounds": {}, "members": {}}
        for s, d in runs.items():
            report["rounds"][s] = json.loads((d / "hub" / "rounds.json").read_text())
        glob = {s: {k: v for k, v in load_npz(d / "hub" / "global.npz").items() if k != "__round__"}
                for s, d in runs.items()}
        t = time.time()
        progress(f"evaluating {cfg.clusters} members: {cfg.eval_seeds} seeds of their test pods per policy, "
                 f"on {cfg.workers} processes")
        policies: list[dict[str, Any]] = []
        local_ws = [MemberState(runs[main] / "state" / m.name).load("local") for m in members]
        for i, local_w in enumerate(local_ws):
            ps: dict[str, Any] = {"local-only": local[i][0]}
            for s in cfg.strategies:
                ps[f"global {s}"] = glob[s]
            if local_w is not None:
                for eta in cfg.etas:
                    if eta > 0:
                        ps[f"personalised eta={eta:g}"] = personalised_mix(local_w, glob[main], eta)
            if f"personalised eta={cfg.eta:g}" not in ps:
                ps[f"personalised eta={cfg.eta:g}"] = (personalised_mix(local_w, glob[main], cfg.eta)
                                                       if local_w is not None else glob[main])
            policies.append(ps)
        evaluation.add(policies)
        evaluated = evaluation.finish(progress)
        for i, (member, (best, scores, figures)) in enumerate(zip(members, evaluated, strict=True)):
            has_gpus = member.nodes.total_gpu_milli > 0
            report["clusters"][member.name] = figures
            fed_val = [float(h.get("members", {}).get(str(i), {}).get("val-score", math.nan))
                       for h in report["rounds"][main]]
            spec = member.spec
            learner = ReplayCreditLearner.from_config(member, member_cfg)  # what the member ran
            report["members"][member.name] = {
                "profile": spec.profile if spec else "", "why": spec.why if spec else "",
                "scarce": bool(spec and spec.scarce), "late": bool(spec and spec.late),
                "joins_at": learner.joins_at, "decisions_per_round": learner.decisions,
                "nodes": len(member.nodes), "gpus": bool(has_gpus), "best_heuristic": best,
                "heuristic_validation_scores": scores, "local_only_val": local[i][1],
                "federated_val": fed_val,
            }
    phases["evaluation"] = round(time.time() - t, 1)
    report["verdicts"] = verdicts(report, cfg)
    report["fleet"] = fleet_verdicts(report, cfg)
    report["bytes"] = bytes_sent(report["rounds"])
    report["wall_s"] = round(time.time() - t0, 1)
    report["phases_s"] = phases
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    plot_rounds(report, out / "rounds.png")
    write_html(report, out / "rounds.png", out / "report.html", format_report(report))
    return report


def _queue_what_needs_no_federated_model(
        pool: ProcessPoolExecutor, members: list[Any], cfg: FederateConfig, init: dict[str, Any], out: Path,
        reused: bool, progress: Callable[[str], None]) -> tuple[list[Any], dict[int, Any], MemberEvaluation]:
    """Queue on ``pool`` what needs no federated model: local-only (unless a reused training
    left it: then it is returned as it is), the longest first (the members' costs differ by 5x),
    then the heuristics' validation replays and the test replays of kube-default and the
    starting model. Returns (local-only's results when reused, else []; its futures by member;
    the evaluation queue)."""
    n = len(members)
    kept = [load_local_only(m.name, out) for m in members] if reused else []
    local: list[Any] = []
    futures: dict[int, Any] = {}
    if reused and all(k is not None for k in kept):
        local = list(kept)
    else:
        progress(f"local-only baselines: {n} members x {cfg.rounds} rounds on {cfg.workers} processes"
                 + (", beside the federated runs" if cfg.beside_flower and not reused else ""))
        order = sorted(range(n), key=lambda i: -(len(members[i].train) + len(members[i].val)))
        futures = {i: pool.submit(local_only, i, cfg, init, out) for i in order}
    evaluation = MemberEvaluation(members, cfg, pool)
    start = "shipped start" if cfg.init == "shipped" else "random start"
    evaluation.add([{"kube-default": "kube-default", start: init} for _ in members])
    return local, futures, evaluation


def bytes_sent(rounds: dict[str, list[dict]]) -> dict[str, Any]:
    """What each member really sent and received, per strategy, summed over its rounds from its
    own reports (every reply, also one without an upload: it carries a zero update) and how
    many of its replies were uploads. Both ways beside the float32 equivalent: ``int8`` /
    ``fp32`` up, ``down`` / ``down-fp32`` (the global as it arrived: an INT8 delta or full copy
    with ``download-codec = "int8-delta"``, else float32; a report without ``bytes-down-fp32``
    counts what arrived)."""
    out: dict[str, Any] = {}
    for s, hist in rounds.items():
        per: dict[str, dict[str, int]] = {}
        for h in hist:
            for pid, m in h.get("members", {}).items():
                row = per.setdefault(pid, {"int8": 0, "fp32": 0, "down": 0, "down-fp32": 0, "uploads": 0})
                # A reply without an upload still carries its (zero) update: Flower wants one
                # ArrayRecord with the same keys in every reply, so those bytes were sent too.
                row["int8"] += int(m.get("bytes-up", 0))
                row["fp32"] += int(m.get("bytes-up-fp32", 0))
                row["down"] += int(m.get("bytes-down", 0))
                row["down-fp32"] += int(m.get("bytes-down-fp32", m.get("bytes-down", 0)))
                row["uploads"] += int(m.get("uploaded", 1)) == 1
        out[s] = {"members": per, "int8": sum(r["int8"] for r in per.values()),
                  "fp32": sum(r["fp32"] for r in per.values()), "down": sum(r["down"] for r in per.values()),
                  "down-fp32": sum(r["down-fp32"] for r in per.values())}
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
