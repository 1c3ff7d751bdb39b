"""Gymnasium environment over the simulator: one step = one pod to place.

Observation (a padded ``Dict`` so clusters of any size fit one space):

- ``nodes``: ``[max_nodes, len(NODE_FEATURES)]`` float32, the shared feature builder's
  per-node features (rows past the cluster's size are zero),
- ``pod``: ``[len(POD_FEATURES)]``, ``context``: ``[len(CONTEXT_FEATURES)]``,
- ``mask``: ``[max_nodes]`` int8, 1 for the nodes where the pod fits now.

Real use in the observation (the ``cpu_used`` / ``mem_used`` features) is the one definition
of :class:`~fedsched.common.model.cluster.ClusterState`: requests in packing mode (as serving
without telemetry), the usage model's measured use in replay mode (as serving with telemetry;
``tests/agent/serving/test_no_train_serve_skew.py`` checks the extender against this env).

The action is a node index; :meth:`SchedulingEnv.action_masks` gives the mask as booleans
(sb3-contrib's MaskablePPO reads it). An action on a masked node costs the
``invalid_action`` penalty and the pod is placed by kube-default's scores instead, as the
extender falls back to default scoring (``info["invalid_action"]`` is set). Pods that fit
nowhere never reach the agent: they fail (packing) or back off
(replay) between steps, and the failed-placement term of the reward charges them to the
decision that preceded them. The GPU on the chosen node is picked by the feature builder's
rule (FGD's fragmentation-minimising GPU for sharing pods).

Rewards are weighted terms (:class:`RewardConfig`, defaults per mode), each documented with
its unit. Packing: allocation gained (percent of capacity), fragmentation removed (percent
of GPU capacity; a potential-based shaping term, so with ``gamma = 1`` it does not change
the optimal policy) and failed placements (percent of capacity arrived but not placed).
Replay: pending time of the bound pod, load variance, OOM and overload events, failed
placements, fragmentation ratio and SLA violations (pods waiting longer than
``sla_pending_s``).

**Node credit** (replay, ``RewardConfig.node_horizon_s > 0``): the cluster-wide OOM,
overload and load-variance terms charge a decision for whatever happened anywhere since the
previous one, which says little about the decision itself. With node credit, each decision
is instead charged its *own chosen node's* outcome over the horizon after its bind: the
node's hot CPU minutes and throttled CPU core-minutes (the online metrics' per-node counters,
``LoadMetrics.node_hot_s`` / ``node_throttled``), OOM kills and, where
``RewardConfig.node_hot_mem`` prices them, the node's hot memory minutes (``node_hot_mem_s``). Whose
OOM kills is ``RewardConfig.oom_credit``: ``"pod"`` (the default) the placed pod's own; ``"node"``
every kill on the chosen node (``NodeStats.oom_count``), which is what a deployed member measures
(``agent/serving/outcomes.py``) and charges the decision whose pod pushed memory over even when
the kernel's choice (the lowest-priority, most recently started pod) kills another. What
throttling is charged is ``RewardConfig.throttle_credit``: ``"node"`` (the default) the chosen
node's, whoever's demand caused it (over hours mostly other decisions' doing); ``"pod"`` the
placed pod's own throttled CPU core-minutes (``ReplaySimulator.pod_throttled_core_s``: its share
of its node's demand above capacity) from the bind until the horizon has passed or that run of
the pod ends (completion, eviction, OOM kill; a later run after a new bind is that bind's),
whichever comes first; the hot minutes and OOM kills are charged as with ``"node"``, and both
throttling charges are priced by ``node_throttled``. A best-effort pod under the idle-capacity
cap is never throttled in this sense (the usage model's docstring), so ``"pod"`` charges its
placement for hot minutes and OOM kills only. The credit is known only once the horizon has
passed, so a step's ``info`` carries its decision's serial (``info["decision"]``) and the
credits that matured at that step (``info["credits"]``, ``(serial, reward)`` pairs; every open
decision matures at the episode's end); :meth:`SchedulingEnv.open_credits` gives what still-open
decisions have earned so far. PPO adds each credit to the reward of the step that took the
decision. The step's own reward keeps the queue terms (pending time, SLA, failed placements) and
fragmentation.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from fedsched.common.learning.features import (
    CONTEXT_FEATURES,
    NODE_FEATURES,
    POD_FEATURES,
    FeatureBuilder,
    Features,
)
from fedsched.common.model.cluster import ClusterState, NodeTable, Pod, PodTable
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.schedulers.base import Placement
from fedsched.common.schedulers.kube_default import KubeDefault
from fedsched.common.sim.packing import PackingSimulator

OBS_BOUND = 100.0  # features are clipped to [-OBS_BOUND, OBS_BOUND]
THROTTLE_CREDITS = ("node", "pod")  # RewardConfig.throttle_credit
OOM_CREDITS = ("pod", "node")  # RewardConfig.oom_credit


@dataclass
class RewardConfig:
    """Weights of the reward terms (0 disables a term)."""

    alloc_gain: float = 1.0
    """packing: + allocated share gained, in % of capacity"""
    frag_removed: float = 0.5
    """packing: + cluster GPU fragmentation removed, % of GPU capacity"""
    failed: float = 1.0
    """both: - requests of pods that failed, % of capacity (replay: per pod)"""
    pending_time: float = 0.05
    """replay: - minutes the bound pod waited"""
    load_variance: float = 0.01
    """replay: - variance of node CPU utilisation (%^2 / 100)"""
    oom: float = 1.0
    """replay: - OOM kills since the last decision"""
    overload: float = 0.5
    """replay: - nodes entering overload since the last decision"""
    fragmentation: float = 0.02
    """replay: - fragmentation ratio (%) at the decision"""
    sla: float = 0.5
    """replay: - pods bound after waiting more than sla_pending_s"""
    sla_pending_s: float = 30.0
    """replay: the pending-time objective"""
    node_horizon_s: float = 0.0
    """replay: > 0 charges each decision its chosen node's outcome over this many simulated
    seconds after the bind (``node_*`` terms, reported as ``info["credits"]`` for the trainer to
    add to that decision; the oom, overload and load_variance terms are then off); 0: the
    cluster-wide events since the last decision"""
    node_hot: float = 0.1
    """replay node credit: - minutes the chosen node's windowed CPU use spends above the threshold"""
    node_throttled: float = 0.1
    """replay node credit: - CPU core-minutes throttled on the chosen node"""
    node_oom: float = 2.0
    """replay node credit: - OOM kills of the placed pod (or on the chosen node: ``oom_credit``)"""
    node_hot_mem: float = 0.0
    """replay node credit: - minutes the chosen node's windowed memory use spends above the
    threshold (0: not charged; a dense sign of the memory pressure behind rare OOM kills)"""
    throttle_credit: str = "node"
    """replay node credit: whose throttled CPU ``node_throttled`` charges: ``"node"`` the chosen
    node's over the horizon, ``"pod"`` the placed pod's own from its bind until the horizon has
    passed or that run of it ends (module docstring)"""
    oom_credit: str = "pod"
    """replay node credit: whose OOM kills ``node_oom`` charges: ``"pod"`` the placed pod's own,
    ``"node"`` every kill on the chosen node over the horizon (module docstring)"""

    invalid_action: float = 1.0
    """both: - per action on a masked node (then kube-default decides)"""


@dataclass
class EnvConfig:
    """The environment's simulator, observation size and reward weights."""

    mode: Literal["packing", "replay"] = "packing"
    """simulator: packing (pods arrive until the target load) or replay (the trace's timeline)"""
    target_load: float = 1.3
    """packing: arrived requests as a multiple of capacity"""
    max_nodes: int | None = None
    """observation padding, in nodes (default: the cluster's node count); one size for all
    environments that are stepped together"""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """weights of the reward terms"""
    replay: dict[str, Any] = field(default_factory=dict)
    """replay: ReplayConfig fields that differ from its defaults"""


class SchedulingEnv(gym.Env):
    """Place each arriving pod on a node; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, nodes: NodeTable, pods: PodTable, *, typical: TypicalPods | None = None,
                 config: EnvConfig | None = None, seed: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg = config or EnvConfig()
        if cfg.mode not in ("packing", "replay"):
            raise ValueError(f"unknown mode {cfg.mode!r}: expected packing or replay")
        self.cluster_nodes, self.pool = nodes, pods
        self.typical = typical if typical is not None else TypicalPods.from_pods(pods)
        self.features = FeatureBuilder(self.typical)
        self.max_nodes = cfg.max_nodes or len(nodes)
        if self.max_nodes < len(nodes):
            raise ValueError(f"max_nodes {self.max_nodes} < cluster size {len(nodes)}")
        n_f, n_p, n_c = len(NODE_FEATURES), len(POD_FEATURES), len(CONTEXT_FEATURES)
        self.observation_space = spaces.Dict({
            "nodes": spaces.Box(-OBS_BOUND, OBS_BOUND, (self.max_nodes, n_f), np.float32),
            "pod": spaces.Box(-OBS_BOUND, OBS_BOUND, (n_p,), np.float32),
            "context": spaces.Box(-OBS_BOUND, OBS_BOUND, (n_c,), np.float32),
            "mask": spaces.MultiBinary(self.max_nodes),
        })
        self.action_space = spaces.Discrete(self.max_nodes)
        self._seed = seed
        self._episode = 0
        self.sim: Any = None
        self._mask = np.zeros(self.max_nodes, dtype=bool)
        self._pod: Pod | None = None  # the pending decision's pod (None: none pending)
        self._feats: Features | None = None  # its candidates' features, built when first asked for
        self._nodes = np.zeros(0, dtype=np.int64)
        self._fallback = KubeDefault()
        self._serial = 0
        self._open = []
        self._node_credit = cfg.mode == "replay" and cfg.reward.node_horizon_s > 0
        self._oom_node = cfg.reward.oom_credit == "node"
        if cfg.reward.throttle_credit not in THROTTLE_CREDITS:
            raise ValueError(f"unknown throttle_credit {cfg.reward.throttle_credit!r}: expected node or pod")
        if cfg.reward.oom_credit not in OOM_CREDITS:
            raise ValueError(f"unknown oom_credit {cfg.reward.oom_credit!r}: expected pod or node")

    # ---- gym API ---------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._seed, self._episode = seed, 0
        run_seed = int(self.np_random.integers(2**31)) if self._seed is None else self._seed + self._episode
        self._episode += 1
        if self.cfg.mode == "packing":
            self.sim = PackingSimulator(self.cluster_nodes, self.pool, target_load=self.cfg.target_load,
                                        seed=run_seed, typical=self.typical)
        else:
            from fedsched.common.sim.replay import ReplayConfig, ReplaySimulator

            self.sim = ReplaySimulator(self.cluster_nodes, self.pool, config=ReplayConfig(**self.cfg.replay),
                                       seed=run_seed, typical=self.typical)
        self._stats = self._snapshot()
        self._open: list[list] = []
        self._serial = 0  # decisions of this episode (every open one matures at its end)
        self.episode_return = 0.0
        reward_before = self._advance()
        self.episode_return += reward_before
        return self._obs(), {"skipped_reward": reward_before}

    def step(self, action: int):
        if self.sim is None or self._pod is None:
            raise RuntimeError("step() before reset() or after the episode ended")
        self._features()  # select_gpus reuses the build's GPU picks
        action = int(action)
        invalid = not (0 <= action < self.max_nodes) or not self._mask[action]
        if invalid:
            scores = self._fallback.score(self.sim.state, self._pod, self._nodes)
            action = int(self._nodes[int(np.argmax(scores))])
        gpus = self.features.select_gpus(self.sim.state, self._pod, action)
        return self._bind(Placement(action, gpus), invalid)

    def step_placement(self, placement: Placement, observe: bool = True):
        """Step with a complete placement (node and GPUs), e.g. a teacher scheduler's. With
        ``observe`` False the observation returned is None and the next pod's features are not
        built unless asked for (:attr:`decision`): a collector that reads only some decisions'
        features (:func:`fedsched.agent.learning.credit.collect_credited`) skips the rest."""
        if self.sim is None or self._pod is None:
            raise RuntimeError("step_placement() before reset() or after the episode ended")
        if not (0 <= placement.node < self.max_nodes) or not self._mask[placement.node]:
            raise ValueError(f"node {placement.node} is not feasible for this pod")
        return self._bind(placement, False, observe)

    def _bind(self, placement: Placement, invalid: bool, observe: bool = True):
        before = self._snapshot()
        pod = self._pod
        self.sim.bind(placement)
        reward = self._reward(before, self._snapshot(), bound=True)
        if invalid:
            reward -= self.cfg.reward.invalid_action
        self._serial += 1
        if self._node_credit:
            self._open_decision(self._serial, placement.node, pod.index)
        reward += self._advance()
        self.episode_return += reward
        terminated = self._pod is None
        info: dict[str, Any] = {"invalid_action": invalid, "node": placement.node, "decision": self._serial}
        if self._node_credit:
            info["credits"] = self._mature(everything=terminated)
            self.episode_return += sum(c for _, c in info["credits"])
        if terminated:
            info["episode_metrics"] = self.final_metrics()
            info["episode_return"] = self.episode_return
        return self._obs() if observe else None, float(reward), terminated, False, info

    # ---- node credit (RewardConfig.node_horizon_s) -----------------------------------------
    def _open_decision(self, serial: int, node: int, pod: int) -> None:
        """An open decision: ``[serial, node, pod, bind time, hot0, thr0, oom0, releases0, thr_end,
        hot_mem0]``;
        ``thr0`` the chosen node's throttled core-seconds then (``"node"``) or the pod's own
        (``"pod"``, with ``releases0`` its releases so far and ``thr_end`` its throttling when that
        run ended, None while it runs)."""
        sim = self.sim
        lm = sim.load_metrics
        if self.cfg.reward.throttle_credit == "pod":
            thr0, rel0 = float(sim.pod_throttled_core_s(pod)[0]), sim.releases_of(pod)
        else:
            thr0, rel0 = float(lm.node_throttled[node]), -1
        oom0 = int(sim.node_stats.oom_count[node]) if self._oom_node else sim.oom_kills_of(pod)
        self._open.append([serial, node, pod, sim.now, float(lm.node_hot_s[node]), thr0,
                           oom0, rel0, None, float(lm.node_hot_mem_s[node])])

    def _throttled(self, d: list) -> float:
        """Throttled core-seconds charged to open decision ``d`` so far."""
        if d[7] < 0:  # "node"
            return float(self.sim.load_metrics.node_throttled[d[1]]) - d[5]
        return (d[8] if d[8] is not None else float(self.sim.pod_throttled_core_s(d[2])[0])) - d[5]

    def _end_runs(self) -> None:
        """``"pod"``: freeze the throttling of the decisions whose run of the pod has ended. Called
        after the simulator advanced to a decision: a released pod runs again only after a new bind
        and its start-up, so its total now is the one at its release."""
        if self.cfg.reward.throttle_credit != "pod":
            return
        sim = self.sim
        for d in self._open:
            if d[8] is None and sim.releases_of(d[2]) != d[7]:
                d[8] = float(sim.pod_throttled_core_s(d[2])[0])

    def _credit(self, d: list) -> float:
        _, node, pod, _, hot0, _, oom0, _, _, hot_mem0 = d
        w, lm = self.cfg.reward, self.sim.load_metrics
        kills = int(self.sim.node_stats.oom_count[node]) if self._oom_node else self.sim.oom_kills_of(pod)
        return -(w.node_hot * (float(lm.node_hot_s[node]) - hot0) / 60.0
                 + w.node_hot_mem * (float(lm.node_hot_mem_s[node]) - hot_mem0) / 60.0
                 + w.node_throttled * self._throttled(d) / 60.0
                 + w.node_oom * (kills - oom0))

    def _mature(self, everything: bool = False) -> list[tuple[int, float]]:
        """Credits of the open decisions whose horizon has passed (all of them at the end). The
        open decisions are in bind order and simulated time never goes back, so the matured ones
        are a prefix: a step looks at them and the first still open one, not at every open one."""
        horizon, now = self.cfg.reward.node_horizon_s, self.sim.now
        self._end_runs()
        open_ = self._open
        k = len(open_)
        if not everything:
            k = 0
            while k < len(open_) and now >= open_[k][3] + horizon:
                k += 1
        out = [(d[0], self._credit(d)) for d in open_[:k]]
        del open_[:k]
        return out

    def open_credits(self) -> list[tuple[int, float]]:
        """The credits the open decisions have earned so far (their horizon not yet over): what
        a trainer whose rollout ends now can give them. They stay open."""
        if not self._node_credit:
            return []
        self._end_runs()
        return [(d[0], self._credit(d)) for d in self._open]

    def clone(self, *, future: np.ndarray | None = None,
              features: FeatureBuilder | None = None) -> SchedulingEnv:
        """An independent copy of the episode as it stands, pending decision included (packing
        mode): stepping the copy (a look-ahead rollout) leaves this environment untouched.

        ``future`` (pool indices) replaces the arrivals after the pending pod
        (:meth:`PackingSimulator.clone`); ``features``: the copy's feature builder (default:
        this one's; a separate builder keeps each one's fragmentation cache warm).
        """
        if self.cfg.mode != "packing":
            raise NotImplementedError("clone() supports packing mode only")
        if self.sim is None:
            raise RuntimeError("clone() before reset()")
        c = copy.copy(self)
        c.sim = self.sim.clone(future)
        if features is not None:
            c.features = features
        c._mask = self._mask.copy()
        c._nodes = self._nodes.copy()
        c._open = [list(d) for d in self._open]
        c._stats = dict(self._stats)
        c._np_random = copy.deepcopy(self._np_random)
        return c

    def action_masks(self) -> np.ndarray:
        return self._mask.copy()

    @property
    def decision(self) -> tuple[Pod, ClusterState, np.ndarray, Features]:
        """The pending decision: (pod, cluster state, feasible node ids, their features)."""
        pod, state, nodes = self.pending
        return pod, state, nodes, self._features()

    @property
    def pending(self) -> tuple[Pod, ClusterState, np.ndarray]:
        """The pending decision without its features (none built for it): (pod, cluster state,
        feasible node ids)."""
        if self._pod is None:
            raise RuntimeError("no pending decision (call reset(), or the episode ended)")
        return self._pod, self.sim.state, self._nodes

    def _features(self) -> Features:
        """The pending decision's features, built once. Built when first asked for, not when
        the pod arrives: nothing changes the state in between (every bind goes through
        :meth:`_bind`, which moves on to the next pod), and a warm builder builds what a cold one
        does (``tests/common/learning/test_feature_cache.py``)."""
        if self._feats is None:
            assert self._pod is not None
            self._feats = self.features.build(self.sim.state, self._pod, self._nodes)
        return self._feats

    # ---- internals -------------------------------------------------------------------
    def _advance(self) -> float:
        """Move to the next pod that fits somewhere; failures on the way cost reward."""
        reward = 0.0
        sim = self.sim
        while True:
            before = self._snapshot()
            if self.cfg.mode == "packing":
                item = sim.next_pod()
                if item is None:
                    break
                pod, state = item
                mask = state.feasible(pod)
                if not mask.any():
                    sim.bind(Placement(-1))
                    reward += self._reward(before, self._snapshot(), bound=False)
                    continue
            else:
                item = sim.next_pod(skip_infeasible=True)
                reward += self._reward(before, self._snapshot(), bound=False)
                if item is None:
                    break
                pod, state = item
                mask = sim.feasible_mask
            self._pod = pod
            nodes = np.flatnonzero(mask)
            self._mask[:] = False
            self._mask[nodes] = True
            self._nodes = nodes
            self._feats = None
            return reward
        self._pod = self._feats = None
        self._mask[:] = False
        return reward

    def _snapshot(self) -> dict[str, float]:
        sim = self.sim
        if self.cfg.mode == "packing":
            return {"alloc": sim.allocated_pct, "arrived": sim.arrived_pct, "frag": sim.frag_pct}
        c = sim.counters
        return {"oom": float(c["oom_events"]), "overload": float(c["overload_events"]),
                "failed": float(sim.counts()["failed"]), "binds": float(c["binds"])}

    def _reward(self, a: dict[str, float], b: dict[str, float], bound: bool) -> float:
        w = self.cfg.reward
        if self.cfg.mode == "packing":
            gained = b["alloc"] - a["alloc"]
            failed = (b["arrived"] - a["arrived"]) - gained
            return w.alloc_gain * gained + w.frag_removed * (a["frag"] - b["frag"]) - w.failed * failed
        r = -w.failed * (b["failed"] - a["failed"])
        if not self._node_credit:
            r -= w.oom * (b["oom"] - a["oom"]) + w.overload * (b["overload"] - a["overload"])
        if bound:
            sim = self.sim
            waited = float(sim.latencies[-1]) if len(sim.latencies) else 0.0
            r -= w.pending_time * waited / 60.0 + (w.sla if waited > w.sla_pending_s else 0.0)
            state = sim.state
            if not self._node_credit:
                u = 100.0 * state.cpu_used[state.alive] / self.cluster_nodes.cpu[state.alive]
                r -= w.load_variance * float(u.var()) / 100.0
            if w.fragmentation:
                from fedsched.common.model.fragmentation import fragmentation_ratio

                alive = state.alive
                nt = self.cluster_nodes
                r -= w.fragmentation * 100.0 * fragmentation_ratio(
                    nt.cpu[alive] - state.cpu_req[alive], nt.cpu[alive],
                    nt.mem[alive] - state.mem_req[alive], nt.mem[alive])
        return r

    def _obs(self) -> dict[str, np.ndarray]:
        n_f = len(NODE_FEATURES)
        nodes = np.zeros((self.max_nodes, n_f), dtype=np.float32)
        if self._pod is None:
            return {"nodes": nodes, "pod": np.zeros(len(POD_FEATURES), np.float32),
                    "context": np.zeros(len(CONTEXT_FEATURES), np.float32),
                    "mask": self._mask.astype(np.int8)}
        feats = self._features()
        nodes[self._nodes] = np.clip(feats.nodes, -OBS_BOUND, OBS_BOUND)
        return {"nodes": nodes, "pod": np.clip(feats.pod, -OBS_BOUND, OBS_BOUND),
                "context": np.clip(feats.context, -OBS_BOUND, OBS_BOUND),
                "mask": self._mask.astype(np.int8)}

    def final_metrics(self) -> dict[str, float]:
        """The run's metrics (call once, at the end of the episode)."""
        if self.cfg.mode == "packing":
            return self.sim.result().metrics
        return self.sim.finish().metrics
