"""Serving decisions and their outcomes go to the decision log, which the ClientApp learns from."""

from __future__ import annotations

import math
import time

import numpy as np

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.agent.federation.learners import LogFinetuneLearner
from fedsched.agent.federation.round import MemberState, RoundInfo
from fedsched.agent.serving.outcomes import OutcomeRecorder
from fedsched.common.federation.weights import load_npz, weights_of
from fedsched.common.learning.checkpoint import load_checkpoint
from fedsched.common.learning.decision_log import DecisionLog
from fedsched.common.learning.features import NODE_FEATURES
from fedsched.common.model.cluster import Pod
from fedsched.common.model.traces import builtin_trace, load_nodes
from fedsched.common.schedulers import default_policy_path
from tests.extender_support import running, snapshot


def test_decisions_are_logged_with_their_outcome_after_the_horizon(tmp_path):
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv")).select(np.arange(40))
    cache = ClusterCache.from_table(nodes)
    cache.apply_telemetry(snapshot({n: (0.3, 0.3) for n in nodes.names}))
    clock = [time.time()]
    with running(cache) as (server, c):
        rec = OutcomeRecorder(server.decider, tmp_path / "log", horizon_s=60, clock=lambda: clock[0])
        names = list(nodes.names)
        bound = []
        for i in range(12):
            pod = pod_to_json(Pod(-1, 2000, 4096, 0, 0, 0, 1), f"p{i}", uid=f"u{i}")
            pod["metadata"]["creationTimestamp"] = time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock[0] - 5)
            )
            _, out = c.post("prioritize", {"Pod": pod, "NodeNames": names})
            best = max(out, key=lambda h: h["Score"])["Host"]
            # the last pod goes elsewhere than the policy said (kube's choice wins in the log)
            node = best if i < 11 else next(h["Host"] for h in out if h["Host"] != best)
            assert c.post(
                "bind", {"PodName": f"p{i}", "PodNamespace": "d", "PodUID": f"u{i}", "Node": node}
            ) == (200, {"Error": ""})
            bound.append(node)
        assert rec.tick() == 0  # nothing is due before the horizon
        hot = bound[0]
        cache.apply_telemetry(snapshot({n: (0.97 if n == hot else 0.3, 0.3) for n in names}))  # overload
        cache.record_oom(hot)
        clock[0] += 61
        assert rec.tick() == 12
        rec.stop()
    records = DecisionLog(tmp_path / "log").tail_records(100)
    assert len(records) == 12
    for r, node in zip(records, bound, strict=True):
        assert r.decision.nodes.shape[1] == len(NODE_FEATURES)
        assert r.model_version == server.decider.models.version
        assert 4 < r.reward["pending_s"] < 10 and r.reward["observed_s"] >= 60
        assert r.reward["overload"] == float(node == hot) and r.reward["oom"] == float(node == hot)
        assert not math.isnan(r.reward["cpu_util"])
    # the deployed ClientApp's local update learns from this very log
    policy, _, _ = load_checkpoint(default_policy_path())
    start = weights_of(policy)
    learner = LogFinetuneLearner(str(tmp_path / "log"), window=100, epochs=2, learning_rate=1e-3)
    learned = learner.learn(start, start, MemberState(tmp_path / "state"), RoundInfo(server_round=1, seed=0))
    new, n = learned.weights, learned.examples
    assert n == 12 and any(not np.array_equal(new[k], start[k]) for k in start)
    assert load_npz(tmp_path / "missing.npz") is None


def test_pending_decisions_are_bounded_and_flushed_on_stop(tmp_path):
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv")).select(np.arange(10))
    cache = ClusterCache.from_table(nodes)
    with running(cache) as (server, c):
        rec = OutcomeRecorder(server.decider, tmp_path / "log", horizon_s=3600, max_pending=5)
        for i in range(8):
            pod = pod_to_json(Pod(-1, 100, 100, 0, 0, 0, 1), f"p{i}", uid=f"u{i}")
            _, out = c.post("prioritize", {"Pod": pod, "NodeNames": list(nodes.names)})
            if i >= 6:
                c.post(
                    "bind",
                    {"PodName": f"p{i}", "PodNamespace": "d", "PodUID": f"u{i}", "Node": out[0]["Host"]},
                )
        assert len(rec.waiting) == 5 and rec.dropped == 3
        rec.stop()  # the two bound ones are written with what was seen so far
    records = DecisionLog(tmp_path / "log").tail_records(10)
    assert len(records) == 2 and all(r.reward["observed_s"] < 60 for r in records)
