"""Application keys of Pod objects (``agent/cluster/apps.py``) and their int codes."""

from __future__ import annotations

import threading

import pytest

from fedsched.agent.cluster.apps import AppCodes, owner_key


def pod(name: str | None = "p", namespace: str | None = "shop", owners: list | None = None,
        labels: dict | None = None) -> dict:
    meta: dict = {}
    if name is not None:
        meta["name"] = name
    if namespace is not None:
        meta["namespace"] = namespace
    if owners is not None:
        meta["ownerReferences"] = owners
    if labels is not None:
        meta["labels"] = labels
    return {"metadata": meta, "spec": {}}


def ref(kind: str, name: str, controller: bool | None = True) -> dict:
    r = {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": f"uid-{name}"}
    if controller is not None:
        r["controller"] = controller
    return r


HASH = {"pod-template-hash": "7d9c5b6f8"}

CASES = [
    # (id, pod object, key)
    ("deployment via its replicaset",
     pod("web-7d9c5b6f8-m4kqt", owners=[ref("ReplicaSet", "web-7d9c5b6f8")], labels={**HASH, "app": "web"}),
     ("shop", "Deployment", "web")),
    ("another rollout of the same deployment",
     pod("web-5f6b8c9d4-x2x2x", owners=[ref("ReplicaSet", "web-5f6b8c9d4")],
         labels={"pod-template-hash": "5f6b8c9d4"}),
     ("shop", "Deployment", "web")),
    ("deployment with dashes in its name",
     pod("my-web-app-7d9c5b6f8-abcde", owners=[ref("ReplicaSet", "my-web-app-7d9c5b6f8")], labels=HASH),
     ("shop", "Deployment", "my-web-app")),
    ("bare replicaset (no pod-template-hash)",
     pod("cache-x1", owners=[ref("ReplicaSet", "cache")]), ("shop", "ReplicaSet", "cache")),
    ("replicaset whose name does not end in the hash",
     pod("odd-x1", owners=[ref("ReplicaSet", "odd")], labels=HASH), ("shop", "ReplicaSet", "odd")),
    ("replicaset named like the hash alone",
     pod("x", owners=[ref("ReplicaSet", "-7d9c5b6f8")], labels=HASH), ("shop", "ReplicaSet", "-7d9c5b6f8")),
    ("statefulset", pod("redis-0", owners=[ref("StatefulSet", "redis")]), ("shop", "StatefulSet", "redis")),
    ("statefulset's second replica", pod("redis-1", owners=[ref("StatefulSet", "redis")]),
     ("shop", "StatefulSet", "redis")),
    ("daemonset", pod("dp-b7wqs", "kube-system", owners=[ref("DaemonSet", "dp")]),
     ("kube-system", "DaemonSet", "dp")),
    ("job", pod("resnet50-train-x7k2p", "ml", owners=[ref("Job", "resnet50-train")]),
     ("ml", "Job", "resnet50-train")),
    ("a cronjob's job: the job's own name",
     pod("etl-28930860-q9wzl", "batch", owners=[ref("Job", "etl-28930860")]),
     ("batch", "Job", "etl-28930860")),
    ("custom controller", pod("w-0", owners=[ref("RayCluster", "ray")]), ("shop", "RayCluster", "ray")),
    ("the controller among several owners",
     pod("q", owners=[ref("ConfigMap", "cm", controller=False), ref("StatefulSet", "db")]),
     ("shop", "StatefulSet", "db")),
    ("owners but no controller: its own", pod("q", owners=[ref("StatefulSet", "db", controller=None)]),
     ("shop", "Pod", "q")),
    ("controller reference without a name: its own", pod("q", owners=[ref("StatefulSet", "")]),
     ("shop", "Pod", "q")),
    ("bare pod", pod("debug-shell", "default"), ("default", "Pod", "debug-shell")),
    ("bare pod, empty owner list", pod("debug-shell", "default", owners=[]),
     ("default", "Pod", "debug-shell")),
    ("no namespace", pod("p", None), ("", "Pod", "p")),
    ("no name, no owner", pod(None), None),
    ("no name, an owner", pod(None, owners=[ref("Job", "j")]), ("shop", "Job", "j")),
    ("garbage owner list", pod("p", owners="nope"), ("shop", "Pod", "p")),  # type: ignore[arg-type]
    ("no metadata", {"spec": {}}, None),
    ("not an object", "pod", None),
]


@pytest.mark.parametrize(("obj", "key"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_owner_key(obj, key):
    assert owner_key(obj) == key


def test_same_name_in_two_namespaces_are_two_applications():
    owners = [ref("ReplicaSet", "web-7d9c5b6f8")]
    a = owner_key(pod("web-7d9c5b6f8-aaaaa", "shop", owners, HASH))
    b = owner_key(pod("web-7d9c5b6f8-aaaaa", "staging", owners, HASH))
    assert a == ("shop", "Deployment", "web") and b == ("staging", "Deployment", "web")
    codes = AppCodes()
    assert codes.code(a) != codes.code(b)
    # a bare pod and a controller of the same name are not one application either
    assert owner_key(pod("redis", "shop")) != owner_key(pod("redis-0", "shop", [ref("StatefulSet", "redis")]))


def test_codes_are_stable_dense_and_thread_safe():
    codes = AppCodes()
    assert codes.code(None) == -1 and len(codes) == 0
    assert [codes.code(("a", "Job", str(i))) for i in range(3)] == [0, 1, 2]
    assert codes.code(("a", "Job", "1")) == 1 and codes.get(("a", "Job", "2")) == 2
    assert codes.get(("a", "Job", "9")) is None and len(codes) == 3
    # many threads asking for the same new keys get one code per key
    keys = [("t", "Deployment", str(i)) for i in range(200)]
    got: list[list[int]] = []

    def worker() -> None:
        got.append([codes.code(k) for k in keys])

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(g == got[0] for g in got) and sorted(got[0]) == list(range(3, 203))
    # pruning forgets keys, never reuses a code
    assert codes.prune({0, 2}) == 201 and len(codes) == 2
    assert codes.code(("a", "Job", "0")) == 0 and codes.code(("a", "Job", "1")) == 203
