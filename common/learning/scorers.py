"""The scorer adapters: a policy network behind the one scorer interface.

:class:`PolicyScheduler` puts the node-scoring network behind it (greedy: the highest logit
wins), :class:`WeightScheduler` the weight policy (each node scores ``sum(w * term)``), so the
simulator, the evaluation and the extender call either exactly like a baseline (``fedsched
evaluate --policy DIR/checkpoint.pt``); :func:`scheduler_from_checkpoint` picks the adapter
for a checkpoint's policy kind, with the adapter options the checkpoint's metadata carries
under ``scoring`` (:func:`scoring_options`).

A node-scoring policy may keep kube-default beside it (``kube_weight``): its logits plus
``kube_weight`` times kube-default's score / 100 (50..200), the same term credit regression puts
in its target (``CreditConfig.tie_weight``) raised at scoring time. The policy then departs from
kube-default's spread only where its predicted cost gap is larger than that margin; every path
that scores with the policy (the simulator, the benchmarks, the extender, the decision service)
scores through :meth:`PolicyScheduler.score` and so sees the same sum.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsched.common.learning.checkpoint import load_checkpoint, typical_from_dict
from fedsched.common.learning.features import (
    FeatureBuilder,
    Features,
)
from fedsched.common.learning.kinds import NODE_SCORING, WEIGHTS, kind_of
from fedsched.common.learning.nets import NodeScoringPolicy, WeightPolicy, gpu_mask, weight_inputs
from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.schedulers.base import Scheduler, SchedulerContext
from fedsched.common.schedulers.kube_default import kube_default_scores

SCORING_KEY = "scoring"
"""The checkpoint metadata key of the adapter options a policy is scored with."""
SCORING_OPTIONS = {NODE_SCORING: ("kube_weight",), WEIGHTS: ()}
"""The options each policy kind's adapter takes from the metadata."""
MAX_KUBE_WEIGHT = 1e6
"""Above this kube-default decides alone anyway; a larger weight (1e308) would overflow the sum."""


def scheduler_from_checkpoint(path: str | Path, ctx: SchedulerContext | None = None) -> Scheduler:
    """The scorer-interface adapter for any checkpoint kind, with its metadata's scoring options."""
    policy, meta, _ = load_checkpoint(path)
    return scorer_for(policy, typical_from_dict(meta.get("typical_pods")), ctx, name=str(path),
                      **scoring_options(meta, kind_of(policy)))


def scoring_metadata(kube_weight: float) -> dict[str, float]:
    """What a checkpoint scored with ``kube_weight`` keeps under ``SCORING_KEY`` (``{}``: the
    logits alone); :func:`scoring_options` reads it back."""
    return {"kube_weight": float(kube_weight)} if kube_weight > 0 else {}


def scoring_options(meta: dict[str, Any], kind: str) -> dict[str, Any]:
    """The adapter options under the metadata's ``scoring`` key (``{}`` where there is none).
    An option the policy kind's adapter does not take, or a value that is not a number in
    ``[0, MAX_KUBE_WEIGHT]``, is a ``ValueError`` naming it: a checkpoint is never scored
    otherwise than it says."""
    raw = meta.get(SCORING_KEY) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"metadata {SCORING_KEY!r}: expected a mapping of options, got {type(raw).__name__}")
    allowed = SCORING_OPTIONS.get(kind, ())
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise ValueError(f"metadata {SCORING_KEY!r}: {', '.join(map(repr, unknown))} not an option of a "
                         f"{kind} policy (options: {', '.join(allowed) or 'none'})")
    out = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= MAX_KUBE_WEIGHT:
            raise ValueError(f"metadata {SCORING_KEY!r}: {k} must be a number in [0, {MAX_KUBE_WEIGHT:g}], "
                             f"got {v!r}")
        out[k] = float(v)
    return out


def scorer_for(policy: Any, typical: TypicalPods | None, ctx: SchedulerContext | None = None,
               name: str | None = None, **options: Any) -> Scheduler:
    """The scorer adapter of a policy network of any registered kind (``options``: the
    adapter's own, e.g. ``backend`` for the node-scoring policy)."""
    return SCORERS[kind_of(policy)](policy, typical, ctx, name=name, **options)


# ---- the scorer adapter --------------------------------------------------------------------

BACKENDS = ("numpy", "torch", "onnx")


class PolicyScheduler(Scheduler):
    """A node-scoring policy behind the scorer interface (greedy: the highest logit wins).

    ``backend`` computes the same logits one of three ways: ``numpy`` (``score_numpy``, the
    default: nothing to set up), ``torch`` (the forward pass) or ``onnx`` (onnxruntime on one
    thread, on an exported copy of the policy). ``auto`` times every available backend on a
    synthetic 500-node input and keeps the fastest; ``backend_timings`` holds the medians
    (seconds per call).
    """

    name = "policy"

    def __init__(self, policy: NodeScoringPolicy, typical: TypicalPods | None,
                 ctx: SchedulerContext | None = None, name: str | None = None,
                 backend: str = "numpy", kube_weight: float = 0.0) -> None:
        super().__init__(ctx)
        if not 0 <= kube_weight <= MAX_KUBE_WEIGHT:  # NaN fails too
            raise ValueError(f"kube_weight must be a number in [0, {MAX_KUBE_WEIGHT:g}], got {kube_weight!r}")
        self.kube_weight = float(kube_weight)
        """weight of kube-default's score / 100 added to the logits (module docstring)"""
        self.policy = policy.eval()
        self.features = FeatureBuilder(typical)
        if name:
            self.name = name
        self.backend_timings: dict[str, float] = {}
        self.last_features: Features | None = None
        self._onnx: Any = None  # an OnnxScorer once the onnx backend was set up
        if backend == "auto":
            self._use_fastest()
        else:
            self._use(backend)

    @classmethod
    def from_checkpoint(cls, path: str | Path, ctx: SchedulerContext | None = None,
                        backend: str = "numpy") -> PolicyScheduler:
        policy, meta, _ = load_checkpoint(path)
        return cls(policy, typical_from_dict(meta.get("typical_pods")), ctx, name=str(path), backend=backend,
                   **scoring_options(meta, NODE_SCORING))

    def _use(self, backend: str) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; expected auto or one of {', '.join(BACKENDS)}")
        if backend == "onnx" and self._onnx is None:
            import tempfile

            from fedsched.common.learning.onnx import OnnxScorer, export_onnx

            with tempfile.TemporaryDirectory() as d:  # onnxruntime keeps the model in memory
                self._onnx = OnnxScorer(export_onnx(self.policy, Path(d) / "policy.onnx"))
        self.backend = backend

    def _use_fastest(self, n_nodes: int = 500, warmup: int = 5, calls: int = 30) -> None:
        rng = np.random.default_rng(0)
        cfg = self.policy.cfg
        shapes = ((n_nodes, cfg.n_node), cfg.n_pod, cfg.n_ctx)
        x = tuple(rng.random(shape, dtype=np.float32) for shape in shapes)
        for backend in BACKENDS:
            try:
                self._use(backend)
            except ImportError:  # onnx / onnxruntime not installed
                continue
            times = []
            for i in range(warmup + calls):
                t0 = time.perf_counter()
                self.logits(*x)
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
            self.backend_timings[backend] = float(np.median(times))
        best = min(self.backend_timings, key=self.backend_timings.__getitem__)
        if best != "onnx":
            self._onnx = None
        self._use(best)

    def logits(self, nodes: np.ndarray, pod: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        """float32 logits of one pod over the given (feasible) nodes' features, on ``self.backend``."""
        if self.backend == "onnx":
            return self._onnx.logits(nodes, pod, ctx)
        if self.backend == "torch" and len(nodes):
            with torch.inference_mode():
                logits, _ = self.policy(torch.as_tensor(nodes, dtype=torch.float32)[None],
                                        torch.as_tensor(pod, dtype=torch.float32)[None],
                                        torch.as_tensor(ctx, dtype=torch.float32)[None],
                                        torch.ones(1, len(nodes), dtype=torch.bool))
            return logits[0].numpy()
        return self.policy.score_numpy(nodes, pod, ctx)

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        f = self.features.build(state, pod, nodes)
        self.last_features = f  # what the decision log records
        scores = self.logits(f.nodes, f.pod, f.context).astype(np.float64)
        if self.kube_weight > 0:
            scores += self.kube_weight / 100.0 * kube_default_scores(state, pod, np.asarray(nodes))
        return scores

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        return self.features.select_gpus(state, pod, node)

class WeightScheduler(Scheduler):
    """A weight policy behind the scorer interface: node score = x(node) . w(pod, cluster)."""

    name = "weights"

    def __init__(self, policy: WeightPolicy, typical: TypicalPods | None,
                 ctx: SchedulerContext | None = None, name: str | None = None) -> None:
        super().__init__(ctx)
        self.policy = policy.eval()
        self.features = FeatureBuilder(typical)
        self.last_weights: np.ndarray | None = None  # the weights of the last scored pod
        self.last_features: Features | None = None
        if name:
            self.name = name

    def weights(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(weights over WEIGHT_TERMS, per-node terms) for this decision."""
        f = self.features.build(state, pod, nodes)
        self.last_features = f  # what the decision log records
        x, summary = weight_inputs(f)
        return self.policy.weights_numpy(summary, gpu_mask(state.nodes.total_gpu_milli > 0)), x

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        w, x = self.weights(state, pod, nodes)
        self.last_weights = w
        return x.astype(np.float64) @ w

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        return self.features.select_gpus(state, pod, node)


# The adapter of each policy kind (fedsched.common.learning.kinds).
SCORERS: dict[str, type[Scheduler]] = {NODE_SCORING: PolicyScheduler, WEIGHTS: WeightScheduler}
