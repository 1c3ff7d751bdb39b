"""Random: uniform over feasible nodes, uniform over fitting GPUs for a sharing pod.

Upstream: hkust-adsl/kubernetes-scheduler-simulator pkg/simulator/plugin/random_score.go
(one uniformly drawn feasible node scores 100, the rest 0) and gpuSelMethod "random".
"""

from __future__ import annotations

import numpy as np
from scipy.stats import chisquare

from fedsched.common.schedulers import RandomScore, SchedulerContext, place
from tests.common.schedulers.sched_testkit import pod, set_gpu_free, share, state, whole

TRIALS = 4000
# chi-square critical values at p = 0.001: 3 dof 16.27, 2 dof 13.82
CRIT = {3: 16.27, 2: 13.82}


def test_node_choice_is_uniform_over_feasible_nodes():
    # node2 lacks CPU, node4 lacks memory: 4 feasible nodes out of 6
    st = state(cpu=[4000, 500, 4000, 4000, 8000, 2000], mem=[4096, 4096, 4096, 100, 4096, 4096])
    sched = RandomScore(SchedulerContext(rng=np.random.default_rng(7)))
    rng = np.random.default_rng(11)
    counts = np.zeros(6, dtype=int)
    for _ in range(TRIALS):
        counts[place(sched, st, pod(cpu=1000, mem=1024), rng).node] += 1
    assert counts[1] == 0 and counts[3] == 0
    stat = chisquare(counts[[0, 2, 4, 5]]).statistic
    assert stat < CRIT[3], counts


def test_sharing_pod_gets_a_uniformly_random_fitting_gpu():
    st = state(cpu=[8000], gpu=[4])
    set_gpu_free(st, 0, [300, 1000, 600, 100])  # 250m fits GPUs 0, 1, 2 (not 3)
    sched = RandomScore(SchedulerContext(rng=np.random.default_rng(3)))
    counts = np.zeros(4, dtype=int)
    for _ in range(TRIALS // 2):
        (g,) = sched.select_gpus(st, share(250), 0)
        counts[g] += 1
    assert counts[3] == 0
    assert chisquare(counts[:3]).statistic < CRIT[2], counts


def test_whole_gpu_pod_takes_the_lowest_free_gpus():
    st = state(cpu=[8000], gpu=[4])
    set_gpu_free(st, 0, [1000, 300, 1000, 1000])
    sched = RandomScore(SchedulerContext(rng=np.random.default_rng(0)))
    for _ in range(5):
        assert sched.select_gpus(st, whole(2), 0) == (0, 2)
    assert sched.select_gpus(st, pod(cpu=100), 0) == ()


def test_seeded_runs_repeat():
    st = state(cpu=[4000] * 8)

    def run(seed):
        sched = RandomScore(SchedulerContext(rng=np.random.default_rng(seed)))
        return [place(sched, st, pod(cpu=100), np.random.default_rng(0)).node for _ in range(20)]

    assert run(5) == run(5)
    assert run(5) != run(6)
