"""The member's Flower ClientApp: one federated round = local PPO training and an INT8 upload.

Run config (``[tool.flwr.app.config]``, overridable with ``flwr run --run-config``):
``eta`` (personalisation, default 0.2, rejected outside [0, 1]), ``local-steps`` (PPO
decisions per round), ``upload-every`` (sparse communication), ``upload-norm`` (upload
earlier when the accumulated change passes this norm), ``state-dir`` (where each member
keeps ``W_local`` and its error-feedback residual). FedProx's ``proximal-mu`` arrives in
the round's config. In simulation the member cluster comes from the node's
``partition-id`` (:func:`fedsched.agent.federated.member_cluster`).

Reply: one ArrayRecord with the INT8-encoded delta (``NAME.q`` / ``NAME.scale``) and one
MetricRecord with ``num-examples`` (decisions trained on; 0 when the member skipped its
upload), the mean reward, and bytes sent and received.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsched.common.weight_codec import ErrorFeedback, encode_int8, nbytes

from .federated import MemberState, config_value, local_round, member_cluster

app = ClientApp()


def _cfg(context: Context, key: str, default):
    return config_value(context.run_config, key, default)


@app.train()
def train(msg: Message, context: Context) -> Message:
    eta = _cfg(context, "eta", 0.2)
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"run config eta must be in [0, 1], got {eta}")
    pid = int(context.node_config.get("partition-id", 0))
    member = member_cluster(pid, openb_nodes=_cfg(context, "openb-nodes", 120))
    state_root = Path(_cfg(context, "state-dir", "fedsched-state"))
    state = MemberState(state_root / member.name)
    config = msg.content["config"]
    rnd = int(config.get("server-round", 1))
    global_w = {k: v.numpy() for k, v in msg.content["arrays"].items()}
    result = local_round(member, state, global_w, eta=eta, steps=_cfg(context, "local-steps", 256),
                         mu=float(config.get("proximal-mu", 0.0)), seed=1000 * rnd + pid,
                         upload_every=_cfg(context, "upload-every", 1), server_round=rnd,
                         norm_threshold=_cfg(context, "upload-norm", 1e9))
    ef = ErrorFeedback()
    residual = state.load("residual")
    if residual is not None:
        ef.load(residual)
    # A skipped upload still sends the same keys (zeros) so replies stay consistent.
    encoded = ef.encode(result.delta) if result.upload else encode_int8(result.delta)
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
