"""The agent's cluster cache fed with API-server JSON (NodeList / PodList, watch-style updates).

No API server can run here (kube-apiserver is not obtainable from the package registries), so
the cache is tested with Kubernetes API objects in the wire format (tests/data/k8s/) and, in
test_k8s_watch.py, through the official client against a local server speaking the API.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import numpy as np
import pytest

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.agent.cluster.telemetry import NodeUsage
from fedsched.common.model.cluster import Pod
from fedsched.common.schedulers import KoordinatorLoadAware, LoadVariationRiskBalancing
from tests.extender_support import snapshot
from tests.paths import TEST_DATA

K8S = TEST_DATA / "k8s"


@pytest.fixture
def objects() -> tuple[list[dict], list[dict]]:
    return (
        json.loads((K8S / "nodes.json").read_text())["items"],
        json.loads((K8S / "pods.json").read_text())["items"],
    )


def _ids(cache: ClusterCache, name: str) -> int:
    return cache.index[name]


def test_full_resync_counts_bound_running_pods_only(objects):
    nodes, pods = objects
    cache = ClusterCache()
    cache.replace_all(nodes, pods)
    assert cache.synced and len(cache.index) == 6
    s = cache.state
    a, b = _ids(cache, "cpu-node-a"), _ids(cache, "cpu-node-b")
    assert s.cpu_req[a] == 500  # web; the Succeeded backup pod does not count
    # redis 1000m + etl max(750m, init 2000m) + BestEffort debug shell 0
    assert s.cpu_req[b] == 1000 + 2000 and s.mem_req[b] == 2048 + 4096
    assert s.cpu_req_nz[b] == 1000 + 2000 + 100  # kube's non-zero default for scoring
    v = _ids(cache, "gpu-v100-0")
    assert s.cpu_req[v] == 8000 + 50 and (s.gpu_free[v] == 0).sum() == 2  # two whole GPUs taken
    t4 = _ids(cache, "gpu-t4-0")
    assert sorted(s.gpu_free[t4][:4].tolist()) == [500, 1000, 1000, 1000]  # the shared half GPU
    assert "llama-finetune-9fz2c" not in {b.uid for b in cache.pods.values()}
    assert len(cache.pods) == 7  # all bound, non-terminal pods, the device-plugin DaemonSet pod too
    assert cache.table.models == ("Tesla-T4", "Tesla-V100-SXM2-16GB")
    # cordoned and NotReady nodes are known but not schedulable
    assert not cache.schedulable[_ids(cache, "cpu-node-c")]
    assert not cache.schedulable[_ids(cache, "gpu-v100-1")]
    assert cache.schedulable[a] and cache.tainted[t4]


def test_watch_style_updates_move_the_state(objects):
    nodes, pods = objects
    cache = ClusterCache()
    cache.replace_all(nodes, [])
    pending = next(p for p in pods if p["metadata"]["name"] == "llama-finetune-9fz2c")
    cache.upsert_pod(pending)  # Pending, no node: nothing counted
    assert not cache.pods
    bound = copy.deepcopy(pending)
    bound["spec"]["nodeName"] = "gpu-v100-0"
    bound["status"]["phase"] = "Running"
    seen = []
    cache.on_bound.append(seen.append)
    cache.upsert_pod(bound)
    v = _ids(cache, "gpu-v100-0")
    assert cache.state.cpu_req[v] == 48000 and (cache.state.gpu_free[v] == 0).all()
    cache.upsert_pod(bound)  # MODIFIED with the same content: no double counting
    assert cache.state.cpu_req[v] == 48000 and len(seen) == 1
    done = copy.deepcopy(bound)
    done["status"]["phase"] = "Succeeded"
    cache.upsert_pod(done)
    assert cache.state.cpu_req[v] == 0 and (cache.state.gpu_free[v] == 1000).sum() == 8
    cache.upsert_pod(bound)
    cache.delete_pod(bound["metadata"]["uid"])
    assert cache.state.cpu_req[v] == 0 and not cache.pods


def test_pods_on_unknown_nodes_wait_for_the_node(objects):
    nodes, pods = objects
    cache = ClusterCache()
    cache.replace_all([n for n in nodes if n["metadata"]["name"] != "cpu-node-a"], [])
    web = next(p for p in pods if p["metadata"]["name"].startswith("web-"))
    cache.upsert_pod(web)
    assert not cache.pods and web["metadata"]["uid"] in cache.waiting
    cache.upsert_node(next(n for n in nodes if n["metadata"]["name"] == "cpu-node-a"))
    assert cache.state.cpu_req[_ids(cache, "cpu-node-a")] == 500 and not cache.waiting


def test_node_updates_keep_the_pods_and_deletes_drop_them(objects):
    nodes, pods = objects
    cache = ClusterCache()
    cache.replace_all(nodes, pods)
    b = _ids(cache, "cpu-node-b")
    before = cache.state.cpu_req[b]
    cordon = copy.deepcopy(next(n for n in nodes if n["metadata"]["name"] == "cpu-node-b"))
    cordon["spec"]["unschedulable"] = True
    state = cache.state
    cache.upsert_node(cordon)
    assert cache.state is state and not cache.schedulable[b]  # no rebuild for a cordon
    bigger = copy.deepcopy(cordon)
    bigger["status"]["allocatable"]["cpu"] = "31"
    cache.upsert_node(bigger)  # capacity moved: tables rebuilt, pods re-counted
    b = _ids(cache, "cpu-node-b")
    assert cache.table.cpu[b] == 31000 and cache.state.cpu_req[b] == before
    cache.delete_node("cpu-node-b")
    assert "cpu-node-b" not in cache.index and all(p.node != "cpu-node-b" for p in cache.pods.values())
    assert np.isin(list(cache.index), ["cpu-node-b"]).sum() == 0


def test_unreadable_objects_are_counted_not_fatal(objects):
    nodes, pods = objects
    bad_pod = copy.deepcopy(pods[0])
    bad_pod["metadata"]["uid"] = "bad"
    bad_pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "a lot"
    bad_node = {"metadata": {"name": "weird"}, "status": {"allocatable": {"cpu": "-3"}}}
    cache = ClusterCache()
    cache.replace_all([*nodes, bad_node], [*pods, bad_pod])
    assert "weird" not in cache.index and "bad" not in cache.pods and cache.rejected_objects == 2


def test_telemetry_sets_real_use_trend_and_overload(objects):
    nodes, _ = objects
    cache = ClusterCache()
    cache.replace_all(nodes, [])
    a = _ids(cache, "cpu-node-a")
    first = snapshot({"cpu-node-a": (0.5, 0.25)})
    cache.apply_telemetry(first)
    assert cache.state.cpu_used[a] == pytest.approx(0.5 * 7910)
    assert cache.state.mem_used[a] == pytest.approx(0.25 * cache.table.mem[a])
    later = snapshot({"cpu-node-a": (0.95, 0.25)})
    object.__setattr__(later, "fetched_at", first.fetched_at + 10)
    cache.apply_telemetry(later)
    tel = cache.telemetry
    assert tel.overloaded[a] and tel.overload_count[a] == 1 and tel.cpu_trend[a] > 0
    cache.apply_telemetry(snapshot({}, up=False))  # Prometheus down: the last values stay, flagged
    assert not cache.telemetry_up and cache.cpu_ratio[a] == 0.95


def test_telemetry_sets_windowed_statistics_and_metric_ages(objects):
    nodes, _ = objects
    cache = ClusterCache()
    cache.replace_all(nodes, [])
    a, b, c = (_ids(cache, n) for n in ("cpu-node-a", "cpu-node-b", "gpu-t4-0"))
    tel = cache.telemetry
    assert np.isnan(tel.cpu_mean).all() and np.isnan(tel.mem_std).all()  # nothing measured yet
    assert tel.metrics_age_s is None  # no refresh yet: the baselines take the metrics as fresh
    # a refresh 200 s ago whose samples were 4 s old then
    snap = snapshot({"cpu-node-a": (0.5, 0.25), "cpu-node-b": (0.2, 0.1)}, age_s=204.0)
    stats = NodeUsage(0.5, 0.25, math.nan, math.nan, snap.nodes["cpu-node-a"].timestamp,
                      cpu_mean=0.4, cpu_std=0.05, mem_mean=0.3, mem_std=0.01)
    snap = dataclasses.replace(snap, fetched_at=snap.fetched_at - 200,
                               nodes={**snap.nodes, "cpu-node-a": stats})
    cache.apply_telemetry(snap)
    assert (tel.cpu_mean[a], tel.cpu_std[a], tel.mem_mean[a], tel.mem_std[a]) == (0.4, 0.05, 0.3, 0.01)
    assert np.isnan(tel.cpu_mean[b])  # no statistics for node b (a test double without them)
    assert tel.metrics_age_s[a] == pytest.approx(4.0) and tel.metrics_age_s[b] == pytest.approx(4.0)
    assert tel.metrics_age_s[c] == math.inf  # Prometheus never had it
    # now: node a's exporter has gone away; it keeps its last sample (and statistics), which grow old
    cache.apply_telemetry(snapshot({"cpu-node-b": (0.2, 0.1)}))
    assert tel.metrics_age_s[a] == pytest.approx(204.0, abs=0.5)
    assert tel.metrics_age_s[b] == pytest.approx(0.0, abs=0.5)
    assert tel.cpu_mean[a] == 0.4
    # the load-aware baselines read them: node a's metrics are expired for Koordinator (180 s)
    p = Pod(index=0, cpu=100, mem=0, num_gpu=0, gpu_milli=0, spec_mask=0, qos=1)
    ids = np.array([a, b, c])
    assert KoordinatorLoadAware().refused(cache.state, p, ids).tolist() == [True, False, False]
    lvrb = LoadVariationRiskBalancing().score(cache.state, p, ids)
    assert lvrb[2] == 0  # no metrics: upstream's minimum score
    # node a: mu = .4 + 100/7910, sigma .05 -> risk .2313 -> 77 (memory risk .155 is lower)
    assert lvrb[0] == 77


def test_a_node_the_model_cannot_hold_is_left_out_and_the_cache_stays_whole(objects):
    nodes, pods = objects
    cache = ClusterCache()
    cache.replace_all(nodes, pods)
    dgx2 = copy.deepcopy(next(n for n in nodes if n["metadata"]["name"] == "gpu-v100-0"))
    dgx2["metadata"]["name"] = "dgx2"
    dgx2["status"]["allocatable"]["nvidia.com/gpu"] = "16"
    cache.upsert_node(dgx2)
    assert "dgx2" not in cache.index and cache.rejected_objects == 1
    assert len(cache.infos) == len(cache.table) == len(cache.index) == 6
    more = copy.deepcopy(nodes[0])
    more["metadata"]["name"] = "cpu-node-z"
    cache.upsert_node(more)  # later nodes still arrive
    assert "cpu-node-z" in cache.index and len(cache.table) == 7


def test_real_use_is_requests_until_telemetry_measures_it(objects):
    """ClusterState's one definition of real use: requests where nothing measures a node (as
    packing mode), the measured use once telemetry has a value (as replay), per node and
    resource; a bind then moves requests only on measured nodes."""
    nodes, pods = objects
    cache = ClusterCache()
    cache.replace_all(nodes, pods)
    s = cache.state
    assert s.use_source == "requests"
    np.testing.assert_array_equal(s.cpu_used, s.cpu_req)
    np.testing.assert_array_equal(s.mem_used, s.mem_req)
    a, b = _ids(cache, "cpu-node-a"), _ids(cache, "cpu-node-b")
    cache.apply_telemetry(snapshot({"cpu-node-a": (0.5, float("nan"))}))
    assert s.cpu_measured[a] and not s.mem_measured[a] and not s.cpu_measured[b]
    assert s.cpu_used[a] == pytest.approx(0.5 * 7910) and s.mem_used[a] == s.mem_req[a]
    assert cache.telemetry.cpu_trend[a] == 0  # no trend from requests to a first measurement
    assert s.use_source == "mixed"
    pod = Pod(-1, 100, 64, 0, 0, 0, 1)
    cpu_a = s.cpu_used[a]
    cache.bind("extra-a", pod, "cpu-node-a")
    cache.bind("extra-b", pod, "cpu-node-b")
    assert s.cpu_used[a] == cpu_a and s.mem_used[a] == s.mem_req[a]  # measured CPU stays
    assert (s.cpu_used[b], s.mem_used[b]) == (s.cpu_req[b], s.mem_req[b])  # requests follow
    cache.delete_pod("extra-b")
    assert (s.cpu_used[b], s.mem_used[b]) == (s.cpu_req[b], s.mem_req[b])


def test_the_pending_queue_counts_unbound_pods_of_its_scheduler(objects):
    """Telemetry.queue_len (the policy's queue feature) as the replay simulator's pending queue:
    unbound, not ended pods of the agent's scheduler; a bind takes one out."""
    nodes, pods = objects
    cache = ClusterCache()
    cache.queue_scheduler = "fedsched"
    cache.replace_all(nodes, pods)
    assert cache.telemetry.queue_len == 1  # llama-finetune-9fz2c: Pending, no node
    extra = pod_to_json(Pod(-1, 100, 64, 0, 0, 0, 1), "other", uid="uid-other")
    other = copy.deepcopy(extra)
    other["metadata"].update(name="other-sched", uid="uid-other-sched")
    other["spec"]["schedulerName"] = "default-scheduler"
    cache.upsert_pod(extra)
    cache.upsert_pod(other)  # another profile's pod: not in this queue
    assert cache.telemetry.queue_len == 2
    pod = cache.pod(extra)
    cache.bind("uid-other", pod, "cpu-node-a")
    assert cache.telemetry.queue_len == 1
    done = copy.deepcopy(extra)
    done["metadata"]["uid"] = "uid-done"
    done["status"] = {"phase": "Failed"}
    cache.upsert_pod(done)
    assert cache.telemetry.queue_len == 1
    cache.upsert_node(copy.deepcopy(nodes[0]) | {"metadata": nodes[0]["metadata"] | {"labels": {"x": "y"}}})
    assert cache.telemetry.queue_len == 1
