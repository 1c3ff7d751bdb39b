"""The ClientApp's train function called directly with Flower messages: simulation and deployment."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedsched.agent.federation.client_app import train
from fedsched.agent.learning.bc import collect
from fedsched.agent.learning.env import EnvConfig, SchedulingEnv
from fedsched.agent.serving.decision_log import DecisionLog
from fedsched.common.federation.codec import decode_int8
from fedsched.common.federation.weights import weights_of
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.common.model.synthetic import generate_cluster, write_csvs
from fedsched.common.schedulers import make_scheduler


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield


def message(weights: dict) -> Message:
    content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in weights.items()}),
                          "config": ConfigRecord({"server-round": 1})})
    return Message(content, dst_node_id=7, message_type="train")


def test_deployed_member_learns_from_its_own_data_and_decision_log(tmp_path):
    nodes, pods = generate_cluster("gpu", seed=3, n_nodes=16, n_pods=120)
    n_csv, p_csv = write_csvs(nodes, pods, tmp_path, "member")
    env = SchedulingEnv(nodes, pods, config=EnvConfig(target_load=1.0), seed=0)
    log = DecisionLog(tmp_path / "log")
    for d in collect([env], make_scheduler("kube-default"), 200):
        log.append(d, int(d.best[0]), model_version="kube-default")
    log.flush()
    glob = weights_of(NodeScoringPolicy())
    node_config = {"cluster-name": "prod-eu", "nodes-csv": str(n_csv), "pods-csv": str(p_csv),
                   "decision-log": str(tmp_path / "log"), "window": 150,
                   "serve-policy": str(tmp_path / "serve" / "policy.pt")}
    ctx = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                  run_config={"state-dir": str(tmp_path / "state"), "eta": 0.2})
    reply = train(message(glob), ctx)
    metrics = next(iter(reply.content.metric_records.values()))
    assert metrics["num-examples"] == 150 and metrics["uploaded"] == 1
    delta = decode_int8({k: v.numpy() for k, v in reply.content["arrays"].items()})
    assert set(delta) == set(glob) and any(np.abs(v).max() > 0 for v in delta.values())
    assert (tmp_path / "state" / "prod-eu" / "local.npz").exists()  # W_local persisted under its name
    # the extender's checkpoint: the personalised mix, loadable by the serving agent
    from fedsched.agent.serving.model_store import ModelStore
    from fedsched.common.federation.codec import personalised_mix
    from fedsched.common.federation.weights import load_npz

    served = ModelStore(str(tmp_path / "serve" / "policy.pt")).current.scheduler.policy
    local = load_npz(tmp_path / "state" / "prod-eu" / "local.npz")
    mix = personalised_mix(local, glob, 0.2)
    for k, v in weights_of(served).items():
        np.testing.assert_allclose(v, mix[k], rtol=1e-6, atol=1e-7)
    bad = Context(run_id=1, node_id=7, node_config={"nodes-csv": str(n_csv)}, state=RecordDict(),
                  run_config={"state-dir": str(tmp_path / "state")})
    with pytest.raises(ValueError, match="pods-csv"):
        train(message(glob), bad)
    with pytest.raises(ValueError, match="eta"):
        train(message(glob), Context(run_id=1, node_id=7, node_config={}, state=RecordDict(),
                                     run_config={"eta": 1.5}))
