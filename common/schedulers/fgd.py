"""FGD: Fragmentation Gradient Descent (Weng et al., USENIX ATC'23).

Upstream: hkust-adsl/kubernetes-scheduler-simulator pkg/simulator/plugin/fgd_score.go and
pkg/utils/frag.go (fragmentation model in :mod:`fedsched.common.model.fragmentation`).
For each feasible node ``n`` and hypothetical state ``n'`` after placing the pod,
``score = int(sigmoid((F_n - F_n') / 1000) * 100)``: the node whose fragmentation drops
most (or grows least) wins. A sharing pod is tried on every GPU that fits; the node's
score is its best GPU's, and that GPU (lowest index among equal scores) is the one
reserved. Whole-GPU pods take the lowest-indexed free GPUs. The typical pods come from
``SchedulerContext.train_pods`` only.

Arguments: ``pod_popularity_threshold`` (default 95), upstream's
``TypicalPodsConfig.podPopularityThreshold`` as the published runs set it
(experiments/run_scripts/generate_run_scripts.py): the typical pods are the
most popular task classes until they cover this % of the training pods. The other fields of
that config are fixed here (CPU-only pods included, one class per step, no GPU-resource
weighting), and the sigmoid scale 1000 is a constant upstream too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.model.fragmentation import (
    FragmentationModel,
    NodeFragCache,
    TypicalPods,
    best_per_node,
    placement_deltas,
)
from fedsched.common.schedulers.base import Scheduler, SchedulerArgs, SchedulerContext, check_int


@dataclass(frozen=True)
class FGDArgs(SchedulerArgs):
    """FGD's arguments (upstream ``TypicalPodsConfig`` of the FGD simulator)."""

    pod_popularity_threshold: int = 95
    """typical pods = the most popular classes covering this % of the training pods; in (0, 100]"""

    def __post_init__(self) -> None:
        check_int(self, "pod_popularity_threshold", 0, 100, lo_open=True)


def fgd_score(delta: np.ndarray) -> np.ndarray:
    return np.trunc(100.0 / (1.0 + np.exp(-delta / 1000.0)))


class FGD(Scheduler):
    name = "fgd"
    Args = FGDArgs
    args: FGDArgs

    def __init__(self, ctx: SchedulerContext | None = None, args: FGDArgs | None = None) -> None:
        super().__init__(ctx, args)
        if self.ctx.train_pods is None:
            raise ValueError("FGD needs training pods to derive its typical pods from")
        self.typical = TypicalPods.from_pods(self.ctx.train_pods,
                                             threshold=self.args.pod_popularity_threshold / 100)
        self._models: dict[int, FragmentationModel] = {}
        self._caches: dict[int, NodeFragCache] = {}

    def frag_model(self, state: ClusterState) -> FragmentationModel:
        n_models = len(state.nodes.models)
        if n_models not in self._models:
            self._models[n_models] = FragmentationModel(self.typical, n_models)
        return self._models[n_models]

    def deltas(self, state: ClusterState, pod: Pod,
               nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row into ``nodes``, GPU, fragmentation drop ``F_n - F_n'``) of each placement tried."""
        fm = self.frag_model(state)
        cache = self._caches.setdefault(id(fm), NodeFragCache(fm))
        rows, gpus, delta, _ = placement_deltas(
            fm, state.nodes.cpu[nodes] - state.cpu_req[nodes], state.gpu_free[nodes],
            state.nodes.model[nodes], pod.cpu_nonzero, pod.num_gpu, pod.gpu_milli,
            parts=cache.get(state, nodes))
        return rows, gpus, delta

    def _scores(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows, gpus, delta = self.deltas(state, pod, nodes)
        return best_per_node(len(nodes), rows, gpus, fgd_score(delta))

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        return self._scores(state, pod, nodes)[0]

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        if not pod.is_gpu_share:
            return super().select_gpus(state, pod, node)
        # The lowest-indexed GPU reaching the node's best score (re-scored for this node alone).
        return (int(self._scores(state, pod, np.array([node]))[1][0]),)
