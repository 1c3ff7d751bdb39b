"""The compiled refresh of ``ClusterState.feasible``'s kept answers (``fit_kernel``) answers what a
full pass answers, and what the numpy form answers, through binds, releases, nodes going down and
up, GPU shares, whole GPUs and GPU-model masks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.common.model import cluster as cluster_module
from fedsched.common.model import fit_kernel
from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.schedulers.base import default_gpu_choice
from tests.builders import make_nodes, make_pods

NODES = make_nodes([32000, 64000, 16000, 96000, 8000, 64000, 4000],
                   [131072, 262144, 65536, 393216, 32768, 262144, 8192],
                   [8, 4, 0, 8, 0, 2, 1], model=[0, 1, -1, 2, -1, 1, 0], models=("A", "B", "C"))
POOL = make_pods([4000, 8000, 2000, 16000, 1000, 6000, 12000, 500],
                 [16384, 32768, 4096, 65536, 2048, 8192, 49152, 512],
                 [1, 1, 0, 2, 0, 1, 4, 1], [500, 1000, 0, 1000, 0, 250, 1000, 900])


def _pod(rng: np.random.Generator) -> Pod:
    pod = Pod.from_table(POOL, int(rng.integers(len(POOL))))
    if pod.num_gpu and rng.random() < 0.5:  # a GPU-model constraint: some of A, B, C
        return dataclasses.replace(pod, spec_mask=int(rng.integers(1, 8)))
    return pod


def _run(ops: list[int], kernel: bool) -> list[bytes]:
    """The feasible masks along a sequence of binds, releases and node failures."""
    answers = []
    with pytest.MonkeyPatch.context() as m:  # not the fixture: hypothesis runs many examples per test
        if not kernel:
            m.setattr(cluster_module, "FIT_KERNEL", None)
        state = ClusterState(NODES)
        placed: list[tuple[int, Pod, tuple[int, ...]]] = []
        for r in ops:
            rng = np.random.default_rng(r)
            pod = _pod(rng)
            got = state.feasible(pod)
            assert got.tobytes() == (state.fits(pod, None) & state.alive).tobytes()  # a full pass
            answers.append(got.tobytes())
            what = rng.random()
            if what < 0.1:
                state.alive[int(rng.integers(len(NODES)))] ^= True
            elif what < 0.4 and placed:
                state.release(*placed.pop(int(rng.integers(len(placed)))))
            else:
                for _ in range(int(rng.integers(1, 20))):  # at times more nodes than the scalar path takes
                    fits = np.flatnonzero(state.feasible(pod))
                    if not len(fits):
                        break
                    node = int(rng.choice(fits))
                    gpus = default_gpu_choice(state, pod, node)
                    state.allocate(node, pod, gpus)
                    placed.append((node, pod, gpus))
    return answers


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=40))
def test_compiled_refresh_answers_the_full_pass_and_the_numpy_form(ops):
    assert fit_kernel.FIT_KERNEL is not None, "numba is a dependency"
    assert _run(ops, kernel=True) == _run(ops, kernel=False)
