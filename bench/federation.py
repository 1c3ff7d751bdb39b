"""Federation benchmark (online mode): does the model move, and what do poisoning, failures, a hub
kill, INT8 uploads and FedProx do to it?

Every experiment is one run of Flower's own simulation runtime (``flwr run`` with a private
``FLWR_HOME``, through :func:`fedsched.experiment.federate.run_flower`) of the five non-IID
members of :data:`fedsched.common.federation.members.MEMBERS` in online mode, all from the same
start (the seeded random model; ``--init shipped``: the shipped online policy, the main job's and a
fleet's start) and the same member seeds, so two runs differ only by their condition:

- ``clean`` (FedAvg, INT8 uploads, INT8-delta downloads: the run config's defaults) and
  ``clean-repeat`` (the same run again: the run-to-run floor of every "vs clean" figure; the
  runs are deterministic, so it is 0) and ``clean-seed2`` (another ``training-seed``: another
  training of the same configuration, how far apart two equally clean trainings land);
- ``poison-nan`` / ``poison-huge`` / ``poison-flip``: 20% of the members (partition
  :data:`POISONED`, one of five) send NaN, 10^4-times scaled or sign-flipped updates (the flip
  with the hub's direction check off: undefended FedAvg); the scaled update under the run
  config's ``norm-action`` (rescaled to the others' median norm and kept) and ``huge-reject``
  with ``norm-action = "reject"`` (dropped from the round, the hub's earlier action);
  ``flip-fedtrimmedavg`` and ``flip-krum``: the sign flip under the Byzantine-robust strategies;
  ``flip-cosine``: the sign flip under FedAvg with the hub's direction check (``cosine-floor``
  :data:`COSINE_FLOOR`: an update pointing away from the median of the others is rejected);
  ``poison-inflate`` / ``inflate-bounded``: the same member sends its own update but claims
  10^6 times the pods it scheduled (FedAvg's weight), without the hub's weight bound
  (``weight-bound`` inf) and with the run config's (a weight counts at most 10 x the median of
  the others');
- ``failures``: every member fails each round with probability 0.3;
- ``hub-kill``: the hub (SuperLink and simulation) is killed after its first checkpoint and the
  run is started again on the same directory (it resumes from the checkpoint);
- ``fp32``: clean FedAvg with float32 both ways (uploads and the hub's downloads);
  ``fp32-down``: clean FedAvg with INT8 uploads and float32 downloads (what the compressed
  download alone changes); ``fedprox``: clean FedProx with the run config's
  ``proximal-mu`` (0.01) and ``fedprox-mu1`` with :data:`STRONG_MU` (1.0);
- ``scale`` (``--scale NxR``): N members for R rounds on tiny budgets: wall time and peak RSS.

Reported per run:

1. **Decisions changed**: a fixed probe set of decision points, collected once by kube-default
   in each member's replay twin of its *validation* pods (features from the env, 20% warm-up
   skipped, only decisions between at least two distinct candidates), and for the run's final
   global model the share of probes whose pick differs from the random start's and from the
   clean run's, with ``||W_final - W_init||``. A pick is the node a model scores highest as
   served: its logits plus the run config's ``kube-weight`` times kube-default's score / 100.
   Clean training must move these well above 0 and above the clean-repeat floor, or nothing
   below means anything.
2. **Quality**: the hub's final central trouble score (``rounds.json``: held-out clusters, mean
   and 95% CI over them; the random start's is computed here, as the hub never scores round 0),
   and each member's test-pod replays of the final global model
   (:func:`fedsched.experiment.baselines.evaluate_member`, ``eval_seeds`` seeds, the same seeds
   for every model). *Within 5% of clean* is decided on the paired difference
   ``d = trouble(run) - trouble(clean)`` of the per-member, per-seed test trouble scores.
   A trouble score is a mean log ratio to kube-default and sits near 0, so a relative
   tolerance on it would be meaningless; but since both runs are scored against the same
   kube-default replay, ``d`` is exactly the run's trouble score *against the clean model*
   (``mean_m log((run_m + s_m) / (clean_m + s_m))`` over hot node-seconds, throttling, OOM kills
   and failed pods): a relative change of the (smoothed, geometric-mean) trouble itself. A run
   is within 5% of clean when the 95% CI of ``d`` (pooled over members x seeds) lies inside
   ``+-log(1.05)``. The same statistic for clean vs the random start is reported beside it: the
   tolerance only means something where that effect is clearly larger than the tolerance and the
   CIs are narrower than it (at 3 seeds they are not: see the results). The ratio of summed hot
   node-seconds (run / clean) is reported too.
3. **Robustness**: per round, the updates the hub rejected (``rounds.json`` ``rejected``) and why.
4. **Bytes**: what each member itself reported sending, per round (``bytes-up`` of each member's
   reply; a failed member sent nothing), as counted by
   :func:`fedsched.experiment.federate.bytes_sent` (a reply with ``uploaded = 0`` counted as 0)
   and as the reply's payload really is (those replies still carry the encoded zero update);
   the INT8 run against the fp32 run, with the quality cost of INT8 (central and test trouble
   scores, paired) and the probe decisions the two final models take differently; the bytes
   received both ways, and the same cost for the compressed download alone (``clean`` against
   ``fp32-down``).
5. **FedProx vs FedAvg** on the heterogeneous members: each member's test trouble score under
   both global models and their paired difference with its CI.

Wall times are each run's own (from when it holds the machine-wide Flower lock of
:func:`fedsched.experiment.federate.run_flower`); ``hub_s_to_last_round`` is the hub's clock.
``--reuse`` keeps the runs an interrupted invocation finished in ``--out`` and re-analyses.

    python bench/federation.py [--quick] [--init random|shipped] [--only clean,poison-flip,...]
        [--eval-seeds N] [--scale 50x10] [--out DIR] [--json OUT.json] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
from harness.provenance import git_commit, machine, write_json

from fedsched.common.compute import single_threaded_worker, worker_pool
from fedsched.common.federation.members import member_cluster
from fedsched.common.federation.run_config import app_defaults
from fedsched.common.federation.weights import load_npz
from fedsched.common.model.metrics import mean_ci95
from fedsched.coordinator.server_app import initial_weights, strategy_arguments
from fedsched.experiment.baselines import evaluate_member
from fedsched.experiment.config import FederateConfig
from fedsched.experiment.federate import bytes_sent, run_flower, stop_local_superlink

APP_DIR = Path(__file__).resolve().parents[1]
POISONED = "1"  # the poisoned partition (web: a full-budget member from round 1, ~29% of the weight)
BAND = math.log(1.05)  # "within 5% of clean": the CI of the paired log-ratio difference inside +-BAND
Weights = dict[str, np.ndarray]
STRONG_MU = 1.0  # a second FedProx run, 100x the run config's proximal-mu (0.01 barely moves the model)
COSINE_FLOOR = -0.3  # flip-cosine's cosine-floor (the run config's default): the flip under that check
REUSE = False  # --reuse: runs already finished in --out are not run again


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ---- isolation and process accounting -------------------------------------------------------------
def private_superlink_ports() -> dict[str, str]:
    """Free ports for this benchmark's local SuperLink. ``flwr run`` starts (or *reuses*, if one
    answers) a local SuperLink on fixed ports (39091, 39093) whatever ``FLWR_HOME`` is: another
    job's federation on the same machine would otherwise receive these runs, and stopping it
    would kill them."""
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(str(s.getsockname()[1]))
    return {"FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": ports[0], "FLWR_LOCAL_CONTROL_API_PORT": ports[1]}


def processes_of(home: Path) -> dict[int, str]:
    """pid -> command of the processes whose environment has ``FLWR_HOME=home`` (this run's)."""
    tag = f"FLWR_HOME={home}".encode()
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if tag in (proc / "environ").read_bytes().split(b"\0"):
                out[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:80]
        except OSError:
            continue
    return out


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class RssSampler(threading.Thread):
    """Samples, every second, the RSS of this run's processes (``FLWR_HOME`` in their environment:
    the flwr CLI, SuperLink, simulation, Ray and its ClientApp actors): the peak of their sum and
    of the largest one."""

    def __init__(self, home: Path) -> None:
        super().__init__(daemon=True)
        self.home, self.stop, self.peak_total, self.peak_process = home, threading.Event(), 0.0, 0.0

    def run(self) -> None:
        while not self.stop.wait(1.0):
            sizes = [rss_mib(p) for p in processes_of(self.home)]
            if sizes:
                self.peak_total = max(self.peak_total, sum(sizes))
                self.peak_process = max(self.peak_process, max(sizes))


# ---- runs -----------------------------------------------------------------------------------------
def history(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "hub" / "rounds.json").read_text())


def final_weights(run_dir: Path) -> Weights:
    saved = load_npz(run_dir / "hub" / "global.npz")
    assert saved is not None, f"no checkpoint in {run_dir}"
    return {k: v for k, v in saved.items() if k != "__round__"}


def flower(out: Path, name: str, strategy: str, cfg: FederateConfig, extra: dict | None = None,
           fresh: bool = True) -> dict[str, Any]:
    """One ``run_flower`` with its wall time and peak RSS; its run directory is ``out/name``."""
    record = out / name / "bench-run.json"
    if REUSE and fresh and (out / name / "hub" / "final.json").exists():
        log(f"{name}: reusing the finished run in {out / name}")
        return json.loads(record.read_text()) if record.exists() else {
            "strategy": strategy, "extra": extra or {}, "wall_s": None}
    sampler = RssSampler(out / "flwr-home")
    sampler.start()
    started = [time.time()]

    def progress(msg: str) -> None:
        if msg.startswith("flwr run ("):  # the machine-wide lock is held: the run itself starts
            started[0] = time.time()
        log(msg)

    try:
        run_flower(APP_DIR, out, strategy, cfg, progress, name=name, extra=extra, fresh=fresh)
    finally:
        sampler.stop.set()
        sampler.join()
    wall = round(time.time() - started[0], 1)
    log(f"{name}: {wall} s")
    rec = {"strategy": strategy, "extra": extra or {}, "wall_s": wall,
           "peak_rss_mib_all_processes": round(sampler.peak_total),
           "peak_rss_mib_largest": round(sampler.peak_process)}
    record.write_text(json.dumps(rec))
    return rec


def hub_kill(out: Path, cfg: FederateConfig, name: str = "hub-kill") -> dict[str, Any]:
    """Kill the hub (its SuperLink and the simulation) once its first checkpoint is written,
    then start the same run again on the same directory: it must resume there."""
    home = out / "flwr-home"
    run_dir = out / name
    hub = run_dir / "hub"
    record = run_dir / "bench-hub-kill.json"
    if REUSE and record.exists():
        log(f"{name}: reusing the finished run in {run_dir}")
        return json.loads(record.read_text())

    def killer() -> None:
        deadline = time.time() + 1200
        while time.time() < deadline:
            try:
                done = len(json.loads((hub / "rounds.json").read_text() or "[]"))
            except (OSError, ValueError):
                done = 0
            if done >= 1 and (hub / "global.npz").exists():
                log(f"{name}: killing the hub after round {done}: "
                    f"{stop_local_superlink(home, include_apps=True)} processes signalled")
                return
            time.sleep(0.5)

    started = [time.time()]

    def progress(msg: str) -> None:
        if msg.startswith("flwr run ("):
            started[0] = time.time()
        log(msg)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        run_flower(APP_DIR, out, "fedavg", cfg, progress, name=name)
        first = "completed before the kill"
    except RuntimeError as e:
        first = f"killed: {str(e)[:160]}"
    thread.join(timeout=10)
    first_wall = round(time.time() - started[0], 1)
    before = [h["round"] for h in history(run_dir)]
    time.sleep(3)
    left = processes_of(home)  # what the kill left running (Ray workers...)
    resumed = flower(out, name, "fedavg", cfg, fresh=False)
    rounds = [h["round"] for h in history(run_dir)]
    final = json.loads((hub / "final.json").read_text())
    rec = {**resumed, "wall_s": round(first_wall + resumed["wall_s"], 1), "first_run_wall_s": first_wall,
           "resumed_run_wall_s": resumed["wall_s"], "first_run": first,
            "rounds_before_restart": before, "resumed_from": final["resumed_from"], "rounds": rounds,
            "no_round_lost_or_repeated": rounds == list(range(1, cfg.rounds + 1)),
            "processes_left_after_kill": sorted(set(left.values()))}
    record.write_text(json.dumps(rec))
    return rec


# ---- probe decisions ------------------------------------------------------------------------------
Probe = tuple[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray]


def collect_probes(args: tuple[int, str, int, int]) -> list[Probe]:
    """Up to ``n`` decision points (node features, pod, context, kube-default's pick and its
    scores of the candidates) of the member's validation pods scheduled by kube-default in its
    replay twin."""
    from fedsched.agent.learning.env import EnvConfig, SchedulingEnv
    from fedsched.common.federation.members import reference_typical
    from fedsched.common.model.traces import fits_somewhere
    from fedsched.common.schedulers.base import Placement
    from fedsched.common.schedulers.kube_default import KubeDefault, kube_default_scores

    member_id, size, n, seed = args
    member = member_cluster(member_id, size=size)
    assert member.val is not None
    pods = fits_somewhere(member.val, member.nodes)
    replay = {**member.replay, "allow_unreachable_load": True}
    env = SchedulingEnv(member.nodes, pods, typical=reference_typical(), seed=seed,
                        config=EnvConfig(mode="replay", replay=replay))
    kube = KubeDefault()
    env.reset()
    warmup, step, found = int(0.2 * len(pods)), 0, []
    while True:
        pod, state, cand, feats = env.decision
        kube_scores = np.asarray(kube_default_scores(state, pod, np.asarray(cand)), dtype=np.float64)
        pick = int(np.argmax(kube_scores))
        if step >= warmup and len(cand) >= 2 and len(np.unique(feats.nodes, axis=0)) >= 2:
            found.append((np.array(feats.nodes, np.float32), np.array(feats.pod, np.float32),
                          np.array(feats.context, np.float32), pick, kube_scores))
        node = int(cand[pick])
        _, _, term, trunc, _ = env.step_placement(Placement(node, kube.select_gpus(state, pod, node)))
        step += 1
        if term or trunc:
            break
    keep = np.random.default_rng(seed + member_id).choice(len(found), min(n, len(found)), replace=False)
    return [found[i] for i in sorted(keep)]


def choices(weights: Weights, probes: list[Probe], kube_weight: float) -> np.ndarray:
    """The node ``weights`` picks at every probe decision, scored as the members' models are
    served: the logits plus ``kube_weight`` times kube-default's score / 100 (the sum
    :class:`fedsched.common.learning.scorers.PolicyScheduler` takes)."""
    from fedsched.common.federation.scoring import policy_of

    policy = policy_of(weights)
    return np.array([int(np.argmax(policy.score_numpy(nodes, pod, ctx).astype(np.float64)
                                   + kube_weight / 100.0 * kube_scores))
                     for nodes, pod, ctx, _, kube_scores in probes])


def distance(a: Weights, b: Weights) -> float:
    return float(math.sqrt(sum(float(((a[k].astype(np.float64) - b[k]) ** 2).sum()) for k in b)))


# ---- statistics -------------------------------------------------------------------------------------
def ci(values: list[float]) -> dict[str, float]:
    mean, half = mean_ci95(values)
    return {"mean": mean, "ci95": half, "n": len([v for v in values if v == v])}


def paired(evals: dict[str, dict], a: str, b: str, metric: str = "trouble_score") -> dict[str, Any]:
    """Seed-by-seed differences ``a - b`` of ``metric`` on every member's test pods: per member
    and pooled over members x seeds, with the within-5% and sign verdicts (lower is better)."""
    pooled: list[float] = []
    per: dict[str, dict[str, float]] = {}
    for member, pols in evals.items():
        d = [x - y for x, y in zip(pols[a]["runs"][metric], pols[b]["runs"][metric], strict=True)]
        per[member] = ci(d)
        pooled += d
    out: dict[str, Any] = {**ci(pooled), "members": per}
    lo, hi = out["mean"] - out["ci95"], out["mean"] + out["ci95"]
    out["within_5pct"] = bool(lo >= -BAND and hi <= BAND)
    out["verdict"] = "worse" if lo > 0 else "better" if hi < 0 else "no significant difference"
    return out


def hot_ratio(evals: dict[str, dict], a: str, b: str) -> float:
    """Summed hot CPU node-seconds of ``a`` over ``b``'s (all members and seeds)."""
    num = sum(sum(p[a]["runs"]["hot_cpu_node_s"]) for p in evals.values())
    den = sum(sum(p[b]["runs"]["hot_cpu_node_s"]) for p in evals.values())
    return num / den if den else math.nan


def central(h: list[dict]) -> dict[str, float]:
    """The final round's central trouble score per held-out cluster."""
    c = h[-1]["central"]
    return {k[len("trouble_score_"):]: float(v) for k, v in c.items() if k.startswith("trouble_score_")}


def central_paired(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return ci([a[k] - b[k] for k in b])


def bytes_table(h: list[dict], members: int) -> dict[str, Any]:
    """Per round, per partition: the bytes of the member's reply (``bytes-up``), whether it counted
    as an upload; totals as ``bytes_sent`` counts them and as payload on the wire."""
    per_round = []
    wire = counted = 0
    for e in h:
        row = {}
        for pid, m in sorted(e.get("members", {}).items(), key=lambda kv: int(kv[0])):
            b, up = int(m.get("bytes-up", 0)), int(m.get("uploaded", 1))
            row[pid] = {"bytes_up": b, "uploaded": up, "bytes_down": int(m.get("bytes-down", 0))}
            wire += b
            counted += b if up else 0
        per_round.append({"round": e["round"], "members": row,
                          "no_reply": [str(i) for i in range(members) if str(i) not in row]})
    return {"per_round": per_round, "sent_counted": counted, "sent_payload_incl_skips": wire}


# ---- main -----------------------------------------------------------------------------------------
def select_runs(plan: list[tuple[str, str, dict]], only: set[str]) -> list[tuple[str, str, dict]]:
    """The runs of ``plan`` named in ``only`` (all of them when it is empty), in the plan's order.
    ``clean`` must be among them (every comparison's reference); ``hub-kill`` may be named (it is
    not in the plan: it runs after it). An unknown name is a ``ValueError`` that lists the runs."""
    if not only:
        return plan
    names = [name for name, _, _ in plan]
    unknown = sorted(only - set(names) - {"hub-kill"})
    if unknown or "clean" not in only:
        what = f"unknown run(s) {', '.join(unknown)}" if unknown else "clean is missing"
        raise ValueError(f"--only: {what}; the runs are clean (every comparison's reference), "
                         f"{', '.join(names[1:])} and hub-kill")
    return [p for p in plan if p[0] in only]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench-federation")
    ap.add_argument("--quick", action="store_true", help="tiny budgets: checks the benchmark end to end")
    ap.add_argument("--scale", default=None, help="MEMBERSxROUNDS, e.g. 50x10 (omitted: skipped)")
    ap.add_argument("--skip", default="", help="comma-separated families to skip: robust, bytes, fedprox, "
                                               "repeat, main (everything but --scale; the other results "
                                               "already in --json are kept)")
    ap.add_argument("--member-size", default="full", choices=("full", "small"),
                    help="the members' clusters: full (40-100 nodes) or small (6-10-node smoke variants)")
    ap.add_argument("--init", default="random", choices=("random", "shipped"),
                    help="the members' start: random (the results of record; 'decisions changed' is measured "
                         "from it) or shipped (the online policy, as the main job and a fleet start)")
    ap.add_argument("--only", default="", help="comma-separated run names of the plan to run (e.g. "
                                               "clean,poison-flip,flip-cosine); default: every run")
    ap.add_argument("--eval-seeds", type=int, default=None,
                    help="test-pod replay seeds per member and model (default: 3, --quick 2)")
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--reuse", action="store_true", help="reuse the runs a previous invocation finished in "
                                                         "--out (same settings assumed): re-analyse only")
    args = ap.parse_args()
    global REUSE
    REUSE = args.reuse
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    os.environ.update(private_superlink_ports())
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.quick:
        cfg = FederateConfig(rounds=2, local_decisions=120, scarce_decisions=30, late_round=2, local_epochs=2,
                             eval_seeds=2)
        probes_per_member = 40
    else:
        cfg = FederateConfig(rounds=4, local_decisions=300, scarce_decisions=60, late_round=2, local_epochs=3,
                             eval_seeds=3)
        probes_per_member = 100
    # the random start by default (the main job's is the shipped policy): "decisions changed" is measured
    # from the start; every model scores with the run config's kube weight (its results of record predate
    # it: logits alone)
    cfg = replace(cfg, clusters=5, strategies=("fedavg",), member_size=args.member_size, init=args.init)
    if args.eval_seeds is not None:
        if not 1 <= args.eval_seeds <= 1000:
            ap.error(f"--eval-seeds must be in [1, 1000], got {args.eval_seeds}")
        cfg = replace(cfg, eval_seeds=args.eval_seeds)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    result: dict[str, Any] = {"provenance": {**git_commit(), "machine": machine()},
                              "config": {**asdict(cfg), "poisoned_partition": POISONED,
                                         "within_5pct_band_log": BAND,
                                         "probes_per_member": probes_per_member}}
    if "main" in skip and args.json_out and Path(args.json_out).exists():
        # Only --scale: keep the other results of the JSON, with their provenance.
        provenance = result["provenance"]
        result = json.loads(Path(args.json_out).read_text())
        result["scale_provenance"] = provenance

    def save() -> None:
        if args.json_out:
            write_json(args.json_out, result, default=float)

    t_start = time.time()
    if "main" not in skip:
        plan: list[tuple[str, str, dict]] = [("clean", "fedavg", {})]
        if "repeat" not in skip and not args.quick:
            plan += [("clean-repeat", "fedavg", {}), ("clean-seed2", "fedavg", {"training-seed": 2})]
        if "robust" not in skip:
            plan += [(f"poison-{k}", "fedavg", {"poison-members": POISONED, "poison-kind": k})
                     for k in ("nan", "huge")]
            plan.append(("huge-reject", "fedavg",
                         {"poison-members": POISONED, "poison-kind": "huge", "norm-action": "reject"}))
            # The flip undefended (no direction check), then under each defence.
            flip = {"poison-members": POISONED, "poison-kind": "flip", "cosine-floor": -1.0}
            inflate = {"poison-members": POISONED, "poison-kind": "inflate"}
            plan += [("poison-flip", "fedavg", flip),
                     ("flip-fedtrimmedavg", "fedtrimmedavg", flip), ("flip-krum", "krum", flip),
                     ("flip-cosine", "fedavg", {**flip, "cosine-floor": COSINE_FLOOR}),
                     ("poison-inflate", "fedavg", {**inflate, "weight-bound": math.inf}),
                     ("inflate-bounded", "fedavg", inflate),
                     ("failures", "fedavg", {"fail-rate": 0.3})]
        if "bytes" not in skip:
            plan += [("fp32-down", "fedavg", {"download-codec": "fp32"}),
                     ("fp32", "fedavg", {"codec": "fp32", "download-codec": "fp32"})]
        if "fedprox" not in skip:
            plan += [("fedprox", "fedprox", {}),
                     (f"fedprox-mu{STRONG_MU:g}", "fedprox", {"proximal-mu": STRONG_MU})]
        try:
            plan = select_runs(plan, only)
        except ValueError as e:
            ap.error(str(e))
        runs: dict[str, dict[str, Any]] = {}
        for name, strategy, extra in plan:
            runs[name] = flower(out, name, strategy, cfg, extra)
            result["runs"] = runs
            save()
        if "robust" not in skip and (not only or "hub-kill" in only):
            runs["hub-kill"] = hub_kill(out, cfg)
            save()
        analyse(out, cfg, runs, probes_per_member, result)
        result["main_wall_s"] = round(time.time() - t_start, 1)
        save()
        print(format_table(result))

    if args.scale:
        n, r = (int(x) for x in args.scale.lower().split("x"))
        scfg = replace(cfg, clusters=n, rounds=r, local_decisions=20, scarce_decisions=10, late_round=2,
                       local_epochs=1)
        name = f"scale-{n}x{r}"
        rec = flower(out, name, "fedavg", scfg)
        h = history(out / name)
        result["scale"] = {"members": n, "rounds": r, "local_decisions": 20, "scarce_decisions": 10,
                           "completed_rounds": len(h), "members_reporting_last_round": len(h[-1]["members"]),
                           "rejected": sum(len(e["rejected"]) for e in h),
                           "central_final": h[-1]["central"]["trouble_score"], **rec}
        save()
        print(f"\nscale {n}x{r}: {len(h)} rounds, {rec['wall_s']} s wall, peak RSS "
              f"{rec['peak_rss_mib_all_processes']} MiB (all processes), largest process "
              f"{rec['peak_rss_mib_largest']} MiB")
    save()
    return 0


def start_label(cfg: FederateConfig) -> str:
    """The start's row name, as the main job's report names it."""
    return "shipped start" if cfg.init == "shipped" else "random start"


def analyse(out: Path, cfg: FederateConfig, runs: dict[str, dict], probes_per_member: int,
            result: dict[str, Any]) -> None:
    from fedsched.coordinator.evaluation import online_central_evaluator

    init = initial_weights(cfg.init, cfg.seed, "online")
    start = start_label(cfg)
    finals = {name: final_weights(out / name) for name in runs}
    hist = {name: history(out / name) for name in runs}
    t0 = time.time()
    log(f"{start}: central evaluation")
    with online_central_evaluator(size=cfg.member_size, kube_weight=cfg.kube_weight) as evaluator:
        init_central = evaluator(init)
    members = [member_cluster(i, size=cfg.member_size) for i in range(cfg.clusters)]
    policies: dict[str, Any] = {start: init, **finals}
    with worker_pool(cfg.workers, initializer=single_threaded_worker) as pool:
        log(f"probe decisions: up to {probes_per_member} per member")
        jobs = [(i, cfg.member_size, probes_per_member, 7) for i in range(cfg.clusters)]
        probes = [p for ps in pool.map(collect_probes, jobs) for p in ps]
        evals: dict[str, dict] = {}
        for i, m in enumerate(members):
            log(f"test replays of {m.name}: {len(policies) + 1} policies x {cfg.eval_seeds} seeds")
            evals[m.name] = evaluate_member(i, cfg, policies, pool, m.nodes.total_gpu_milli > 0)
    result["evaluation_wall_s"] = round(time.time() - t0, 1)
    picks = {name: choices(w, probes, cfg.kube_weight) for name, w in policies.items()}
    kube = np.array([p[3] for p in probes])
    result["probes"] = {"n": len(probes), "mean_candidates": float(np.mean([len(p[0]) for p in probes])),
                        "start_agrees_with_kube_default":
                            float((picks[start] == kube).mean())}
    init_c = {k[len("trouble_score_"):]: float(v) for k, v in init_central.items()
              if k.startswith("trouble_score_")}
    clean_c = central(hist["clean"])
    report: dict[str, Any] = {}
    for name in [start, *runs]:
        w = policies[name]
        row: dict[str, Any] = {
            "finite": bool(all(np.isfinite(v).all() for v in w.values())),
            "param_distance_from_init": distance(w, init),
            "param_distance_from_clean": distance(w, finals["clean"]),
            "decisions_changed_vs_init": float((picks[name] != picks[start]).mean()),
            "decisions_changed_vs_clean": float((picks[name] != picks["clean"]).mean()),
            "agrees_with_kube_default": float((picks[name] == kube).mean()),
            "test_trouble": ci([x for p in evals.values() for x in p[name]["runs"]["trouble_score"]]),
            "test_trouble_members": {mn: {k: p[name]["trouble_score"][k] for k in ("mean", "ci95")}
                                     for mn, p in evals.items()},
        }
        c = init_c if name == start else central(hist[name])
        row["central_final"] = ci(list(c.values()))
        row["central_clusters"] = c
        if name != "clean":
            row["central_vs_clean"] = central_paired(c, clean_c)
            row["test_vs_clean"] = paired(evals, name, "clean")
            row["hot_node_s_ratio_vs_clean"] = hot_ratio(evals, name, "clean")
        if name != start:
            h = hist[name]
            row["central_per_round"] = [e["central"]["trouble_score"] for e in h]
            row["rejected_per_round"] = [len(e["rejected"]) for e in h]
            # partition -> its update's cosine to the median of the others' updates
            row["cosines_per_round"] = [e.get("cosines", {}) for e in h]
            row["rejections"] = [{"round": e["round"], **r} for e in h for r in e["rejected"]]
            row["rescaled_updates"] = [{"round": e["round"], "partition": pid, **c}
                                       for e in h for pid, c in e.get("rescaled", {}).items()]
            row["clipped_weights"] = [{"round": e["round"], "partition": pid, **c}
                                      for e in h for pid, c in e.get("clipped", {}).items()]
            row["skipped_per_round"] = [len(e["skipped"]) for e in h]
            row["members_reporting_per_round"] = [len(e["members"]) for e in h]
            row.update({k: v for k, v in runs[name].items() if k != "extra"})
            row["hub_s_to_last_round"] = h[-1]["wall_s"]  # the hub's clock (resumed: since resuming)
            row["run_config"] = runs[name]["extra"]
        report[name] = row
    report["clean"]["test_vs_start"] = paired(evals, "clean", start)
    report["clean"]["central_vs_start"] = central_paired(clean_c, init_c)
    result["report"] = report
    result["evaluation"] = evals  # per member, per policy: mean, CI and the per-seed values
    if "fp32" in runs:
        b = bytes_sent({"int8": hist["clean"], "fp32": hist["fp32"]})
        result["bytes"] = {
            "int8_run": bytes_table(hist["clean"], cfg.clusters),
            "fp32_run": bytes_table(hist["fp32"], cfg.clusters),
            "bytes_sent": b,
            "int8_over_fp32": b["int8"]["int8"] / max(b["fp32"]["int8"], 1),  # each run's real bytes-up
            "down_int8_over_fp32": b["int8"]["down"] / max(b["fp32"]["down"], 1),  # each run's bytes received
            "int8_cost": {"central_int8_minus_fp32": central_paired(clean_c, central(hist["fp32"])),
                          "test_int8_minus_fp32": paired(evals, "clean", "fp32"),
                          "decisions_differ": float((picks["clean"] != picks["fp32"]).mean()),
                          "param_distance_between": distance(finals["clean"], finals["fp32"])},
        }
        if "fp32-down" in runs:
            result["bytes"]["download_cost"] = {
                "test_int8_delta_minus_fp32_down": paired(evals, "clean", "fp32-down"),
                "central_int8_delta_minus_fp32_down": central_paired(clean_c, central(hist["fp32-down"])),
                "decisions_differ": float((picks["clean"] != picks["fp32-down"]).mean()),
                "param_distance_between": distance(finals["clean"], finals["fp32-down"])}
    if "poison-huge" in runs and "huge-reject" in runs:  # the scaled update rescaled (run config) or dropped
        result["rescale_vs_reject"] = {
            "test_rescale_minus_reject": paired(evals, "poison-huge", "huge-reject"),
            "decisions_differ": float((picks["poison-huge"] != picks["huge-reject"]).mean())}
    prox = {"fedprox": cfg.proximal_mu, f"fedprox-mu{STRONG_MU:g}": STRONG_MU}
    result["fedprox_vs_fedavg"] = {name: {
        "proximal_mu": mu, "test_fedprox_minus_fedavg": paired(evals, name, "clean"),
        "central_fedprox_minus_fedavg": central_paired(central(hist[name]), clean_c),
        "decisions_differ": float((picks[name] != picks["clean"]).mean()),
        "param_distance_between": distance(finals[name], finals["clean"]),
    } for name, mu in prox.items() if name in runs}
    defaults = app_defaults()
    byzantine, min_nodes = float(defaults["byzantine-fraction"]), int(defaults["min-nodes"])
    own = {n: strategy_arguments(n, defaults) for n in ("fedtrimmedavg", "krum")}
    result["strategy_parameters"] = (
        f"From the run config (byzantine-fraction {byzantine:g}, min-nodes {min_nodes}): FedTrimmedAvg "
        f"runs with beta = {own['fedtrimmedavg']['beta']:g} (int(beta n) updates trimmed per tail and "
        f"coordinate), Krum with num_malicious_nodes = {own['krum']['num_malicious_nodes']} (scores over "
        f"the n - f - 2 nearest updates).")


def _pm(d: dict[str, float] | None, fmt: str = "+.3f") -> str:
    if not d:
        return "-"
    return f"{d['mean']:{fmt}} ± {d['ci95']:.3f}"


def _cost_line(title: str, cost: dict[str, Any], central_key: str, test_key: str, distance_label: str) -> str:
    """One codec comparison: central and test differences, probe decisions, weight distance."""
    test = cost[test_key]
    return (f"{title} {_pm(cost[central_key], '+.4f')}, test {_pm(test, '+.4f')} ({test['verdict']}); "
            f"{cost['decisions_differ']:.1%} of probe decisions differ; {distance_label} "
            f"{cost['param_distance_between']:.2e}")


def format_table(result: dict[str, Any]) -> str:
    rep = result["report"]
    lines = [f"\nprobe set: {result['probes']['n']} decisions "
             f"({result['probes']['mean_candidates']:.1f} candidates on average); trouble scores: lower is "
             f"better, mean ± 95% CI; 'vs clean': paired differences (test: members x seeds; central: "
             f"held-out clusters); within 5%: CI inside ±{BAND:.3f}"]
    head = ["run", "rej/round", "chg vs init", "chg vs clean", "|dW|", "|W-clean|", "central",
            "central - clean", "test", "test - clean", "within 5%", "hot/clean", "wall s"]
    rows = []
    for name, r in rep.items():
        tv = r.get("test_vs_clean")
        rows.append([name, ",".join(map(str, r.get("rejected_per_round", []))) or "-",
                     f"{r['decisions_changed_vs_init']:.1%}", f"{r['decisions_changed_vs_clean']:.1%}",
                     f"{r['param_distance_from_init']:.2f}",
                     f"{r.get('param_distance_from_clean', math.nan):.2f}",
                     _pm(r["central_final"]),
                     _pm(r.get("central_vs_clean")),
                     _pm(r["test_trouble"]), _pm(tv),
                     ("yes" if tv["within_5pct"] else "no") + f" ({tv['verdict']})" if tv else "-",
                     f"{r['hot_node_s_ratio_vs_clean']:.3f}" if "hot_node_s_ratio_vs_clean" in r else "-",
                     str(r.get("wall_s", "-"))])
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                               enumerate(zip(row, widths, strict=True))))
    lines.append("\neach update's cosine to the median of the round's other updates, by partition, "
                 f"lowest over the rounds (partition {POISONED} is the poisoned one in the poison and flip "
                 "runs):")
    for name, r in rep.items():
        lowest: dict[str, float] = {}
        for per in r.get("cosines_per_round", []):
            for pid, c in per.items():
                lowest[pid] = min(lowest.get(pid, c), c)
        if lowest:
            lines.append(f"  {name}: " + ", ".join(f"{pid}: {c:+.2f}" for pid, c in sorted(lowest.items())))
    c = rep["clean"]
    if "rescale_vs_reject" in result:
        rr = result["rescale_vs_reject"]
        test = rr["test_rescale_minus_reject"]
        lines.append(f"\nthe scaled update rescaled (poison-huge) against dropped (huge-reject): test "
                     f"{_pm(test)} ({test['verdict']}); "
                     f"{rr['decisions_differ']:.1%} of probe decisions differ")
    lines.append(f"\nclean vs {result['config'].get('init', 'random')} start: test "
                 f"{_pm(c['test_vs_start'])} "
                 f"({c['test_vs_start']['verdict']}), central {_pm(c['central_vs_start'])}; "
                 f"{c['decisions_changed_vs_init']:.1%} of probe decisions changed, |dW| "
                 f"{c['param_distance_from_init']:.2f}")
    for name, r in rep.items():
        if r.get("rejections"):
            reasons = sorted({x["reason"].split(":")[0] if "NaN" in x["reason"] else x["reason"][:40]
                              for x in r["rejections"]})
            lines.append(f"  {name}: rejected {len(r['rejections'])} updates ({'; '.join(reasons)})")
        if r.get("rescaled_updates"):
            lines.append(f"  {name}: rescaled {len(r['rescaled_updates'])} updates (" + "; ".join(
                f"round {c['round']} partition {c['partition']}: norm {c['norm']:.3g} counted as "
                f"{c['counted']:.3g}" for c in r["rescaled_updates"]) + ")")
        if r.get("clipped_weights"):
            lines.append(f"  {name}: clipped the weight of {len(r['clipped_weights'])} updates (" + "; ".join(
                f"round {c['round']} partition {c['partition']}: claimed {c['claimed']:,.0f}, counted "
                f"{c['counted']:,.0f}" for c in r["clipped_weights"]) + ")")
    if "hub-kill" in rep:
        k = rep["hub-kill"]
        lines.append(f"\nhub kill: {k['first_run'][:60]}; rounds before restart "
                     f"{k['rounds_before_restart']}, "
                     f"resumed from {k['resumed_from']}, rounds {k['rounds']}, no round lost or repeated: "
                     f"{k['no_round_lost_or_repeated']}; left running after the kill: "
                     f"{len(k['processes_left_after_kill'])}")
    if "bytes" in result:
        b = result["bytes"]
        lines.append(f"\nbytes sent (members' own reports, summed over members and rounds): INT8 run "
                     f"{b['bytes_sent']['int8']['int8']:,} vs fp32 run {b['bytes_sent']['fp32']['int8']:,} "
                     f"({b['int8_over_fp32']:.3f}x); payload incl. replies without an upload: INT8 "
                     f"{b['int8_run']['sent_payload_incl_skips']:,}, "
                     f"fp32 {b['fp32_run']['sent_payload_incl_skips']:,}")
        lines.append(f"bytes received: INT8 run {b['bytes_sent']['int8']['down']:,} vs fp32 run "
                     f"{b['bytes_sent']['fp32']['down']:,} ({b['down_int8_over_fp32']:.3f}x)")
        for rnd in b["int8_run"]["per_round"]:
            cells = ", ".join(f"{pid}: {m['bytes_up']:,}{'' if m['uploaded'] else ' (no upload)'}"
                              for pid, m in rnd["members"].items())
            lines.append(f"  INT8 round {rnd['round']}: {cells}")
        lines.append(_cost_line("INT8 cost: central int8 - fp32", b["int8_cost"], "central_int8_minus_fp32",
                                "test_int8_minus_fp32", "|W_int8 - W_fp32|"))
        if "download_cost" in b:
            lines.append(_cost_line("compressed download alone (clean vs fp32-down): central",
                                    b["download_cost"], "central_int8_delta_minus_fp32_down",
                                    "test_int8_delta_minus_fp32_down", "|W_clean - W_fp32-down|"))
    for name, f in result.get("fedprox_vs_fedavg", {}).items():
        t = f["test_fedprox_minus_fedavg"]
        lines.append(f"\nFedProx (mu {f['proximal_mu']:g}) - FedAvg, test trouble: pooled {_pm(t, '+.4f')} "
                     f"({t['verdict']}); central {_pm(f['central_fedprox_minus_fedavg'], '+.4f')}; "
                     f"{f['decisions_differ']:.1%} of probe decisions differ, |W_prox - W_avg| "
                     f"{f['param_distance_between']:.4f}")
        for mn, d in t["members"].items():
            lines.append(f"  {mn}: {_pm(d, '+.4f')}  "
                         f"(FedAvg {_pm(rep['clean']['test_trouble_members'][mn])}, "
                         f"FedProx {_pm(rep[name]['test_trouble_members'][mn])})")
    lines.append(f"\n{result['strategy_parameters']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
