"""Where ``fedsched serve``'s prioritize time goes: the server's own code run in this process on
the benchmark's bodies, stage by stage (request decode, pod and candidate lookup, the policy's
feature build and forward pass, the rest of the ranking, the worker hand-off and the decision,
the answer encode), and what is left of the client's median for the HTTP server, the loopback
network and the client itself.

Each stage is timed on its own over every body (several passes, the garbage collector off and
frozen as ``fedsched serve`` freezes it) and reported as a median in microseconds; the stages are
medians of separately timed calls, so they add up to the whole path only approximately."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from extender.workload import UID_TOKEN


def _stage_medians(stages: dict[str, Callable[[int], Any]], n: int, passes: int) -> dict[str, float]:
    """Median microseconds of each stage, the stages timed one after the other on the same body
    in every iteration (a burst of another tenant's load then falls on all of them alike)."""
    times: dict[str, list[float]] = {name: [] for name in stages}
    pc = time.perf_counter
    for _ in range(passes):
        for k in range(n):
            for name, fn in stages.items():
                t0 = pc()
                fn(k)
                times[name].append(pc() - t0)
    return {name: float(np.median(t) * 1e6) for name, t in times.items()}


def breakdown(csv_path: Path, policy: str, bodies: list[tuple[bytes, bytes]], passes: int = 3,
              minimal_nodes: dict[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """Median microseconds per stage of the prioritize path (see the module doc); with
    ``minimal_nodes`` also the minimal extender's handler (``minimal_answer``)."""
    from fedsched.agent.cluster.cache import ClusterCache
    from fedsched.agent.serving import extender as ext
    from fedsched.agent.serving.decider import Decider, DeciderConfig
    from fedsched.agent.serving.model_store import ModelStore

    cache = ClusterCache.from_csv(csv_path)
    decider = Decider(cache, ModelStore(policy), DeciderConfig(gate=None))  # the policy path (--gate off)
    server = ext.ExtenderServer(decider, port=0, allow_bind=True)
    try:
        raws = [b.replace(UID_TOKEN.encode(), f"bd-{k:06d}".encode()) for k, (b, _) in enumerate(bodies)]
        decode = ext.decode_body  # the handler's own decode (_Connection._body)

        objs = [decode(r) for r in raws]
        n = len(objs)
        model = decider.models.current
        sch = model.scheduler
        pods = [cache.pod(o["Pod"]) for o in objs]
        ids = [cache.lookup_positions(o["NodeNames"])[0] for o in objs]
        from fedsched.common.schedulers.base import rank

        def ranked(k: int) -> Any:  # as Decider._run_policy ranks
            return rank(sch, cache.state, pods[k], decider.rng, candidates=ids[k][cache.schedulable[ids[k]]])

        cand = []
        for k in range(n):
            feasible = cache.state.feasible(pods[k]) & cache.schedulable
            mask = np.zeros_like(feasible)
            mask[ids[k]] = True
            cand.append(np.flatnonzero(feasible & mask))
        feats = [sch.features.build(cache.state, pods[k], cand[k]) for k in range(n)]
        decisions = [decider.prioritize(o["Pod"], o["NodeNames"]) for o in objs]

        def whole(k: int) -> None:  # what the handler runs between reading the body and writing
            t0 = time.perf_counter()
            body = decode(raws[k])
            server.prioritize(body, t0)
            server.remember(body["Pod"])

        for k in range(n):  # warm every cache
            whole(k)
        gc.collect()
        gc.freeze()
        gc.disable()
        try:
            stages: dict[str, Callable[[int], Any]] = {
                "whole_in_process": whole,
                "decode": lambda k: decode(raws[k]),
                "pod_and_candidates": lambda k: (cache.pod(objs[k]["Pod"]),
                                                 cache.lookup_positions(objs[k]["NodeNames"])),
                "rank": ranked,
                "feature_build": lambda k: sch.features.build(cache.state, pods[k], cand[k]),
                "forward": lambda k: sch.logits(feats[k].nodes, feats[k].pod, feats[k].context),
                "decider_prioritize": lambda k: decider.prioritize(objs[k]["Pod"], objs[k]["NodeNames"]),
                "server_prioritize": lambda k: server.prioritize(objs[k], time.perf_counter()),
                "remember": lambda k: server.remember(objs[k]["Pod"]),
            }
            enc = getattr(server, "encode_priorities", None)
            if enc is not None:
                stages["encode"] = lambda k: enc(decisions[k].hosts, decisions[k].scores)
            if minimal_nodes is not None:
                from extender.minimal import answer

                stages["minimal_answer"] = lambda k: answer(raws[k], minimal_nodes)
            st = _stage_medians(stages, n, passes)
        finally:
            gc.enable()
            gc.unfreeze()
        st["rank_other"] = st["rank"] - st["feature_build"] - st["forward"]
        st["decider_other"] = st["decider_prioritize"] - st["pod_and_candidates"] - st["rank"]
        if "encode" not in st:
            st["encode"] = st["server_prioritize"] - st["decider_prioritize"]
        st["request_checks"] = st["server_prioritize"] - st["decider_prioritize"] - st["encode"]
        return {"median_us": {k: round(v, 1) for k, v in st.items()},
                "backend": getattr(sch, "backend", None), "mode": decider.mode_for(model),
                "sources": sorted({d.source for d in decisions})}
    finally:
        decider.close()


ROWS = (
    ("decode", "request decode (JSON)"),
    ("pod_and_candidates", "pod object + names -> node ids"),
    ("feature_build", "feature build"),
    ("forward", "policy forward"),
    ("rank_other", "rest of the ranking (feasibility, pick)"),
    ("decider_other", "worker hand-off, scores, metrics"),
    ("request_checks", "request checks (names, duplicates)"),
    ("encode", "answer encode"),
    ("remember", "pod kept for bind (local mode)"),
    ("whole_in_process", "whole path in process"),
)


def print_breakdown(bd: dict[str, Any], client_p50_ms: float, minimal_p50_ms: float | None = None,
                    print_: Callable[[str], None] = print) -> dict:
    """The table; returns the HTTP/network/client remainders (client median - in-process path),
    fedsched's and, where measured, the minimal extender's."""
    us = bd["median_us"]
    rest = client_p50_ms * 1e3 - us["whole_in_process"]
    out = {"http_network_client_us": round(rest, 1)}
    print_(f"  where the time goes (fedsched prioritize, median us; policy backend {bd['backend']}, "
           f"mode {bd['mode']}, sources {','.join(bd['sources'])}):")
    for key, label in ROWS:
        print_(f"    {label:<42} {us[key]:8.1f}")
    print_(f"    {'HTTP server + network + client (rest)':<42} {rest:8.1f}   of the client's p50 "
           f"{client_p50_ms * 1e3:.0f}")
    if minimal_p50_ms is not None and "minimal_answer" in us:
        m_rest = minimal_p50_ms * 1e3 - us["minimal_answer"]
        out["minimal_http_network_client_us"] = round(m_rest, 1)
        print_(f"  the minimal extender: handler in process {us['minimal_answer']:.1f} us, HTTP server "
               "(uvicorn) "
               f"+ network + client {m_rest:.1f} us of its p50 {minimal_p50_ms * 1e3:.0f}")
    return out
