"""Hypothesis strategies for requests a scheduler should never send the extender.

Shared by the test suite's fuzzer (``tests/agent/serving/test_extender_fuzz.py``) and the load
benchmark's fuzz phase (``bench/extender/fuzz.py``): arbitrary JSON values, Pod/Node/bind/preempt
bodies of the right shape most of the time with wrongly typed fields and bad quantities in
them, pods of other scheduler profiles, and random methods, paths and byte strings.
Imports ``hypothesis`` and ``fedsched.agent.cluster.k8s_objects`` (the annotation names).
"""

from __future__ import annotations

from urllib.parse import quote

from hypothesis import strategies as st

from fedsched.agent.cluster.k8s_objects import (
    GPU_COUNT_ANNOTATION,
    GPU_MILLI_ANNOTATION,
    GPU_MODEL_ANNOTATION,
    GPU_RESOURCE,
    QOS_ANNOTATION,
)

PREFIX = "/scheduler"  # the verbs' URL prefix (fedsched serve's default)
VERBS = ("filter", "prioritize", "bind", "preempt")

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
JSON = st.recursive(
    SCALARS | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=20,
)
BAD_QUANTITY = JSON | st.sampled_from(
    ["-1", "1e309", "NaN", "Infinity", "1.5", "99999999999999999999Ei", "", " 1", "0x10", "1e-9", "9", "1e18"]
)
RESOURCE = st.sampled_from(["cpu", "memory", GPU_RESOURCE, GPU_COUNT_ANNOTATION]) | st.text(max_size=6)


def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """The right shape most of the time, anything JSON sometimes."""
    return strategy | JSON


QUANTITIES = maybe(st.dictionaries(RESOURCE, BAD_QUANTITY, max_size=4))
CONTAINER = maybe(
    st.fixed_dictionaries(
        {}, optional={"name": JSON, "resources": maybe(st.fixed_dictionaries({}, optional={
            "requests": QUANTITIES, "limits": QUANTITIES}))}
    )
)
ANNOTATIONS = maybe(
    st.dictionaries(
        st.sampled_from([GPU_MILLI_ANNOTATION, GPU_COUNT_ANNOTATION, GPU_MODEL_ANNOTATION, QOS_ANNOTATION])
        | st.text(max_size=6),
        JSON | st.integers(-5, 2000).map(str),
        max_size=4,
    )
)


def fuzzed_pods(profile: str | None = None) -> st.SearchStrategy:
    """Pod objects with every field optional and any of them wrongly typed. With ``profile``, the
    spec is always there and, when it is an object, names that scheduler profile: a server acting
    on that profile only reads these pods instead of passing them over."""
    metadata = maybe(st.fixed_dictionaries({}, optional={
        "name": JSON, "uid": JSON, "annotations": ANNOTATIONS}))
    spec: dict[str, st.SearchStrategy] = {
        "containers": maybe(st.lists(CONTAINER, max_size=3)),
        "initContainers": maybe(st.lists(CONTAINER, max_size=2)),
        "overhead": QUANTITIES,
    }
    if profile is None:
        any_spec = maybe(st.fixed_dictionaries({}, optional={**spec, "schedulerName": JSON}))
        return maybe(st.fixed_dictionaries({}, optional={
            "metadata": metadata, "spec": any_spec, "status": JSON}))
    named = maybe(st.fixed_dictionaries({"schedulerName": st.just(profile)}, optional=spec))
    return maybe(st.fixed_dictionaries({"spec": named}, optional={"metadata": metadata, "status": JSON}))


POD = fuzzed_pods()
NODE = maybe(
    st.fixed_dictionaries(
        {},
        optional={
            # "fuzz-" names: never one of the names the test suite's properties draw
            "metadata": maybe(st.fixed_dictionaries({}, optional={
                "name": maybe(st.text(max_size=8).map(lambda s: "fuzz-" + s)),
                "labels": maybe(st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=2)),
            })),
            "spec": maybe(st.fixed_dictionaries({}, optional={"unschedulable": JSON, "taints": JSON})),
            "status": maybe(st.fixed_dictionaries({}, optional={
                "allocatable": QUANTITIES, "capacity": QUANTITIES, "conditions": JSON})),
        },
    )
)


def args_bodies(
    known: list[str], pod: st.SearchStrategy = POD, node: st.SearchStrategy = NODE
) -> st.SearchStrategy:
    """filter/prioritize bodies: a Pod, NodeNames of known and random names, a Nodes list."""
    names = maybe(st.lists(st.sampled_from(known) | st.text(max_size=8), max_size=8))
    node_list = maybe(st.fixed_dictionaries({"items": maybe(st.lists(node, max_size=3))}))
    return maybe(st.fixed_dictionaries({}, optional={"Pod": pod, "NodeNames": names, "Nodes": node_list}))


def bind_bodies(known: list[str]) -> st.SearchStrategy:
    field = maybe(st.text(max_size=8))
    return maybe(st.fixed_dictionaries({}, optional={
        "PodName": field, "PodNamespace": field, "PodUID": field,
        "Node": maybe(st.sampled_from(known) | st.text(max_size=8)),
    }))


VICTIMS = maybe(st.dictionaries(st.text(max_size=6), maybe(st.fixed_dictionaries({}, optional={
    "Pods": maybe(st.lists(maybe(st.fixed_dictionaries({}, optional={
        "metadata": maybe(st.fixed_dictionaries({}, optional={"uid": JSON})), "UID": JSON})), max_size=3)),
    "NumPDBViolations": JSON,
})), max_size=3))
PREEMPT = maybe(st.fixed_dictionaries({}, optional={
    "Pod": POD, "NodeNameToVictims": VICTIMS, "NodeNameToMetaVictims": VICTIMS}))


def verb_bodies(
    known: list[str], pod: st.SearchStrategy = POD, node: st.SearchStrategy = NODE,
    bind: st.SearchStrategy | None = None,
) -> dict[str, st.SearchStrategy]:
    """A body strategy per verb (``bind``: :func:`bind_bodies` unless given)."""
    return {
        "filter": args_bodies(known, pod, node),
        "prioritize": args_bodies(known, pod, node),
        "bind": bind_bodies(known) if bind is None else bind,
        "preempt": PREEMPT,
    }


# Pods of the fedsched profile, of another one, or of none that makes sense (with a profile name
# set, pods of other profiles take the neutral path).
PROFILES = st.sampled_from(["fedsched", "default-scheduler"]) | JSON
PROFILE_PODS = maybe(st.fixed_dictionaries(
    {"spec": maybe(st.fixed_dictionaries({"schedulerName": PROFILES}))}, optional={"metadata": JSON}
))

METHODS = st.sampled_from(["POST", "POST", "GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
PATHS = st.sampled_from([f"{PREFIX}/filter", f"{PREFIX}/prioritize", f"{PREFIX}/bind",
                         f"{PREFIX}/preempt", "/healthz", "/metrics", "/readyz"]) | st.text(
    max_size=20).map(lambda s: quote(f"{PREFIX}/{s}", safe="/?=&"))
RAW_BODIES = st.binary(max_size=1000) | st.text(max_size=200).map(str.encode) | st.sampled_from(
    [b"", b"{", b"[" * 5000, b'{"Pod": ', b'{"Pod": {}, "NodeNames": [1, 2]}', b"NaN", b"\xff\xfe{}"]
)
