"""The compiled per-candidate columns (``features_kernel``) build the same bits as the numpy form
they replace, whatever the telemetry holds: absent fields, NaN gaps (a node Prometheus has no value
for), peaks below the mean, measured use above capacity, GPU clusters with tags and fragmentation, and
the replay simulator's live signals (the whole replay is compared in ``test_replay_kernels.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.common.learning import features as features_module
from fedsched.common.learning import features_kernel
from fedsched.common.learning.features import _AUX, _BLOCK, NODE_FEATURES, FeatureBuilder, Features, Telemetry
from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import default_gpu_choice
from tests.common.learning.test_feature_cache import NODES, POOL, TYPICAL


def _bits(f: Features) -> tuple[bytes, ...]:
    """Every value of the features, bit for bit (NaN payloads and signed zeros included)."""
    assert f.use_measured is not None
    return (f.nodes.tobytes(), f.pod.tobytes(), f.context.tobytes(), f.use_measured.tobytes())


def _numpy_build(builder: FeatureBuilder, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Features:
    """``builder.build`` on the numpy forms."""
    with pytest.MonkeyPatch.context() as m:  # not the fixture: hypothesis runs many examples per test
        m.setattr(features_module, "KERNEL", None)
        m.setattr(features_module, "GATHER", None)
        m.setattr(features_module, "TOTALS", None)
        return builder.build(state, pod, nodes)


def test_the_kernels_rows_are_the_builders():
    k = features_kernel
    rows = (k._CPU_LEFT, k._GPU_LEFT, k._CAP_CPU, k._CAP_MEM, k._TAGGED, k._N_TAGGED)
    want = tuple(_AUX.index(a) for a in ("cpu_left", "gpu_left", "cap_cpu", "cap_mem", "tagged", "n_tagged"))
    assert rows == want
    assert len(_BLOCK) == k.N_BLOCK


def _field(draw: st.DrawFn, n: int, low: float, high: float) -> np.ndarray | None:
    """A telemetry field as a source gives it: absent, or values with NaN gaps."""
    if draw(st.booleans()):
        return None
    values = draw(st.lists(st.one_of(st.floats(low, high), st.just(float("nan"))), min_size=n, max_size=n))
    return np.array(values)


@st.composite
def telemetry(draw: st.DrawFn) -> Telemetry | None:
    n = len(NODES)
    if draw(st.integers(0, 4)) == 0:
        return None
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    t = Telemetry(rng.normal(size=n) * 100, rng.normal(size=n) * 100, rng.random(n) < 0.3,
                  rng.integers(0, 6, size=n).astype(float), rng.integers(0, 3, size=n),
                  draw(st.integers(0, 9)),
                  cpu_mean=_field(draw, n, 0.0, 1.5), cpu_std=_field(draw, n, 0.0, 0.5),
                  mem_mean=_field(draw, n, 0.0, 1.2), mem_std=_field(draw, n, 0.0, 0.5),
                  cpu_peak=_field(draw, n, 0.0, 2.0), mem_peak=_field(draw, n, 0.0, 2.0))
    if draw(st.booleans()):
        seen = draw(st.tuples(st.floats(0.0, 20.0), st.floats(0.0, 20.0)))
        t.app_usage = lambda app: seen if app % 2 else None
    return t


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=12), telemetry(), st.booleans(),
       st.sampled_from(["requests", "measured"]))
def test_compiled_columns_are_the_numpy_forms_bits(draws, tel, typical, source):
    """Builders kept across pods (the compiled gather refreshes the nodes that moved, the numpy form
    in Python scalars or numpy) and fresh ones, compiled and numpy, all build the same bits, with
    nodes down or not (the context's totals over the alive nodes)."""
    k = features_kernel
    assert k.KERNEL is not None and k.GATHER is not None and k.TOTALS is not None, "numba is a dependency"
    state = ClusterState(NODES, use_source=source)
    state.telemetry = tel
    typ = TYPICAL if typical else None
    warm_compiled, warm_numpy = FeatureBuilder(typ), FeatureBuilder(typ)
    for r in draws:
        rng = np.random.default_rng(r)
        pod = Pod.from_table(POOL, int(rng.integers(len(POOL))))
        fits = np.flatnonzero(state.feasible(pod))
        if not len(fits):
            continue
        if source == "measured":  # measured use, at times above capacity
            node = int(rng.integers(len(NODES)))
            state.set_measured_use(node, cpu=float(rng.uniform(0, 1.3 * NODES.cpu[node])),
                                   mem=float(rng.uniform(0, NODES.mem[node])))
        want = _bits(_numpy_build(FeatureBuilder(typ), state, pod, fits))
        assert _bits(FeatureBuilder(typ).build(state, pod, fits)) == want
        assert _bits(warm_compiled.build(state, pod, fits)) == want
        assert _bits(_numpy_build(warm_numpy, state, pod, fits)) == want
        if rng.random() < 0.2:  # a node goes down or comes back (the simulator's churn)
            state.alive[int(rng.integers(len(NODES)))] ^= True
        for _ in range(int(rng.integers(1, 4))):  # one to three binds: the few-stale-nodes paths
            fits = np.flatnonzero(state.feasible(pod))
            if len(fits):
                node = int(rng.choice(fits))
                state.allocate(node, pod, default_gpu_choice(state, pod, node))


def test_the_pods_log_table_grows_for_a_crowded_node():
    """A node with more pods than the compiled gather's log1p table holds: the table grows and the
    column is numpy's ``log1p(pods) / 5``."""
    state = ClusterState(NODES, use_source="requests")
    tiny = Pod(0, 1, 1, 0, 0, 0, 1)
    builder = FeatureBuilder(None)
    builder.build(state, tiny, np.arange(len(NODES)))
    for _ in range(300):
        state.allocate(3, tiny, ())
    f = builder.build(state, tiny, np.array([3]))
    assert f.nodes[0, NODE_FEATURES.index("pods_on_node")] == np.float32(np.log1p(300.0) / 5.0)
    assert _bits(f) == _bits(_numpy_build(FeatureBuilder(None), state, tiny, np.array([3])))


def test_cluster_totals_are_numpys_sums_over_the_alive_nodes():
    state = ClusterState(NODES, use_source="requests")
    rng = np.random.default_rng(5)
    for _ in range(30):
        pod = Pod.from_table(POOL, int(rng.integers(len(POOL))))
        fits = np.flatnonzero(state.feasible(pod))
        if len(fits):
            node = int(rng.choice(fits))
            state.allocate(node, pod, default_gpu_choice(state, pod, node))
        state.alive[int(rng.integers(len(NODES)))] ^= bool(rng.random() < 0.3)
        if rng.random() < 0.3:
            state.set_measured_use(int(rng.integers(len(NODES))), cpu=1.0)
        got = features_module.cluster_totals(state)
        a = state.alive
        cm = a & state.cpu_measured
        assert got.tolist() == [int(a.sum()), int(state.cpu_req[a].sum()), int(state.mem_req[a].sum()),
                                int(NODES.cpu[a].sum()), int(NODES.mem[a].sum()), int(NODES.gpu[a].sum()),
                                int(state.gpu_free[a].sum()), int(state.cpu_req_nz[cm].sum()),
                                int(state.mem_req_nz[a & state.mem_measured].sum()), int(cm.sum()),
                                int((a & state.mem_measured).sum())]
