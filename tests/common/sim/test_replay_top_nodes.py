"""``KubeDefault.top_nodes`` (``place``'s shortcut over all nodes) names exactly the nodes ``rank``
ties between, compiled (numba) or in numpy, after any sequence of binds, releases and node
failures and for every kind of pod (CPU, best effort, GPU share, whole GPUs, model masks, nodes
without CPU or memory); ``place`` picks the same node with the same draws either way."""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.common.model import cluster
from fedsched.common.model.cluster import Pod
from fedsched.common.schedulers import KubeDefault, default_gpu_choice, kube_default_kernel, place
from fedsched.common.schedulers import kube_default as kd
from fedsched.common.schedulers.base import rank
from tests.common.schedulers.sched_testkit import pod, share, state, whole

SHAPES = [pod(cpu=1000, mem=2048), pod(cpu=6000, mem=1024), pod(), pod(mem=512), share(300, cpu=500),
          share(700, spec_mask=0b10), whole(1, cpu=200), whole(2, spec_mask=0b101), whole(4, mem=4096)]


def _ranked_top(sched: KubeDefault, st, p: Pod) -> np.ndarray:
    r = rank(sched, st, p, np.random.default_rng(0))
    if r.best < 0:
        return np.zeros(0, dtype=np.int64)
    return r.nodes[r.scores == r.scores[r.best]]


@pytest.mark.parametrize("compiled", [True, False])
def test_top_nodes_are_ranks_ties(compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if compiled:
        assert kd.top_kernel is not None, "numba is a dependency: the compiled pass must be there"
    else:
        monkeypatch.setattr(kd, "top_kernel", None)
    rng = np.random.default_rng(5)
    n = 48
    cpu = [8000 + 4000 * (j % 3) for j in range(n)]
    mem = [16384 + 8192 * (j % 4) for j in range(n)]
    cpu[5] = 0  # a resource with no capacity is left out of both scores
    mem[9] = 0
    st = state(cpu=cpu, mem=mem, gpu=[(0, 1, 2, 4, 8)[j % 5] for j in range(n)])
    st.nodes.model[:] = rng.integers(-1, 3, n)
    sched, scorer = KubeDefault(), KubeDefault()
    bound: list[tuple[int, Pod, tuple[int, ...]]] = []
    for step in range(300):
        for p in SHAPES:
            got = sched.top_nodes(st, p)
            assert got.dtype == np.int64
            assert np.array_equal(got, _ranked_top(scorer, st, p)), (step, p)
        k = 1 if step % 7 else kd.SCALAR_MAX + 3  # sometimes more nodes change than the scalar path takes
        for _ in range(k):
            if bound and rng.random() < 0.45:
                j, q, g = bound.pop(int(rng.integers(len(bound))))
                st.release(j, q, g)
            else:
                q = SHAPES[int(rng.integers(len(SHAPES)))]
                ok = np.flatnonzero(st.feasible(q))
                if len(ok):
                    j = int(rng.choice(ok))
                    g = default_gpu_choice(st, q, j)
                    st.allocate(j, q, g)
                    bound.append((j, q, g))
        st.alive[int(rng.integers(n))] = bool(rng.random() < 0.8)


def test_place_with_and_without_the_shortcut_picks_the_same() -> None:
    """Ties are common (equal nodes): the same node, and the generators left in the same state."""
    n = 30
    st = state(cpu=[16000] * n, mem=[65536] * n, gpu=[2] * n)
    sched = KubeDefault()
    r1, r2 = np.random.default_rng(11), np.random.default_rng(11)
    node_rank = np.random.default_rng(2).permutation(n)
    for i in range(120):
        p = SHAPES[i % len(SHAPES)]
        a = place(sched, st, p, r1, node_rank=node_rank if i % 3 == 0 else None)
        r = rank(sched, st, p, r2, node_rank=node_rank if i % 3 == 0 else None)
        assert a.node == r.node
        if a.node >= 0:
            assert a.gpus == sched.select_gpus(st, p, r.node)
            st.allocate(a.node, p, a.gpus)
    assert r1.integers(1 << 30) == r2.integers(1 << 30)


def test_kernel_constants_are_the_models() -> None:
    assert kube_default_kernel.MILLI_PER_GPU == cluster.MILLI_PER_GPU
    assert kube_default_kernel.DEFAULT_MILLI_CPU_REQUEST == cluster.DEFAULT_MILLI_CPU_REQUEST
    assert kube_default_kernel.DEFAULT_MEMORY_REQUEST_MIB == cluster.DEFAULT_MEMORY_REQUEST_MIB
    assert (kd.FIT_WEIGHT, kd.BALANCED_ALLOCATION_WEIGHT, kd.CPU_WEIGHT, kd.MEMORY_WEIGHT,
            kd.MAX_NODE_SCORE) == (1, 1, 1, 1, 100)  # the kernel writes the default profile's weights out
