"""The ClientApp called with Flower messages, mods included: deployment (a member's own data and
decision log), simulation, the run-config defaults, and each mod on and off."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedsched.agent.federation.client_app import app, train
from fedsched.agent.federation.learners import ppo_config
from fedsched.agent.federation.mods import RESIDUAL_KEY, run_config_defaults_mod
from fedsched.agent.federation.round import MemberRunConfig, RoundInfo
from fedsched.common.federation.codec import decode_int8
from fedsched.common.federation.run_config import app_defaults
from fedsched.common.federation.weights import weights_of
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.common.model.synthetic import generate_cluster, write_csvs
from tests.builders import log_with_outcomes


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield


GLOBAL = weights_of(NodeScoringPolicy())


def message(weights: dict, server_round: int = 1) -> Message:
    content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in weights.items()}),
                          "config": ConfigRecord({"server-round": server_round})})
    return Message(content, dst_node_id=7, message_type="train")


def sim_context(state_dir, partition: int = 1, **run_config) -> Context:
    """A simulated member (partition 1: the synthetic web cluster) with a tiny round: PPO in
    packing mode (the mods do not depend on the mode; online rounds are tested in
    test_local_rewards.py and through Flower in tests/experiment/test_federate.py)."""
    return Context(run_id=1, node_id=7, node_config={"partition-id": partition}, state=RecordDict(),
                   run_config={"mode": "packing", "local-steps": 16, "state-dir": str(state_dir),
                               **run_config})


def update(reply: Message) -> dict[str, np.ndarray]:
    return decode_int8({k: v.numpy() for k, v in reply.content["arrays"].items()})


def metrics(reply: Message) -> dict:
    return dict(next(iter(reply.content.metric_records.values())))


def test_deployed_member_learns_from_its_own_data_and_decision_log(tmp_path):
    nodes, pods = generate_cluster("gpu", seed=3, n_nodes=16, n_pods=120)
    n_csv, p_csv = write_csvs(nodes, pods, tmp_path, "member")
    log_with_outcomes(tmp_path / "log", nodes, pods, 200)  # its decisions and their outcomes
    glob = GLOBAL
    node_config = {"cluster-name": "prod-eu", "nodes-csv": str(n_csv), "pods-csv": str(p_csv),
                   "decision-log": str(tmp_path / "log"), "window": 150,
                   "serve-policy": str(tmp_path / "serve" / "policy.pt")}
    ctx = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                  run_config={"state-dir": str(tmp_path / "state"), "eta": 0.2})
    reply = app(message(glob), ctx)
    assert metrics(reply)["num-examples"] == 150 and metrics(reply)["uploaded"] == 1
    delta = update(reply)
    assert set(delta) == set(glob) and any(np.abs(v).max() > 0 for v in delta.values())
    assert (tmp_path / "state" / "prod-eu" / "local.npz").exists()  # W_local persisted under its name
    # the extender's checkpoint: the personalised mix, loadable by the serving agent
    from fedsched.agent.serving.model_store import ModelStore
    from fedsched.agent.serving.rollout_gate import gate
    from fedsched.common.federation.codec import personalised_mix
    from fedsched.common.federation.weights import load_npz
    from fedsched.common.learning.checkpoint import load_checkpoint

    # the roll-out gate of the member's extender judges the mix on evidence from the member's own
    # validation pods: paired replays beside kube-default, one value per seed
    _, meta, _ = load_checkpoint(tmp_path / "serve" / "policy.pt")
    assert meta["operating_mode"] == "online" and set(meta["evidence"]["profiles"]) == {"gpu"}
    own = meta["evidence"]["profiles"]["gpu"]
    assert own["scenario"] == "own" and len(own["seeds"]) == len(own["trouble_score"]["values"]) == 5
    assert set(own["log_ratio"]) >= {"oom_kills_per_1k_starts", "failed_pods"}
    verdict = gate(meta, "gpu")
    assert verdict.reason and verdict.reason.startswith("better than kube-default") == verdict.active
    assert not list((tmp_path / "serve").glob(".*staged*"))  # written beside, moved into place
    assert meta["scoring"] == {"kube_weight": 2.0}  # the run config's kube-weight, as the member validated
    assert ModelStore(str(tmp_path / "serve" / "policy.pt")).current.scheduler.kube_weight == 2.0
    served = ModelStore(str(tmp_path / "serve" / "policy.pt")).current.scheduler.policy
    local = load_npz(tmp_path / "state" / "prod-eu" / "local.npz")
    mix = personalised_mix(local, glob, 0.2)
    for k, v in weights_of(served).items():
        np.testing.assert_allclose(v, mix[k], rtol=1e-6, atol=1e-7)
    bad = Context(run_id=1, node_id=7, node_config={"nodes-csv": str(n_csv)}, state=RecordDict(),
                  run_config={"state-dir": str(tmp_path / "state")})
    with pytest.raises(ValueError, match="pods-csv"):
        app(message(glob), bad)
    with pytest.raises(ValueError, match="eta"):
        app(message(glob), Context(run_id=1, node_id=7, node_config={}, state=RecordDict(),
                                   run_config={"eta": 1.5}))


def test_the_defaults_mod_completes_a_partial_run_config_from_pyproject(tmp_path):
    ctx = sim_context(tmp_path / "state")
    given = dict(ctx.run_config)
    seen: list[dict] = []

    def inner(msg: Message, context: Context) -> Message:  # what the layers below the mod get
        seen.append(dict(context.run_config))
        assert context.state is ctx.state  # the same state: what they write persists
        return train(msg, context)

    reply = run_config_defaults_mod(message(GLOBAL), ctx, inner)
    assert seen == [{**app_defaults(), **given}]  # pyproject's table, the given keys kept
    assert ctx.run_config == given  # the runtime's context is untouched (Flower checks it)
    assert metrics(reply)["num-examples"] == 16  # local-steps came from the given config
    reply = app(message(GLOBAL), ctx)  # the same through the whole app
    assert metrics(reply)["uploaded"] == 1 and ctx.run_config == given
    with pytest.raises(ValueError, match="local-step"):  # a typo fails as under `flwr run`
        app(message(GLOBAL), sim_context(tmp_path / "typo", **{"local-step": 8}))


def test_codec_mod_sends_int8_with_error_feedback_and_fp32_passes_through(tmp_path):
    int8_ctx = sim_context(tmp_path / "int8")  # codec defaults to "int8" (pyproject)
    int8 = app(message(GLOBAL), int8_ctx)
    fp32 = app(message(GLOBAL), sim_context(tmp_path / "fp32", codec="fp32"))
    q = {k: v.numpy() for k, v in int8.content["arrays"].items()}
    raw = {k: v.numpy() for k, v in fp32.content["arrays"].items()}
    assert set(q) == {f"{k}{s}" for k in GLOBAL for s in (".q", ".scale")}
    assert all(v.dtype == np.int8 for k, v in q.items() if k.endswith(".q"))
    assert set(raw) == {f"{k}.raw" for k in GLOBAL} and all(v.dtype == np.float32 for v in raw.values())
    assert metrics(int8)["bytes-up"] <= 0.26 * metrics(int8)["bytes-up-fp32"]
    assert metrics(fp32)["bytes-up"] == metrics(fp32)["bytes-up-fp32"]
    # The same seeded round either way: the INT8 update is the float32 one to within half a step.
    exact, approx = update(fp32), update(int8)
    for k in GLOBAL:
        step = float(np.abs(exact[k]).max()) / 127
        np.testing.assert_allclose(approx[k], exact[k], atol=step / 2 + 1e-7)
        residual = int8_ctx.state[RESIDUAL_KEY][k].numpy()  # kept for the next upload
        np.testing.assert_allclose(residual, exact[k] - approx[k], atol=1e-6)
    with pytest.raises(ValueError, match="codec"):
        app(message(GLOBAL), sim_context(tmp_path / "bad", codec="int4"))


def test_poison_mod_corrupts_only_the_listed_members(tmp_path):
    honest = update(app(message(GLOBAL), sim_context(tmp_path / "honest", codec="fp32")))
    other = update(app(message(GLOBAL), sim_context(tmp_path / "other", codec="fp32",
                                                    **{"poison-members": "0,2"})))
    flipped = update(app(message(GLOBAL), sim_context(tmp_path / "flip", codec="fp32",
                                                      **{"poison-members": "1", "poison-kind": "flip"})))
    huge = update(app(message(GLOBAL), sim_context(tmp_path / "huge", codec="fp32",
                                                   **{"poison-members": " 1 ", "poison-kind": "huge"})))
    for k in GLOBAL:
        np.testing.assert_array_equal(other[k], honest[k])  # partition 1 is not listed: untouched
        np.testing.assert_array_equal(flipped[k], -honest[k])
        np.testing.assert_allclose(huge[k], 1e4 * honest[k], rtol=1e-6)
    # NaN cannot be quantised: with the INT8 codec it still goes out, unquantised, for the hub to reject
    nan_reply = app(message(GLOBAL), sim_context(tmp_path / "nan",
                                                 **{"poison-members": "1", "poison-kind": "nan"}))
    assert set(nan_reply.content["arrays"]) == {f"{k}.raw" for k in GLOBAL}
    assert all(np.isnan(v).all() for v in update(nan_reply).values())
    with pytest.raises(ValueError, match="poison-kind"):
        app(message(GLOBAL), sim_context(tmp_path / "bad", **{"poison-members": "1", "poison-kind": "zero"}))


def test_an_inflating_member_sends_its_own_int8_update_and_claims_a_million_times_its_pods(tmp_path):
    honest = app(message(GLOBAL), sim_context(tmp_path / "honest"))
    liar = app(message(GLOBAL), sim_context(tmp_path / "liar",
                                            **{"poison-members": "1", "poison-kind": "inflate"}))
    assert set(liar.content["arrays"]) == set(honest.content["arrays"])  # INT8, like any other upload
    for k, v in update(honest).items():
        np.testing.assert_array_equal(update(liar)[k], v)
    assert metrics(liar)["num-examples"] == 1e6 * metrics(honest)["num-examples"]
    assert {k: v for k, v in metrics(liar).items() if k != "num-examples"} == \
        {k: v for k, v in metrics(honest).items() if k != "num-examples"}


def test_failure_mod_fails_rounds_at_fail_rate_and_is_off_at_zero(tmp_path):
    with pytest.raises(RuntimeError, match="injected failure in round 3"):
        app(message(GLOBAL, server_round=3), sim_context(tmp_path / "always", **{"fail-rate": 1.0}))
    assert not (tmp_path / "always").exists()  # it failed before doing any work
    reply = app(message(GLOBAL, server_round=3), sim_context(tmp_path / "never", **{"fail-rate": 0.0}))
    assert metrics(reply)["num-examples"] == 16
    with pytest.raises(ValueError, match="fail-rate"):
        app(message(GLOBAL), sim_context(tmp_path / "bad", **{"fail-rate": 1.5}))



def test_a_member_rounds_ppo_settings_come_from_the_run_config():
    table = app_defaults()
    member_cfg = MemberRunConfig.from_run_config({"local-steps": 64, "ppo-learning-rate": 1e-3})
    cfg = ppo_config(member_cfg, RoundInfo(server_round=1, seed=3, mu=0.05))
    assert (cfg.total_steps, cfg.learning_rate, cfg.proximal_mu, cfg.seed) == (64, 1e-3, 0.05, 3)
    assert cfg.num_steps == min(table["ppo-rollout-steps"], 64)
    assert cfg.update_epochs == table["ppo-update-epochs"]
    assert cfg.num_minibatches == table["ppo-num-minibatches"]


def test_a_members_typed_run_config_is_pyprojects_table():
    """Every field of the member's run config is a key of pyproject's table, read with its value
    and type; a typo fails as under `flwr run`."""
    import dataclasses

    table = app_defaults()
    cfg = MemberRunConfig.defaults()
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        assert value == table[MemberRunConfig.key(f.name)] and type(value).__name__ == f.type, f.name
    assert MemberRunConfig.from_run_config({"eta": 1}).eta == 1.0
    with pytest.raises(ValueError, match="local-step"):
        MemberRunConfig.from_run_config({"local-step": 8})
