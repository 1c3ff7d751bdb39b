"""``fedsched record``: record this cluster's nodes and pods as an openb-schema trace, the member's twin.

  fedsched record --out /var/lib/fedsched/twin --prometheus http://prometheus-k8s.monitoring:9090
  fedsched record --out twin --kubeconfig ~/.kube/config --once      # one snapshot, then exit

Runs beside ``fedsched serve`` (a container of its own in the agent's pod, or a process): lists
and watches Nodes and Pods (in-cluster configuration, or ``--kubeconfig``), samples each pod's
measured use from Prometheus every ``--telemetry-interval`` seconds (``--prometheus``; without
it the use columns stay empty) and every ``--flush-interval`` seconds replaces, atomically,
``OUT/nodes.csv`` and ``OUT/pods.csv`` (:mod:`fedsched.agent.cluster.recorder` describes the
columns) and ``OUT/summary.json``. Started again on the same ``--out`` it loads what is there and
continues. ``--max-pods`` bounds the pods kept (the oldest finished ones go first).

The two files are the member's validation twin: a SuperNode's node config points at them
(``nodes-csv="OUT/nodes.csv" pods-csv="OUT/pods.csv"``), and ``fedsched evaluate --nodes
OUT/nodes.csv --pods OUT/pods.csv --allow-oversized`` replays them.

May import: the standard library and ``fedsched.agent.cluster`` (imported when run).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

DEFAULT_FLUSH_S = 30.0
DEFAULT_TELEMETRY_S = 30.0
SYNC_TIMEOUT_S = 60.0  # --once: the first list of nodes and pods must come within this


def register(sub: argparse._SubParsersAction) -> None:
    from fedsched.agent.cluster.recorder import DEFAULT_MAX_PODS

    p = sub.add_parser("record", help="record this cluster's nodes and pods (the member's validation twin)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path,
                   help="output directory (nodes.csv, pods.csv, summary.json); loaded if it has them")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster configuration, else "
                                        "$KUBECONFIG or ~/.kube/config)")
    p.add_argument("--namespace", help="record the pods of this namespace only (default: all)")
    p.add_argument("--prometheus", help="Prometheus base URL for per-pod use (default: none; the use "
                                        "columns stay empty)")
    p.add_argument("--telemetry-interval", type=float, default=DEFAULT_TELEMETRY_S,
                   help=f"seconds between per-pod use samples (default: {DEFAULT_TELEMETRY_S:g})")
    p.add_argument("--flush-interval", type=float, default=DEFAULT_FLUSH_S,
                   help=f"seconds between writes of the files (default: {DEFAULT_FLUSH_S:g})")
    p.add_argument("--max-pods", type=int, default=DEFAULT_MAX_PODS,
                   help=f"pods kept at most; past it the oldest finished go first "
                        f"(default: {DEFAULT_MAX_PODS})")
    p.add_argument("--once", action="store_true",
                   help="list once, take one use sample, write the files and exit")
    p.add_argument("--log-level", default="info", help="debug, info, warning or error (default: info)")
    p.set_defaults(func=run)


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad values with one line each (ValueError: the CLI prints it, exit 2)."""
    if args.max_pods < 1:
        raise ValueError(f"--max-pods must be at least 1, got {args.max_pods}")
    for flag, value in (("--flush-interval", args.flush_interval),
                        ("--telemetry-interval", args.telemetry_interval)):
        if not value > 0 or value == float("inf"):
            raise ValueError(f"{flag} must be a positive number of seconds, got {value:g}")
    if args.prometheus and not str(args.prometheus).startswith(("http://", "https://")):
        raise ValueError(f"--prometheus must be an http:// or https:// URL, got {args.prometheus!r}")
    if args.kubeconfig and not Path(args.kubeconfig).expanduser().is_file():
        raise ValueError(f"--kubeconfig {args.kubeconfig}: no such file")
    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory")
    parent = out if out.exists() else next((p for p in out.absolute().parents if p.exists()), None)
    if parent is None or not parent.is_dir():
        raise ValueError(f"--out {out}: no existing parent directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: {parent} is not writable")
    level = getattr(logging, str(args.log_level).upper(), None)
    if not isinstance(level, int):
        raise ValueError(f"--log-level: unknown level {args.log_level!r}")


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger("fedsched")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))
    root.propagate = False


def run(args: argparse.Namespace) -> int:
    check_args(args)
    _setup_logging(args.log_level)
    log = logging.getLogger("fedsched.record")
    from fedsched.agent.cluster.k8s_watch import KubeConfigError, KubeWatcher, load_kube_config
    from fedsched.agent.cluster.recorder import ClusterRecorder

    recorder = ClusterRecorder(args.out, max_pods=args.max_pods)
    try:
        api = load_kube_config(args.kubeconfig)
    except KubeConfigError as e:
        raise ValueError(str(e)) from None
    watcher = KubeWatcher(recorder, api, namespace=args.namespace,
                          on_error=lambda what, e: log.warning("kubernetes %s: %s", what, e))
    tel: Any = None
    if args.prometheus:
        from fedsched.agent.cluster.telemetry import PrometheusTelemetry

        tel = PrometheusTelemetry(args.prometheus, interval_s=args.telemetry_interval,
                                  timeout_s=min(10.0, args.telemetry_interval),
                                  on_update=recorder.apply_telemetry)
    print(f"fedsched record: recording to {args.out} ({recorder.loaded} pods and {len(recorder.nodes)} "
          f"nodes loaded, at most {args.max_pods} pods)", flush=True)
    stop = threading.Event()
    if not args.once:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    watcher.start()
    try:
        if args.once:
            if not watcher.wait_synced(SYNC_TIMEOUT_S):
                raise ValueError(f"no list of nodes and pods from the API server within {SYNC_TIMEOUT_S:g} s"
                                 f" ({watcher.last_error or 'no answer'})")
            if tel is not None:
                recorder.apply_telemetry(tel.refresh())
        else:
            if tel is not None:
                tel.start()
            while not stop.wait(args.flush_interval):
                try:
                    recorder.flush()
                except OSError as e:  # a full or read-only disk: the files stay as they were; retried
                    log.warning("writing %s failed (the previous files are whole; retrying in %g s): %s",
                                args.out, args.flush_interval, e)
    finally:
        watcher.stop()
        if tel is not None:
            tel.stop()
    summary = recorder.flush()
    print(f"fedsched record: wrote {summary['nodes']} nodes and {summary['pods']} pods to {args.out} "
          f"(skipped {summary['skipped']}, dropped {summary['dropped']}, {summary['samples']} use samples)",
          flush=True)
    return 0
