"""What a policy closes of the oracle's gap to the best heuristic (``bench/oracle_gap.py``), from
stored online-benchmark results, the oracle's and the policy's possibly from two runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.paths import bench_module

BASE = {"hot_cpu_node_s": 100_000.0, "throttled_cpu_core_s": 50_000.0, "oom_kills_per_1k_starts": 4.0,
        "failed_pods": 200.0, "pending_p99_s": 100.0, "util_variance": 257.3}


@pytest.fixture(scope="module")
def og():
    with bench_module("oracle_gap") as module:
        yield module


def _runs(factors: dict[str, dict[str, float]], seeds: int = 12, noise: int = 3) -> dict:
    """Per scheduler and seed, a per-seed workload level (the same for every scheduler of a seed)
    times the scheduler's factor per metric, with a little noise of the scheduler's own."""
    levels = np.random.default_rng(7).uniform(0.5, 2.0, seeds)
    rng = np.random.default_rng(noise)
    return {p: {str(42 + s): {m: v * levels[s] * f.get(m, 1.0) * (1.0 if p == "kube-default"
                                                                   else rng.uniform(0.98, 1.02))
                              for m, v in BASE.items()} for s in range(seeds)}
            for p, f in factors.items()}


def _write(path, runs: dict) -> str:
    """``runs`` as ``bench/online_quality.py --json`` stores them (NaN as null)."""
    clean = {p: {s: {m: (None if isinstance(v, float) and math.isnan(v) else v) for m, v in r.items()}
                 for s, r in per.items()} for p, per in runs.items()}
    path.write_text(json.dumps({"benchmark": "online_quality", "provenance": {"machine": {"cpu_model": "test",
                                                                                          "cpus": 2}},
                                "scenarios": {"web": {"result": {"runs": clean}}}}))
    return str(path)


def test_the_share_is_the_policys_log_gain_over_the_oracles(og):
    runs = _runs({"kube-default": {}, "target-load-packing": {"hot_cpu_node_s": 1.3},
                  "oracle": {"hot_cpu_node_s": 0.5}, "learned-online": {"hot_cpu_node_s": 0.75}})
    g = og.gap(runs, "learned-online")
    assert g["best_heuristic"] == "kube-default" and g["seeds"] == 12
    for key in ("trouble_score", "hot_cpu_node_s"):  # only hot node-time moves: the same share
        s = g["figures"][key]["share"]
        assert s["share"] == pytest.approx(math.log(0.75) / math.log(0.5), abs=0.03)
        assert s["lo"] < s["share"] < s["hi"] and s["hi"] - s["lo"] < 0.2 and s["n"] == 12
        assert g["figures"][key]["policy_vs_oracle"]["verdict"] == "worse"  # short of the oracle
    assert g["figures"]["throttled_cpu_core_s"]["share"] is None  # nothing to close where the oracle ties


def test_no_share_where_the_oracle_is_not_better_than_the_best_heuristic(og):
    runs = _runs({"kube-default": {}, "target-load-packing": {"hot_cpu_node_s": 0.6},
                  "oracle": {"hot_cpu_node_s": 0.9}, "learned-online": {"hot_cpu_node_s": 0.5}})
    g = og.gap(runs, "learned-online")
    assert g["best_heuristic"] == "target-load-packing"
    assert all(f["share"] is None for f in g["figures"].values())
    assert g["figures"]["trouble_score"]["policy_vs_oracle"]["verdict"] == "better"
    assert og.line("web", g).count("no gap to close") == 5


def test_the_policy_comes_from_the_second_file_and_the_oracle_from_the_first(og, tmp_path, capsys):
    first = _runs({"kube-default": {}, "oracle": {"hot_cpu_node_s": 0.5},
                   "learned-online": {"hot_cpu_node_s": 1.5}})  # an older policy of the same name
    second = _runs({"kube-default": {}, "learned-online": {"hot_cpu_node_s": 0.75}}, seeds=10, noise=4)
    kd = second["kube-default"]["42"]
    kd["util_variance"] = math.nextafter(kd["util_variance"], math.inf)  # a last bit another machine moves
    out = tmp_path / "gap.json"
    og.main(["--pair", _write(tmp_path / "a.json", first), _write(tmp_path / "b.json", second),
             "--json", str(out)])
    got = json.loads(out.read_text())["scenarios"]["web"]
    assert got["seeds"] == 10  # the seeds both files hold
    hot = got["figures"]["hot_cpu_node_s"]["share"]["share"]
    assert hot == pytest.approx(math.log(0.75) / math.log(0.5), abs=0.03)
    assert "closes" in capsys.readouterr().out


@pytest.mark.parametrize(("change", "fault"), [
    (lambda r: r["kube-default"]["43"].update(hot_cpu_node_s=1.0), "kube-default seed 43: hot_cpu_node_s"),
    (lambda r: r.pop("learned-online"), "the second file has no learned-online runs"),
    (lambda r: r.update({"learned-online": {str(int(k) + 100): v for k, v in r["learned-online"].items()}}),
     "the two files share no seed"),
])
def test_files_that_did_not_replay_the_same_workloads_are_refused(og, tmp_path, capsys, change, fault):
    first = _runs({"kube-default": {}, "oracle": {"hot_cpu_node_s": 0.5}})
    second = _runs({"kube-default": {}, "learned-online": {"hot_cpu_node_s": 0.75}})
    change(second)
    with pytest.raises(SystemExit) as e:
        og.main(["--pair", _write(tmp_path / "a.json", first), _write(tmp_path / "b.json", second)])
    assert e.value.code == 2 and fault in capsys.readouterr().err


def test_a_file_that_is_not_a_benchmark_result_is_refused(og, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"benchmark": "federation"}))
    with pytest.raises(SystemExit):
        og.main(["--pair", str(bad), str(bad)])
    assert "not a bench/online_quality.py --json result" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["kube-default", "koordinator-load-aware", "oracle"])
def test_a_heuristic_or_the_oracle_is_not_a_policy_to_measure(og, tmp_path, capsys, policy):
    first = _write(tmp_path / "a.json", _runs({"kube-default": {}, "oracle": {"hot_cpu_node_s": 0.5}}))
    with pytest.raises(SystemExit):
        og.main(["--pair", first, first, "--policy", policy])
    assert "is what a policy is measured against" in capsys.readouterr().err
