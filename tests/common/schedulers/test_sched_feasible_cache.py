"""``ClusterState.feasible`` over all nodes keeps its answers per pod shape and checks again only
the nodes whose version moved (one by one in Python for a few, vectorised for many): after any
sequence of binds, releases and node failures it answers what a full pass answers."""

from __future__ import annotations

import numpy as np
import pytest

from fedsched.common.model.cluster import FIT_SCALAR_MAX, MILLI_PER_GPU, Pod
from fedsched.common.schedulers import default_gpu_choice
from tests.common.schedulers.sched_testkit import pod, share, state, whole


def _full_pass(st, p: Pod) -> np.ndarray:
    """The answer without any cache: the vectorised check of every node, then alive."""
    return st.alive & st._fits(p, np.arange(len(st.nodes)))


def test_cached_feasibility_is_a_full_pass() -> None:
    rng = np.random.default_rng(3)
    n = 40
    st = state(cpu=[8000 + 4000 * (j % 3) for j in range(n)], mem=[16384 + 8192 * (j % 4) for j in range(n)],
               gpu=[(0, 1, 2, 4, 8)[j % 5] for j in range(n)])
    st.nodes.model[:] = rng.integers(-1, 3, n)
    shapes = [pod(cpu=1000, mem=2048), pod(cpu=6000, mem=1024), share(300, cpu=500),
              share(700, spec_mask=0b10), whole(1, cpu=200), whole(2, spec_mask=0b101), whole(4), pod()]
    bound: list[tuple[int, Pod, tuple[int, ...]]] = []
    for step in range(400):
        for p in shapes:
            got = st.feasible(p)
            assert np.array_equal(got, _full_pass(st, p)), (step, p)
            ids = rng.permutation(n)[:7]
            assert np.array_equal(st.feasible(p, ids), _full_pass(st, p)[ids])
        k = 1 if step % 7 else FIT_SCALAR_MAX + 3  # sometimes more nodes change than the scalar path takes
        for _ in range(k):
            if bound and rng.random() < 0.45:
                j, q, g = bound.pop(int(rng.integers(len(bound))))
                st.release(j, q, g)
            else:
                q = shapes[int(rng.integers(len(shapes)))]
                ok = np.flatnonzero(st.feasible(q))
                if len(ok):
                    j = int(rng.choice(ok))
                    g = default_gpu_choice(st, q, j)
                    st.allocate(j, q, g)
                    bound.append((j, q, g))
        st.alive[int(rng.integers(n))] = bool(rng.random() < 0.8)
    assert (st.gpu_free <= MILLI_PER_GPU).all()


def test_a_synced_copy_answers_as_the_state_it_follows() -> None:
    """``sync_rows``: a copy brought up to date from the nodes whose version moved in the original
    holds the original's arrays, moves its own versions of exactly those nodes, and its cached
    feasibility (kept across the syncs) is a full pass; another node table is refused."""
    rng = np.random.default_rng(5)
    n = 12
    st = state(cpu=[8000] * n, mem=[16384] * n, gpu=[(0, 2, 4)[j % 3] for j in range(n)])
    shadow, seen = st.copy(), st.version.copy()
    shapes = [pod(cpu=3000, mem=1024), share(400, cpu=500), whole(2, cpu=1000)]
    for _ in range(60):
        q = shapes[int(rng.integers(len(shapes)))]
        ok = np.flatnonzero(st.feasible(q))
        if len(ok):
            j = int(rng.choice(ok))
            st.allocate(j, q, default_gpu_choice(st, q, j))
        st.alive[int(rng.integers(n))] = bool(rng.random() < 0.9)
        rows = np.flatnonzero(st.version != seen)
        v = shadow.version.copy()
        shadow.sync_rows(st, rows)
        seen[rows] = st.version[rows]
        assert np.array_equal(shadow.version - v, np.isin(np.arange(n), rows).astype(np.int64))
        for k in st.ROW_FIELDS:
            assert np.array_equal(getattr(shadow, k), getattr(st, k)), k
        for p in shapes:
            assert np.array_equal(shadow.feasible(p), _full_pass(st, p))
    other = state(cpu=[8000] * n, mem=[16384] * n)
    with pytest.raises(ValueError, match="same node table"):
        other.sync_rows(st, np.arange(n))
