"""The hub's Flower ServerApp: the strategy from the run config, central evaluation and checkpoints
through Flower's ``evaluate_fn``.

Run config (``context.run_config``; defaults in pyproject's ``[tool.flwr.app.config]``, filled
in by :func:`fedsched.common.federation.run_config.with_run_config_defaults` where a runtime
passes none):
``num-server-rounds``, ``strategy`` (fedavg | fedprox | fedtrimmedavg | krum), ``proximal-mu``
(FedProx), ``byzantine-fraction`` (the share of members the robust strategies allow for:
FedTrimmedAvg trims it off each tail, Krum tolerates that share of ``min-nodes``),
``fraction-train``, ``min-nodes``, ``norm-bound``, ``norm-action``, ``cosine-floor`` and ``weight-bound``
(update validation),
``mode`` (online: central trouble score on held-out replay clusters, in ``central-workers``
processes; packing: GPU allocation on the ``eval-nodes`` held-out openb slice),
``download-codec`` (``int8-delta``: each member gets the global as an INT8 delta from what it
already holds, the float32 global when the hub holds nothing for it;
``int8``: the same with INT8 full copies; ``fp32``: the float32 global every round;
:mod:`fedsched.coordinator.strategies`), ``init`` (shipped |
random starting model) with ``seed``, ``out-dir``
(checkpoints and metrics). Every round :class:`fedsched.coordinator.evaluation.HubRecorder`
evaluates the aggregated model, appends the round to ``rounds.json`` and checkpoints it
(``global.npz``); ``final.json`` closes the run. A hub restarted with the same ``out-dir``
resumes from the checkpoint: the strategy continues the round numbering, so the rounds already
done are neither lost nor repeated.
"""

from __future__ import annotations

from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedsched.common.federation.run_config import with_run_config_defaults
from fedsched.common.federation.weights import weights_of
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.coordinator.evaluation import (
    HubRecorder,
    central_evaluator,
    load_checkpoint,
    online_central_evaluator,
)
from fedsched.coordinator.strategies import make_strategy

app = ServerApp()


def initial_weights(init: str, seed: int, mode: str = "online") -> dict[str, np.ndarray]:
    """The hub's starting model: the shipped policy of the mode (a fleet starts from a good
    scheduler, never from random decisions: ``learned-online`` in online mode, ``learned`` in
    packing mode), or a seeded random initialisation: the same bits in every process, whatever
    its torch thread count (the orthogonal initialisation's QR gives other bits on two threads than
    on one, and the hub, the main job and its workers run with different counts)."""
    if init == "shipped":
        from fedsched.common.learning.checkpoint import load_checkpoint as load_policy
        from fedsched.common.schedulers import LEARNED, LEARNED_ONLINE, default_policy_path

        shipped = default_policy_path(LEARNED_ONLINE if mode == "online" else LEARNED)
        return weights_of(load_policy(shipped)[0])
    if init != "random":
        raise ValueError(f"init must be 'shipped' or 'random', got {init!r}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        return weights_of(NodeScoringPolicy())
    finally:
        torch.set_num_threads(threads)


def strategy_arguments(name: str, run_config: Any) -> dict[str, Any]:
    """A strategy's own arguments from the run config, for that strategy only: FedProx's mu,
    FedTrimmedAvg's trimmed share and Krum's tolerated malicious members (``byzantine-fraction``
    of ``min-nodes``, rounded down)."""
    byzantine = float(run_config["byzantine-fraction"])
    if name == "fedprox":
        return {"proximal_mu": float(run_config["proximal-mu"])}
    if name == "fedtrimmedavg":
        return {"beta": byzantine}
    if name == "krum":
        return {"num_malicious_nodes": int(byzantine * int(run_config["min-nodes"]))}
    return {}


def central_workers(value: Any) -> int | str:
    """Run config ``central-workers``: ``auto`` or a positive number of processes."""
    if value == "auto":
        return "auto"
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1 or isinstance(value, float | bool):
        raise ValueError(f"run config central-workers must be 'auto' or a positive integer, got {value!r}")
    return n


@app.main()
def main(grid: Grid, context: Context) -> None:
    context = with_run_config_defaults(context)  # pyproject's defaults where a runtime passed none
    rounds = int(context.run_config["num-server-rounds"])
    out = Path(str(context.run_config["out-dir"]))
    out.mkdir(parents=True, exist_ok=True)
    mode = str(context.run_config["mode"])
    if mode not in ("online", "packing"):
        raise ValueError(f"run config mode must be online or packing, got {mode!r}")
    done, weights = load_checkpoint(out)
    if done >= rounds:
        log(INFO, "hub: %s rounds already done in %s; nothing to resume", rounds, out)
        return
    if weights is None:
        weights = initial_weights(str(context.run_config["init"]), int(context.run_config["seed"]), mode)
    name = str(context.run_config["strategy"])
    min_nodes = int(context.run_config["min-nodes"])
    own = strategy_arguments(name, context.run_config)
    strategy = make_strategy(name, norm_bound=float(context.run_config["norm-bound"]), round_offset=done,
                             norm_action=str(context.run_config["norm-action"]),
                             cosine_floor=float(context.run_config["cosine-floor"]),
                             weight_bound=float(context.run_config["weight-bound"]),
                             download_codec=str(context.run_config["download-codec"]),
                             fraction_train=float(context.run_config["fraction-train"]),
                             fraction_evaluate=0.0, min_train_nodes=min_nodes, min_available_nodes=min_nodes,
                             **own)
    if mode == "online":
        online = online_central_evaluator(size=str(context.run_config["member-size"]),
                                          workers=central_workers(context.run_config["central-workers"]),
                                          kube_weight=float(context.run_config["kube-weight"]))
        evaluator, close = online, online.close
    else:
        evaluator, close = central_evaluator(int(context.run_config["eval-nodes"])), None
    try:
        recorder = HubRecorder(out, strategy, evaluator, resumed_from=done)
        strategy.start(grid=grid, initial_arrays=ArrayRecord({k: Array(v) for k, v in weights.items()}),
                       num_rounds=rounds - done, train_config=ConfigRecord(), evaluate_fn=recorder)
        recorder.finish(rounds)
    finally:
        if close is not None:
            close()
