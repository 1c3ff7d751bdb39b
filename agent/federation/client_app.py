"""The member's Flower ClientApp: one federated round = load, a local round, reply with the update.

Run config (``context.run_config``, read once as a
:class:`fedsched.agent.federation.round.MemberRunConfig`; defaults in pyproject's
``[tool.flwr.app.config]``, filled in by the app's
:func:`fedsched.agent.federation.mods.run_config_defaults_mod` where a runtime passes none):
``eta`` (personalisation, rejected outside [0, 1]), ``mode`` (``online``: credit regression on
the member's own rewards in its replay twin, with ``local-decisions`` / ``scarce-decisions``,
``late-round``, ``local-epochs``, ``local-learning-rate``; ``packing``: PPO with
``local-steps`` and the ``ppo-*`` settings), ``upload-every`` (sparse communication),
``upload-norm`` (upload earlier when the accumulated change passes this norm), ``state-dir``
(where each member keeps ``W_local`` and its experience), ``finetune-*`` (a deployed member's
update). FedProx's ``proximal-mu`` arrives in the round's config. In simulation the member
cluster comes from the node's ``partition-id``
(:func:`fedsched.common.federation.members.member_cluster`). In deployment the SuperNode's
node config names the member's own data: ``cluster-name``, ``nodes-csv`` and ``pods-csv`` (its
cluster in the openb schema), and optionally ``decision-log`` (a
:class:`fedsched.common.learning.decision_log.DecisionLog` directory) with ``window``: the member
then learns from the outcomes of its own recent decisions (credit regression on the log's last
``window`` entries with a known outcome) instead of simulating; with ``serve-policy`` (a checkpoint path)
it then writes its personalised mix ``eta * W_local + (1 - eta) * W_global`` there, and the
member's extender (``fedsched serve --policy`` on that path) hot-reloads it. The round itself
(personalise, learn, keep ``W_local``, decide on the upload) is
:func:`fedsched.agent.federation.round.member_round`; how the member learns is its learner
(:func:`fedsched.agent.federation.learners.learner_for`).

``train`` replies with one ArrayRecord holding its float32 delta (``NAME.raw``) and one
MetricRecord with ``num-examples`` (pods scheduled this round; 0 when the member skipped its
upload or has not joined yet), the mean reward, bytes sent and received, whether it uploaded,
its partition, its validation score (online mode; NaN otherwise) and whether it has joined.
Its mods (:mod:`fedsched.agent.federation.mods`) rebuild a compressed global before ``train``
(and report the bytes that really arrived as ``bytes-down``, beside ``bytes-down-fp32``), encode
the delta for the wire (INT8 with error feedback unless ``codec = "fp32"``) and add the
experiment knobs (``fail-rate``, ``poison-members`` / ``poison-kind``).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsched.agent.federation.learners import learner_for
from fedsched.agent.federation.mods import (
    codec_mod,
    download_mod,
    failure_mod,
    poison_mod,
    run_config_defaults_mod,
)
from fedsched.agent.federation.round import (
    MemberRunConfig,
    RoundInfo,
    load_member,
    member_round,
    partition_id,
)
from fedsched.common.federation.codec import RAW_SUFFIX, nbytes

app = ClientApp(mods=[run_config_defaults_mod])


@app.train(mods=[download_mod, failure_mod, codec_mod, poison_mod])
def train(msg: Message, context: Context) -> Message:
    # Load: this member's settings, cluster, state and way of learning, and the global model.
    cfg = MemberRunConfig.from_run_config(context.run_config)
    member, state = load_member(context.node_config, cfg)
    learner = learner_for(member, cfg, context.node_config)
    global_w = {k: v.numpy() for k, v in msg.content["arrays"].items()}
    config = msg.content["config"]
    info = RoundInfo.for_member(int(config["server-round"]), partition_id(context.node_config),
                                mu=float(config.get("proximal-mu", 0.0)), training_seed=cfg.training_seed)

    # One local round: learning from the member's own rewards (its replay twin, or its decision log).
    result = member_round(learner, state, global_w, cfg, info)

    # Reply: the update (the codec mod encodes it) and the round's metrics.
    update = {k + RAW_SUFFIX: v.astype(np.float32) for k, v in result.delta.items()}
    metrics = MetricRecord({
        "num-examples": int(result.examples), "mean-reward": float(result.mean_reward),
        "bytes-up": int(nbytes(update)), "bytes-down": int(nbytes(global_w)),
        "bytes-down-fp32": int(nbytes(global_w)),
        "bytes-up-fp32": int(nbytes(result.delta)), "uploaded": int(result.upload),
        "partition": partition_id(context.node_config), "val-score": float(result.val_score),
        "joined": int(result.joined),
    })
    arrays = ArrayRecord({k: Array(v) for k, v in update.items()})
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
