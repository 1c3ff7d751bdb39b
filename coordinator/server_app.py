"""The hub's Flower ServerApp: strategy from the run config, checkpoints, central evaluation.

Run config: ``num-server-rounds``, ``strategy`` (fedavg | fedprox | fedtrimmedavg | krum),
``proximal-mu``, ``fraction-train``, ``min-nodes``, ``norm-bound`` (update validation),
``out-dir`` (checkpoints and metrics), ``init`` (shipped | random starting model). Every
round the aggregated global model is checkpointed (``global.npz`` with its round number,
written atomically) and evaluated on a held-out simulated cluster (an openb GPU slice with
test pods, packing mode); per-round metrics (central evaluation, members' rewards, bytes
up/down, rejected updates) go to ``rounds.json``. A hub restarted with the same
``out-dir`` resumes from the checkpoint: the rounds already done are neither lost nor
repeated.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from fedsched.common.federation.run_config import config_value
from fedsched.common.federation.weights import load_npz, save_npz, weights_of
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.coordinator.evaluation import central_evaluator
from fedsched.coordinator.strategies import make_strategy

app = ServerApp()


def initial_weights(init: str = "shipped", seed: int = 1) -> dict[str, np.ndarray]:
    """The hub's starting model: the shipped policy (a fleet starts from a good scheduler,
    never from random decisions), or a seeded random initialisation."""
    if init == "shipped":
        from fedsched.common.learning.checkpoint import load_checkpoint
        from fedsched.common.schedulers import default_policy_path

        return weights_of(load_checkpoint(default_policy_path())[0])
    if init != "random":
        raise ValueError(f"init must be 'shipped' or 'random', got {init!r}")
    torch.manual_seed(seed)
    return weights_of(NodeScoringPolicy())


@app.main()
def main(grid: Grid, context: Context) -> None:
    def cfg(key: str, default):
        return config_value(context.run_config, key, default)

    rounds = cfg("num-server-rounds", 3)
    out = Path(cfg("out-dir", "fedsched-hub"))
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "global.npz"
    saved = load_npz(ckpt)
    done = int(saved.pop("__round__")) if saved is not None else 0
    weights = saved if saved is not None else initial_weights(cfg("init", "shipped"), cfg("seed", 1))
    history_path = out / "rounds.json"
    history = json.loads(history_path.read_text()) if history_path.exists() and done else []
    if done >= rounds:
        print(f"hub: {rounds} rounds already done in {out}; nothing to resume")
        return
    min_nodes = cfg("min-nodes", 2)
    strategy = make_strategy(cfg("strategy", "fedavg"), proximal_mu=cfg("proximal-mu", 0.01),
                             norm_bound=cfg("norm-bound", 5.0), round_offset=done,
                             fraction_train=cfg("fraction-train", 1.0), fraction_evaluate=0.0,
                             min_train_nodes=min_nodes, min_available_nodes=min_nodes)
    evaluate = central_evaluator(cfg("eval-nodes", 200))
    t0 = time.time()

    def on_round(rnd: int, arrays: ArrayRecord) -> None:
        w = {k: v.numpy() for k, v in arrays.items()}
        save_npz(ckpt, {**w, "__round__": np.array(rnd)})
        members = {str(int(m.get("partition", node))): m
                   for node, m in strategy.member_metrics.get(rnd, {}).items()}
        history.append({"round": rnd, "central": evaluate(w), "rejected": strategy.rejections.get(rnd, []),
                        "skipped": strategy.skipped.get(rnd, []), "members": members,
                        "wall_s": round(time.time() - t0, 1)})
        history_path.write_text(json.dumps(history, indent=2))

    strategy.on_round = on_round

    def train_metrics(rnd: int, metrics: MetricRecord | None) -> None:
        for entry in history:
            if metrics is not None and entry["round"] == rnd:
                entry["train"] = {k: float(v) for k, v in metrics.items()}
        history_path.write_text(json.dumps(history, indent=2))

    result = strategy.start(grid=grid, initial_arrays=ArrayRecord({k: Array(v) for k, v in weights.items()}),
                            num_rounds=rounds - done, train_config=ConfigRecord({}))
    for r, m in result.train_metrics_clientapp.items():
        train_metrics(r + done, m)
    (out / "final.json").write_text(json.dumps({"rounds": rounds, "resumed_from": done,
                                                "history": history}, indent=2))
