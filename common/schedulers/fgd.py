"""FGD: Fragmentation Gradient Descent (Weng et al., USENIX ATC'23).

Upstream: hkust-adsl/kubernetes-scheduler-simulator pkg/simulator/plugin/fgd_score.go and
pkg/utils/frag.go (fragmentation model in :mod:`fedsched.common.fragmentation`).
For each feasible node ``n`` and hypothetical state ``n'`` after placing the pod,
``score = int(sigmoid((F_n - F_n') / 1000) * 100)``: the node whose fragmentation drops
most (or grows least) wins. A sharing pod is tried on every GPU that fits; the node's
score is its best GPU's, and that GPU (lowest index among equals) is the one reserved.
Whole-GPU pods take the lowest-indexed free GPUs. The typical pods come from
``SchedulerContext.train_pods`` only.
"""

from __future__ import annotations

import numpy as np

from ..cluster import MILLI_PER_GPU, ClusterState, Pod
from ..fragmentation import FragmentationModel, TypicalPods
from .base import Scheduler, SchedulerContext


def fgd_score(delta: np.ndarray) -> np.ndarray:
    return np.trunc(100.0 / (1.0 + np.exp(-delta / 1000.0)))


class FGD(Scheduler):
    name = "fgd"

    def __init__(self, ctx: SchedulerContext | None = None) -> None:
        super().__init__(ctx)
        if self.ctx.train_pods is None:
            raise ValueError("FGD needs training pods to derive its typical pods from")
        self.typical = TypicalPods.from_pods(self.ctx.train_pods)
        self._model: FragmentationModel | None = None
        self._model_for: int = -1

    def frag_model(self, state: ClusterState) -> FragmentationModel:
        if self._model is None or self._model_for != len(state.nodes.models):
            self._model = FragmentationModel(self.typical, len(state.nodes.models))
            self._model_for = len(state.nodes.models)
        return self._model

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        fm = self.frag_model(state)
        cpu_left = state.nodes.cpu[nodes] - state.cpu_req[nodes]
        free = state.gpu_free[nodes]
        model = state.nodes.model[nodes]
        before = fm.node_frag(cpu_left, free, model)
        cpu_after = cpu_left - pod.cpu_nonzero
        if not pod.is_gpu_share:
            after_free = free
            if pod.num_gpu:
                # Take num_gpu fully free GPUs (which ones does not change F).
                full = free >= MILLI_PER_GPU
                taken = full & (np.cumsum(full, axis=1) <= pod.num_gpu)
                after_free = np.where(taken, 0, free)
            return fgd_score(before - fm.node_frag(cpu_after, after_free, model))
        best, _ = self._share_scores(before, cpu_after, free, model, pod)
        return best

    def _share_scores(self, before: np.ndarray, cpu_after: np.ndarray, free: np.ndarray,
                      model: np.ndarray, pod: Pod) -> tuple[np.ndarray, np.ndarray]:
        """Per node: the best score over its GPUs, and the GPU that reaches it first."""
        fm = self._model
        assert fm is not None
        # One candidate per distinct free share among the fitting GPUs (equal shares score equally).
        fits = free >= pod.gpu_milli
        g = free.shape[1]
        earlier_equal = np.tril(np.ones((g, g), dtype=bool), k=-1)  # [i, j]: j < i
        dup = ((free[:, :, None] == free[:, None, :]) & earlier_equal[None]).any(axis=2)
        rows, gpus = np.nonzero(fits & ~dup)  # row-major: GPUs of a node in index order
        after_free = free[rows].copy()
        after_free[np.arange(len(rows)), gpus] -= pod.gpu_milli
        s = fgd_score(before[rows] - fm.node_frag(cpu_after[rows], after_free, model[rows]))
        best = np.full(len(free), -1.0)
        np.maximum.at(best, rows, s)
        at_best = s == best[rows]
        first_rows, first = np.unique(rows[at_best], return_index=True)
        gpu = np.full(len(free), -1, dtype=np.int64)
        gpu[first_rows] = gpus[at_best][first]
        return best, gpu

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        if not pod.is_gpu_share:
            return super().select_gpus(state, pod, node)
        # The lowest-indexed GPU reaching the node's best score (re-scored for this node alone).
        fm = self.frag_model(state)
        one = np.array([node])
        cpu_left = state.nodes.cpu[one] - state.cpu_req[one]
        free, model = state.gpu_free[one], state.nodes.model[one]
        _, gpu = self._share_scores(fm.node_frag(cpu_left, free, model), cpu_left - pod.cpu_nonzero,
                                    free, model, pod)
        return (int(gpu[0]),)
