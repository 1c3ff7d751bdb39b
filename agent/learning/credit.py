"""Credit regression: learn each candidate node's cost from the node credit of logged
decisions, and schedule greedily on it (a one-step, fitted-Q improvement of the policy that
logged them).

The node credit (``RewardConfig.node_horizon_s``, ``agent/learning/env.py``) charges a replay
decision its chosen node's hot CPU minutes, throttled CPU core-minutes and the OOM kills of the
pod it placed (with ``RewardConfig.oom_credit = "node"`` every kill on the node) over the horizon
after the bind; with ``RewardConfig.throttle_credit = "pod"`` the
throttling charged is instead the placed pod's own throttled CPU core-minutes over that run of it
within the horizon (its share of its node's demand above capacity: what it caused and suffered,
not what other pods on the node did later), priced by the same ``node_throttled`` weight.
Logged under a behaviour policy that explores (at each decision one of several heuristics, or a
random feasible node), the pairs (features of the candidates, chosen node, its credit) estimate
``Q(state, node)``: the expected cost of putting this pod on this node when the rest of the
schedule follows the behaviour policy. The node-scoring network is fitted so that its logit of
the chosen node regresses onto

    target = -log(1 - credit) + tie_weight * kube_default_score / 100

(mean squared error on the chosen node only; the logits of the other candidates are left to
generalisation; the log compresses the heavy tail of the credit, whose order it keeps).

What a unit of trouble costs (:func:`trouble_weights`). The benchmark judges a scheduler by
the trouble score, the mean log ratio of its hot CPU node-time, throttled CPU, OOM kills and
failed pods to kube-default's. To first order a decision moves it by ``dx / (x_kd + s)`` per
metric, so a hot node-minute, a throttled core-minute and an OOM kill are priced per cluster
from a kube-default run of that cluster: on small edge nodes, where throttling is rare, a
throttled core-minute costs about forty hot node-minutes; on GPU nodes whose CPU-side work
throttles all the time, about a sixteenth of one. The credit is then the decision's share of its
cluster's trouble score (times the decisions of the run), and the regression learns the
score the policy is judged on rather than a fixed mix of its terms. Acting
greedily on the logits then picks the node with the least predicted cost, and between nodes
whose predicted costs differ by less than about ``tie_weight`` it spreads as kube-default does
(a pessimism margin against the noise of the predictions), so a calm cluster is scheduled
like kube-default and the learned part acts where it predicts trouble. The network, its
inputs and its serving path are those of every node-scoring policy (``NodeScoringPolicy``,
``PolicyScheduler``): nothing new to serve.

The same regression runs on a deployed member's decision log, whose records carry the outcome
of every bound decision (``agent/serving/outcomes.py``): :func:`credited_from_log` turns a
record's outcome into the same credit (its node's hot minutes and the pod's OOM kills over the
horizon; throttling and hot memory minutes are not measured there and count 0) and its tie from
the chosen node's features (:func:`tie_from_features`, kube-default's formula on the feature
columns). A
federated member's simulated experience is kept in the same log format with the credit and the
tie recorded exactly (reward columns ``credit`` and ``tie``). :func:`fit_credit` takes FedProx's
proximal term (``proximal_mu`` with an ``anchor``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedsched.agent.learning.env import RewardConfig, SchedulingEnv
from fedsched.common.learning.features import NODE_FEATURES, POD_FEATURES
from fedsched.common.learning.records import Decision
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.schedulers import Scheduler
from fedsched.common.schedulers.base import Placement
from fedsched.common.schedulers.kube_default import KubeDefault

BEHAVIOURS = ("kube-default", "koordinator-load-aware", "load-variation-risk-balancing",
              "target-load-packing", "best-fit", "oracle")


@dataclass
class CreditConfig:
    """Credit regression settings."""

    samples: int = 40_000
    """credited decisions to collect (over all environments)"""
    explore: float = 0.25
    """share of decisions taken at a random feasible node (the rest: a random behaviour heuristic)"""
    tie_weight: float = 0.3
    """weight of kube-default's score (0..100, scaled to 0..1) in the regression target: the
    policy departs from kube-default's choice only for a predicted cost gap above this (a
    pessimism margin against the noise of the predictions)"""
    epochs: int = 10
    """passes over the collected decisions"""
    batch_size: int = 256
    """decisions per minibatch"""
    learning_rate: float = 1e-3
    """Adam step size"""
    seed: int = 1
    """seeds the behaviour choices, the data order and the initialisation"""
    warmup: int = 0
    """decisions at the start of every episode taken under the behaviour policy but not
    collected (a replay starts from an empty cluster: its first decisions meet no trouble)"""
    size_buckets: bool = True
    """minibatches of decisions with similar candidate counts (:func:`size_bucketed_batches`);
    False: plain random minibatches (the first online policy's fit)"""
    target: str = "log"
    """the regression's cost (:func:`targets`): ``log``, ``log1p`` of the credit (its heavy
    tail compressed: the fit learns the expected log cost, which underrates rare large costs);
    ``mean``: the credit itself (the fit learns the expected cost, the quantity the benchmark's
    totals add up)"""


@dataclass
class Credited:
    """One credited decision: what the policy saw, the node taken and its regression target."""

    decision: Decision
    chosen: int  # index into decision.nodes
    credit: float  # the node credit (<= 0)
    tie: float  # kube-default's score of the chosen node, 0..1


def collect_credited(envs: Sequence[SchedulingEnv], behaviours: Sequence[Scheduler], cfg: CreditConfig,
                     progress: Callable[[int], None] | None = None) -> list[Credited]:
    """Step ``envs`` (round robin, node credit on) under the exploring behaviour policy and pair
    every decision with its credit once it matures (all of an episode's at its end)."""
    if not all(env._node_credit for env in envs):
        raise ValueError("credit regression needs replay environments with RewardConfig.node_horizon_s > 0")
    rng = np.random.default_rng(cfg.seed)
    kube = KubeDefault()
    pending: list[dict[int, tuple[Decision, int, float]]] = [{} for _ in envs]
    steps = [0] * len(envs)
    out: list[Credited] = []
    for env in envs:
        env.reset()
    while len(out) < cfg.samples:
        for i, env in enumerate(envs):
            pod, state, cand = env.pending  # features only where read: warm-up's are never kept
            if rng.random() < cfg.explore:
                pick = int(rng.integers(len(cand)))
                sched: Scheduler = kube
            else:
                sched = behaviours[int(rng.integers(len(behaviours)))]
                attach = getattr(sched, "attach_simulator", None)
                if attach is not None:
                    attach(env.sim)
                if isinstance(sched, PolicyScheduler) and sched.features.typical is env.typical:
                    # a policy behaviour sees what the env builds: no second feature build
                    feats = env.decision[3]
                    scores = sched.logits(feats.nodes, feats.pod, feats.context).astype(np.float64)
                else:
                    scores = np.asarray(sched.score(state, pod, cand), dtype=np.float64)
                best = np.flatnonzero(scores == scores.max())
                pick = int(best[rng.integers(len(best))])
            tie = float(np.asarray(kube.score(state, pod, cand[pick:pick + 1]))[0]) / 100.0
            node = int(cand[pick])
            kept = steps[i] >= cfg.warmup
            if kept:
                feats = env.decision[3]
                d = Decision(feats.nodes.astype(np.float16), feats.pod, feats.context, np.array([pick]),
                             has_gpus=state.nodes.total_gpu_milli > 0)
            _, _, term, trunc, info = env.step_placement(Placement(node, sched.select_gpus(state, pod, node)),
                                                         observe=False)
            if kept:
                pending[i][int(info["decision"])] = (d, pick, tie)
            steps[i] += 1
            before = len(out)
            for serial, c in info["credits"]:
                rec = pending[i].pop(int(serial), None)
                if rec is not None:
                    out.append(Credited(rec[0], rec[1], float(c), rec[2]))
            if progress is not None and len(out) // 5000 > before // 5000:
                progress(len(out))
            if term or trunc:
                pending[i].clear()
                steps[i] = 0
                env.reset()
            if len(out) >= cfg.samples:
                break
    return out[:cfg.samples]


def trouble_weights(reference: Mapping[str, float], decisions: int, starts: float) -> dict[str, float]:
    """Node-credit weights (``RewardConfig.node_hot`` per hot node-minute, ``node_throttled``
    per throttled core-minute, the node's or the pod's (``throttle_credit``), ``node_oom`` per
    OOM kill) under which a decision's credit is its
    share of the trouble score, times the ``decisions`` of the run.

    The trouble score (``fedsched.common.model.metrics.trouble_score``) is the mean over its
    metrics of ``log((x + s) / (x_ref + s))``; to first order a decision that adds ``dx`` to a
    metric moves it by ``dx / (4 (x_ref + s))``. ``reference`` holds kube-default's figures on
    the same cluster, so the weights price a hot node-minute, a throttled core-minute and an OOM
    kill as the benchmark does on *this* cluster: where throttling is rare (small edge nodes) a
    throttled core-minute costs far more than a hot node-minute; where it is everywhere (GPU
    nodes' CPU-side work) far less. Fixed weights price them alike everywhere. Failed pods have
    no per-decision credit (their term is left to the tie with kube-default)."""
    from fedsched.common.model.metrics import TROUBLE_SMOOTHING as S

    n = len(S)
    scale = max(decisions, 1) / n
    per_kill = 1000.0 / max(starts, 1.0)  # one kill's share of OOM kills per 1,000 starts
    return {"node_hot": scale * 60.0 / (float(reference["hot_cpu_node_s"]) + S["hot_cpu_node_s"]),
            "node_throttled": scale * 60.0 / (float(reference["throttled_cpu_core_s"])
                                              + S["throttled_cpu_core_s"]),
            "node_oom": scale * per_kill / (float(reference["oom_kills_per_1k_starts"])
                                            + S["oom_kills_per_1k_starts"])}


CREDIT_TARGETS = ("log", "mean")


def targets(data: Sequence[Credited], tie_weight: float, target: str = "log") -> np.ndarray:
    """``-cost + tie_weight * tie`` with ``cost = log1p(-credit)`` (``target="log"``) or
    ``-credit`` (``"mean"``).

    The log compresses the credit's heavy tail (one node throttled for hours would otherwise
    dominate the squared error) and keeps each sample's order, but least squares then estimates
    ``E[log(1 + cost)]``, which by Jensen's inequality rates a node whose cost is rare and large
    below one whose cost is steady and of the same mean: greedy on it takes exactly the rare
    large risks (a pod throttled for hours) that the benchmark's totals count in full. ``mean``
    estimates ``E[cost]`` itself, at the price of a noisier fit."""
    if target not in CREDIT_TARGETS:
        raise ValueError(f"unknown credit target {target!r}: expected one of {', '.join(CREDIT_TARGETS)}")
    credit = np.minimum(np.array([c.credit for c in data], dtype=np.float64), 0.0)
    tie = np.array([c.tie for c in data], dtype=np.float64)
    value = -np.log1p(-credit) if target == "log" else credit  # minus the cost: higher is better
    return (value + tie_weight * tie).astype(np.float32)


_F = {n: i for i, n in enumerate(NODE_FEATURES)}
_POD_CPU, _POD_MEM = POD_FEATURES.index("cpu"), POD_FEATURES.index("mem")


def tie_from_features(nodes: np.ndarray, pod: np.ndarray | None = None) -> np.ndarray:
    """kube-default's score (``KubeDefault.score``, 50..200) / 100 of each candidate computed
    from its feature row (``[K, F]``): LeastAllocated on the free CPU and memory shares after
    the pod, plus BalancedAllocation's change in balance (skipped, as kube does, for a ``pod``
    that requests neither CPU nor memory).
    Float arithmetic on float16 features and requests without kube's 100 m / 200 MiB defaults,
    so it is kube's score to within a few points: the pessimism margin of the regression target
    where the exact score is not known (a decision log holds features, not states)."""
    x = np.asarray(nodes, dtype=np.float64)
    cpu_after, mem_after = x[:, _F["cpu_after"]], x[:, _F["mem_after"]]
    fit = 100.0 * (np.clip(cpu_after, 0.0, 1.0) + np.clip(mem_after, 0.0, 1.0)) / 2.0
    with_ = 100.0 * (1.0 - x[:, _F["imbalance_after"]])
    without = 100.0 * (1.0 - np.abs(x[:, _F["cpu_free"]] - x[:, _F["mem_free"]]) / 2.0)
    balanced = 50.0 + (50.0 + with_ - without) / 2.0
    if pod is not None and pod[_POD_CPU] == 0 and pod[_POD_MEM] == 0:
        balanced = np.zeros_like(balanced)
    return (fit + balanced) / 100.0


def log_credit(reward: dict[str, float], weights: RewardConfig) -> float | None:
    """A logged decision's credit (<= 0), on the scale of the replay node credit: ``credit``
    when the log recorded it (a simulated member's experience), else from the serving outcome
    (``hot_s``: seconds the chosen node ran hot after the bind, ``oom``: OOM kills on it since)
    with the node credit's weights. None when the outcome is unknown."""
    if "credit" in reward:
        return min(float(reward["credit"]), 0.0)
    if "hot_s" not in reward and "oom" not in reward:
        return None
    hot = float(reward.get("hot_s", 0.0))
    oom = float(reward.get("oom", 0.0))
    return -(weights.node_hot * max(hot, 0.0) / 60.0 + weights.node_oom * max(oom, 0.0))


def credited_from_log(records: Sequence, weights: RewardConfig | None = None) -> list[Credited]:
    """The credited decisions of decision-log records (``LoggedDecision``): their credit
    (:func:`log_credit`) and their tie (the record's ``tie`` if present, else
    :func:`tie_from_features` of the chosen node). Records without a known outcome are left out."""
    w = weights or RewardConfig()
    out: list[Credited] = []
    for r in records:
        credit = log_credit(r.reward, w)
        if credit is None:
            continue
        d = r.decision
        tie = (float(r.reward["tie"]) if "tie" in r.reward
               else float(tie_from_features(d.nodes[r.chosen:r.chosen + 1], d.pod)[0]))
        out.append(Credited(Decision(d.nodes, d.pod, d.context, np.array([r.chosen]), has_gpus=d.has_gpus),
                            int(r.chosen), credit, tie))
    return out


def size_bucketed_batches(sizes: np.ndarray, batch_size: int, rng: np.random.Generator,
                          pool: int = 32) -> list[np.ndarray]:
    """Minibatches of a random epoch whose decisions have similar candidate counts: the data
    is shuffled, cut into pools of ``pool`` batches, each pool sorted by size and cut into
    batches, and the batches shuffled. A batch pads to its largest decision, so mixing 10- and
    300-node clusters at random would spend most of the work on padding; the pools keep the
    batches' content random otherwise."""
    perm = rng.permutation(len(sizes))
    batches: list[np.ndarray] = []
    step = batch_size * pool
    for start in range(0, len(perm), step):
        chunk = perm[start:start + step]
        chunk = chunk[np.argsort(sizes[chunk], kind="stable")]
        batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]


def fit_credit(policy: torch.nn.Module, data: Sequence[Credited], cfg: CreditConfig,
               on_epoch: Callable[[dict[str, float]], None] | None = None,
               anchor: dict[str, torch.Tensor] | None = None, proximal_mu: float = 0.0) -> dict[str, float]:
    """Regress ``policy``'s logit of each chosen node onto its target; returns the last epoch's
    statistics (MSE, and the R^2 of the chosen logits against the targets). With
    ``proximal_mu > 0`` the loss adds FedProx's ``mu / 2 * ||w - anchor||^2``."""
    from fedsched.agent.learning.bc import _batch

    if not data:
        raise ValueError("credit regression needs at least one credited decision")
    decisions = [c.decision for c in data]
    chosen = np.array([c.chosen for c in data], dtype=np.int64)
    y = targets(data, cfg.tie_weight, cfg.target)
    var = float(np.var(y)) or 1.0
    rng = np.random.default_rng(cfg.seed)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate)
    stats: dict[str, float] = {}
    policy.train()
    sizes = np.array([len(d.nodes) for d in decisions], dtype=np.int64)
    for epoch in range(cfg.epochs):
        t0 = time.perf_counter()
        losses = []
        if cfg.size_buckets:
            batches = size_bucketed_batches(sizes, cfg.batch_size, rng)
        else:
            perm = rng.permutation(len(data))
            batches = [perm[i:i + cfg.batch_size] for i in range(0, len(perm), cfg.batch_size)]
        for idx in batches:
            nodes, pod, ctx, mask, _ = _batch(decisions, idx)
            logits, _ = policy(nodes, pod, ctx, mask)
            pred = logits.gather(1, torch.from_numpy(chosen[idx])[:, None])[:, 0]
            loss = torch.mean((pred - torch.from_numpy(y[idx])) ** 2)
            if proximal_mu > 0 and anchor is not None:
                loss = loss + proximal_mu / 2 * sum(((p - anchor[n]) ** 2).sum()
                                                    for n, p in policy.named_parameters() if n in anchor)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()
            losses.append(float(torch.mean((pred.detach() - torch.from_numpy(y[idx])) ** 2)))
        mse = float(np.mean(losses))
        stats = {"epoch": epoch + 1, "mse": mse, "r2": 1.0 - mse / var, "seconds": time.perf_counter() - t0}
        if on_epoch is not None:
            on_epoch(stats)
    policy.eval()
    return stats
