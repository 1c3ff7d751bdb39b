"""The gRPC decision service under careless and hostile clients, on a real server on loopback:
a duplicate among many names found in one pass, and the server's bounds (:class:`GrpcLimits`:
message size, concurrent RPCs, connections, handshake and idle time), also through
``fedsched serve --grpc-*``."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.harness.polling import wait_for
from bench.harness.ports import free_port
from bench.harness.serve import serve_process
from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.serving import grpc_service
from fedsched.agent.serving.decider import Decider, DeciderConfig
from fedsched.agent.serving.grpc_service import DecisionClient, GrpcLimits, pod_spec_from_pod, serve_grpc
from fedsched.agent.serving.model_store import ModelStore
from fedsched.common.model.cluster import Pod
from fedsched.common.model.traces import builtin_trace

POD = pod_spec_from_pod(Pod(0, 4000, 8192, 0, 0, 0, 1))
#: Generous: the linear check answers 40,000 names in well under a second on a loaded 2-core
#: machine; the quadratic one took 12-18 s.
LARGE_DEADLINE_S = 8.0


@pytest.fixture(scope="module")
def cache() -> ClusterCache:
    return ClusterCache.from_csv(builtin_trace("openb_node_list_gpu_node.csv"))


@pytest.fixture
def decider(cache: ClusterCache) -> Iterator[Decider]:
    d = Decider(cache, ModelStore("learned"), DeciderConfig(budget_ms=2000.0))
    try:
        yield d
    finally:
        d.close()


class CountedName(str):
    """A node name that counts the equality comparisons made on it."""

    comparisons = 0

    def __eq__(self, other: object) -> bool:
        CountedName.comparisons += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


# ---- a duplicate among many names ----------------------------------------------------------------


def test_the_duplicate_check_compares_each_name_at_most_once():
    """One pass: about one comparison for the duplicate itself, not one per earlier name."""
    names = [CountedName(f"node-{k:05d}") for k in range(3000)]
    names.append(CountedName("node-00000"))  # the duplicate comes last: the worst case
    CountedName.comparisons = 0
    with pytest.raises(grpc_service._Refused) as e:
        grpc_service._names(SimpleNamespace(node_names=names))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "node 'node-00000' is named twice" in e.value.message
    assert CountedName.comparisons <= len(names)  # quadratic: about len(names)**2 / 2
    CountedName.comparisons = 0
    assert grpc_service._names(SimpleNamespace(node_names=names[:-1])) == names[:-1]
    assert CountedName.comparisons <= len(names)


@pytest.mark.parametrize("rpc", ["ScoreNodes", "FilterNodes"])
def test_40000_names_with_a_duplicate_are_refused_at_once(decider: Decider, rpc: str):
    server, port = serve_grpc(decider, port=0)
    names = [f"node-{k:06d}" for k in range(39_999)] + ["node-000000"]
    try:
        with DecisionClient(f"127.0.0.1:{port}") as client:
            client.wait_ready()
            call = client.score_nodes if rpc == "ScoreNodes" else client.filter_nodes
            with pytest.raises(grpc.RpcError) as e:
                call(POD, names, timeout=LARGE_DEADLINE_S)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
            assert "'node-000000' is named twice" in e.value.details()
            # Without the duplicate: every name answered (unknown nodes score 0, or are refused).
            if rpc == "ScoreNodes":
                resp = call(POD, names[:-1], timeout=LARGE_DEADLINE_S)
                assert len(resp.scores) == len(names) - 1 and not any(s.score for s in resp.scores)
            else:
                refused = call(POD, names[:-1], timeout=LARGE_DEADLINE_S)
                assert len(refused) == len(names) - 1
    finally:
        server.stop(None)


# ---- the server's bounds -------------------------------------------------------------------------


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="max_message_bytes must be positive"):
        GrpcLimits(max_message_bytes=0)


def test_a_request_over_the_message_limit_is_resource_exhausted(decider: Decider):
    server, port = serve_grpc(decider, port=0, limits=GrpcLimits(max_message_bytes=64 * 1024))
    names = list(decider.cache.table.names)
    try:
        with DecisionClient(f"127.0.0.1:{port}") as client:
            client.wait_ready()
            with pytest.raises(grpc.RpcError) as e:
                client.score_nodes(POD, [f"n{k:07d}-{'x' * 40}" for k in range(2000)], timeout=10)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert len(client.score_nodes(POD, names[:50], timeout=10).scores) == 50  # still serving
    finally:
        server.stop(None)


def test_rpcs_past_the_concurrency_limit_are_refused_at_once(cache: ClusterCache, monkeypatch):
    """One worker, at most two RPCs in the server: with the policy held, the third RPC is
    RESOURCE_EXHAUSTED at once instead of queueing; the held two answer once it is released."""
    decider = Decider(cache, ModelStore("learned"), DeciderConfig(budget_ms=60_000.0))
    scheduler = decider.models.current.scheduler
    real_score, release, entered = scheduler.score, threading.Event(), threading.Event()

    def held_score(state, pod, nodes):
        entered.set()
        release.wait(60)
        return real_score(state, pod, nodes)

    monkeypatch.setattr(scheduler, "score", held_score)
    server, port = serve_grpc(decider, port=0, limits=GrpcLimits(workers=1, max_concurrent_rpcs=2))
    names = list(cache.table.names)[:20]
    try:
        with DecisionClient(f"127.0.0.1:{port}") as client:
            client.wait_ready()
            held = [client.stub.ScoreNodes.future(_request(names), timeout=60) for _ in range(2)]
            assert entered.wait(30), "the policy was never called"
            t = time.perf_counter()
            with pytest.raises(grpc.RpcError) as e:
                client.score_nodes(POD, names, timeout=30)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.perf_counter() - t < 15  # refused, not queued behind the held RPCs
            release.set()
            for f in held:
                assert len(f.result(timeout=60).scores) == len(names)
    finally:
        release.set()
        server.stop(None)
        decider.close()


def test_health_watch_streams_cannot_take_the_rpc_places(decider: Decider):
    """A health Watch is a stream held open at its client's pleasure: it is refused, so watches
    cannot fill the concurrent-RPC places; Check (kubelet's gRPC probe) is served."""
    server, port = serve_grpc(decider, port=0, limits=GrpcLimits(max_concurrent_rpcs=4), ready_poll_s=0.05)
    try:
        with DecisionClient(f"127.0.0.1:{port}") as client:
            client.wait_ready()
            stub = health_pb2_grpc.HealthStub(client.channel)
            for _ in range(8):
                with pytest.raises(grpc.RpcError) as e:
                    next(stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10))
                assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
            wait_for(lambda: client.health(timeout=10) == "SERVING", 30, 0.1, "health SERVING")
            assert client.filter_nodes(POD, ["a"], timeout=10)  # the RPC places are free
    finally:
        server.stop(None)


def _request(names: list[str]):
    from fedsched.common.proto import decision_pb2

    return decision_pb2.ScoreNodesRequest(spec=POD, node_names=names)


def _own_channel(port: int) -> DecisionClient:
    """A client with a connection of its own (gRPC shares connections between channels)."""
    return DecisionClient(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])


def _closed_after(sock: socket.socket, limit_s: float) -> float | None:
    """Seconds until the server closes ``sock`` (reading and dropping what it sends), None if it
    is still open after ``limit_s``."""
    t = time.perf_counter()
    sock.settimeout(limit_s)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.perf_counter() - t


def test_connections_past_the_limit_are_closed(decider: Decider):
    limits = GrpcLimits(max_connections=2, handshake_timeout_s=60.0)
    server, port = serve_grpc(decider, port=0, limits=limits)
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    try:
        with _own_channel(port) as client:
            with pytest.raises(grpc.RpcError) as e:
                client.filter_nodes(POD, ["a"], timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        for s in held:
            s.close()
        with _own_channel(port) as client:  # below the limit again: served

            def served() -> bool:
                try:
                    client.filter_nodes(POD, ["a"], timeout=5)
                    return True
                except grpc.RpcError:
                    return False

            wait_for(served, 30, 0.2, "a connection accepted once the held ones closed")
    finally:
        for s in held:
            s.close()
        server.stop(None)


def test_a_connection_that_never_finishes_its_handshake_is_closed(decider: Decider):
    server, port = serve_grpc(decider, port=0, limits=GrpcLimits(handshake_timeout_s=1.0))
    try:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"PRI * HTTP/2.0\r\n")  # half the HTTP/2 preface, then nothing
            closed = _closed_after(s, 60)
        assert closed is not None, "still open after 60 s"
        assert closed >= 0.5  # by the handshake timeout, not at once
    finally:
        server.stop(None)


def test_an_idle_connection_is_sent_goaway_and_the_client_reconnects(decider: Decider):
    server, port = serve_grpc(decider, port=0, limits=GrpcLimits(idle_timeout_s=0.5))
    try:
        with _own_channel(port) as client:
            states: list[str] = []
            client.channel.subscribe(lambda st: states.append(st.name))
            assert set(client.filter_nodes(POD, ["a"], timeout=10)) == {"a"}  # unknown to the cache

            def idle_after_ready() -> bool:
                return "READY" in states and "IDLE" in states[states.index("READY"):]

            wait_for(idle_after_ready, 30, 0.1, "the channel idle after the server's GOAWAY")
            assert client.filter_nodes(POD, ["a"], timeout=10)  # connects again
    finally:
        server.stop(None)


# ---- fedsched serve --grpc-* ---------------------------------------------------------------------

GRPC_FLAGS = ["--grpc-workers", "--grpc-max-concurrent-rpcs", "--grpc-max-connections", "--grpc-max-streams",
              "--grpc-max-message-bytes", "--grpc-idle-timeout", "--grpc-handshake-timeout",
              "--grpc-keepalive"]


def test_serve_help_shows_the_grpc_limits():
    out = subprocess.run([sys.executable, "-m", "fedsched.cli.main", "serve", "--help"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    for flag in GRPC_FLAGS:
        assert flag in out, flag
    assert "(default: 4194304)" in out


def test_serve_applies_the_grpc_limits(tmp_path):
    csv = tmp_path / "nodes.csv"
    csv.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{k},8000,32768,0,\n" for k in range(3)))
    grpc_port = free_port()
    with serve_process("--policy", "learned", "--cluster-csv", str(csv), "--insecure", "--host", "127.0.0.1",
                       "--port", "0", "--grpc-port", str(grpc_port), "--grpc-max-message-bytes", "4096",
                       "--gate", "off"), DecisionClient(f"127.0.0.1:{grpc_port}") as client:
        client.wait_ready(timeout=60)
        assert client.filter_nodes(POD, ["n0", "n1"], timeout=10) == {}
        with pytest.raises(grpc.RpcError) as e:
            client.filter_nodes(POD, [f"n{k:04d}" for k in range(1000)], timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
