"""The control-plane fixture itself: where its binaries come from, what it starts, what it leaves."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import requests

import tests.k8s_support as kcp
from bench.harness.control_plane import ControlPlane, control_plane, create_nodes, set_node_ready
from fedsched.agent.cluster.k8s_objects import node_from_json
from fedsched.common.model.traces import builtin_trace, load_nodes, slice_cluster


def test_missing_binaries_without_go_skip_with_the_reason(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kcp, "K8S_BIN", tmp_path / "bin")
    monkeypatch.setattr(kcp.shutil, "which", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match=r"go is not on PATH.*build_k8s\.sh"):
        kcp.k8s_binaries()


def test_missing_binaries_are_built_by_the_build_script(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    monkeypatch.setattr(kcp, "K8S_BIN", bin_dir)
    monkeypatch.setattr(kcp.shutil, "which", lambda name: "/usr/bin/go")
    notices: list[str] = []
    monkeypatch.setattr(kcp, "notice", notices.append)
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        bin_dir.mkdir(parents=True, exist_ok=True)
        for b in kcp.BINARIES:
            (bin_dir / b).write_text("#!/bin/sh\n")
            (bin_dir / b).chmod(0o755)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(kcp.subprocess, "run", fake_run)
    assert kcp.k8s_binaries() == bin_dir
    assert calls == [["bash", str(kcp.BUILD_SCRIPT)]]
    assert len(notices) == 1 and "about 13 minutes" in notices[0]
    assert kcp.k8s_binaries() == bin_dir and len(calls) == 1  # present: not built again


def test_a_failed_build_skips_with_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kcp, "K8S_BIN", tmp_path / "bin")
    monkeypatch.setattr(kcp.shutil, "which", lambda name: "/usr/bin/go")
    monkeypatch.setattr(kcp, "notice", lambda message: None)

    def failing(cmd, stdout, **kw):
        stdout.write(b"build_k8s: ERROR: cannot download k8s.io/kubernetes@v1.37.2\n")
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(kcp.subprocess, "run", failing)
    with pytest.raises(pytest.skip.Exception, match=r"exit 1.*cannot download"):
        kcp.k8s_binaries()


def test_a_control_plane_is_real_and_leaves_nothing_behind(k8s: ControlPlane, tmp_path: Path) -> None:
    """A second control plane (the session's, ``k8s``, keeps running): v1.37.2, token
    authentication, openb nodes registered Ready and schedulable, every process gone after."""
    with control_plane(tmp_path / "cp", k8s.bin) as cp:
        assert cp.api.get("/version")["gitVersion"] == "v1.37.2"
        with requests.Session() as s:
            s.trust_env = False
            assert s.get(f"{cp.url}/api/v1/nodes", verify=str(cp.ca), timeout=10).status_code == 401
        nodes = slice_cluster(load_nodes(builtin_trace("openb_node_list_gpu_node.csv")), 3, 7)
        created = create_nodes(cp.api, nodes)
        for i, obj in enumerate(created):
            info = node_from_json(obj)
            assert (info.name, info.cpu, info.mem, info.gpu, info.ready) == (
                nodes.names[i], int(nodes.cpu[i]), int(nodes.mem[i]), int(nodes.gpu[i]), True)
            assert info.model == nodes.models[int(nodes.model[i])] and not obj["spec"].get("taints")
        info = node_from_json(set_node_ready(cp.api, nodes.names[0], False))
        assert not info.ready
        pids = [p.pid for p in cp.procs.procs]
        assert len(pids) == 2 and all(p.poll() is None for p in cp.procs.procs)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
