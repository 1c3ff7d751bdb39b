"""The decision-time search (``lookahead:<base>``): arguments, registry names, what the rollouts
see that the base does not, and that the live state is never written (hypothesis).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.common.model.cluster import USE_REQUESTS, ClusterState
from fedsched.common.schedulers import (
    Lookahead,
    LookaheadArgs,
    SchedulerContext,
    make_scheduler,
    place,
    split_names,
)
from fedsched.common.schedulers.lookahead import parse_args
from fedsched.common.sim.packing import run_packing
from tests.common.schedulers.sched_testkit import nodes, pod, pod_table, state, whole
from tests.common.schedulers.test_sched_properties import TRAIN, check_gpus, clusters, pods


def search(base: str, train, **kw) -> Lookahead:
    return Lookahead(SchedulerContext(train_pods=train), lambda: make_scheduler(base, SchedulerContext(
        train_pods=train)), LookaheadArgs(**kw))


@pytest.mark.parametrize("field,value", [
    ("candidates", 0), ("candidates", 65), ("candidates", 2.0), ("horizon", -1), ("horizon", 1001),
    ("futures", 0), ("futures", 65), ("seed", -1), ("seed", True),
])
def test_args_out_of_range_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"LookaheadArgs.{field} = "):
        LookaheadArgs(**{field: value})


def test_args_defaults():
    assert LookaheadArgs() == LookaheadArgs(candidates=4, horizon=10, futures=1, seed=0)


def test_registry_names():
    ctx = SchedulerContext(train_pods=TRAIN)
    s = make_scheduler("lookahead:fgd", ctx)
    assert isinstance(s, Lookahead) and s.name == "lookahead:fgd" and s.base.name == "fgd"
    assert s.base is not s.rollout_base  # each base keeps its caches on its own state
    for bad, msg in [("lookahead:", "one base scheduler"), ("lookahead:lookahead:fgd", "one base scheduler"),
                     ("lookahead:no-such", "unknown policy 'no-such'")]:
        with pytest.raises(ValueError, match=msg):
            make_scheduler(bad, ctx)
    with pytest.raises(ValueError, match="training pods"):
        make_scheduler("lookahead:kube-default", SchedulerContext())


def test_registry_names_with_arguments():
    ctx = SchedulerContext(train_pods=TRAIN)
    s = make_scheduler("lookahead[candidates=8, futures=2]:best-fit", ctx)
    assert isinstance(s, Lookahead) and s.base.name == "best-fit"
    assert s.args == LookaheadArgs(candidates=8, futures=2)
    assert s.name == "lookahead[candidates=8, futures=2]:best-fit"
    assert make_scheduler("lookahead[]:fgd", ctx).args == LookaheadArgs()
    assert make_scheduler("lookahead[]:fgd", ctx).name == "lookahead:fgd"
    for bad, msg in [
        ("lookahead[candidates=8:fgd", r"expected lookahead\[key=value"),
        ("lookahead[depth=3]:fgd", "'depth=3' is not key=value with a key among candidates"),
        ("lookahead[candidates]:fgd", "'candidates' is not key=value"),
        ("lookahead[candidates=2.5]:fgd", "candidates must be an integer, got '2.5'"),
        ("lookahead[candidates=2,candidates=3]:fgd", "candidates is given twice"),
        ("lookahead[candidates=0]:fgd", "LookaheadArgs.candidates = 0 is out of range"),
        ("lookahead[horizon=1001]:fgd", "LookaheadArgs.horizon = 1001 is out of range"),
        ("lookahead[futures=2]:", "one base scheduler"),
        ("lookahead[futures=2]:lookahead:fgd", "one base scheduler"),
        ("lookahead[futures=2]:no-such", "unknown policy 'no-such'"),
    ]:
        with pytest.raises(ValueError, match=msg):
            make_scheduler(bad, ctx)


def test_a_rollout_sees_the_arrival_the_base_strands():
    """CPU-only nodes of 4 and 8 cores, a 4-core pod, and the pods to come are 8-core pods:
    kube-default spreads the pod to the emptier 8-core node, where the next pod no longer fits;
    one step of look-ahead puts it on the 4-core node and the next pod gets the 8-core node.
    With no look-ahead (horizon 0: no GPUs, so every value is 0) the base's choice stands."""
    st_ = ClusterState(nodes(cpu=[4000, 8000], mem=[1 << 16] * 2), use_source=USE_REQUESTS)
    p = pod(cpu=4000, mem=1024)
    train = pod_table([(8000, 1024, 0, 0)])
    rng = np.random.default_rng(0)
    assert place(make_scheduler("kube-default"), st_, p, rng).node == 1
    assert place(search("kube-default", train, horizon=0), st_, p, rng).node == 1
    s = search("kube-default", train, horizon=1)
    assert place(s, st_, p, rng).node == 0 and (s.searched, s.switched) == (1, 1)


def test_a_rollout_keeps_whole_gpus_for_the_multi_gpu_pods_to_come():
    """Three 2-GPU nodes, one with a GPU taken (and its CPU): kube-default sends a 1-GPU pod to an
    untouched node; with 2-GPU pods to come, the search fills the half-used node instead."""
    st_ = state(cpu=[32000] * 3, gpu=[2, 2, 2])
    st_.allocate(0, whole(1, cpu=16000, mem=1024), (0,))
    p = whole(1, cpu=1000, mem=1024)
    train = pod_table([(1000, 1024, 2, 1000)])
    rng = np.random.default_rng(0)
    assert place(make_scheduler("kube-default"), st_, p, rng).node != 0
    pl = place(search("kube-default", train, horizon=2), st_, p, rng)
    assert pl.node == 0 and pl.gpus == (1,)


def snapshot(s: ClusterState) -> dict[str, np.ndarray]:
    return {k: getattr(s, k).copy() for k in (*ClusterState.ROW_FIELDS, "version")}


@settings(max_examples=60, deadline=None)
@given(state_=clusters(), arrivals=st.lists(pods(kinds=("cpu", "share", "whole")), min_size=1, max_size=6),
       base=st.sampled_from(["fgd", "kube-default", "best-fit"]), horizon=st.integers(0, 4),
       seed=st.integers(0, 2**16))
def test_the_live_state_is_never_written_and_the_shadow_tracks_it(state_, arrivals, base, horizon, seed):
    """Over a run of arrivals bound one by one: scoring leaves every per-node array of the live state
    as it was (versions too), the placement is valid, and the shadow equals the live state."""
    s = search(base, TRAIN, horizon=horizon, candidates=3, futures=2, seed=seed)
    rng = np.random.default_rng(seed)
    for p in arrivals:
        before = snapshot(state_)
        pl = place(s, state_, p, rng)
        for k, v in before.items():
            np.testing.assert_array_equal(getattr(state_, k), v, err_msg=k)
        if pl.node < 0:
            assert not state_.feasible(p).any()
            continue
        assert state_.feasible(p)[pl.node]
        check_gpus(state_, p, pl.node, pl.gpus)
        state_.allocate(pl.node, p, pl.gpus)
        shadow = s._sync(state_)
        for k in ClusterState.ROW_FIELDS:
            np.testing.assert_array_equal(getattr(shadow, k), getattr(state_, k), err_msg=k)


def test_a_packing_run_is_a_function_of_its_seed():
    """A small packing run through the simulator: the same seeds give the same run, and the search
    searched (its counters) and placed every pod it could."""
    table = nodes(cpu=[32000] * 6 + [96000] * 2, mem=[1 << 18] * 8, gpu=[8, 8, 4, 4, 2, 2, 0, 0])
    pool = pod_table([(4000, 8192, 1, 500), (8000, 16384, 1, 1000), (2000, 4096, 0, 0),
                      (16000, 32768, 2, 1000), (1000, 2048, 1, 250)] * 8)
    runs = []
    for _ in range(2):
        s = make_scheduler("lookahead:fgd", SchedulerContext(train_pods=pool))
        res = run_packing(table, pool, s, target_load=1.3, seed=3)
        runs.append(res.placements.tolist())
        assert s.searched > 0 and 0 < res.metrics["gpu_alloc_at_target"] <= 100
    assert runs[0] == runs[1]


def test_a_node_the_pod_does_not_fit_is_refused_and_the_shadow_stays_true():
    """A caller that breaks the contract (a candidate the pod does not fit) gets allocate()'s
    refusal, and the search's shadow state still equals the live state afterwards."""
    st_ = ClusterState(nodes(cpu=[4000, 8000, 8000], mem=[1 << 16] * 3), use_source=USE_REQUESTS)
    s = search("kube-default", pod_table([(2000, 1024, 0, 0)]), horizon=2)
    big = pod(cpu=6000, mem=1024)
    with pytest.raises(AssertionError, match="over-allocated"):
        s.score(st_, big, np.array([0, 1, 2]))
    shadow = s._sync(st_)
    for k in ClusterState.ROW_FIELDS:
        np.testing.assert_array_equal(getattr(shadow, k), getattr(st_, k), err_msg=k)
    assert place(s, st_, big, np.random.default_rng(0)).node in (1, 2)


@pytest.mark.parametrize("text,names", [
    ("fgd,kube-default", ["fgd", "kube-default"]),
    (" fgd , ,lookahead:fgd,", ["fgd", "lookahead:fgd"]),
    ("fgd,lookahead[candidates=8,horizon=20]:fgd,best-fit",
     ["fgd", "lookahead[candidates=8,horizon=20]:fgd", "best-fit"]),
    ("", []),
])
def test_a_list_of_names_splits_outside_brackets(text, names):
    assert split_names(text) == names


@pytest.mark.parametrize("text,msg", [("lookahead[candidates=8,fgd", "'\\[' without its '\\]'"),
                                      ("fgd],best-fit", "'\\]' without its '\\['")])
def test_a_list_with_unbalanced_brackets_is_refused(text, msg):
    with pytest.raises(ValueError, match=msg):
        split_names(text)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 64), st.integers(0, 1000), st.integers(1, 64), st.integers(0, 2**40))
def test_the_arguments_spec_reads_back_as_the_same_arguments(candidates, horizon, futures, seed):
    args = LookaheadArgs(candidates=candidates, horizon=horizon, futures=futures, seed=seed)
    assert parse_args(args.spec()) == args
    assert parse_args(" , ".join(reversed(args.spec().split(",")))) == args  # any order, spaces


@pytest.mark.parametrize("text,msg", [
    ("depth=3", "'depth=3' is not key=value"), ("candidates", "'candidates' is not key=value"),
    ("horizon=1e3", "horizon must be an integer"), ("seed=" + "9" * 5000, "seed must be an integer"),
    ("futures=1,futures=1", "futures is given twice"), ("candidates=65", "out of range"),
])
def test_bad_arguments_are_refused_saying_which(text, msg):
    with pytest.raises(ValueError, match=msg):
        parse_args(text)


def test_a_search_over_a_checkpoint_path_resolves_to_the_search(tmp_path):
    """``lookahead:<path>.pt`` names the search over the checkpoint (the evidence of ``fedsched serve
    --search``), not a checkpoint file of that name."""
    from fedsched.common.schedulers import default_policy_path

    path = default_policy_path("learned")
    s = make_scheduler(f"lookahead[horizon=2]:{path}", SchedulerContext(train_pods=TRAIN))
    assert isinstance(s, Lookahead) and s.args == LookaheadArgs(horizon=2)
    with pytest.raises(ValueError, match="no such checkpoint"):
        make_scheduler(f"lookahead:{tmp_path / 'missing.pt'}", SchedulerContext(train_pods=TRAIN))


def test_a_new_pool_and_a_reseed_change_only_what_they_say():
    """set_pool: the arrivals come from the new pods (and an empty pool is refused); reseed: the
    draws are a function of (seed, key), whatever came before."""
    table = nodes(cpu=[32000] * 4, mem=[1 << 18] * 4, gpu=[8, 8, 4, 2])
    st_ = ClusterState(table, use_source=USE_REQUESTS)
    small = pod_table([(1000, 2048, 1, 250)] * 4)
    s = search("fgd", small, horizon=3, candidates=4)
    assert s.pool is small
    big = pod_table([(16000, 32768, 4, 1000)] * 3)
    s.set_pool(big)
    assert s.pool is big and s._arrival(0).num_gpu == 4 and list(s.typical.num_gpu) == [4]
    with pytest.raises(ValueError, match="pods to draw its arrivals from"):
        s.set_pool(pod_table([]))
    assert s.pool is big
    p = pod(cpu=2000, mem=1024, num_gpu=1, gpu_milli=500)
    s.set_pool(small)
    s.reseed(7)
    first = s._rng.integers(1 << 30, size=4).tolist()
    s.score(st_, p, np.arange(4))
    s.reseed(7)
    assert s._rng.integers(1 << 30, size=4).tolist() == first
    s.reseed(8)
    assert s._rng.integers(1 << 30, size=4).tolist() != first


def test_the_shadow_takes_measured_use_that_moves_without_a_version():
    """A serving agent's telemetry sets a node's measured use without moving its version: the
    rollouts still see the use of now, not the use of when the shadow was made."""
    st_ = ClusterState(nodes(cpu=[32000] * 3, mem=[1 << 18] * 3, gpu=[8, 8, 4]), use_source=USE_REQUESTS)
    s = search("kube-default", pod_table([(1000, 2048, 0, 0)] * 4), horizon=2)
    s._sync(st_)
    version = st_.version.copy()
    st_.set_measured_use(1, cpu=30000.0, mem=1000.0)
    assert (st_.version == version).all()
    shadow = s._sync(st_)
    for k in ClusterState.ROW_FIELDS:
        np.testing.assert_array_equal(getattr(shadow, k), getattr(st_, k), err_msg=k)
