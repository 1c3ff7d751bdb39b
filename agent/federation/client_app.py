"""The member's Flower ClientApp: one federated round = local PPO training and an INT8 upload.

Run config (``[tool.flwr.app.config]``, overridable with ``flwr run --run-config``):
``eta`` (personalisation, default 0.2, rejected outside [0, 1]), ``local-steps`` (PPO
decisions per round), ``upload-every`` (sparse communication), ``upload-norm`` (upload
earlier when the accumulated change passes this norm), ``state-dir`` (where each member
keeps ``W_local`` and its error-feedback residual). FedProx's ``proximal-mu`` arrives in
the round's config. In simulation the member cluster comes from the node's
``partition-id`` (:func:`fedsched.agent.federation.task.member_cluster`). In deployment the
SuperNode's node config names the member's own data: ``cluster-name``, ``nodes-csv`` and
``pods-csv`` (its cluster in the openb schema), and optionally ``decision-log`` (a
:class:`fedsched.agent.serving.decision_log.DecisionLog` directory) with ``window``: the member then
learns from its own recent decisions (behaviour cloning on the log's last ``window``
entries, lr 1e-4) instead of simulating; with ``serve-policy`` (a checkpoint path) it then
writes its personalised mix ``eta * W_local + (1 - eta) * W_global`` there, and the member's
extender (``fedsched serve --policy`` on that path) hot-reloads it.

Reply: one ArrayRecord with the INT8-encoded delta (``NAME.q`` / ``NAME.scale``) and one
MetricRecord with ``num-examples`` (decisions trained on; 0 when the member skipped its
upload), the mean reward, and bytes sent and received.

Experiment knobs (benchmarks and robustness tests; all off by default): ``codec = "fp32"``
uploads float32 deltas (``NAME.raw``) to compare against INT8; ``poison-members`` (comma-
separated partition ids) with ``poison-kind`` = nan | huge | flip makes those members send
NaN, 10^4-times scaled or sign-flipped updates; ``fail-rate`` makes every member fail a
round with that probability (seeded by round and partition), as a crashed member would.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsched.agent.federation.task import (
    MemberState,
    RoundResult,
    finetune_on_log,
    local_round,
    write_serving_checkpoint,
)
from fedsched.common.federation.codec import ErrorFeedback, encode_int8, nbytes, personalised_mix
from fedsched.common.federation.members import member_cluster, member_from_node_config
from fedsched.common.federation.run_config import config_value

app = ClientApp()


def poisoned(delta: dict[str, np.ndarray], pid: int, members: str, kind: str) -> dict[str, np.ndarray]:
    """The update a poisoned member sends instead of ``delta`` (unchanged for honest members)."""
    if str(pid) not in {m.strip() for m in members.split(",") if m.strip()}:
        return delta
    if kind == "nan":
        return {k: np.full_like(v, np.nan) for k, v in delta.items()}
    if kind == "huge":
        return {k: v * 1e4 for k, v in delta.items()}
    if kind == "flip":
        return {k: -v for k, v in delta.items()}
    raise ValueError(f"unknown poison-kind {kind!r}: expected nan, huge or flip")


def _cfg(context: Context, key: str, default):
    return config_value(context.run_config, key, default)


@app.train()
def train(msg: Message, context: Context) -> Message:
    eta = _cfg(context, "eta", 0.2)
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"run config eta must be in [0, 1], got {eta}")
    pid = int(context.node_config.get("partition-id", 0))
    member = member_from_node_config(context.node_config) or member_cluster(
        pid, openb_nodes=_cfg(context, "openb-nodes", 120))
    state_root = Path(_cfg(context, "state-dir", "fedsched-state"))
    state = MemberState(state_root / member.name)
    config = msg.content["config"]
    rnd = int(config.get("server-round", 1))
    global_w = {k: v.numpy() for k, v in msg.content["arrays"].items()}
    if np.random.default_rng([rnd, pid, 7]).random() < _cfg(context, "fail-rate", 0.0):
        raise RuntimeError(f"member {pid}: injected failure in round {rnd} (fail-rate)")
    log_dir = context.node_config.get("decision-log")
    if log_dir:  # deployment: learn from the member's own recent decisions
        local = state.load("local")
        start = personalised_mix(local, global_w, eta) if local is not None else global_w
        window = int(context.node_config.get("window", 5000))
        new, used = finetune_on_log(global_w, start, str(log_dir), window, 1e-4, 2, seed=1000 * rnd + pid)
        state.save("local", new)
        serve_path = context.node_config.get("serve-policy")
        if serve_path:  # the member's extender hot-reloads its personalised mix from this file
            write_serving_checkpoint(str(serve_path), personalised_mix(new, global_w, eta), rnd)
        delta = {k: (new[k] - global_w[k]).astype(np.float32) for k in global_w}
        result = RoundResult(delta, used, 0.0, True)
    else:  # simulation, or a member that trains on a model of its own cluster
        result = local_round(member, state, global_w, eta=eta, steps=_cfg(context, "local-steps", 256),
                             mu=float(config.get("proximal-mu", 0.0)), seed=1000 * rnd + pid,
                             upload_every=_cfg(context, "upload-every", 1), server_round=rnd,
                             norm_threshold=_cfg(context, "upload-norm", 1e9))
    ef = ErrorFeedback()
    residual = state.load("residual")
    if residual is not None:
        ef.load(residual)
    delta = poisoned(result.delta, pid, _cfg(context, "poison-members", ""),
                     _cfg(context, "poison-kind", "nan"))
    if _cfg(context, "codec", "int8") == "fp32":
        encoded = {k + ".raw": v.astype(np.float32) for k, v in delta.items()}
    elif delta is not result.delta and not all(np.isfinite(v).all() for v in delta.values()):
        encoded = {}  # NaN cannot be quantised: a poisoned member sends raw floats as "int8"
        for k, v in delta.items():
            encoded[k + ".q"], encoded[k + ".scale"] = v, np.array(1.0, np.float32)
    else:
        # A skipped upload still sends the same keys (zeros) so replies stay consistent.
        encoded = ef.encode(delta) if result.upload else encode_int8(delta)
        if result.upload:
            state.save("residual", ef.state())
    metrics = MetricRecord({
        "num-examples": int(result.examples), "mean-reward": float(result.mean_reward),
        "bytes-up": int(nbytes(encoded)), "bytes-down": int(nbytes(global_w)),
        "bytes-up-fp32": int(nbytes(result.delta)), "uploaded": int(result.upload), "partition": pid,
    })
    content = RecordDict({"arrays": ArrayRecord({k: Array(np.asarray(v)) for k, v in encoded.items()}),
                          "metrics": metrics})
    return Message(content=content, reply_to=msg)
