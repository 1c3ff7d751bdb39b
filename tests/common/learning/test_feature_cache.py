"""The feature builder's per-node cache (NodeColumnCache) never changes a feature: a builder that
has seen every earlier state of a cluster builds, bit for bit, what a fresh builder builds,
whatever pods come and go and whatever the live signals do meanwhile."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fedsched.common.learning.features import NODE_FEATURES, FeatureBuilder, Telemetry
from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.model.fragmentation import FragmentationModel, TypicalPods
from fedsched.common.schedulers.base import default_gpu_choice
from tests.builders import make_nodes, make_pods

NODES = make_nodes([32000, 64000, 16000, 96000, 8000, 64000], [131072, 262144, 65536, 393216, 32768, 262144],
                   [8, 4, 0, 8, 0, 2], model=[0, 1, -1, 0, -1, 1])
POOL = make_pods([4000, 8000, 2000, 16000, 1000, 6000, 12000],
                 [16384, 32768, 4096, 65536, 2048, 8192, 49152],
                 [1, 1, 0, 2, 0, 1, 4], [500, 1000, 0, 1000, 0, 250, 1000], qos=[1, 3, 0, 1, 2, 1, 3])
TYPICAL = TypicalPods.from_pods(POOL)


def same(a, b) -> bool:
    return all(np.array_equal(getattr(a, f).view(np.uint32), getattr(b, f).view(np.uint32))
               for f in ("nodes", "pod", "context"))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["place", "remove", "use", "telemetry"]), st.integers(0, 10**6)),
                min_size=1, max_size=40),
       st.booleans())
@example(steps=[("place", 0)] * 9 + [("place", 14126)], typical=True)  # a no-change delta rounded to -0.0
def test_a_warm_builder_builds_what_a_fresh_one_builds(steps, typical):
    state = ClusterState(NODES, use_source="requests")
    state.telemetry = Telemetry.zeros(len(NODES))
    warm = FeatureBuilder(TYPICAL if typical else None)
    placed: list[tuple[int, Pod, tuple[int, ...]]] = []
    for op, r in steps:
        rng = np.random.default_rng(r)
        pod = Pod.from_table(POOL, int(rng.integers(len(POOL))))
        if op == "place":
            fits = np.flatnonzero(state.feasible(pod))
            if len(fits):
                node = int(rng.choice(fits))
                gpus = default_gpu_choice(state, pod, node)
                state.allocate(node, pod, gpus)
                placed.append((node, pod, gpus))
        elif op == "remove" and placed:
            state.release(*placed.pop(int(rng.integers(len(placed)))))
        elif op == "use":  # measured use moves without a version change
            node = int(rng.integers(len(NODES)))
            state.set_measured_use(node, cpu=float(rng.uniform(0, NODES.cpu[node])))
        elif op == "telemetry":
            state.telemetry.cpu_trend = rng.normal(size=len(NODES))
            state.telemetry.overload_count = rng.integers(0, 5, size=len(NODES)).astype(float)
        candidates = np.flatnonzero(state.feasible(pod))
        if not len(candidates):
            continue
        candidates = np.sort(rng.choice(candidates, size=int(rng.integers(1, len(candidates) + 1)),
                                        replace=False))
        got = warm.build(state, pod, candidates)
        want = FeatureBuilder(TYPICAL if typical else None).build(state, pod, candidates)
        assert got.nodes.shape == (len(candidates), len(NODE_FEATURES))
        assert same(got, want), (op, r)


CPU_NODES = make_nodes([32000, 64000, 16000, 96000], [131072, 262144, 65536, 393216], [0, 0, 0, 0],
                       model=[-1, -1, -1, -1])


class EveryClusterFragmentation(FeatureBuilder):
    """The builder as it was: the fragmentation model also on a cluster without GPUs."""

    def frag_model(self, state):
        return FragmentationModel(self.typical, len(state.nodes.models))


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=30))
def test_without_gpus_the_builder_skips_fragmentation_and_builds_the_same_bits(draws):
    state = ClusterState(CPU_NODES, use_source="requests")
    fast, full = FeatureBuilder(TYPICAL), EveryClusterFragmentation(TYPICAL)
    cpu_pods = [i for i in range(len(POOL)) if POOL.num_gpu[i] == 0]
    for r in draws:
        rng = np.random.default_rng(r)
        pod = Pod.from_table(POOL, int(rng.choice(cpu_pods)))
        fits = np.flatnonzero(state.feasible(pod))
        if not len(fits):
            continue
        assert fast.frag_model(state) is None
        assert same(fast.build(state, pod, fits), full.build(state, pod, fits))
        state.allocate(int(rng.choice(fits)), pod, ())
