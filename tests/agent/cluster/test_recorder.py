"""The cluster recorder (``fedsched.agent.cluster.recorder``) and ``fedsched record``'s flags.

Pod and Node JSON go in as the watch hands them; the files come out and are read back with the
project's own trace readers (``load_nodes`` / ``load_pods``) and by a deployed member
(``member_from_node_config``). Shown: bad or partial objects are skipped and counted, never fatal
(a table and hypothesis' arbitrary JSON); the size bound drops the oldest finished pods first; a
flush is atomic (a failed one leaves the previous files whole); a new recorder on the same
directory continues where the last flush left off; Prometheus' per-pod use becomes the pods' and
their applications' use per request.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsched.agent.cluster import recorder as recorder_mod
from fedsched.agent.cluster.recorder import (
    NODES_FILE,
    POD_HEADER,
    PODS_FILE,
    UNLOADABLE_FILE,
    ClusterRecorder,
    RecorderError,
    parse_time,
    refine,
)
from fedsched.cli.main import main as cli_main
from fedsched.common.federation.members import member_from_node_config
from fedsched.common.model.traces import load_nodes, load_pods
from tests.paths import REPO

FIXTURES = REPO / "tests" / "data" / "k8s"
T0 = 1_764_000_000.0  # 2025-11-24T16:00:00Z
MIB = 2**20


class Clock:
    def __init__(self, t: float = T0 + 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_obj(name: str, cpu: str = "16", mem: str = "64Gi", gpus: int = 0, model: str = "") -> dict:
    alloc: dict[str, Any] = {"cpu": cpu, "memory": mem, "pods": "110"}
    labels = {"kubernetes.io/hostname": name}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
        labels["nvidia.com/gpu.product"] = model
    return {"metadata": {"name": name, "labels": labels}, "spec": {},
            "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}


def pod_obj(name: str, ns: str = "default", cpu: str = "500m", mem: str = "256Mi", node: str | None = None,
            created: float = T0, phase: str = "Pending", owner: str | None = None, gpus: int = 0,
            gpu_milli: int | None = None, model: str | None = None, limits: dict | None = None,
            uid: str | None = None) -> dict:
    res: dict[str, Any] = {"requests": {"cpu": cpu, "memory": mem}}
    if limits:
        res["limits"] = dict(limits)
    if gpus:
        res.setdefault("limits", {})["nvidia.com/gpu"] = str(gpus)
    ann: dict[str, str] = {}
    if gpu_milli is not None:
        ann["alibabacloud.com/gpu-milli"] = str(gpu_milli)
        ann["alibabacloud.com/gpu-count"] = "1"
    if model:
        ann["alibabacloud.com/gpu-card-model"] = model
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": uid or f"uid-{ns}-{name}",
                            "creationTimestamp": iso(created), "annotations": ann}
    if owner:
        meta["ownerReferences"] = [{"kind": "StatefulSet", "name": owner, "controller": True}]
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x", "resources": res}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def by_name(path: Path) -> dict[str, dict[str, str]]:
    return {r["name"]: r for r in rows(path)}


@pytest.fixture
def clock() -> Clock:
    return Clock()


# ---- reading the objects ---------------------------------------------------------------------------

def test_real_objects_are_recorded_and_load_with_the_trace_readers(tmp_path: Path, clock: Clock) -> None:
    """The fixture's Node and Pod JSON (a real cluster's, tests/data/k8s) give files that the
    trace loader reads unchanged, with requests, QoS, GPU asks, owners and limits."""
    nodes = json.loads((FIXTURES / "nodes.json").read_text())["items"]
    pods = json.loads((FIXTURES / "pods.json").read_text())["items"]
    rec = ClusterRecorder(tmp_path, clock=clock)
    rec.replace_all(nodes, pods)
    summary = rec.flush()
    assert summary["skipped"] == {"nodes": 0, "pods": 0, "rows": 0}
    assert (summary["nodes"], summary["pods"]) == (len(nodes), len(pods))
    table = load_nodes(tmp_path / NODES_FILE)
    assert set(table.models) == {"Tesla-T4", "Tesla-V100-SXM2-16GB"}
    loaded = load_pods(tmp_path / PODS_FILE, table, allow_oversized=True)
    assert len(loaded) == len(pods)
    r = by_name(tmp_path / PODS_FILE)
    web = r["shop/web-7d9c5b6f8-m4kqt"]
    assert (web["cpu_milli"], web["memory_mib"], web["app"]) == ("500", "512", "shop/Deployment/web")
    assert (web["cpu_limit_milli"], web["memory_limit_mib"], web["node"]) == ("1000", "1024", "cpu-node-a")
    assert float(web["creation_time"]) == parse_time("2026-11-29T08:02:11Z")
    bert = r["ml/bert-infer-6c8d7f9b5-2xvqp"]
    assert (bert["num_gpu"], bert["gpu_milli"]) == ("1", "500")
    pending = r["ml/llama-finetune-9fz2c"]
    assert (pending["node"], pending["scheduled_time"], pending["deletion_time"]) == ("", "", "")
    backup = r["batch/db-backup-28930800-7hxkd"]  # Succeeded: ended, so it has a deletion time
    assert backup["pod_phase"] == "Succeeded" and backup["deletion_time"]
    assert float(backup["deletion_time"]) >= float(backup["creation_time"])
    assert list(rows(tmp_path / PODS_FILE)[0]) == list(POD_HEADER)


BAD_PODS: list[tuple[str, Any]] = [
    ("not an object", ["a", "list"]),
    ("no metadata", {"spec": {}}),
    ("no name", {"metadata": {"namespace": "x", "creationTimestamp": iso(T0)}, "spec": {}}),
    ("name not text", {"metadata": {"name": 7, "creationTimestamp": iso(T0)}, "spec": {}}),
    ("bad cpu quantity", pod_obj("q", cpu="lots")),
    ("negative memory", pod_obj("n", mem="-1Gi")),
    ("no creation time", {**pod_obj("c"), "metadata": {"name": "c", "namespace": "d", "uid": "u-c"}}),
    ("garbage creation time", pod_obj("g") | {"metadata": {**pod_obj("g")["metadata"],
                                                            "creationTimestamp": "yesterday"}}),
    ("containers not a list", pod_obj("l") | {"spec": {"containers": {"a": 1}}}),
    ("gpu-milli not a number", pod_obj("m", gpu_milli=None) | {"metadata": {
        **pod_obj("m")["metadata"], "annotations": {"alibabacloud.com/gpu-milli": "half"}}}),
    ("fractional GPUs", pod_obj("f", limits={"nvidia.com/gpu": "1.5"})),
    ("huge request", pod_obj("h", cpu="1e30")),
    ("bad limit quantity", pod_obj("b", limits={"cpu": "12 cores"})),
]


@pytest.mark.parametrize(("why", "obj"), BAD_PODS, ids=[w for w, _ in BAD_PODS])
def test_a_bad_pod_is_skipped_and_counted(tmp_path: Path, clock: Clock, why: str, obj: Any) -> None:
    rec = ClusterRecorder(tmp_path, clock=clock)
    rec.replace_all([node_obj("n1")], [pod_obj("good-1")])
    rec.upsert_pod(obj)
    rec.upsert_pod(pod_obj("good-2", node="n1"))
    s = rec.flush()
    assert s["skipped"]["pods"] == 1, why
    assert set(by_name(tmp_path / PODS_FILE)) == {"default/good-1", "default/good-2"}
    load_pods(tmp_path / PODS_FILE, load_nodes(tmp_path / NODES_FILE))


BAD_NODES: list[tuple[str, Any]] = [
    ("not an object", "node"),
    ("no name", {"metadata": {}, "status": {"allocatable": {"cpu": "4", "memory": "1Gi"}}}),
    ("bad cpu", node_obj("c", cpu="four")),
    ("no cpu", node_obj("z", cpu="0")),
    ("no memory", {"metadata": {"name": "m"}, "status": {"allocatable": {"cpu": "4"}}}),
    ("too many GPUs", node_obj("g", gpus=64, model="A100")),
    ("allocatable a list", {"metadata": {"name": "l"}, "status": {"allocatable": ["cpu"]}}),
]


@pytest.mark.parametrize(("why", "obj"), BAD_NODES, ids=[w for w, _ in BAD_NODES])
def test_a_bad_node_is_skipped_and_counted(tmp_path: Path, clock: Clock, why: str, obj: Any) -> None:
    rec = ClusterRecorder(tmp_path, clock=clock)
    rec.replace_all([node_obj("n1"), obj], [])
    rec.upsert_node(obj)
    rec.upsert_nodes([obj, node_obj("n2")])
    s = rec.flush()
    assert s["skipped"]["nodes"] == 3, why
    assert load_nodes(tmp_path / NODES_FILE).names == ("n1", "n2")


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                               max_size=4),
                    max_leaves=20)
# objects shaped like pods and nodes, with any value in any field
POD_LIKE = st.fixed_dictionaries({"metadata": st.fixed_dictionaries(
    {}, optional={"name": JSON | st.text(min_size=1, max_size=8), "namespace": JSON, "uid": JSON,
                  "creationTimestamp": JSON | st.just(iso(T0)), "annotations": JSON,
                  "ownerReferences": JSON}),
}, optional={"spec": JSON | st.fixed_dictionaries({"containers": st.lists(
    st.fixed_dictionaries({"resources": JSON | st.fixed_dictionaries({"requests": JSON, "limits": JSON})}),
    max_size=2)}, optional={"nodeName": JSON}), "status": JSON})
NODE_LIKE = st.fixed_dictionaries({"metadata": st.fixed_dictionaries({}, optional={
    "name": JSON | st.text(min_size=1, max_size=8), "labels": JSON})},
    optional={"status": JSON | st.fixed_dictionaries({"allocatable": JSON}), "spec": JSON})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pods=st.lists(POD_LIKE | JSON, max_size=6), nodes=st.lists(NODE_LIKE | JSON, max_size=4))
def test_arbitrary_json_is_never_fatal(tmp_path_factory: pytest.TempPathFactory, pods: list,
                                       nodes: list) -> None:
    """Whatever the watch hands over, the recorder records or skips it, and counts each skip;
    what it writes always loads with the trace readers."""
    out = tmp_path_factory.mktemp("fuzz")
    rec = ClusterRecorder(out, clock=Clock())
    rec.replace_all([node_obj("anchor"), *copy.deepcopy(nodes)], copy.deepcopy(pods))
    for p in pods:  # each event is either recorded or counted as skipped, once
        before = dict(rec.counts.skipped)
        rec.upsert_pod(copy.deepcopy(p))
        skipped = rec.counts.skipped["pods"] - before["pods"]
        assert skipped in (0, 1) and (skipped or rec.pods)
        rec.delete_pod(str(p)[:20])
    for n in nodes:
        before_nodes = rec.counts.skipped["nodes"]
        rec.upsert_node(copy.deepcopy(n))
        assert rec.counts.skipped["nodes"] - before_nodes in (0, 1)
    s = rec.flush()
    assert s["skipped"]["pods"] <= 2 * len(pods) and s["skipped"]["nodes"] <= 2 * len(nodes)
    table = load_nodes(out / NODES_FILE)
    if rows(out / PODS_FILE):
        load_pods(out / PODS_FILE, table, allow_oversized=True)


# ---- times ----------------------------------------------------------------------------------------------

def test_scheduling_end_and_deletion_times(tmp_path: Path, clock: Clock) -> None:
    rec = ClusterRecorder(tmp_path, clock=clock)
    rec.replace_all([node_obj("n1")], [pod_obj("a"), pod_obj("b"), pod_obj("c"), pod_obj("d")])
    clock.t = T0 + 1100
    bound = pod_obj("a", node="n1", phase="Running")
    bound["status"]["conditions"] = [{"type": "PodScheduled", "status": "True",
                                      "lastTransitionTime": iso(T0 + 1050)}]
    rec.upsert_pod(bound)
    rec.upsert_pod(pod_obj("b", node="n1"))  # no condition: when the recorder saw it bound
    rec.upsert_pod(pod_obj("e", node="n1", created=T0 + 7))  # bound when first seen: at its creation
    clock.t = T0 + 1200
    done = pod_obj("c", node="n1", phase="Succeeded")
    done["status"]["containerStatuses"] = [
        {"state": {"terminated": {"finishedAt": iso(T0 + 1150)}}},
        {"state": {"terminated": {"finishedAt": iso(T0 + 1170)}}}]
    rec.upsert_pod(done)
    clock.t = T0 + 1300
    rec.delete_pod("uid-default-d")
    rec.delete_pod("uid-default-c")  # ended before: keeps its end time
    rec.delete_pod("uid-unknown")  # never seen: nothing
    rec.flush()
    r = by_name(tmp_path / PODS_FILE)
    assert float(r["default/a"]["scheduled_time"]) == T0 + 1050
    assert float(r["default/b"]["scheduled_time"]) == T0 + 1100
    assert float(r["default/e"]["scheduled_time"]) == T0 + 7
    assert float(r["default/c"]["deletion_time"]) == T0 + 1170
    assert float(r["default/d"]["deletion_time"]) == T0 + 1300 and r["default/d"]["scheduled_time"] == ""
    assert r["default/a"]["deletion_time"] == ""
    pods = load_pods(tmp_path / PODS_FILE, load_nodes(tmp_path / NODES_FILE))
    assert sorted(math.isnan(x) for x in pods.deletion) == [False, False, True, True, True]


def test_a_pod_missing_from_a_relist_was_deleted_then(tmp_path: Path, clock: Clock) -> None:
    rec = ClusterRecorder(tmp_path, clock=clock)
    rec.replace_all([node_obj("n1")], [pod_obj("stays", node="n1"), pod_obj("goes", node="n1")])
    clock.t = T0 + 5000
    rec.replace_all([node_obj("n1")], [pod_obj("stays", node="n1")])
    assert rec.pods["uid-default-goes"].deletion == T0 + 5000
    assert not rec.pods["uid-default-stays"].finished


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-12-02T15:36:08Z", 1796225768.0), ("2026-12-02T15:36:08.5Z", 1796225768.5),
    ("2026-12-02T16:36:08+01:00", 1796225768.0), ("", math.nan), (None, math.nan), ("noon", math.nan),
    (17, math.nan)])
def test_parse_time(text: Any, expected: float) -> None:
    got = parse_time(text)
    assert (math.isnan(got) and math.isnan(expected)) or got == expected


@pytest.mark.parametrize(("stamp", "seen", "expected"), [
    (100.0, 100.25, 100.25),  # seen within the stamp's second: the moment seen
    (100.0, 100.0, 100.0),
    (100.0, 101.5, 100.999),  # seen late (the watch lagged): the end of the stamp's second
    (100.0, 102.0, 100.0),  # seen more than a second late (a relist): the stamp
    (100.0, 5000.0, 100.0),
    (100.0, 99.5, 100.0),  # a clock behind the API server's: the stamp
    (100.5, 100.7, 100.5),  # a stamp with a fraction is already precise
    (math.nan, 100.2, math.nan),  # no stamp: the caller decides
], ids=["within", "at", "late", "relist", "much-later", "clock-behind", "fraction", "none"])
def test_refine(stamp: float, seen: float, expected: float) -> None:
    got = refine(stamp, seen)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)


def test_changes_within_one_second_keep_the_order_they_were_seen_in(tmp_path: Path, clock: Clock) -> None:
    """Two pods created, bound and ended within the same whole seconds are recorded in the order
    the watch delivered them (a replay then takes them in that order); a pod first seen in a
    relist long after its creation keeps its stamps."""
    rec = ClusterRecorder(tmp_path, clock=clock)
    rec.replace_all([node_obj("n1")], [pod_obj("old", node="n1", created=T0)])  # listed 1000 s later
    t = T0 + 2000.0
    for name, at in (("x", 0.6), ("y", 0.3)):  # y's change seen first in each second
        clock.t = t + at
        rec.upsert_pod(pod_obj(name, created=t))
    for name, at in (("y", 1.2), ("x", 1.8)):
        clock.t = t + at
        bound = pod_obj(name, node="n1", created=t, phase="Running")
        bound["status"]["conditions"] = [{"type": "PodScheduled", "status": "True",
                                          "lastTransitionTime": iso(t + 1)}]
        rec.upsert_pod(bound)
    for name, at in (("x", 5.1), ("y", 5.4)):
        clock.t = t + at
        done = pod_obj(name, node="n1", created=t, phase="Succeeded")
        done["status"]["containerStatuses"] = [{"state": {"terminated": {"finishedAt": iso(t + 5)}}}]
        rec.upsert_pod(done)
    rec.flush()
    r = by_name(tmp_path / PODS_FILE)
    got = {n: tuple(float(r[f"default/{n}"][k]) for k in ("creation_time", "scheduled_time", "deletion_time"))
           for n in ("x", "y")}
    assert got["y"] == pytest.approx((t + 0.3, t + 1.2, t + 5.4))
    assert got["x"] == pytest.approx((t + 0.6, t + 1.8, t + 5.1))
    assert float(r["default/old"]["creation_time"]) == T0
    pods = load_pods(tmp_path / PODS_FILE, load_nodes(tmp_path / NODES_FILE))
    assert sorted(pods.creation)[1:] == pytest.approx([t + 0.3, t + 0.6])


# ---- bounding -----------------------------------------------------------------------------------------

# (pods as (name, creation offset, deletion offset or None), max_pods, the names kept)
BOUND_CASES = [
    ([("a", 0, 10), ("b", 1, None), ("c", 2, 5), ("d", 3, None)], 2, {"b", "d"}),  # finished go first
    ([("a", 0, 10), ("b", 1, None), ("c", 2, 5), ("d", 3, None)], 3, {"a", "b", "d"}),  # earliest end first
    ([("a", 0, None), ("b", 1, None), ("c", 2, None)], 2, {"b", "c"}),  # then the oldest live
    ([("a", 0, 1), ("b", 1, 2)], 5, {"a", "b"}),  # under the bound: all
    ([("a", 5, None), ("b", 1, 100), ("c", 0, None)], 1, {"a"}),
]


@pytest.mark.parametrize(("pods", "max_pods", "kept"), BOUND_CASES)
def test_the_size_bound_drops_the_oldest_finished_first(tmp_path: Path, clock: Clock, pods: list,
                                                         max_pods: int, kept: set[str]) -> None:
    rec = ClusterRecorder(tmp_path, clock=clock)
    rec.replace_all([node_obj("n1")], [pod_obj(n, created=T0 + c, node="n1") for n, c, _ in pods])
    for n, _, d in pods:
        if d is not None:
            clock.t = T0 + d
            rec.delete_pod(f"uid-default-{n}")
    rec.max_pods = max_pods  # the bound as the next flush applies it
    s = rec.flush()
    assert {n.removeprefix("default/") for n in by_name(tmp_path / PODS_FILE)} == kept
    assert s["dropped"] == len(pods) - len(kept) and s["pods"] == len(kept)


def test_the_state_stays_within_ten_percent_of_the_bound_between_flushes(tmp_path: Path,
                                                                         clock: Clock) -> None:
    rec = ClusterRecorder(tmp_path, max_pods=50, clock=clock)
    for i in range(400):
        rec.upsert_pod(pod_obj(f"p{i:03d}", created=T0 + i))
        assert len(rec.pods) <= 55
    assert rec.flush()["pods"] == 50
    assert min(by_name(tmp_path / PODS_FILE)) == "default/p350"  # the newest 50 live pods


# ---- atomic writes and restarts ---------------------------------------------------------------------------

def test_a_failed_flush_leaves_the_previous_files_whole(tmp_path: Path, clock: Clock,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    rec = ClusterRecorder(tmp_path, clock=clock)
    rec.replace_all([node_obj("n1")], [pod_obj("a")])
    rec.flush()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    rec.upsert_pod(pod_obj("b"))
    real_replace = os.replace

    def failing_replace(src: Any, dst: Any) -> None:
        if str(dst).endswith(PODS_FILE):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space"):
        rec.flush()
    monkeypatch.setattr(os, "replace", real_replace)
    assert (tmp_path / PODS_FILE).read_bytes() == before[PODS_FILE]  # the old file, whole
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary left
    assert set(by_name(tmp_path / PODS_FILE)) == {"default/a"}
    rec.flush()
    assert set(by_name(tmp_path / PODS_FILE)) == {"default/a", "default/b"}


def test_a_new_recorder_continues_from_the_last_flush(tmp_path: Path, clock: Clock) -> None:
    """A restart (the old process gone without a word) loses only what came after its last
    flush: every recorded field comes back, and the counters carry on."""
    rec = ClusterRecorder(tmp_path, clock=clock)
    rec.replace_all([node_obj("n1"), node_obj("g1", gpus=4, model="T4")],
                    [pod_obj("web-0", node="n1", owner="web", limits={"cpu": "1", "memory": "512Mi"}),
                     pod_obj("gpu", node="g1", gpus=2, model="T4", phase="Running"),
                     pod_obj("pend"), {"metadata": "bad"}])
    rec.apply_telemetry(Snapshot({("default", "web-0"): (0.2, 100 * MIB)}))
    rec.apply_telemetry(Snapshot({("default", "web-0"): (0.4, 300 * MIB)}))
    clock.t += 10
    rec.delete_pod("uid-default-pend")
    first = rec.flush()
    written = (tmp_path / PODS_FILE).read_bytes()
    rec.upsert_pod(pod_obj("after-the-flush"))  # lost with the process
    del rec

    again = ClusterRecorder(tmp_path, clock=clock)
    assert again.loaded == 3 and set(again.nodes) == {"n1", "g1"}
    assert again.flush()["skipped"]["pods"] == first["skipped"]["pods"] == 1
    assert (tmp_path / PODS_FILE).read_bytes() == written  # the same rows, to the byte
    web = again.pods["uid-default-web-0"]
    assert web.use_samples == 2
    assert (web.use_cpu_sum, web.use_mem_sum) == (pytest.approx(600.0), pytest.approx(400.0))
    # the next relist goes on from there: the pod deleted meanwhile ends at the relist
    clock.t += 100
    again.replace_all([node_obj("n1"), node_obj("g1", gpus=4, model="T4")],
                      [pod_obj("web-0", node="n1", owner="web", limits={"cpu": "1", "memory": "512Mi"})])
    assert again.pods["uid-default-gpu"].deletion == clock.t
    assert again.flush()["flushes"] == 3


def test_a_directory_with_foreign_files_is_refused_and_bad_rows_are_counted(tmp_path: Path) -> None:
    (tmp_path / PODS_FILE).write_text("name,cpu_milli\nx,1\n")
    with pytest.raises(RecorderError, match="not a recorder file"):
        ClusterRecorder(tmp_path)
    (tmp_path / PODS_FILE).write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(RecorderError, match="not a re"):
        ClusterRecorder(tmp_path)
    rec = ClusterRecorder(tmp_path / "ok", clock=Clock())
    rec.replace_all([node_obj("n1")], [pod_obj("a"), pod_obj("b")])
    rec.flush()
    text = (tmp_path / "ok" / PODS_FILE).read_text().splitlines()
    text[2] = text[2].replace("Burstable", "Platinum")
    half_gpu = text[1].split(",")
    half_gpu[4] = "500"  # gpu_milli without num_gpu: the trace loader refuses such a row
    (tmp_path / "ok" / PODS_FILE).write_text("\n".join([*text, ",".join(half_gpu), "truncated,1"]) + "\n")
    again = ClusterRecorder(tmp_path / "ok")
    assert again.loaded == 1 and again.counts.skipped["rows"] == 3
    with pytest.raises(RecorderError, match="not a directory"):
        ClusterRecorder(tmp_path / "ok" / PODS_FILE)


# ---- telemetry -------------------------------------------------------------------------------------------

class Snapshot:
    def __init__(self, pods: dict, up: bool = True) -> None:
        self.pods, self.up, self.error, self.pods_error = pods, up, "" if up else "down", ""


def test_measured_use_per_pod_and_per_application(tmp_path: Path, clock: Clock) -> None:
    rec = ClusterRecorder(tmp_path, clock=clock)
    rec.replace_all([node_obj("n1")], [
        pod_obj("web-0", node="n1", owner="web", cpu="1", mem="1Gi"),
        pod_obj("web-1", node="n1", owner="web", cpu="1", mem="1Gi"),
        pod_obj("solo", node="n1", cpu="0", mem="0"),  # no requests: the non-zero defaults count
        pod_obj("waiting", owner="web")])  # pending: not measured
    use = {("default", "web-0"): (0.5, 512 * MIB), ("default", "web-1"): (0.1, 256 * MIB),
           ("default", "solo"): (0.05, 100 * MIB), ("default", "waiting"): (9.0, 9 * MIB),
           ("other", "web-0"): (7.0, 7 * MIB)}
    rec.apply_telemetry(Snapshot(use))
    rec.apply_telemetry(Snapshot({("default", "web-0"): (0.3, math.nan)}))  # a half sample: none
    rec.apply_telemetry(Snapshot({("default", "web-0"): (5.0, 5 * MIB)}, up=False))  # down: none
    s = rec.flush()
    assert (s["samples"], s["refreshes"]) == (3, 2)
    r = by_name(tmp_path / PODS_FILE)
    assert float(r["default/web-0"]["cpu_use_milli"]) == pytest.approx(500.0)
    assert float(r["default/web-1"]["memory_use_mib"]) == pytest.approx(256.0)
    for name in ("default/web-0", "default/web-1"):
        assert float(r[name]["app_cpu_use_ratio"]) == pytest.approx(600 / 2000)
        assert float(r[name]["app_mem_use_ratio"]) == pytest.approx(768 / 2048)
    assert float(r["default/solo"]["app_cpu_use_ratio"]) == pytest.approx(50 / 100)
    assert float(r["default/solo"]["app_mem_use_ratio"]) == pytest.approx(100 / 200)
    assert r["default/waiting"]["use_samples"] == "0" and r["default/waiting"]["cpu_use_milli"] == ""


# ---- GPU models the nodes lack ----------------------------------------------------------------------

def test_pods_of_a_gpu_model_no_node_has_are_kept_aside_until_one_comes(tmp_path: Path, clock: Clock) -> None:
    rec = ClusterRecorder(tmp_path, clock=clock)
    rec.replace_all([node_obj("n1"), node_obj("t4", gpus=2, model="T4")],
                    [pod_obj("a100-job", gpus=1, model="A100"), pod_obj("either", gpus=1, model="A100,T4"),
                     pod_obj("cpu")])
    assert rec.flush()["omitted"] == 1
    assert set(by_name(tmp_path / PODS_FILE)) == {"default/either", "default/cpu"}
    assert by_name(tmp_path / PODS_FILE)["default/either"]["gpu_spec"] == "T4"
    assert set(by_name(tmp_path / UNLOADABLE_FILE)) == {"default/a100-job"}
    load_pods(tmp_path / PODS_FILE, load_nodes(tmp_path / NODES_FILE))
    again = ClusterRecorder(tmp_path, clock=clock)  # kept across a restart
    again.upsert_node(node_obj("a100", gpus=8, model="A100"))
    assert again.flush()["omitted"] == 0
    assert by_name(tmp_path / PODS_FILE)["default/either"]["gpu_spec"] == "A100|T4"
    pods = load_pods(tmp_path / PODS_FILE, load_nodes(tmp_path / NODES_FILE))
    assert len(pods) == 3


# ---- the twin: a member's node config -----------------------------------------------------------------

def test_a_member_node_config_loads_the_recording(tmp_path: Path, clock: Clock) -> None:
    """What a deployed member's SuperNode node config names (nodes-csv, pods-csv) is the
    recorder's output as it is: the member's nodes, and its pods split into train, validation
    and test."""
    rec = ClusterRecorder(tmp_path, clock=clock)
    nodes = [node_obj(f"n{i}", cpu="8", mem="32Gi") for i in range(4)] + [node_obj("g0", gpus=4, model="T4")]
    pods = [pod_obj(f"app{i % 7}-{i}", owner=f"app{i % 7}", created=T0 + 10 * i, node=f"n{i % 4}",
                    cpu=f"{100 + 50 * (i % 5)}m") for i in range(80)]
    pods += [pod_obj(f"gpu-{i}", gpus=1, model="T4", created=T0 + 5 * i, node="g0") for i in range(10)]
    rec.replace_all(nodes, pods)
    rec.flush()
    member = member_from_node_config({"cluster-name": "edge-1", "nodes-csv": str(tmp_path / NODES_FILE),
                                      "pods-csv": str(tmp_path / PODS_FILE)})
    assert member is not None and member.name == "edge-1"
    assert len(member.nodes) == 5 and member.val is not None
    assert len(member.train) + len(member.val) + len(member.test) == 90
    assert len(member.val) > 0 and len(member.test) > 0


# ---- the command's flags ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "message"), [
    (["--max-pods", "0"], "--max-pods must be at least 1"),
    (["--flush-interval", "0"], "--flush-interval must be a positive number"),
    (["--telemetry-interval", "nan"], "--telemetry-interval must be a positive number"),
    (["--prometheus", "prometheus:9090"], "--prometheus must be an http"),
    (["--kubeconfig", "/nonexistent/kubeconfig"], "no such file"),
    (["--log-level", "loud"], "unknown level"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str],
                                           message: str) -> None:
    assert cli_main(["record", "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedsched record: error:") and message in err and "\n" not in err
    assert "Traceback" not in err


def test_bad_output_paths_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    afile = tmp_path / "file"
    afile.write_text("x")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / PODS_FILE).write_text("a,b\n1,2\n")
    kube = tmp_path / "kubeconfig"
    kube.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    for out, message in ((afile, "is not a directory"), (afile / "below", "no existing parent"),
                         (foreign, "not a recorder file")):
        assert cli_main(["record", "--out", str(out), "--kubeconfig", str(kube)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("fedsched record: error:") and message in err and "\n" not in err
    assert cli_main(["record", "--out", str(tmp_path / "new"), "--kubeconfig", str(kube), "--once"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("fedsched record: error:") and "kubeconfig" in err
    assert not recorder_mod.ClusterRecorder(tmp_path / "new").pods
