"""GpuClustering on hand-computed cases.

Upstream: hkust-adsl/kubernetes-scheduler-simulator pkg/simulator/plugin/
gpu_clustering_score.go. With base = 100/4 * (8000 - gpuLeft) / 8000 (Go integer
arithmetic): +75 when the node only runs pods of the pod's tag, +50 when it runs that tag
among others, +25 when it runs no GPU pods, +0 when it runs only other tags; CPU-only pods
score 0. No upstream test file exists; the vectors are hand-computed.

Tags (pkg/type/open-gpu-share/utils/pod.go, GetGpuAffinityFromPodAnnotation): "share-gpu"
for a sharing pod, and "%d-gpu" for whole-GPU pods, i.e. one tag *per GPU count*
("1-gpu", "2-gpu", ...); the node's tag map ignores CPU-only pods.
"""

from __future__ import annotations

import numpy as np

from fedsched.common.schedulers import GpuClustering, place
from tests.common.schedulers.sched_testkit import all_nodes, pod, set_gpu_free, share, state, whole


def scores(st, p):
    return GpuClustering().score(st, p, all_nodes(st))


def four_nodes():
    # node1: 8 GPUs idle                               gpuLeft 8000 -> base 0
    # node2: 4 GPUs, one sharing pod (GPU0 700 free)    gpuLeft 3700 -> base 25*4300/8000 = 13
    # node3: 8 GPUs, one 2-GPU whole pod               gpuLeft 6000 -> base 25*2000/8000 = 6
    # node4: 4 GPUs, a sharing pod and a 1-GPU pod      gpuLeft 2500 -> base 25*5500/8000 = 17
    st = state(cpu=[64000] * 4, gpu=[8, 4, 8, 4])
    set_gpu_free(st, 1, [700, 1000, 1000, 1000])
    st.allocate(2, whole(2), (0, 1))
    set_gpu_free(st, 3, [500, 0, 1000, 1000])
    return st


# sharing pod: node1 no GPU pods 0+25, node2 only share 13+75, node3 only whole 6+0,
# node4 mixed 17+50
def test_sharing_pod_hand_computed():
    np.testing.assert_array_equal(scores(four_nodes(), share(200)), [25, 88, 6, 67])


# 2-GPU whole pod: node1 25, node2 (only share) 13, node3 (only 2-gpu) 6+75 = 81,
# node4 (has share and 1-gpu; the 2-gpu tag is absent -> upstream 0, fedsched counts all
# whole pods as one tag -> 50): the 1-GPU/2-GPU split is tested below.
def test_whole_pod_hand_computed_matching_tag():
    np.testing.assert_array_equal(scores(four_nodes(), whole(2))[:3], [25, 13, 81])


def test_cpu_pods_score_zero():
    np.testing.assert_array_equal(scores(four_nodes(), pod(cpu=1000)), [0, 0, 0, 0])


def test_cpu_pods_do_not_change_tags():
    st = state(cpu=[64000], gpu=[8])
    st.allocate(0, pod(cpu=1000), ())
    # still "no GPU pods": base 0 + 25
    np.testing.assert_array_equal(scores(st, share(200)), [25])


def test_keeps_sharing_and_whole_gpu_pods_apart():
    st = state(cpu=[64000] * 4, gpu=[4] * 4)
    rng = np.random.default_rng(0)
    placed = []
    for p in [share(300), whole(1), share(300), whole(1), share(600), whole(1)]:
        pl = place(GpuClustering(), st, p, rng)
        st.allocate(pl.node, p, pl.gpus)
        placed.append((p.is_gpu_share, pl.node))
    share_nodes = {n for s, n in placed if s}
    whole_nodes = {n for s, n in placed if not s}
    assert share_nodes and whole_nodes and not share_nodes & whole_nodes
    assert not ((st.gpu_tag_pods[:, 0] > 0) & (st.gpu_tag_pods[:, 1:].sum(axis=1) > 0)).any()


# Upstream tags whole-GPU pods by count. A node running only a 2-GPU pod, scored for a
# 1-GPU pod: tag "1-gpu" absent, tag map not empty -> "different affinities": base only,
# 25 * (8000 - 6000) / 8000 = 6. fedsched's single "whole" tag gives 6 + 75 = 81.
def test_upstream_whole_gpu_tags_are_per_gpu_count():
    st = state(cpu=[64000], gpu=[8])
    st.allocate(0, whole(2), (0, 1))
    np.testing.assert_array_equal(scores(st, whole(1)), [6])


def test_integer_base_uses_go_order_of_operations():
    # 100/4 = 25 first, then 25 * (8000 - left) / 8000 truncated, only share pods -> +75:
    # left 7999 -> 25*1/8000 = 0 -> 75; left 8 -> 25*7992/8000 = 24.975 -> 24 -> 99
    st = state(cpu=[64000, 64000], gpu=[8, 8])
    set_gpu_free(st, 0, [999] + [1000] * 7)
    set_gpu_free(st, 1, [1] * 8)
    np.testing.assert_array_equal(scores(st, share(1)), [75, 99])
