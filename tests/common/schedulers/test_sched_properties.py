"""Property tests over every baseline on random small clusters (hypothesis).

For a random cluster (pre-loaded with random pods) and a random pod, each scheduler's
scores over the feasible nodes have the right shape and are finite, place() returns a
feasible node (or -1 exactly when none fits), and the chosen GPUs are valid: a whole-GPU
pod gets num_gpu distinct fully free GPUs, a sharing pod one GPU with enough free share, a
CPU pod none; binding the placement never over-allocates the node.
"""

from __future__ import annotations

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fedsched.common.model.cluster import MILLI_PER_GPU, USE_REQUESTS, ClusterState
from fedsched.common.schedulers import BASELINES, SchedulerContext, default_gpu_choice, make_scheduler, place
from tests.common.schedulers.sched_testkit import nodes, pod, pod_table

TRAIN = pod_table([(4000, 8192, 1, 500), (4000, 8192, 1, 500), (8000, 16384, 1, 1000),
                   (2000, 4096, 0, 0), (16000, 32768, 2, 1000), (1000, 2048, 1, 250, 0b01)])

SHARES = [100, 250, 300, 500, 700, 1000]


@st.composite
def pods(draw, kinds=("cpu", "share", "whole")):
    kind = draw(st.sampled_from(kinds))
    cpu = draw(st.sampled_from([0, 500, 1000, 4000, 16000]))
    mem = draw(st.sampled_from([0, 1024, 8192, 65536]))
    mask = draw(st.sampled_from([0, 0, 0b01, 0b10, 0b11]))
    if kind == "cpu":
        return pod(cpu=cpu, mem=mem)
    if kind == "share":
        return pod(cpu=cpu, mem=mem, num_gpu=1, gpu_milli=draw(st.sampled_from(SHARES[:-1])),
                   spec_mask=mask)
    return pod(cpu=cpu, mem=mem, num_gpu=draw(st.sampled_from([1, 1, 2, 4, 8])), spec_mask=mask)


@st.composite
def clusters(draw):
    n = draw(st.integers(1, 5))
    gpu = draw(st.lists(st.integers(0, 8), min_size=n, max_size=n))
    model = [draw(st.integers(0, 1)) if g else -1 for g in gpu]
    table = nodes(cpu=draw(st.lists(st.sampled_from([2000, 8000, 32000, 96000]), min_size=n, max_size=n)),
                  mem=draw(st.lists(st.sampled_from([4096, 65536, 262144]), min_size=n, max_size=n)),
                  gpu=gpu, model=model)
    state = ClusterState(table, use_source=USE_REQUESTS)  # real use = requests, as packing mode
    for p in draw(st.lists(pods(), max_size=10)):
        ok = np.flatnonzero(state.feasible(p))
        if len(ok):
            node = int(ok[draw(st.integers(0, len(ok) - 1))])
            state.allocate(node, p, default_gpu_choice(state, p, node))
    dead = draw(st.integers(-1, n - 1))
    if dead >= 0 and n > 1:
        state.alive[dead] = False
    return state


def check_gpus(state: ClusterState, p, node: int, gpus: tuple[int, ...]) -> None:
    free = state.gpu_free[node]
    if p.num_gpu == 0:
        assert gpus == ()
    elif p.is_gpu_share:
        assert len(gpus) == 1
        assert 0 <= gpus[0] < state.nodes.gpu[node] and free[gpus[0]] >= p.gpu_milli
    else:
        assert len(gpus) == p.num_gpu == len(set(gpus))
        assert all(0 <= g < state.nodes.gpu[node] and free[g] == MILLI_PER_GPU for g in gpus)


@settings(max_examples=250, deadline=None)
@given(state=clusters(), p=pods(kinds=("cpu", "share", "share", "whole", "whole")),
       seed=st.integers(0, 2**16))
def test_every_scheduler_scores_and_places_validly(state, p, seed):
    feasible = state.feasible(p)
    idx = np.flatnonzero(feasible)
    event("share" if p.is_gpu_share else "whole" if p.num_gpu else "cpu")
    event(f"feasible nodes: {min(len(idx), 2)}")
    for name in BASELINES:
        sched = make_scheduler(name, SchedulerContext(train_pods=TRAIN, rng=np.random.default_rng(seed)))
        if len(idx):
            s = np.asarray(sched.score(state, p, idx))
            assert s.shape == idx.shape, name
            assert np.isfinite(s).all(), name
        pl = place(sched, state, p, np.random.default_rng(seed),
                   node_rank=np.random.default_rng(seed).permutation(len(state.nodes)) if seed % 2 else None)
        if not len(idx):
            assert pl.node == -1 and pl.gpus == (), name
            continue
        assert feasible[pl.node], name
        check_gpus(state, p, pl.node, pl.gpus)
        # select_gpus on its own, on every feasible node, is valid too
        for node in idx:
            check_gpus(state, p, int(node), sched.select_gpus(state, p, int(node)))
        after = state.copy()
        after.allocate(pl.node, p, pl.gpus)  # raises if over-allocated
