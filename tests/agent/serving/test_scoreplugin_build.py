"""The Go Score plugin (agent/scoreplugin): its unit tests, and the plugin against the real
gRPC decision service.

Both run ``go test`` in agent/scoreplugin (its own Go module) with the plugin build's settings;
``scripts/test.sh`` compiles the same packages before pytest (kube-scheduler's framework: about
five minutes on 2 cores with a cold Go build cache), so here the build cache makes it fast. Without
Go the tests skip, which ``tests/require_services.py`` turns into a failure under ``CI=true``.

The second test starts the agent's decision service (``serve_grpc``, mutual TLS with
certificates from fedsched's own CA; a node-scoring and a weight policy freshly initialised and
saved as checkpoints, so the test does not depend on the shipped policies' feature schema;
the openb GPU cluster) and runs the plugin's ``TestWithTheAgent`` against it: the plugin's final
scores must be the scores the agent sent (mode ``scores``), and, in mode ``weights``, the
plugin's own weighted free shares of each node must be the agent's ``x(node) . w`` for the
weights it sent (over the terms the plugin computes), within one point of rounding.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import node_to_json, pod_to_json
from fedsched.agent.serving import grpc_service
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.learning.checkpoint import save_checkpoint
from fedsched.common.learning.nets import WEIGHT_TERMS, NodeScoringPolicy, PolicyConfig, WeightPolicy
from fedsched.common.model.cluster import Pod
from fedsched.common.model.traces import builtin_trace
from tests.extender_support import agent_pki
from tests.paths import REPO

PLUGIN = REPO / "agent" / "scoreplugin"
GO_TEST_TIMEOUT_S = 1200  # a cold build cache compiles kube-scheduler's framework packages first

# (name, pod): a whole GPU, a shared GPU, a CPU pod (no GPU model constraints: kube-scheduler's
# filters know nothing of them, so every candidate below is feasible for both sides)
PODS = [
    ("gpu-1", Pod(0, 4000, 8192, 1, 1000, 0, 1)),
    ("share-half", Pod(0, 2000, 4096, 1, 500, 0, 2)),
    ("cpu", Pod(0, 8000, 16000, 0, 0, 0, 0)),
]
N_NODES = 30
# the weight terms the plugin computes (agent/scoreplugin/pkg/fedsched/weights.go)
PLUGIN_TERMS = tuple(f"{kind}_{r}" for kind in ("free", "load") for r in ("cpu", "mem", "io", "net", "gpu"))


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not on PATH: the Go Score plugin (agent/scoreplugin) cannot be tested "
                    "(Go >= 1.26)")
    return go


def _go_test(go: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # The build settings of agent/scoreplugin/build.sh (no cgo, -trimpath), which scripts/test.sh
    # also runs this module's tests with once before pytest: the same settings compile to the same
    # Go build cache entries, so kube-scheduler's packages are compiled once, in the set-up.
    full_env = {**os.environ, **(env or {}), "CGO_ENABLED": "0"}
    full_env["GOFLAGS"] = (full_env.get("GOFLAGS", "") + " -p=2").strip()
    return subprocess.run(
        ["nice", "-n", "19", go, "test", "-count=1", "-trimpath", *args],
        cwd=PLUGIN, env=full_env, capture_output=True, text=True, timeout=GO_TEST_TIMEOUT_S, check=False,
    )


def _check(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"go test failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")


def test_go_unit_tests_pass():
    proc = _go_test(_go(), "./...")
    _check(proc)
    assert "ok  \tfedsched.dev/scoreplugin/pkg/fedsched" in proc.stdout, proc.stdout


class _Recording(grpc_service.DecisionServicer):
    """The service as served, keeping every answer it sent (in order)."""

    answers: ClassVar[list[tuple[str, object]]] = []

    def ScoreNodes(self, request, context):
        resp = super().ScoreNodes(request, context)
        self.answers.append(("ScoreNodes", resp))
        return resp

    def GetSchedulingWeights(self, request, context):
        resp = super().GetSchedulingWeights(request, context)
        self.answers.append(("GetSchedulingWeights", resp))
        return resp


def test_the_plugin_scores_with_the_real_agent_over_mutual_tls(tmp_path: Path, monkeypatch):
    go = _go()
    cache = ClusterCache.from_csv(builtin_trace("openb_node_list_gpu_node.csv"))
    torch.manual_seed(3)
    weight_policy = WeightPolicy()
    torch.nn.init.normal_(weight_policy.actor[-1].weight, std=1.0)  # weights spread over the terms
    checkpoints = {}
    for name, policy, algorithm in (("scores", NodeScoringPolicy(PolicyConfig(hidden=16)), "ppo"),
                                    ("weights", weight_policy, "td3")):
        checkpoints[name] = save_checkpoint(tmp_path / f"{name}.pt", policy, algorithm=algorithm,
                                            hyperparameters={}, typical=None, data="0" * 16)
    decider = Decider(cache, ModelStore(str(checkpoints["scores"])), DeciderConfig(budget_ms=2000.0),
                      weights_models=ModelStore(str(checkpoints["weights"])))
    pki = agent_pki(tmp_path)
    _Recording.answers = []
    monkeypatch.setattr(grpc_service, "DecisionServicer", _Recording)
    server, port = grpc_service.serve_grpc(
        decider, port=0, tls=(pki.server.files.cert, pki.server.files.key, pki.ca))
    table = cache.table
    names = list(table.names[:N_NODES])
    models = tuple(table.models)
    pods = {name: pod for name, pod in PODS}
    spec = {
        "address": f"127.0.0.1:{port}",
        "tls": {"caFile": str(pki.ca), "certFile": str(pki.client.files.cert),
                "keyFile": str(pki.client.files.key), "serverName": "localhost"},
        "deadline": "1s",
        "modes": ["scores", "weights"],
        "Nodes": [node_to_json(table, i) for i in range(N_NODES)],
        "Pods": [pod_to_json(pod, name, models) for name, pod in PODS],
        "out": str(tmp_path / "results.json"),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    try:
        proc = _go_test(go, "-run", "^TestWithTheAgent$", "-v", "./pkg/fedsched",
                        env={"FEDSCHED_SCOREPLUGIN_AGENT": str(tmp_path / "spec.json")})
    finally:
        server.stop(None)
    _check(proc)
    assert "--- PASS: TestWithTheAgent" in proc.stdout, proc.stdout  # ran, not skipped
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(r["mode"], r["pod"]) for r in results] == [(m, n) for m in spec["modes"] for n, _ in PODS]
    answers = _Recording.answers
    assert [verb for verb, _ in answers] == ["ScoreNodes"] * len(PODS) + ["GetSchedulingWeights"] * len(PODS)

    for r, (_, resp) in zip(results, answers, strict=True):
        assert r["reason"] == "", r
        assert set(r["scores"]) == set(names)
        if r["mode"] == "scores":
            sent = {s.node: s.score for s in resp.scores}
            assert r["scores"] == sent, r["pod"]
            assert max(sent.values()) == 100  # the policy (or its fallback) picked a node
            continue
        # weights: the agent's own node scores x(node) . w for the weights it sent, over the terms
        # the plugin computes from NodeInfo (free_/load_ of cpu, mem, io, net, gpu; terms the
        # agent derives from telemetry are ignored by the plugin and the rest scaled to sum 1)
        weights = np.array([resp.weights[t] for t in WEIGHT_TERMS])
        assert abs(weights.sum() - 1.0) < 1e-6
        known = [i for i, t in enumerate(WEIGHT_TERMS) if t in PLUGIN_TERMS]
        assert len(known) == len(PLUGIN_TERMS), f"the agent lacks terms the plugin scores: {WEIGHT_TERMS}"
        w = weights[known] / weights[known].sum()
        pod = pods[r["pod"]]
        ids, _ = cache.lookup_positions(names)
        feasible = ids[(cache.state.feasible(pod) & cache.schedulable)[ids]]
        assert len(feasible) == len(names), "every candidate fits every test pod"
        _, x = decider.weights_models.current.scheduler.weights(cache.state, pod, feasible)
        agent_scores = np.rint(100.0 * (x[:, known].astype(np.float64) @ w)).astype(int)
        for node_id, want in zip(feasible, agent_scores, strict=True):
            got = r["scores"][table.names[node_id]]
            assert abs(got - want) <= 1, (r["pod"], table.names[node_id], got, want)
