"""A real Prometheus server for a local experiment (the kwok fleet) and the telemetry tests
(``tests/prometheus_support.py`` re-exports it): :func:`running_prometheus` starts the
``prometheus`` binary (Debian's package, which ``scripts/setup.sh`` installs) on a free loopback
port with a temporary config and a recording rules file, waits for ``/-/ready`` and terminates it
afterwards; :class:`PrometheusServer` queries it.

Imports the standard library, :mod:`.processes` and the rules file shipped as package data of
``fedsched.common`` (``data/prometheus/recording-rules.yaml``, the default rules).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from fedsched.common.compute import kill_with_parent_thread
from fedsched.experiment.processes import HOST, free_port, tail

__all__ = ["PROMETHEUS", "PrometheusServer", "running_prometheus", "shipped_rules"]

PROMETHEUS = shutil.which("prometheus") or shutil.which("prometheus", path="/usr/bin:/usr/local/bin")
START_TIMEOUT = 30.0


def shipped_rules() -> str:
    """The recording rules the agent's telemetry reads (``common/data/prometheus/recording-rules.yaml``)."""
    return (resources.files("fedsched.common") / "data" / "prometheus" / "recording-rules.yaml").read_text()


@dataclass
class PrometheusServer:
    """A running ``prometheus`` process started by :func:`running_prometheus`."""

    proc: subprocess.Popen
    port: int
    workdir: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def api(self, path: str, timeout: float = 5.0) -> dict:
        """GET ``/api/v1/<path>`` and return the decoded ``data``."""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}", timeout=timeout) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"{path}: {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict]:
        return self.api("query?" + urllib.parse.urlencode({"query": promql}))["result"]

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate (SIGTERM, then SIGKILL) and wait."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)


def _wait_ready(proc: subprocess.Popen, port: int, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    url = f"http://{HOST}:{port}/-/ready"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode}:\n{tail(log)}")
        with contextlib.suppress(OSError, urllib.error.URLError), urllib.request.urlopen(url, timeout=1) as r:
            if r.status == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"prometheus not ready on port {port} after {timeout}s:\n{tail(log)}")


@contextlib.contextmanager
def running_prometheus(workdir: Path, scrape_configs: list[dict], rules_text: str | None = None,
                       interval: str = "1s") -> Iterator[PrometheusServer]:
    """Run ``prometheus`` on a free loopback port with these scrape configs and rules.

    ``rules_text`` defaults to the shipped rules file as it is (:func:`shipped_rules`). The
    config, the rules and the TSDB live under ``workdir``; the process is terminated on exit.
    """
    if PROMETHEUS is None:
        raise RuntimeError("prometheus binary not found (apt-get install prometheus; scripts/setup.sh)")
    workdir.mkdir(parents=True, exist_ok=True)
    rules = workdir / "rules.yaml"
    rules.write_text(shipped_rules() if rules_text is None else rules_text)
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(rules)],
        "scrape_configs": scrape_configs,
    }
    cfg = workdir / "prometheus.yml"
    cfg.write_text(json.dumps(config, indent=2))  # JSON is YAML
    log = workdir / "prometheus.log"
    server: PrometheusServer | None = None
    for _attempt in range(3):  # the free port may be taken between probing and binding
        port = free_port()
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address={HOST}:{port}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=kill_with_parent_thread)
        try:
            _wait_ready(proc, port, log, START_TIMEOUT)
        except RuntimeError:
            if "address already in use" in tail(log):
                continue
            raise
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        server = PrometheusServer(proc, port, workdir, log)
        break
    if server is None:
        raise RuntimeError(f"prometheus could not bind a port:\n{tail(log)}")
    try:
        yield server
    finally:
        server.stop()
