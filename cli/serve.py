"""``fedsched serve``: run the online agent (scheduler extender, optional gRPC service).

  fedsched serve --policy learned --cluster-csv nodes.csv --insecure --port 8888      # local mode
  fedsched serve --policy /models/policy.pt --tls-cert tls.crt --tls-key tls.key \\
      --client-ca ca.crt --prometheus http://prometheus:9090 --host 0.0.0.0               # in a cluster

In a cluster (no ``--cluster-csv``) the agent keeps its cache by watching Nodes and Pods
(in-cluster config, or ``--kubeconfig``) and reads telemetry from Prometheus; it serves
HTTPS with mutual TLS, so ``--tls-cert``, ``--tls-key`` and ``--client-ca`` are required
(certificates from ``fedsched certs``). ``--cluster-csv NODES.csv`` (openb schema) serves a
simulated cluster instead, binds through the extender's bind verb, and is the only mode
that allows ``--insecure`` (plain HTTP).

Both listen on 127.0.0.1 unless ``--host`` says otherwise (the chart gives ``--host=0.0.0.0``).
The admin verbs (``/admin/reload``) answer over mutual TLS only a client certificate named in
``--admin-clients``, and over plain HTTP only loopback callers; they load files from the policy
file's directory only.

``--config FILE`` is a YAML mapping whose keys are these options' long names (``budget-ms:
5``); options given on the command line win. ``--policy`` is a checkpoint file (watched and
hot-reloaded when it changes, e.g. by a federation round) or a shipped policy name.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedsched.agent.serving.decider import Decider, DeciderConfig
    from fedsched.agent.serving.extender import ConnectionLimits
    from fedsched.common.schedulers.lookahead import LookaheadArgs

OPTIONS: dict[str, tuple[type, Any, str]] = {
    "policy": (str, None, "checkpoint (*.pt) or shipped policy name (learned, learned-td3)"),
    "weights-policy": (str, None, "a weight (TD3) policy for gRPC GetSchedulingWeights"),
    "cluster-csv": (str, None, "local mode: a simulated cluster from a nodes CSV (openb schema)"),
    "kubeconfig": (str, None, "kubeconfig file (default: in-cluster configuration)"),
    "namespace": (str, None, "watch pods of this namespace only (default: all)"),
    "prometheus": (str, None, "Prometheus base URL for node telemetry (default: none, requests only)"),
    "telemetry-interval": (float, 5.0, "seconds between telemetry refreshes"),
    "host": (str, "127.0.0.1", "address the extender (and the gRPC service) listens on; 0.0.0.0 for "
                               "every interface (in a pod)"),
    "port": (int, 8888, "extender port"),
    "max-connections": (int, 128, "at most this many extender connections (a thread each); one more "
                                  "closes the oldest idle one, or gets a 503 when none is idle"),
    "idle-timeout": (float, 120.0, "seconds an extender connection may stay idle between requests"),
    "header-timeout": (float, 10.0, "seconds from a request's first byte to the end of its headers "
                                    "(and for the TLS handshake): a slow client is cut"),
    "body-timeout": (float, 30.0, "seconds a request's body, or its answer, may take to pass"),
    "max-body": (int, 2 * 1024 * 1024, "bytes a request body may have (more: a 413); bodies over 64 KiB "
                                       "are worked on only while those in flight total at most this "
                                       "(one that waits a second for room: a 503). Raise it for full "
                                       "Nodes requests (nodeCacheCapable: false) of over a hundred "
                                       "nodes"),
    "max-learned-nodes": (int, 5000, "nodes learned from full Nodes requests (nodeCacheCapable: false) "
                                     "that the watch has not reported, kept at most; one more forgets "
                                     "the least recently named (the watch's nodes are never dropped)"),
    "prefix": (str, "/scheduler", "URL prefix of the verbs (the extender's urlPrefix path)"),
    "grpc-port": (int, None, "also serve the gRPC decision service on this port"),
    "grpc-workers": (int, 4, "threads answering gRPC requests"),
    "grpc-max-concurrent-rpcs": (int, 32, "gRPC requests in the server at once, running or waiting for a "
                                          "worker; one more is refused (RESOURCE_EXHAUSTED)"),
    "grpc-max-connections": (int, 64, "open gRPC connections; one more is closed as it arrives"),
    "grpc-max-streams": (int, 16, "concurrent gRPC requests on one connection"),
    "grpc-max-message-bytes": (int, 4 * 1024 * 1024, "largest gRPC request or answer "
                                                     "(larger: RESOURCE_EXHAUSTED)"),
    "grpc-idle-timeout": (float, 300.0, "seconds a gRPC connection may go without a request before it "
                                        "is closed (GOAWAY; the Score plugin reconnects at once)"),
    "grpc-handshake-timeout": (float, 10.0, "seconds a gRPC connection's TLS and HTTP/2 handshake may take"),
    "grpc-keepalive": (float, 60.0, "seconds of silence after which a gRPC connection is pinged; "
                                    "closed when the ping is not answered within 20 s"),
    "tls-cert": (str, None, "server certificate (PEM)"),
    "tls-key": (str, None, "server key (PEM)"),
    "client-ca": (str, None, "CA that signed the scheduler's client certificate (mutual TLS)"),
    "insecure": (bool, False, "plain HTTP (local --cluster-csv mode only)"),
    "admin-clients": (str, None, "comma-separated client-certificate names (subject CN or DNS SAN) "
                                 "allowed the admin verbs (/admin/reload) over mutual TLS (default: "
                                 "none, refused to every certificate); over plain HTTP only loopback "
                                 "callers may use them"),
    "mode": (str, "active", "active (the policy's scores) or shadow (default scores; the policy logged)"),
    "gate": (str, "auto", "roll-out gate for --mode active: auto (every profile the cluster's nodes hold; "
                          "a mixed cluster must pass each), web, gpu or edge (that profile), or off; a "
                          "policy whose checkpoint evidence (fedsched evidence) does not prove it better "
                          "than kube-default on the profile, with no guardrail worse, is served in shadow "
                          "mode"),
    "gate-objective": (str, "trouble", "what the gate asks the policy to be proven better on: trouble "
                                       "(online health), hot-cpu, gpu-alloc or gpu-frag; the guardrails "
                                       "(OOM kills, throttled CPU, failed pods, pending p99) hold whatever "
                                       "the objective"),
    "budget-ms": (float, 10.0, "latency budget per request; the kube-default fallback answers past it"),
    "search": (str, None, "decision-time search over the policy's best candidates, for GPU packing "
                          "clusters: 'default' or key=value,... of candidates (4), horizon (10), futures "
                          "(1) and seed (0); arrivals are drawn from the pods the agent was asked to "
                          "place. It takes tens of ms per pod: raise --budget-ms and the Score plugin's "
                          "deadline. The gate judges it by its own evidence (fedsched evidence POLICY "
                          "--search ARGS --write)"),
    "packing-check": (str, "auto", "serve the policy actively only where a packing simulation of the "
                                   "pods asked for on this cluster's nodes allocates more with it than "
                                   "with this baseline (e.g. kube-default; shadow mode otherwise and until "
                                   "256 pods have been asked for), checked again for each new model or node "
                                   "table; auto: against kube-default when the gate judges the policy on a "
                                   "packing objective (gpu-alloc, gpu-frag), else off; off"),
    "packing-alternatives": (str, "fgd", "baselines the packing check also simulates, comma-separated: "
                                         "where one of them allocates the most with evidence it serves "
                                         "in the policy's place (only where the roll-out gate admits it "
                                         "by its own shipped evidence, when the gate is on); off: none"),
    "scheduler-name": (str, "fedsched", "act on pods of this scheduler profile ('*': every pod)"),
    "cpu-threshold": (float, 0.9, "refuse nodes whose real CPU use is above this share"),
    "mem-threshold": (float, 0.9, "refuse nodes whose real memory use is above this share"),
    "stale-after": (float, 60.0, "seconds after which a node's telemetry is stale"),
    "max-stale-share": (float, 0.5, "at most this share of candidates refused for stale telemetry"),
    "seed": (int, 0, "tie-break seed"),
    "no-early-rank": (bool, False, "rank a pod's candidates only when prioritize asks, not as soon as "
                                   "filter has answered, beside kube-scheduler's own scoring (the answer "
                                   "is the same)"),
    "backend": (str, "numpy", "policy inference backend: numpy, torch, onnx or auto"),
    "watch-policy": (float, 5.0, "seconds between checks of the policy file for hot reload (0: off)"),
    "decision-log": (str, None, "directory of the decision log (decisions and their outcomes)"),
    "log-max-decisions": (int, 50_000, "the decision log keeps at most this many decisions"),
    "outcome-horizon": (float, 300.0, "seconds after binding at which a decision's outcome is recorded"),
    "log-format": (str, "json", "json (structured) or text"),
    "log-level": (str, "info", "debug, info, warning or error"),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run the online agent: scheduler extender (+ gRPC decision service)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, help="YAML file of options (keys: the long option names)")
    for name, (typ, default, help_) in OPTIONS.items():
        if typ is bool:
            p.add_argument(f"--{name}", action="store_true", default=None, help=help_)
        else:
            shown = f" (default: {default})" if default is not None else ""
            p.add_argument(f"--{name}", type=typ, default=None, help=help_ + shown)
    p.set_defaults(func=run)


def resolve_options(args: argparse.Namespace) -> dict[str, Any]:
    """Defaults, then the config file, then the command line."""
    opts = {k: v[1] for k, v in OPTIONS.items()}
    if args.config is not None:
        import yaml

        try:
            data = yaml.safe_load(args.config.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ValueError(f"--config {args.config}: {e}") from e
        if not isinstance(data, dict):
            raise ValueError(f"--config {args.config}: expected a mapping of options")
        for key, value in data.items():
            k = str(key).replace("_", "-")
            if k not in OPTIONS:
                raise ValueError(
                    f"--config {args.config}: unknown option {key!r}; known: {', '.join(OPTIONS)}"
                )
            typ = OPTIONS[k][0]
            if (
                value is not None
                and not (typ is float and isinstance(value, int))
                and not isinstance(value, typ)
            ):
                raise ValueError(f"--config {args.config}: {key} must be {typ.__name__}, got {value!r}")
            opts[k] = typ(value) if value is not None else None
    for k in OPTIONS:
        v = getattr(args, k.replace("-", "_"))
        if v is not None:
            opts[k] = v
    return opts


class _JsonFormatter(logging.Formatter):
    def __init__(self, version: Any) -> None:
        super().__init__()
        self.version = version

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "model_version": self.version(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class _TextFormatter(logging.Formatter):
    def __init__(self, version: Any) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s [model %(model_version)s] %(message)s")
        self.version = version

    def format(self, record: logging.LogRecord) -> str:
        record.model_version = self.version()
        return super().format(record)


def setup_logging(fmt: str, level: str, version: Any) -> None:
    if fmt not in ("json", "text"):
        raise ValueError(f"--log-format must be json or text, got {fmt!r}")
    lvl = getattr(logging, level.upper(), None)
    if not isinstance(lvl, int):
        raise ValueError(f"--log-level: unknown level {level!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter(version) if fmt == "json" else _TextFormatter(version))
    root = logging.getLogger("fedsched")
    root.handlers[:] = [handler]
    root.setLevel(lvl)
    root.propagate = False


def build_agent(opts: dict[str, Any]) -> Decider:
    """The decider (its cache, models and metrics) from resolved options; :func:`run` starts the
    background parts (watches, telemetry, outcome log, policy watch) around it."""
    from fedsched.agent.cluster.cache import ClusterCache
    from fedsched.agent.serving.decider import Decider
    from fedsched.agent.serving.metrics import ServingMetrics
    from fedsched.agent.serving.model_store import ModelStore

    if not opts["policy"]:
        raise ValueError("--policy is required (a checkpoint or a shipped policy name)")
    if opts["insecure"] and not opts["cluster-csv"]:
        raise ValueError(
            "--insecure is only allowed with --cluster-csv (the local mode); in a cluster the "
            "extender serves mutual TLS: give --tls-cert, --tls-key and --client-ca"
        )
    tls_parts = [opts["tls-cert"], opts["tls-key"], opts["client-ca"]]
    if not opts["insecure"] and not all(tls_parts):
        raise ValueError(
            "mutual TLS needs --tls-cert, --tls-key and --client-ca (or --insecure with "
            "--cluster-csv for local use)"
        )
    for part in tls_parts:
        if part and not Path(part).is_file():
            raise FileNotFoundError(f"no such file: {part}")
    metrics = ServingMetrics()
    models = ModelStore(opts["policy"], backend=opts["backend"])
    weights_models = ModelStore(opts["weights-policy"]) if opts["weights-policy"] else None
    learned = opts["max-learned-nodes"]
    cache = (ClusterCache.from_csv(opts["cluster-csv"], max_learned_nodes=learned) if opts["cluster-csv"]
             else ClusterCache(max_learned_nodes=learned))
    cfg = decider_config(opts)
    cache.queue_scheduler = cfg.scheduler_name  # the pending queue the policy's queue feature counts
    decider = Decider(cache, models, cfg, metrics, weights_models)
    metrics.watch_telemetry(lambda: cache.last_telemetry, lambda: cache.telemetry_up)
    return decider


def decider_config(opts: dict[str, Any]) -> DeciderConfig:
    """The decider's configuration from the resolved options (bad values are a ``ValueError``)."""
    from fedsched.agent.serving.decider import DeciderConfig, SafetyConfig

    safety = SafetyConfig(
        opts["cpu-threshold"], opts["mem-threshold"], opts["stale-after"], opts["max-stale-share"]
    )
    name = opts["scheduler-name"]
    gate = None if opts["gate"] == "off" else opts["gate"]
    return DeciderConfig(opts["mode"], opts["budget-ms"], None if name == "*" else name, opts["seed"], safety,
                         gate, opts["gate-objective"], early_rank=not opts["no-early-rank"],
                         assume=not opts["cluster-csv"], search=search_args(opts["search"]),
                         packing_check=None if opts["packing-check"] == "off" else opts["packing-check"],
                         packing_alternatives=packing_alternatives(opts["packing-alternatives"]))


def packing_alternatives(text: str) -> tuple[str, ...]:
    """``--packing-alternatives``' names (``off``: none); a ``ValueError`` that names the option."""
    names = tuple(n.strip() for n in text.split(","))
    if text.strip() == "off":
        return ()
    if not all(names):
        raise ValueError(f"--packing-alternatives {text!r}: expected baseline names separated by commas, "
                         "or off")
    return names


def search_args(text: str | None) -> LookaheadArgs | None:
    """``--search``'s arguments (None: no search); a ``ValueError`` that names the option."""
    from fedsched.common.schedulers.lookahead import LookaheadArgs, parse_args

    if text is None:
        return None
    if not text.strip():
        raise ValueError("--search needs 'default' or key=value,... (e.g. candidates=4,horizon=10)")
    try:
        return LookaheadArgs() if text.strip() == "default" else parse_args(text)
    except ValueError as e:
        raise ValueError(f"--search {text!r}: {e}") from None


def connection_limits(opts: dict[str, Any]) -> ConnectionLimits:
    """The extender's connection bounds from resolved options (a ValueError names a bad one)."""
    from fedsched.agent.serving.extender import ConnectionLimits

    return ConnectionLimits(opts["max-connections"], opts["idle-timeout"], opts["header-timeout"],
                            opts["body-timeout"], opts["max-body"])


MMAP_THRESHOLD = 256 * 1024


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Have glibc's malloc serve every block of ``nbytes`` or more by a mapping of its own, returned
    to the system when freed (``mallopt(M_MMAP_THRESHOLD)``); whether it was set. By default glibc
    raises the threshold to the size of each large block freed, so after a few request bodies of
    megabytes every later one came from the heaps of the connection threads' arenas, which kept
    the memory: three rounds of 16 bodies of 3.6 MB at once kept 80 MB once answered, with this 10.
    Not on another C library, nor when ``MALLOC_MMAP_THRESHOLD_`` is set (the operator's choice)."""
    import ctypes
    import os

    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is not None:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library with mallopt (musl's only answers 0)
        return False
    m_mmap_threshold = -3  # malloc.h
    return bool(mallopt(m_mmap_threshold, nbytes))


def run(args: argparse.Namespace) -> int:
    opts = resolve_options(args)
    fix_mmap_threshold()
    limits = connection_limits(opts)
    holder: dict[str, Any] = {}
    setup_logging(
        opts["log-format"],
        opts["log-level"],
        lambda: holder["decider"].models.version if "decider" in holder else "-",
    )
    log = logging.getLogger("fedsched.serve")
    decider = build_agent(opts)
    from fedsched.common.compute import single_threaded

    single_threaded()  # after build_agent: torch is loaded by then
    holder["decider"] = decider
    cache = decider.cache
    stoppers: list[Any] = []

    from fedsched.agent.serving.extender import ExtenderServer, server_tls

    tls = None if opts["insecure"] else server_tls(opts["tls-cert"], opts["tls-key"], opts["client-ca"])
    if not opts["cluster-csv"]:
        from fedsched.agent.cluster.k8s_watch import KubeWatcher, load_kube_config

        watcher = KubeWatcher(
            cache,
            load_kube_config(opts["kubeconfig"]),
            namespace=opts["namespace"],
            on_error=lambda what, e: log.warning("kubernetes %s: %s", what, e),
        )
        watcher.start()
        stoppers.append(watcher.stop)
    if opts["prometheus"]:
        from fedsched.agent.cluster.telemetry import PrometheusTelemetry

        tel = PrometheusTelemetry(
            opts["prometheus"], interval_s=opts["telemetry-interval"], on_update=cache.apply_telemetry
        )
        cache.apply_telemetry(tel.refresh())
        tel.start()
        stoppers.append(tel.stop)
    if opts["decision-log"]:
        from fedsched.agent.serving.outcomes import OutcomeRecorder

        rec = OutcomeRecorder(
            decider,
            opts["decision-log"],
            horizon_s=opts["outcome-horizon"],
            max_decisions=opts["log-max-decisions"],
        )
        rec.start()
        stoppers.append(rec.stop)
    if opts["watch-policy"] and opts["watch-policy"] > 0:
        decider.models.watch(opts["watch-policy"])
        stoppers.append(decider.models.stop)
    if tls is None and opts["host"] not in ("127.0.0.1", "localhost", "::1"):
        log.warning("plain HTTP on %s: every client that reaches it may ask for decisions", opts["host"])
    admins = [n.strip() for n in (opts["admin-clients"] or "").split(",") if n.strip()]
    server = ExtenderServer(decider, opts["host"], opts["port"], opts["prefix"], tls,
                            allow_bind=bool(opts["cluster-csv"]), admin_clients=admins, limits=limits)
    if opts["grpc-port"] is not None:
        from fedsched.agent.serving.grpc_service import GrpcLimits, serve_grpc

        gtls = None if opts["insecure"] else (opts["tls-cert"], opts["tls-key"], opts["client-ca"])
        glimits = GrpcLimits(
            workers=opts["grpc-workers"], max_concurrent_rpcs=opts["grpc-max-concurrent-rpcs"],
            max_connections=opts["grpc-max-connections"], max_streams=opts["grpc-max-streams"],
            max_message_bytes=opts["grpc-max-message-bytes"], idle_timeout_s=opts["grpc-idle-timeout"],
            handshake_timeout_s=opts["grpc-handshake-timeout"], keepalive_s=opts["grpc-keepalive"])
        gserver, gport = serve_grpc(decider, opts["host"], opts["grpc-port"], gtls, limits=glimits)
        stoppers.append(lambda: gserver.stop(grace=1).wait())
        log.info("gRPC decision service on %s:%d", opts["host"], gport)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # Everything loaded so far (torch, the model, the cache) lives as long as the process:
    # keep it out of the garbage collector's generations, whose full passes over it were the
    # multi-millisecond pauses in the decision latency's tail.
    gc.collect()
    gc.freeze()
    server.start()
    log.info(
        "extender serving %s (%s mode, %d nodes, budget %.1f ms, mode %s)",
        server.url,
        "local" if opts["cluster-csv"] else "cluster",
        len(cache.index),
        opts["budget-ms"],
        opts["mode"],
    )
    print(f"fedsched serve: listening on {server.url} (model {decider.models.version})", flush=True)
    while not stop.wait(0.5):
        pass
    log.info("shutting down")
    server.stop()
    for s in reversed(stoppers):
        s()
    decider.close()
    return 0
