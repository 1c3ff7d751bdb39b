"""The reference the extender's own speed is judged against: a minimal Starlette + orjson
scheduler extender serving LeastAllocated prioritize scores (0..10) over the nodes of a CSV.

It is what a hand-written extender with no policy, no safety filter, no budget and no metrics
costs: orjson decodes the body, a Python loop scores each named node from the CSV's
allocatable CPU and memory less the pod's requests (kube's LeastAllocated, equal weights), and
orjson encodes the answer; uvicorn serves it (httptools and uvloop when installed, its
defaults). Without orjson installed it falls back to the standard library's json (and says so
on its first line).

    python bench/extender/minimal.py --cluster-csv NODES.csv --port 0

prints ``listening on http://127.0.0.1:PORT/scheduler (json: orjson)`` once it accepts
connections, and serves ``POST /scheduler/prioritize`` and ``GET /healthz``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import re
import socket
import sys
from typing import Any

try:
    import orjson

    JSON = "orjson"
    loads, dumps = orjson.loads, orjson.dumps
except ImportError:  # the figures then say json
    JSON = "json"
    loads = json.loads

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


_QTY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_MEM_UNITS = {"": 1 / 2**20, "Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0, "Ti": 1024.0**2,
              "k": 1e3 / 2**20, "M": 1e6 / 2**20, "G": 1e9 / 2**20}


def milli_cpu(q: str) -> float:
    m = _QTY.match(str(q))
    if not m:
        return 0.0
    return float(m.group(1)) * (1.0 if m.group(2) == "m" else 1000.0)


def mem_mib(q: str) -> float:
    m = _QTY.match(str(q))
    return float(m.group(1)) * _MEM_UNITS.get(m.group(2), 1.0) if m else 0.0


def load_cluster(path: str) -> dict[str, tuple[float, float]]:
    """node name -> (allocatable milli-CPU, memory MiB), from an openb nodes CSV (no requests
    are bound in this benchmark: allocatable is free)."""
    with open(path, newline="") as f:
        return {r["sn"]: (float(r["cpu_milli"]), float(r["memory_mib"])) for r in csv.DictReader(f)}


def answer(raw: bytes, nodes: dict[str, tuple[float, float]]) -> bytes:
    """A prioritize body -> the encoded LeastAllocated answer (the whole handler but the HTTP)."""
    body = loads(raw)
    pod = body["Pod"]
    cpu = mem = 0.0
    for c in pod.get("spec", {}).get("containers", []):
        req = c.get("resources", {}).get("requests", {})
        cpu += milli_cpu(req.get("cpu", "0"))
        mem += mem_mib(req.get("memory", "0"))
    names = body.get("NodeNames")
    if names is None:
        names = [n["metadata"]["name"] for n in (body.get("Nodes") or {}).get("items", [])]
    out = []
    for name in names:
        cap = nodes.get(name)
        if cap is None:
            out.append({"Host": name, "Score": 0})
            continue
        c_free = max(cap[0] - cpu, 0.0) * 100.0 / cap[0] if cap[0] else 0.0
        m_free = max(cap[1] - mem, 0.0) * 100.0 / cap[1] if cap[1] else 0.0
        out.append({"Host": name, "Score": int((c_free + m_free) / 2) // 10})
    return dumps(out)


def make_app(nodes: dict[str, tuple[float, float]]) -> Any:
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def prioritize(request: Any) -> Response:
        return Response(answer(await request.body(), nodes), media_type="application/json")

    async def healthz(request: Any) -> Response:
        return Response(b"ok\n", media_type="text/plain")

    return Starlette(routes=[Route("/scheduler/prioritize", prioritize, methods=["POST"]),
                             Route("/healthz", healthz)])


def main() -> int:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster-csv", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    server = uvicorn.Server(uvicorn.Config(make_app(load_cluster(args.cluster_csv)), log_level="warning",
                                           access_log=False, lifespan="off"))

    async def serve() -> None:
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        port = sock.getsockname()[1]
        print(f"listening on http://{args.host}:{port}/scheduler (json: {JSON})", flush=True)
        await task

    factory = server.config.get_loop_factory()  # uvloop where installed
    loop = factory() if factory is not None else asyncio.new_event_loop()
    loop.run_until_complete(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
