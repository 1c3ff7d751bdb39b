"""Builders shared by the scheduler tests (tests/schedulers/test_sched_*.py).

Tiny clusters are built directly from numpy arrays; pods are placed with
``ClusterState.allocate`` so that every derived counter (non-zero requests, GPU shares,
GpuClustering tags) is the one the simulator would hold.

Units follow ``fedsched.common.model.cluster``: CPU in milli-cores, memory in MiB, GPU shares in
milli-GPU (1000 = one GPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedsched.common.model.cluster import MILLI_PER_GPU, ClusterState, NodeTable, Pod, PodTable

MODELS = ("A100", "V100")


def nodes(cpu: Sequence[int], mem: Sequence[int] | None = None, gpu: Sequence[int] | None = None,
          model: Sequence[int] | None = None, models: Sequence[str] = MODELS) -> NodeTable:
    """A NodeTable; GPU nodes default to model 0, CPU-only nodes to -1."""
    n = len(cpu)
    gpu_arr = np.asarray(gpu if gpu is not None else [0] * n, dtype=np.int64)
    mem_arr = np.asarray(mem if mem is not None else [1 << 20] * n, dtype=np.int64)
    if model is None:
        model = [0 if g > 0 else -1 for g in gpu_arr]
    return NodeTable(
        names=tuple(f"node{i + 1}" for i in range(n)), cpu=np.asarray(cpu, dtype=np.int64),
        mem=mem_arr, gpu=gpu_arr, model=np.asarray(model, dtype=np.int64), models=tuple(models),
        disk_io=np.full(n, 1000.0), net=np.full(n, 10000.0))


def state(cpu: Sequence[int], mem: Sequence[int] | None = None, gpu: Sequence[int] | None = None,
          model: Sequence[int] | None = None, models: Sequence[str] = MODELS) -> ClusterState:
    return ClusterState(nodes(cpu, mem, gpu, model, models))


def pod(cpu: int = 0, mem: int = 0, num_gpu: int = 0, gpu_milli: int | None = None,
        spec_mask: int = 0, index: int = 0) -> Pod:
    """A pod; ``gpu_milli`` defaults to 1000 (whole GPUs) when ``num_gpu`` > 0."""
    if gpu_milli is None:
        gpu_milli = MILLI_PER_GPU if num_gpu else 0
    return Pod(index=index, cpu=cpu, mem=mem, num_gpu=num_gpu, gpu_milli=gpu_milli,
               spec_mask=spec_mask, qos=1)


def share(gpu_milli: int, cpu: int = 0, mem: int = 0, spec_mask: int = 0) -> Pod:
    """A GPU-sharing pod (one GPU, ``gpu_milli`` < 1000)."""
    return pod(cpu=cpu, mem=mem, num_gpu=1, gpu_milli=gpu_milli, spec_mask=spec_mask)


def whole(num_gpu: int, cpu: int = 0, mem: int = 0, spec_mask: int = 0) -> Pod:
    """A whole-GPU pod taking ``num_gpu`` full GPUs."""
    return pod(cpu=cpu, mem=mem, num_gpu=num_gpu, gpu_milli=MILLI_PER_GPU, spec_mask=spec_mask)


def pod_table(rows: Sequence[tuple[int, int, int, int]] | Sequence[tuple[int, int, int, int, int]]
              ) -> PodTable:
    """A PodTable from rows ``(cpu, mem, num_gpu, gpu_milli[, spec_mask])``."""
    rows = [tuple(r) + (0,) * (5 - len(r)) for r in rows]
    arr = np.asarray(rows, dtype=np.int64).reshape(-1, 5)
    n = len(arr)
    return PodTable(names=tuple(f"p{i}" for i in range(n)), cpu=arr[:, 0], mem=arr[:, 1],
                    num_gpu=arr[:, 2], gpu_milli=arr[:, 3], spec_mask=arr[:, 4],
                    qos=np.ones(n, dtype=np.int64), creation=np.full(n, np.nan),
                    deletion=np.full(n, np.nan))


def set_gpu_free(st: ClusterState, node: int, free: Sequence[int]) -> None:
    """Bring the node's per-GPU free shares to ``free`` by binding GPU pods (no CPU/memory).

    A GPU left with 0 free gets a whole-GPU pod, a GPU left with 0 < f < 1000 a sharing
    pod of ``1000 - f``; so the node's GpuClustering tags change accordingly.
    """
    assert len(free) == int(st.nodes.gpu[node])
    for g, f in enumerate(free):
        if f == 0:
            st.allocate(node, whole(1), (g,))
        elif f < MILLI_PER_GPU:
            st.allocate(node, share(MILLI_PER_GPU - f), (g,))


def set_node_info(st: ClusterState, node: int, requested: tuple[int, int],
                  nonzero: tuple[int, int] | None = None) -> None:
    """Set a node's kube ``NodeInfo`` totals directly: ``Requested`` and ``NonZeroRequested``.

    Needed to replay upstream Kubernetes vectors whose existing pods request memory "0"
    explicitly: kube's non-zero defaults only replace *missing* requests, while the fedsched
    pod model cannot tell an explicit 0 from a missing request (0 always means missing).
    """
    nonzero = nonzero if nonzero is not None else requested
    st.cpu_req[node], st.mem_req[node] = requested
    st.cpu_req_nz[node], st.mem_req_nz[node] = nonzero
    st.version[node] += 1  # a direct write: the per-node caches must see it (ClusterState.version)


def all_nodes(st: ClusterState) -> np.ndarray:
    return np.arange(len(st.nodes))
