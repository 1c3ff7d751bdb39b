"""The interpretable agent: a policy that outputs resource weights for a weighted score.

Instead of scoring nodes directly, the actor maps a summary of the decision (the pod's
features, the cluster context and pooled statistics of the candidates) to a weight vector
on the simplex over ``WEIGHT_TERMS``: for each resource r in cpu, mem, io, net, gpu, a
"free" term (the node's free share of r after placing the pod, as kube's LeastAllocated)
and a "load" term (one minus it, as MostAllocated). Each candidate scores
``sum_k w_k * x_k(node)``, the weighted mean the default scheduler computes with fixed
weights; here the weights change per pod. The action is the weight vector, so the
network's size does not depend on the cluster's, and an operator can read what it did
("pack GPUs, spread memory").

GPU terms get weight 0 on clusters without GPUs (their logits are masked). The critic
(for TD3) scores a (summary, weights) pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .cluster import ClusterState, Pod
from .features import CONTEXT_FEATURES, NODE_FEATURES, POD_FEATURES, FeatureBuilder, Features
from .fragmentation import TypicalPods
from .schedulers.base import Scheduler, SchedulerContext

RESOURCES = ("cpu", "mem", "io", "net", "gpu")
FREE_COLUMNS = tuple(NODE_FEATURES.index(f"{r}_after") for r in RESOURCES)
WEIGHT_TERMS = tuple(f"{kind}_{r}" for kind in ("free", "load") for r in RESOURCES)
GPU_TERMS = np.array([t.endswith("_gpu") for t in WEIGHT_TERMS])
N_SUMMARY = len(POD_FEATURES) + len(CONTEXT_FEATURES) + 2 * len(RESOURCES)


def weight_inputs(f: Features) -> tuple[np.ndarray, np.ndarray]:
    """(x[K, len(WEIGHT_TERMS)] per-node terms, summary[N_SUMMARY]) of one decision."""
    free = np.clip(f.nodes[:, FREE_COLUMNS], 0.0, 1.0)
    x = np.concatenate([free, 1.0 - free], axis=1).astype(np.float32)
    if len(free):
        pooled = np.concatenate([free.mean(axis=0), free.std(axis=0)])
    else:
        pooled = np.zeros(2 * len(RESOURCES))
    summary = np.concatenate([f.pod, f.context, pooled]).astype(np.float32)
    return x, summary


def gpu_mask(has_gpus: bool) -> np.ndarray:
    """Which weight terms may be non-zero."""
    return np.ones(len(WEIGHT_TERMS), dtype=bool) if has_gpus else ~GPU_TERMS


@dataclass(frozen=True)
class WeightPolicyConfig:
    hidden: int = 64  # width of the hidden layers of the actor and each critic
    n_summary: int = N_SUMMARY  # input size (fixed by the feature schema)
    n_terms: int = len(WEIGHT_TERMS)


class WeightPolicy(nn.Module):
    """Actor (summary -> weight logits) and twin critics Q(summary, weights)."""

    KIND = "weights"

    def __init__(self, cfg: WeightPolicyConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or WeightPolicyConfig()
        h = cfg.hidden
        self.actor = nn.Sequential(nn.Linear(cfg.n_summary, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh(),
                                   nn.Linear(h, cfg.n_terms))
        n_in = cfg.n_summary + cfg.n_terms
        self.q1 = nn.Sequential(nn.Linear(n_in, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))
        self.q2 = nn.Sequential(nn.Linear(n_in, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))
        nn.init.zeros_(self.actor[-1].weight)  # start from uniform weights
        nn.init.zeros_(self.actor[-1].bias)

    @staticmethod
    def to_simplex(logits: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
        if allowed is not None:
            logits = torch.where(allowed, logits, torch.full_like(logits, -1e9))
        return torch.softmax(logits, dim=-1)

    def weights(self, summary: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
        return self.to_simplex(self.actor(summary), allowed)

    def q(self, summary: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sw = torch.cat([summary, w], dim=-1)
        return self.q1(sw)[..., 0], self.q2(sw)[..., 0]

    def weights_numpy(self, summary: np.ndarray, allowed: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            w = self.weights(torch.from_numpy(summary)[None], torch.from_numpy(allowed)[None])[0]
        return w.double().numpy()


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
