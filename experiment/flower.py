"""Flower 1.42 deployments on loopback for a local experiment (the kwok fleet's hub) and the tests
(``tests/flower_support.py`` re-exports this module): nginx and stunnel for the hub link's
mutual TLS, waiting for a port to open, SuperNode authentication keys, the operator's ``flwr``
connection, and a federated run checked for ``finished:completed``.

Imports the standard library, ``cryptography`` and :mod:`fedsched.experiment.processes`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedsched.experiment.processes import tail

NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
STUNNEL = shutil.which("stunnel") or shutil.which("stunnel4") or shutil.which("stunnel", path="/usr/bin")
BIN = Path(sys.executable).parent
FLOWER_BINS = ("flwr", "flower-superlink", "flower-supernode")
HOST = "127.0.0.1"
START_TIMEOUT = 30
#: Flower's processes: no telemetry, no update check, no runtime `uv sync` of the app.
FLOWER_ENV = {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0",
              "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1"}


def missing_tools(*extra_bins: str) -> list[str]:
    """Why a loopback federation cannot run here (empty when it can)."""
    why = []
    if NGINX is None:
        why.append("nginx not found on PATH (apt-get install nginx)")
    if STUNNEL is None:
        why.append("stunnel not found on PATH (apt-get install stunnel4)")
    bins = (*FLOWER_BINS, *extra_bins)
    if not all((BIN / b).exists() for b in bins):
        why.append(f"Flower CLIs {bins} not installed beside {sys.executable}")
    return why


def wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}:\n{tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
            return
        time.sleep(0.2)
    raise TimeoutError(f"port {port} of {proc.args[0]} not open after {timeout}s:\n{tail(log)}")


def ec_auth_key(directory: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode authentication key pair (EC P-384, OpenSSH format as Flower loads it)."""
    key = ec.generate_private_key(ec.SECP384R1())
    priv, pub = directory / f"{name}", directory / f"{name}.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    priv.chmod(0o600)
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                  serialization.PublicFormat.OpenSSH))
    return priv, pub


def write_connection(home: Path, address: str, ca: Path, name: str = "hub") -> None:
    """The operator's ``$FLWR_HOME/config.toml`` with one SuperLink connection (the Control API)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{address}"\n'
        f'root-certificates = "{ca}"\n')


def flwr(env: dict[str, str], cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the ``flwr`` CLI with ``env`` (its FLWR_HOME holds the connection)."""
    return subprocess.run([str(BIN / "flwr"), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


def online_nodes(env: dict[str, str], cwd: Path, connection: str = "hub") -> list[dict]:
    res = flwr(env, cwd, "supernode", "ls", connection, "--format", "json")
    try:
        nodes = json.loads(res.stdout).get("nodes", [])
    except ValueError:
        return []
    return [n for n in nodes if str(n.get("status", "")).lower() == "online"]


def wait_online(env: dict[str, str], cwd: Path, count: int, diagnostics: list[Path],
                connection: str = "hub", timeout: float = START_TIMEOUT) -> None:
    """Wait until ``count`` SuperNodes are online; fail with the logs in ``diagnostics`` otherwise."""
    deadline = time.monotonic() + timeout
    while len(online_nodes(env, cwd, connection)) < count and time.monotonic() < deadline:
        time.sleep(1)
    if len(online_nodes(env, cwd, connection)) < count:
        listing = flwr(env, cwd, "supernode", "ls", connection).stdout
        logs = "\n".join(tail(p) for p in diagnostics)
        raise AssertionError(
            f"fewer than {count} SuperNodes came online through the sidecars:\n{listing}\n{logs}")


def run_federation(env: dict[str, str], cwd: Path, app_dir: Path, run_config: str, log: Path,
                   timeout: float, connection: str = "hub",
                   watch: Sequence[subprocess.Popen] = ()) -> dict:
    """``flwr run APP CONNECTION --stream --run-config ...``; returns the run's ``flwr ls`` entry
    (``flwr run --stream`` exits 0 even when the run fails: the status is what counts).

    ``timeout`` only ends a run that hangs: make it a multiple of the idle machine's time, which a
    loaded machine does not use up. A broken deployment fails sooner: the run ends with an error as
    soon as one of the processes in ``watch`` (the SuperLink, SuperNode, proxies...) exits."""
    with log.open("w") as f:
        proc = subprocess.Popen([str(BIN / "flwr"), "run", str(app_dir), connection, "--stream",
                                 "--run-config", run_config], env=env, cwd=cwd, stdout=f,
                                stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while proc.poll() is None:
                dead = [p for p in watch if p.poll() is not None]
                if dead:
                    raise AssertionError(f"{dead[0].args[0]} exited with {dead[0].returncode} during the run")
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(proc.args, timeout)
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    listing = flwr(env, cwd, "ls", connection, "--format", "json")
    runs = json.loads(listing.stdout)["runs"]
    assert len(runs) == 1, listing.stdout
    return runs[0]
