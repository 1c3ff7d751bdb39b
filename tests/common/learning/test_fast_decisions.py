"""The learned scorer's fast path decides what the plain definitions decide.

In a replay of about two thousand decisions with the shipped ``learned-online`` policy on a GPU
cluster, every decision of the scorer the simulator and serving use (a warm
:class:`~fedsched.common.learning.features.FeatureBuilder`: its per-node column cache, the few
changed nodes recomputed in Python scalars, and the GPU picks of its last build; the numpy
forward) is checked against the definitions: the features of a fresh builder (bit for
bit), the logits of ``score_numpy`` on those features plus the policy's ``kube_weight`` times
kube-default's score / 100 (bit for bit: the scorer's own arithmetic is that sum's), the torch
``forward`` plus the same term within ``RTOL`` of the largest score (the numpy forward already
differs from torch's by up to ~8e-5 of it, at 7aab7d0 as now: different
summation orders; it then picks another of near-tied nodes in about 1.5% of decisions, which is
why the scorer is held to the numpy function, not to torch), and the same GPUs as a fresh
builder picks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsched.common.learning.features import FeatureBuilder
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.model.cluster import ClusterState, Pod
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.schedulers import LEARNED_ONLINE, SchedulerContext, make_scheduler
from fedsched.common.schedulers.base import Scheduler
from fedsched.common.schedulers.kube_default import kube_default_scores
from fedsched.common.sim.replay import ReplayConfig, run_replay

RTOL = 1e-4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, except that -0.0 equals 0.0 (a fragmentation delta computed from cached parts may
    round to -0.0 where a fresh batch gives 0.0; the network cannot tell them apart)."""
    return a.shape == b.shape and np.array_equal((a + np.float32(0)).view(np.uint32),
                                                 (b + np.float32(0)).view(np.uint32))


class Checked(Scheduler):
    """The fast scorer, each decision compared with the definitions."""

    name = "checked"

    def __init__(self, fast: PolicyScheduler, typical: TypicalPods | None) -> None:
        super().__init__()
        self.fast, self.typical = fast, typical
        self.decisions = self.gpu_choices = self.shared_gpu_choices = 0
        self.worst_rel = 0.0

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        got = self.fast.score(state, pod, nodes)
        f = FeatureBuilder(self.typical).build(state, pod, nodes)
        warm = self.fast.last_features
        assert warm is not None
        for part in ("nodes", "pod", "context"):
            assert _bits_equal(getattr(warm, part), getattr(f, part)), part
        with torch.inference_mode():
            want, _ = self.fast.policy(torch.from_numpy(f.nodes)[None], torch.from_numpy(f.pod)[None],
                                       torch.from_numpy(f.context)[None],
                                       torch.ones(1, len(nodes), dtype=torch.bool))
        # the shipped policy keeps kube-default beside it (kube_weight): the same term on both sides
        kube = self.fast.kube_weight / 100.0 * kube_default_scores(state, pod, nodes)
        want = want[0].double().numpy() + kube
        # float32 rounding is relative to the network's activations (of order 1), not to its output:
        # a lone candidate's logit of 3e-4 carried a difference of 1e-7 (float32's step at 1) on an
        # AMD EPYC machine, 3.6e-4 of the logit.
        scale = max(float(np.abs(want).max()), 1.0)
        self.worst_rel = max(self.worst_rel, float(np.abs(got - want).max()) / scale)
        logits = self.fast.policy.score_numpy(f.nodes, f.pod, f.context).astype(np.float64)
        assert np.array_equal(got, logits + kube)
        self.decisions += 1
        return got

    def select_gpus(self, state: ClusterState, pod: Pod, node: int) -> tuple[int, ...]:
        got = self.fast.select_gpus(state, pod, node)
        assert got == FeatureBuilder(self.typical).select_gpus(state, pod, node)
        self.gpu_choices += 1
        self.shared_gpu_choices += pod.is_gpu_share
        return got


def test_fast_decisions_match_the_definitions_over_a_replay():
    nodes, pods = generate_cluster("gpu", 11, n_nodes=60, n_pods=6000, trace_hours=12.0)
    typical = TypicalPods.from_pods(pods)
    fast = make_scheduler(LEARNED_ONLINE, SchedulerContext(train_pods=pods, rng=np.random.default_rng(0)))
    assert isinstance(fast, PolicyScheduler)
    checked = Checked(fast, fast.features.typical)
    cfg = ReplayConfig(target_load=0.8, max_pods=2000, allow_unreachable_load=True)
    run_replay(nodes, pods, checked, config=cfg, seed=3, typical=typical)
    assert checked.decisions >= 1500
    assert checked.shared_gpu_choices >= 100  # FGD's GPU choice was exercised
    assert checked.worst_rel <= RTOL, checked.worst_rel


def test_numpy_logits_are_the_forward_within_tolerance_at_every_size():
    policy = make_scheduler(LEARNED_ONLINE).policy
    cfg = policy.cfg
    rng = np.random.default_rng(7)
    for k in (1, 2, 3, 17, 64, 241, 500, 1523):
        x = rng.random((k, cfg.n_node), dtype=np.float32)
        pod, ctx = rng.random(cfg.n_pod, dtype=np.float32), rng.random(cfg.n_ctx, dtype=np.float32)
        got = policy.score_numpy(x, pod, ctx)
        with torch.inference_mode():
            want, _ = policy(torch.from_numpy(x)[None], torch.from_numpy(pod)[None],
                             torch.from_numpy(ctx)[None], torch.ones(1, k, dtype=torch.bool))
        want = want[0].numpy()
        assert got.dtype == np.float32 and got.shape == (k,)
        assert np.abs(got - want).max() <= RTOL * max(float(np.abs(want).max()), 1e-30)
