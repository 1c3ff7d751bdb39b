"""Keep the agent's cluster cache in sync with the Kubernetes API server (list + watch).

The online agent is a ``nodeCacheCapable`` kube-scheduler extender: kube-scheduler sends it
node *names* only, so the agent must hold the nodes and the bound pods itself.
:class:`KubeWatcher` does what a client-go reflector does, with the official ``kubernetes``
Python client:

1. list all Nodes and all Pods (``CoreV1Api.list_node`` / ``list_pod_for_all_namespaces`` or
   ``list_namespaced_pod``, paged with ``limit``/``continue``, ``_preload_content=False`` and
   the raw JSON parsed here: the sink consumes API dicts, never client model objects) and hand
   both lists to the sink's :meth:`ClusterSink.replace_all` in one call;
2. watch both collections from the lists' ``resourceVersion`` (``kubernetes.watch.Watch``,
   each event's ``raw_object``): ADDED/MODIFIED -> ``upsert_*``, DELETED -> ``delete_*``;
   BOOKMARK events only advance the resourceVersion. A watch that the server ends normally
   (its ``timeoutSeconds``) is resumed from the last resourceVersion seen;
3. on any watch failure -- an ERROR event (410 Gone when the resourceVersion was compacted,
   or any other Status), a dropped connection, a read timeout, an error raised by the sink --
   both watches are stopped, and after an exponential, capped backoff everything is listed
   again and resynced through ``replace_all``. The threads never die of an error: it is kept
   in :attr:`KubeWatcher.last_error` and passed to ``on_error``.

Node events are applied in batches: the nodes' watch thread only reads them into a queue, and the
supervisor thread hands every event waiting there to the sink at once, consecutive ADDED/MODIFIED
ones through :meth:`ClusterSink.upsert_nodes` when the sink has it (one rebuild of its tables
for any number of new nodes; a sink without it gets one ``upsert_node`` each). Nothing waits for
a batch to fill: an event alone is applied as soon as it comes, and events queue up only while
the sink is busy with the previous ones, so a burst of n nodes joining (whose every rebuild costs
O(n)) is applied in a few rebuilds instead of n. Pod events are applied one by one by their own
thread (an upsert of a pod is O(1)); a pod whose node is not applied yet waits for it in the
sink.

Which pods count as bound is the sink's business (``spec.nodeName`` set and the phase not
Succeeded/Failed for :class:`fedsched.agent.cluster.cache.ClusterCache`), so no field selector
is used. Sink calls are serialised by one lock, and a halted watch generation can never write
to the sink after the next ``replace_all``.

:func:`load_kube_config` builds the ``ApiClient``: in-cluster service-account credentials when
running in a pod, else a kubeconfig file.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import kubernetes.client
import kubernetes.config
import kubernetes.watch
from kubernetes.config.config_exception import ConfigException

log = logging.getLogger(__name__)

KINDS = ("nodes", "pods")
CONNECT_TIMEOUT_S = 10.0
NODE_QUEUE = 16_384  # node events read and not yet applied, at most (then the nodes' watch waits)


class ClusterSink(Protocol):
    """The consumer of the watch: raw Kubernetes API JSON (camelCase dicts)."""

    def replace_all(self, nodes: list[dict], pods: list[dict]) -> None: ...

    def upsert_node(self, obj: dict) -> None: ...

    # Optional: ``upsert_nodes(objs: list[dict]) -> None``, consecutive node upserts in order at
    # once (used when the sink has it; see the module doc).

    def delete_node(self, name: str) -> None: ...

    def upsert_pod(self, obj: dict) -> None: ...

    def delete_pod(self, uid: str) -> None: ...


class KubeConfigError(RuntimeError):
    """Neither in-cluster credentials nor a usable kubeconfig file were found."""


def load_kube_config(kubeconfig: str | None = None) -> kubernetes.client.ApiClient:
    """An ``ApiClient`` for the cluster this agent serves.

    ``kubeconfig`` (a path) wins when given. Otherwise, in a pod (``KUBERNETES_SERVICE_HOST``
    set) the service account's token and CA are used; outside a pod the file named by
    ``$KUBECONFIG`` or ``~/.kube/config``. The global client configuration is left alone.
    """
    cfg = kubernetes.client.Configuration()
    if kubeconfig:
        path = Path(kubeconfig).expanduser()
        if not path.is_file():
            raise KubeConfigError(f"kubeconfig {str(path)!r} does not exist")
        try:
            kubernetes.config.load_kube_config(config_file=str(path), client_configuration=cfg,
                                               persist_config=False)
        except (ConfigException, OSError, ValueError) as e:
            raise KubeConfigError(f"kubeconfig {str(path)!r} is not usable: {e}") from e
        return kubernetes.client.ApiClient(cfg)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            kubernetes.config.load_incluster_config(client_configuration=cfg)
        except (ConfigException, OSError) as e:
            raise KubeConfigError(
                "KUBERNETES_SERVICE_HOST is set (running in a pod) but the in-cluster config failed: "
                f"{e} (is a service account token mounted at "
                "/var/run/secrets/kubernetes.io/serviceaccount?). Pass --kubeconfig to use a file."
            ) from e
        return kubernetes.client.ApiClient(cfg)
    env = os.environ.get("KUBECONFIG", "")
    candidates = [p for p in env.split(os.pathsep) if p] or [str(Path("~/.kube/config").expanduser())]
    existing = [p for p in candidates if Path(p).expanduser().is_file()]
    if not existing:
        raise KubeConfigError(
            "no Kubernetes configuration: not running in a pod (KUBERNETES_SERVICE_HOST unset) and no "
            f"kubeconfig file at {', '.join(candidates)}; pass --kubeconfig PATH")
    try:
        kubernetes.config.load_kube_config(config_file=str(Path(existing[0]).expanduser()),
                                           client_configuration=cfg, persist_config=False)
    except (ConfigException, OSError, ValueError) as e:
        raise KubeConfigError(f"kubeconfig {existing[0]!r} is not usable: {e}") from e
    return kubernetes.client.ApiClient(cfg)


@dataclass
class _Generation:
    """One list + pair of watches; halted as a whole when either watch fails."""

    resource_versions: dict[str, str]
    failed: threading.Event = field(default_factory=threading.Event)
    halted: threading.Event = field(default_factory=threading.Event)
    watches: dict[str, kubernetes.watch.Watch] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)
    events: int = 0
    # node events read and not yet applied: (type, object); None wakes the supervisor
    node_events: queue.Queue = field(default_factory=lambda: queue.Queue(NODE_QUEUE))

    def fail(self) -> None:
        """Halt this generation (the supervisor wakes, stops both watches and relists)."""
        self.failed.set()
        with contextlib.suppress(queue.Full):
            self.node_events.put_nowait(None)


class KubeWatcher:
    """List + watch Nodes and Pods into a :class:`ClusterSink` (see the module docstring).

    ``relists`` counts full resyncs after the first list (``replace_all`` calls minus one);
    ``events`` counts the ADDED/MODIFIED/DELETED events handed to the sink, ``backlog`` the node
    events read and not yet handed to it (at most :data:`NODE_QUEUE`). ``on_error`` is
    called with where the error happened (``"list"``, ``"nodes"``, ``"pods"``) and the
    exception; it must not block.

    ``api_client=None`` means :func:`load_kube_config` (``None``), which raises
    :class:`KubeConfigError` when there is no configuration. Beyond the basic knobs:
    ``max_backoff_s`` caps the exponential resync backoff, ``request_timeout_s`` is the read
    timeout of list calls, ``page_size`` the ``limit`` of each list page.
    """

    def __init__(self, sink: ClusterSink, api_client: kubernetes.client.ApiClient | None = None,
                 namespace: str | None = None, resync_backoff_s: float = 1.0, watch_timeout_s: int = 300,
                 on_error: Callable[[str, Exception], None] | None = None, max_backoff_s: float = 30.0,
                 request_timeout_s: float = 60.0, page_size: int = 500) -> None:
        if resync_backoff_s <= 0 or max_backoff_s < resync_backoff_s:
            raise ValueError("need 0 < resync_backoff_s <= max_backoff_s")
        if watch_timeout_s < 1:
            raise ValueError("watch_timeout_s must be >= 1")
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self.sink = sink
        self.api_client = api_client if api_client is not None else load_kube_config(None)
        self.core = kubernetes.client.CoreV1Api(self.api_client)
        self.namespace = namespace
        self.resync_backoff_s = float(resync_backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.watch_timeout_s = int(watch_timeout_s)
        self.request_timeout_s = float(request_timeout_s)
        self.page_size = int(page_size)
        self.on_error = on_error
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._sink_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._gen: _Generation | None = None
        self._inflight: Any = None  # the urllib3 response of a list in progress (stop() cuts it)
        self._thread: threading.Thread | None = None
        self._last_error = ""
        self._relists = 0
        self._events = 0
        self._lists = 0

    # ---- public state -------------------------------------------------------------------------
    @property
    def synced(self) -> bool:
        """True once the first full list of both nodes and pods reached the sink."""
        return self._synced.is_set()

    @property
    def last_error(self) -> str:
        return self._last_error

    @property
    def relists(self) -> int:
        return self._relists

    @property
    def events(self) -> int:
        return self._events

    @property
    def backlog(self) -> int:
        """Node events read from the watch and not yet applied to the sink."""
        gen = self._gen
        return gen.node_events.qsize() if gen is not None else 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kube-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the watches and join every thread; True when all threads ended in ``timeout``."""
        self._stop.set()
        gen = self._gen
        if gen is not None:
            gen.fail()  # wakes the supervisor, which halts the generation
        self._cut_inflight()
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        alive = thread.is_alive()
        if alive:
            log.warning("kube-watch did not stop within %.1f s", timeout)
        else:
            self._thread = None
        return not alive

    # ---- supervisor ---------------------------------------------------------------------------
    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            if failures:
                delay = min(self.max_backoff_s, self.resync_backoff_s * 2 ** (failures - 1))
                if self._stop.wait(delay):
                    break
            try:
                nodes, node_rv = self._list("nodes")
                pods, pod_rv = self._list("pods")
            except Exception as e:
                if self._stop.is_set():
                    break
                self._record_error("list", e)
                failures += 1
                continue
            gen = _Generation({"nodes": node_rv, "pods": pod_rv})
            try:
                with self._sink_lock:
                    self.sink.replace_all(nodes, pods)
            except Exception as e:
                self._record_error("list", e)
                failures += 1
                continue
            with self._state_lock:
                self._lists += 1
                if self._lists > 1:
                    self._relists += 1
            self._synced.set()
            self._gen = gen
            for kind in KINDS:
                t = threading.Thread(target=self._watch_loop, args=(gen, kind), name=f"kube-watch-{kind}",
                                     daemon=True)
                gen.threads.append(t)
                t.start()
            if self._stop.is_set():
                gen.fail()
            while not gen.failed.is_set():
                self._apply_node_events(gen)
            self._halt(gen)
            if self._stop.is_set():
                break
            # A generation that delivered events was healthy: start the backoff over.
            failures = 1 if gen.events else failures + 1
        self._gen = None

    def _halt(self, gen: _Generation, timeout: float = 5.0) -> None:
        """Stop both watches of ``gen`` and join their threads.

        ``Watch.stop()`` shuts the stream's socket down; it is repeated until the thread ends,
        because a thread can be between two requests when it is first called.
        """
        gen.halted.set()
        deadline = time.monotonic() + timeout
        for t in gen.threads:
            while t.is_alive() and time.monotonic() < deadline:
                for w in list(gen.watches.values()):
                    w.stop()
                t.join(0.05)
            if t.is_alive():
                log.warning("%s did not stop within %.1f s; its events are discarded", t.name, timeout)

    def _cut_inflight(self) -> None:
        resp = self._inflight
        if resp is None:
            return
        conn = getattr(resp, "connection", None)
        sock = getattr(conn, "sock", None) if conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # ---- list -----------------------------------------------------------------------------
    def _list_fn(self, kind: str) -> Callable[..., Any]:
        if kind == "nodes":
            return self.core.list_node
        if self.namespace is None:
            return self.core.list_pod_for_all_namespaces
        return functools.partial(self.core.list_namespaced_pod, self.namespace)

    def _list(self, kind: str) -> tuple[list[dict], str]:
        """All objects of ``kind`` (paged) and the list's resourceVersion."""
        fn = self._list_fn(kind)
        items: list[dict] = []
        resource_version = ""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self.page_size, "_preload_content": False,
                                      "_request_timeout": (CONNECT_TIMEOUT_S, self.request_timeout_s)}
            if token:
                kwargs["_continue"] = token
            resp = fn(**kwargs)
            self._inflight = resp
            try:
                body = resp.data
            finally:
                self._inflight = None
                resp.release_conn()
            doc = json.loads(body)
            if not isinstance(doc, dict) or not isinstance(doc.get("items", []), list):
                raise ValueError(f"list {kind}: not a Kubernetes List object")
            meta = doc.get("metadata") or {}
            page = doc.get("items") or []
            if not all(isinstance(o, dict) for o in page):
                raise ValueError(f"list {kind}: items must be objects")
            items.extend(page)
            if not resource_version:
                resource_version = str(meta.get("resourceVersion") or "")
            token = meta.get("continue") or None
            if not token:
                break
        if not resource_version:
            raise ValueError(f"list {kind}: the List has no metadata.resourceVersion")
        return items, resource_version

    # ---- watch ------------------------------------------------------------------------------
    def _watch_loop(self, gen: _Generation, kind: str) -> None:
        rv = gen.resource_versions[kind]
        fn = self._list_fn(kind)
        while not gen.halted.is_set():
            # return_type "object": events are parsed to dicts only (no client model objects).
            w = kubernetes.watch.Watch(return_type="object")
            gen.watches[kind] = w
            started, seen = time.monotonic(), 0
            try:
                for event in w.stream(fn, resource_version=rv, timeout_seconds=self.watch_timeout_s,
                                      allow_watch_bookmarks=True,
                                      _request_timeout=(CONNECT_TIMEOUT_S, self.watch_timeout_s + 30.0)):
                    if gen.halted.is_set():
                        return
                    rv = self._apply(gen, kind, event) or rv
                    seen += 1
            except Exception as e:
                if not gen.halted.is_set():
                    self._record_error(kind, e)
                gen.fail()
                return
            # The server ended the watch (timeoutSeconds): resume from the last resourceVersion.
            # A stream that ends at once and empty is not retried in a tight loop.
            if not seen and time.monotonic() - started < 1.0 and gen.halted.wait(self.resync_backoff_s):
                return

    def _apply(self, gen: _Generation, kind: str, event: dict) -> str | None:
        """Hand one watch event to the sink; returns the object's resourceVersion."""
        etype = event.get("type")
        obj = event.get("raw_object")
        if not isinstance(obj, dict):
            raise ValueError(f"watch {kind}: {etype} event without an object")
        meta = obj.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if etype == "BOOKMARK":
            return str(rv) if rv else None
        if etype not in ("ADDED", "MODIFIED", "DELETED"):
            raise ValueError(f"watch {kind}: unexpected event type {etype!r}")
        if kind == "nodes":  # applied by the supervisor, with the others waiting (module doc)
            while not gen.halted.is_set():
                try:
                    gen.node_events.put((etype, obj), timeout=0.1)
                    break
                except queue.Full:
                    pass
            return str(rv) if rv else None
        with self._sink_lock:
            if gen.halted.is_set():
                return None
            if etype == "DELETED":
                uid = meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}"
                self.sink.delete_pod(str(uid))
            else:
                self.sink.upsert_pod(obj)
            gen.events += 1
            with self._state_lock:
                self._events += 1
        return str(rv) if rv else None

    def _apply_node_events(self, gen: _Generation) -> None:
        """Wait for node events and hand the sink every one waiting (the module doc); an error of
        the sink halts the generation, as one in a watch thread does."""
        q = gen.node_events
        item = q.get()
        batch: list[tuple[str, dict]] = []
        while item is not None:
            batch.append(item)
            try:
                item = q.get_nowait()
            except queue.Empty:
                break
        if not batch:
            return
        try:
            with self._sink_lock:
                if gen.halted.is_set():
                    return
                self._apply_nodes(batch)
                gen.events += len(batch)
                with self._state_lock:
                    self._events += len(batch)
        except Exception as e:
            self._record_error("nodes", e)
            gen.fail()

    def _apply_nodes(self, batch: list[tuple[str, dict]]) -> None:
        many = getattr(self.sink, "upsert_nodes", None)
        run: list[dict] = []  # consecutive upserts not yet applied
        for etype, obj in [*batch, ("", {})]:
            if etype in ("ADDED", "MODIFIED"):
                run.append(obj)
                continue
            if many is not None and len(run) > 1:
                many(run)
            else:
                for o in run:
                    self.sink.upsert_node(o)
            run = []
            if etype == "DELETED":
                self.sink.delete_node(str((obj.get("metadata") or {}).get("name", "")))

    # ---- errors -----------------------------------------------------------------------------
    def _record_error(self, where: str, exc: Exception) -> None:
        status = getattr(exc, "status", None)
        code = f" (HTTP {status})" if isinstance(status, int) and status else ""
        msg = f"{where}: {type(exc).__name__}{code}: {exc}".strip()
        self._last_error = " ".join(msg.split())[:500]
        log.warning("kube-watch %s", self._last_error)
        if self.on_error is not None:
            try:
                self.on_error(where, exc)
            except Exception:
                log.exception("kube-watch on_error callback failed")
