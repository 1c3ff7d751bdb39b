"""Credit regression's pricing and batching (``agent/learning/credit.py``) and the online
recipe's collection (``agent/learning/online.py``): the trouble-priced node credit is the
first-order change of the trouble score, size-bucketed batches cover every decision once, and
parallel collection gives the same decisions for the same recipe."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.agent.learning.credit import size_bucketed_batches, trouble_weights
from fedsched.agent.learning.online import (
    OnlineRecipe,
    build_envs,
    collect_parallel,
    price_trouble,
    profile_parameters,
    reference_typical,
)
from fedsched.common.learning.scorers import scoring_metadata
from fedsched.common.model.metrics import trouble_score

_METRICS = {"hot_cpu_node_s": 1e6, "throttled_cpu_core_s": 1e6, "oom_kills_per_1k_starts": 50.0,
            "failed_pods": 1000.0}


@settings(max_examples=60, deadline=None)
@given(hot=st.floats(0, 1e6), thr=st.floats(0, 1e6), oom=st.floats(0, 50), failed=st.floats(0, 1000),
       decisions=st.integers(1, 100_000), starts=st.integers(1, 100_000))
def test_trouble_priced_credit_is_the_first_order_change_of_the_trouble_score(hot, thr, oom, failed,
                                                                             decisions, starts):
    ref = {"hot_cpu_node_s": hot, "throttled_cpu_core_s": thr, "oom_kills_per_1k_starts": oom,
           "failed_pods": failed}
    w = trouble_weights(ref, decisions, starts)
    # one decision adding a hot node-minute, a throttled core-minute or one OOM kill
    cases = [("hot_cpu_node_s", 60.0, w["node_hot"]), ("throttled_cpu_core_s", 60.0, w["node_throttled"]),
             ("oom_kills_per_1k_starts", 1000.0 / starts, w["node_oom"])]
    for metric, dx, weight in cases:
        eps = 1e-6  # a small step: the score's derivative, not its curvature
        moved = dict(ref, **{metric: ref[metric] + eps * dx})
        slope = trouble_score(moved, ref) / eps
        assert weight / decisions == pytest.approx(slope, rel=1e-3, abs=1e-12)


def test_a_rare_trouble_costs_more_than_a_common_one():
    # small edge nodes: little throttling, much hot node-time -> a throttled core-minute is dear
    w = trouble_weights({"hot_cpu_node_s": 90_000.0, "throttled_cpu_core_s": 2_000.0,
                         "oom_kills_per_1k_starts": 0.2}, 10_000, 10_000)
    assert w["node_throttled"] > 40 * w["node_hot"]
    # GPU nodes' CPU-side work: throttling everywhere -> a throttled core-minute is cheap
    w = trouble_weights({"hot_cpu_node_s": 100_000.0, "throttled_cpu_core_s": 1.8e6,
                         "oom_kills_per_1k_starts": 4.6}, 4_000, 4_000)
    assert w["node_throttled"] < w["node_hot"] / 10


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 400), min_size=1, max_size=3000), batch=st.integers(1, 64),
       seed=st.integers(0, 2**31))
def test_size_bucketed_batches_cover_every_decision_once(sizes, batch, seed):
    s = np.array(sizes)
    batches = size_bucketed_batches(s, batch, np.random.default_rng(seed))
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(len(s)))
    assert all(1 <= len(b) <= batch for b in batches)


def test_size_bucketed_batches_pad_far_less_than_random_ones():
    rng = np.random.default_rng(0)
    sizes = np.exp(rng.uniform(math.log(10), math.log(300), 20_000)).astype(int)

    def padded(batches: list[np.ndarray]) -> int:
        return sum(len(b) * int(sizes[b].max()) for b in batches)

    perm = rng.permutation(len(sizes))
    random = [perm[i:i + 256] for i in range(0, len(perm), 256)]
    bucketed = size_bucketed_batches(sizes, 256, rng)
    assert padded(bucketed) < 0.6 * padded(random)
    assert padded(bucketed) >= int(sizes.sum())


def test_realistic_training_clusters_span_an_order_of_magnitude():
    rng = np.random.default_rng(5)
    for profile, lo, hi in (("web", 30, 320), ("gpu", 20, 160), ("edge", 10, 80)):
        n = [profile_parameters(profile, rng)["n_nodes"] for _ in range(200)]
        assert lo <= min(n) and max(n) <= hi
        assert max(n) / min(n) > 5
    slices = [profile_parameters("openb", rng)["slice"] for _ in range(200)]
    assert min(slices) >= 60 and max(slices) <= 300
    with pytest.raises(ValueError, match="unknown training scale"):
        profile_parameters("web", rng, "huge")


def _tiny(workers: int) -> OnlineRecipe:
    r = OnlineRecipe(profiles=("web", "edge"), clusters_per_profile=2, scale="small", workers=workers,
                     validate=False)
    r.credit.samples = 400
    return r


def test_pricing_gives_each_environment_its_own_weights():
    recipe = _tiny(1)
    typical = reference_typical(recipe)
    envs, _ = build_envs(recipe, typical, recipe.reward)
    weights = price_trouble(envs, typical)
    assert len(weights) == len(envs) == 4
    for env, w in zip(envs, weights, strict=True):
        assert env.cfg.reward.node_hot == w["node_hot"] > 0
        assert env.cfg.reward.node_throttled == w["node_throttled"] > 0
        assert env.cfg.reward.node_horizon_s == recipe.reward.node_horizon_s
    assert len({round(w["node_throttled"] / w["node_hot"], 9) for w in weights}) > 1


@pytest.fixture(scope="module")
def two_workers() -> list:
    return collect_parallel(_tiny(2), log=lambda m: None)


def test_parallel_collection_is_reproducible_and_fills_the_quota(two_workers):
    a, b = two_workers, collect_parallel(_tiny(2), log=lambda m: None)
    assert len(a) == len(b) == 400
    assert [c.credit for c in a] == [c.credit for c in b]
    assert [c.chosen for c in a] == [c.chosen for c in b]
    assert any(c.credit < 0 for c in a)


def test_ray_tasks_collect_what_the_processes_collect(two_workers):
    import ray

    recipe = _tiny(2)
    recipe.engine = "ray"
    try:
        got = collect_parallel(recipe, log=lambda m: None)
    finally:
        ray.shutdown()
    assert [c.credit for c in got] == [c.credit for c in two_workers]
    assert [c.chosen for c in got] == [c.chosen for c in two_workers]


def test_the_daily_peak_falls_inside_a_training_episode():
    from fedsched.agent.learning.online import PEAK_HOUR, profile_cluster

    rng = np.random.default_rng(11)
    for profile in ("web", "gpu", "edge"):
        p = profile_parameters(profile, rng)
        assert 0.25 * p["trace_hours"] <= p[PEAK_HOUR] <= 0.85 * p["trace_hours"]
    p = profile_parameters("web", np.random.default_rng([4, len("web")]))
    _, _, replay = profile_cluster("web", 4)
    assert replay["usage_peak_hour"][1:] == pytest.approx((p[PEAK_HOUR],) * 3)
    assert replay["usage_peak_hour"][0] == pytest.approx((p[PEAK_HOUR] - 12.0) % 24.0)


def test_several_tie_weights_need_the_validation_that_chooses_between_them(tmp_path):
    from fedsched.agent.learning.online import train

    recipe = _tiny(1)
    recipe.tie_weights = (0.3, 1.0)
    with pytest.raises(ValueError, match="several tie weights"):
        train(recipe, tmp_path / "run")


def _refusal(capsys, tmp_path, *flags: str) -> str:
    """``online.main`` with ``flags`` must refuse them (exit through argparse): its stderr."""
    from fedsched.agent.learning import online

    with pytest.raises(SystemExit):
        online.main(["--out", str(tmp_path), *flags])
    return capsys.readouterr().err.strip()


def _recipe_parser(monkeypatch, tmp_path):
    """``parse(*flags)``: the recipe ``online.main`` builds from ``flags`` (with ``--no-validate``),
    its training replaced so that nothing runs; the command must succeed."""
    from fedsched.agent.learning import online

    seen = {}

    def fake_train(recipe, out, **_):
        seen["recipe"] = recipe
        return {"checkpoint": str(out / "checkpoint.pt"), "samples": 0, "wall_s": 0.0}

    monkeypatch.setattr(online, "train", fake_train)

    def parse(*flags: str):
        assert online.main(["--out", str(tmp_path), *flags, "--no-validate"]) == 0
        return seen["recipe"]

    return parse


def test_the_credit_horizon_flag_reaches_the_recipe_and_its_reproduce_command(monkeypatch, capsys, tmp_path):
    from fedsched.agent.learning import online

    parse = _recipe_parser(monkeypatch, tmp_path)
    recipe = parse("--horizon", "7200")
    assert recipe.reward.node_horizon_s == 7200.0
    assert online._collection_key(recipe)["horizon_s"] == 7200.0  # kept decisions are per horizon
    assert "--horizon 7200" in online._flags(recipe)
    assert parse().reward.node_horizon_s == 1800.0  # the default: 30 minutes
    for bad in ("0", "-5", "nan"):
        assert "--horizon" in _refusal(capsys, tmp_path, "--horizon", bad)


def test_the_throttle_credit_flag_reaches_the_recipe_its_data_key_and_its_reproduce_command(
        monkeypatch, capsys, tmp_path):
    from fedsched.agent.learning import online

    parse = _recipe_parser(monkeypatch, tmp_path)
    node = parse()
    assert node.reward.throttle_credit == "node"  # the default: today's credit
    assert "throttle_credit" not in online._collection_key(node)  # decisions kept before still match
    assert "--throttle-credit node" in online._flags(node)
    pod = parse("--throttle-credit", "pod", "--horizon", "7200")
    assert pod.reward.throttle_credit == "pod" and pod.reward.node_horizon_s == 7200.0
    assert online._collection_key(pod)["throttle_credit"] == "pod"  # kept decisions are per credit
    assert online._collection_key(pod) != online._collection_key(replace(pod, reward=node.reward))
    assert "--throttle-credit pod" in online._flags(pod)
    typical = online.reference_typical(_tiny(1))
    envs, _ = online.build_envs(replace(_tiny(1), reward=pod.reward), typical, pod.reward, only=[0])
    assert envs[0].cfg.reward.throttle_credit == "pod"  # reaches the environments
    for bad in ("cluster", "Pod", ""):
        err = _refusal(capsys, tmp_path, "--throttle-credit", bad).splitlines()
        assert "--throttle-credit: expected node or pod" in err[-1]


def test_the_hot_memory_credit_flag_reaches_the_recipe_its_data_key_and_its_reproduce_command(
        monkeypatch, capsys, tmp_path):
    from fedsched.agent.learning import online

    parse = _recipe_parser(monkeypatch, tmp_path)
    unpriced = parse()
    assert unpriced.reward.node_hot_mem == 0.0  # the default: the credit as before
    assert "hot_mem_credit" not in online._collection_key(unpriced)  # decisions kept before still match
    priced = parse("--hot-mem-credit", "0.4")
    assert priced.reward.node_hot_mem == 0.4
    assert online._collection_key(priced)["hot_mem_credit"] == 0.4  # kept decisions are per price
    assert "--hot-mem-credit 0.4" in online._flags(priced)
    for bad in ("-0.1", "nan", "inf"):
        err = _refusal(capsys, tmp_path, "--hot-mem-credit", bad)
        assert "--hot-mem-credit: expected a finite number >= 0" in err


def test_the_oom_credit_and_price_flags_reach_the_recipe_its_data_key_and_its_reproduce_command(
        monkeypatch, capsys, tmp_path):
    from fedsched.agent.learning import online

    parse = _recipe_parser(monkeypatch, tmp_path)
    plain = parse()
    assert plain.reward.oom_credit == "pod" and plain.reward.node_oom == 2.0  # the defaults: as before
    assert not {"oom_credit", "oom_price"} & set(online._collection_key(plain))  # kept decisions match
    node = parse("--oom-credit", "node", "--credit-weights", "fixed", "--oom-price", "10")
    assert node.reward.oom_credit == "node" and node.reward.node_oom == 10.0
    key = online._collection_key(node)
    assert key["oom_credit"] == "node" and key["oom_price"] == 10.0  # kept decisions are per credit
    assert "--oom-credit node" in online._flags(node) and "--oom-price 10" in online._flags(node)
    typical = online.reference_typical(_tiny(1))
    envs, _ = online.build_envs(replace(_tiny(1), reward=node.reward), typical, node.reward, only=[0])
    assert envs[0].cfg.reward.oom_credit == "node"  # reaches the environments
    fixed = ["--credit-weights", "fixed"]
    for argv, message in ((["--oom-credit", "cluster"], "--oom-credit: expected pod or node"),
                          (["--oom-credit", ""], "--oom-credit: expected pod or node"),
                          (["--oom-price", "-1", *fixed], "--oom-price: expected a finite"),
                          (["--oom-price", "nan", *fixed], "--oom-price: expected a finite"),
                          (["--oom-price", "5", "--credit-weights", "trouble"], "--oom-price: only with")):
        assert message in _refusal(capsys, tmp_path, *argv).splitlines()[-1]


def test_the_memory_use_range_draws_each_training_clusters_level_and_moves_nothing_else(
        monkeypatch, capsys, tmp_path):
    from fedsched.agent.learning import online

    parse = _recipe_parser(monkeypatch, tmp_path)
    plain = parse()
    assert plain.mem_use_range is None  # the default: the usage model's calibrated level
    assert "mem_use_range" not in online._collection_key(plain)  # decisions kept before still match
    assert "--mem-use-range" not in " ".join(online._flags(plain))
    ranged = parse("--mem-use-range", "0.2,0.7")
    assert ranged.mem_use_range == (0.2, 0.7)
    assert online._collection_key(ranged)["mem_use_range"] == [0.2, 0.7]  # kept decisions are per range
    assert "--mem-use-range 0.2,0.7" in online._flags(ranged)
    typical = online.reference_typical(_tiny(1))
    base, _ = online.build_envs(_tiny(1), typical)
    drawn, _ = online.build_envs(replace(_tiny(1), mem_use_range=(0.2, 0.7)), typical)
    levels = [env.cfg.replay["usage_mem_median"] for env in drawn]
    assert all(len(set(lv)) == 1 and 0.2 <= lv[0] <= 0.7 for lv in levels)  # every class alike, in range
    assert len({lv[0] for lv in levels}) == len(levels)  # a level per cluster
    for b, d in zip(base, drawn, strict=True):  # the same clusters, pods and loads: only the level moved
        assert "usage_mem_median" not in b.cfg.replay
        assert {k: v for k, v in d.cfg.replay.items() if k != "usage_mem_median"} == b.cfg.replay
        assert np.array_equal(b.pool.cpu, d.pool.cpu)
        assert np.array_equal(b.cluster_nodes.mem, d.cluster_nodes.mem)
    again, _ = online.build_envs(replace(_tiny(1), mem_use_range=(0.2, 0.7)), typical)
    assert [env.cfg.replay["usage_mem_median"] for env in again] == levels  # reproducible
    for bad in ("0.7,0.2", "0,0.5", "nan,1", "0.3", "a,b", "0.2,0.5,0.7", "0.5,inf", "1,1e300", "-1,1"):
        err = _refusal(capsys, tmp_path, f"--mem-use-range={bad}").splitlines()
        assert "--mem-use-range: expected LO,HI" in err[-1]


def _credited(credits: list[float], ties: list[float] | None = None) -> list:
    from fedsched.agent.learning.credit import Credited

    ties = ties or [0.0] * len(credits)
    return [Credited(decision=None, chosen=0, credit=c, tie=t) for c, t in zip(credits, ties, strict=True)]


def test_the_mean_target_ranks_nodes_by_their_expected_cost_the_log_target_does_not():
    from fedsched.agent.learning.credit import targets

    # node A: a steady cost of 1 per decision; node B: cost 0 nine times in ten, 10 once (same mean)
    # plus a little more, so B is the worse node by the expected cost the benchmark's totals add up
    steady, risky = [-1.0] * 10, [0.0] * 9 + [-10.5]
    for target, risky_looks_better in (("log", True), ("mean", False)):
        a, b = targets(_credited(steady), 0.0, target).mean(), targets(_credited(risky), 0.0, target).mean()
        assert (b > a) == risky_looks_better, target
    np.testing.assert_allclose(targets(_credited(risky), 0.0, "mean"), risky)


@settings(max_examples=50, deadline=None)
@given(credits=st.lists(st.floats(-1e4, 1.0), min_size=1, max_size=20), tie=st.floats(0, 2),
       weight=st.floats(0, 1))
def test_both_targets_keep_the_order_of_the_costs_and_add_the_same_tie(credits, tie, weight):
    from fedsched.agent.learning.credit import targets

    data = _credited(credits, [tie] * len(credits))
    order = np.argsort(np.minimum(credits, 0.0), kind="stable")
    for target in ("log", "mean"):
        y = targets(data, weight, target).astype(np.float64)
        assert np.all(np.diff(y[order]) >= -1e-6 * (1 + np.abs(y[order][1:])))
        bare = targets(_credited(credits), 0.0, target).astype(np.float64)
        np.testing.assert_allclose(y - bare, weight * tie, rtol=1e-4, atol=1e-3)


def test_an_unknown_credit_target_is_refused_and_the_flag_reaches_the_recipe(monkeypatch, capsys, tmp_path):
    from fedsched.agent.learning import online
    from fedsched.agent.learning.credit import targets

    with pytest.raises(ValueError, match="unknown credit target 'median'"):
        targets(_credited([-1.0]), 0.3, "median")
    parse = _recipe_parser(monkeypatch, tmp_path)
    assert parse().credit.target == "log"  # the default: the shipped policy's fit
    recipe = parse("--credit-target", "mean")
    assert recipe.credit.target == "mean" and "--credit-target mean" in online._flags(recipe)
    assert "target" not in online._collection_key(recipe)  # a fit choice: kept decisions serve both
    assert "--credit-target" in _refusal(capsys, tmp_path, "--credit-target", "median")


def test_the_kube_weight_flag_reaches_the_recipe_and_its_reproduce_command(monkeypatch, capsys, tmp_path):
    from fedsched.agent.learning import online

    parse = _recipe_parser(monkeypatch, tmp_path)
    weight = parse().kube_weight
    assert weight == 0.0 and scoring_metadata(weight) == {}  # the logits alone
    recipe = parse("--kube-weight", "1")
    assert scoring_metadata(recipe.kube_weight) == {"kube_weight": 1.0}
    assert "--kube-weight 1" in online._flags(recipe)
    assert "kube_weight" not in online._collection_key(recipe)  # a scoring choice: kept decisions serve both
    for bad in ("-1", "nan", "inf", "1e308"):
        err = _refusal(capsys, tmp_path, "--kube-weight", bad)
        assert "--kube-weight: expected a number in [0, 1e+06]" in err


def test_a_trained_checkpoint_is_scored_with_its_recipes_kube_weight(tmp_path):
    from fedsched.agent.learning.online import train
    from fedsched.common.learning.checkpoint import load_checkpoint
    from fedsched.common.schedulers import make_scheduler

    recipe = replace(_tiny(1), kube_weight=0.7, credit_weights="fixed")
    recipe.credit.samples, recipe.credit.epochs = 200, 1
    summary = train(recipe, tmp_path / "run", log=lambda m: None)
    _, meta, _ = load_checkpoint(summary["checkpoint"])
    assert meta["scoring"] == {"kube_weight": 0.7} and "--kube-weight 0.7" in meta["recipe"]
    assert make_scheduler(summary["checkpoint"]).kube_weight == 0.7
