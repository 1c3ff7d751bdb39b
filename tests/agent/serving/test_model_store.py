"""The model store never wedges and never takes a bad model (issue 26, items 1, 3 and 7): a
failed load keeps the old model serving, is counted with its reason, and the watcher goes on to
load the next good file; non-finite weights are refused at start-up and by ``/admin/reload``."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from bench.harness.extender_client import metric
from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.learning.checkpoint import CheckpointError
from fedsched.common.model.traces import builtin_trace
from fedsched.common.schedulers import LEARNED_ONLINE, default_policy_path
from tests.checkpoint_support import NON_FINITE, write_corrupt, write_scaled
from tests.extender_support import running


def _wait(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.fixture
def policy(tmp_path):
    path = tmp_path / "policy.pt"
    shutil.copy(default_policy_path(LEARNED_ONLINE), path)
    return path


@pytest.fixture(scope="module")
def openb() -> ClusterCache:
    return ClusterCache.from_csv(builtin_trace("openb_node_list_gpu_node.csv"))


@pytest.mark.parametrize("corruption", ["wrong-shape", "nan"])
def test_the_watcher_survives_a_bad_file_and_loads_the_next_good_one(policy, corruption):
    store = ModelStore(str(policy))
    errors: list[tuple] = []
    store.on_error = lambda *a: errors.append(a)
    v0 = store.version
    store.watch(0.02)
    try:
        write_corrupt(policy, corruption)  # atomic rename, as a federation round
        assert _wait(lambda: errors), "the failed reload was never reported"
        assert store.version == v0 and store._thread is not None and store._thread.is_alive()
        write_scaled(policy, 0.5)
        assert _wait(lambda: store.version != v0), "the good file after the bad one was never loaded"
    finally:
        store.stop()
    assert len(errors) == 1


@pytest.mark.parametrize("corruption", NON_FINITE)
def test_non_finite_weights_are_refused_at_start_up_and_on_reload(policy, tmp_path, corruption):
    bad = write_corrupt(tmp_path / "bad.pt", corruption)
    with pytest.raises(CheckpointError, match="non-finite"):
        ModelStore(str(bad))
    store = ModelStore(str(policy))
    v0 = store.version
    changed, msg = store.reload(str(bad))
    assert not changed and "non-finite" in msg and store.version == v0 and store.path == policy


def test_admin_reload_refuses_a_bad_file_or_path_with_a_4xx_counted_as_a_reload_error(
    openb, policy, tmp_path
):
    nan = write_corrupt(tmp_path / "nan.pt", "nan")
    shape = write_corrupt(tmp_path / "shape.pt", "wrong-shape")
    with running(openb, policy=str(policy)) as (server, c):
        v0 = server.decider.models.version
        answers = {}
        for name, body in [("nan", {"path": str(nan)}), ("shape", {"path": str(shape)}), ("int", {"path": 5}),
                           ("list", {"path": ["x"]}), ("missing", {"path": str(tmp_path / "nope.pt")})]:
            status, raw = c.raw("POST", "/admin/reload", json.dumps(body).encode())
            answers[name] = status, json.loads(raw)
        text = c.get("/metrics")[1]
        assert server.decider.models.version == v0
        status, raw = c.raw("POST", "/admin/reload", json.dumps({"path": str(policy)}).encode())
        assert status == 200 and json.loads(raw)["changed"] is False  # the old model still serves
    for name, (status, out) in answers.items():
        assert 400 <= status < 500, (name, status, out)
        assert "internal error" not in out["Error"] and out["model_version"] == v0, (name, out)
    assert "non-finite" in answers["nan"][1]["Error"] and "head_out.weight" in answers["shape"][1]["Error"]
    assert "path" in answers["int"][1]["Error"]
    errors = "fedsched_model_reloads_total"
    assert metric(text, errors, result="error") == 5
    assert metric(text, errors, result="error", reason="non_finite") == 1
    assert metric(text, errors, result="error", reason="malformed") == 1
    assert metric(text, errors, result="error", reason="bad_request") == 2
    assert metric(text, errors, result="error", reason="missing") == 1
    assert metric(text, "fedsched_fallbacks_total") == 0
