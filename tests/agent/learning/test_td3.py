"""TD3 weight scorer: simplex actions, a known best weight vector, BC to a teacher, checkpoints."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.agent.learning.bc import BCConfig, collect, fit
from fedsched.agent.learning.env import EnvConfig, SchedulingEnv
from fedsched.agent.learning.td3 import TD3Config, TD3Trainer, choose_node
from fedsched.common.learning.checkpoint import load_checkpoint, save_checkpoint
from fedsched.common.learning.features import CONTEXT_FEATURES, NODE_FEATURES, POD_FEATURES, Features
from fedsched.common.learning.nets import (
    FREE_COLUMNS,
    GPU_TERMS,
    N_SUMMARY,
    WEIGHT_TERMS,
    WeightPolicy,
    gpu_mask,
    weight_inputs,
)
from fedsched.common.learning.scorers import WeightScheduler, scheduler_from_checkpoint
from fedsched.common.model.synthetic import generate_cluster
from fedsched.common.schedulers import SchedulerContext, make_scheduler
from fedsched.common.sim.packing import run_packing

CPU_FREE = NODE_FEATURES.index("cpu_after")


class PickMostFreeCpu:
    """Toy env: 6 nodes with random free shares; reward 1 iff the pod goes to the node with
    the most free CPU among the feasible ones. The best weights put all mass on free_cpu."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.max_nodes = 6
        self.state = SimpleNamespace(nodes=SimpleNamespace(total_gpu_milli=0))
        self.t = 0

    def _draw(self) -> None:
        k = self.max_nodes
        feats = np.zeros((k, len(NODE_FEATURES)), np.float32)
        feats[:, list(FREE_COLUMNS)] = self.rng.random((k, len(FREE_COLUMNS)))
        self.nodes = np.flatnonzero(self.rng.random(k) > 0.2)
        if len(self.nodes) == 0:
            self.nodes = np.array([0])
        self.feats = Features(feats[self.nodes], np.zeros(len(POD_FEATURES), np.float32),
                              np.zeros(len(CONTEXT_FEATURES), np.float32))

    @property
    def decision(self):
        return None, self.state, self.nodes, self.feats

    def reset(self, seed=None, options=None):
        self.t = 0
        self._draw()
        return {}, {}

    def step(self, node: int):
        best = self.nodes[int(np.argmax(self.feats.nodes[:, CPU_FREE]))]
        r = float(node == best)
        self.t += 1
        done = self.t >= 20
        self._draw()
        return {}, r, done, False, {"episode_metrics": {}, "episode_return": 0.0}


def test_td3_learns_the_known_best_weight_vector():
    envs = [PickMostFreeCpu(1), PickMostFreeCpu(2)]
    cfg = TD3Config(total_steps=6000, learning_starts=500, batch_size=128, gamma=0.0, seed=3,
                    actor_lr=1e-3, critic_lr=1e-3, log_every=2000)
    trainer = TD3Trainer(envs, cfg)
    test_env = PickMostFreeCpu(99)
    test_env.reset()

    def greedy_accuracy() -> float:
        hits = 0
        for _ in range(400):
            _, _, _, feats = test_env.decision
            s = weight_inputs(feats)[1]
            w = trainer.act(s, gpu_mask(False), explore=False)
            node, _ = choose_node(test_env, w)
            _, r, *_ = test_env.step(node)
            hits += r
        return hits / 400

    before = greedy_accuracy()
    trainer.train()
    after = greedy_accuracy()
    w = trainer.act(np.zeros(N_SUMMARY, np.float32), gpu_mask(False), explore=False)
    assert after >= 0.9 > before + 0.2, (before, after)
    assert WEIGHT_TERMS[int(np.argmax(w))] == "free_cpu" and w[WEIGHT_TERMS.index("free_cpu")] > 0.5


def test_an_update_is_one_collection_step_then_its_gradient_steps():
    envs = [PickMostFreeCpu(1), PickMostFreeCpu(2), PickMostFreeCpu(3)]
    cfg = TD3Config(total_steps=1000, learning_starts=300, batch_size=32, log_every=200, seed=1)
    trainer = TD3Trainer(envs, cfg)
    rows: list[dict[str, float]] = []
    steps_at_update: list[int] = []
    trainer.train(on_update=lambda r: (rows.append(r), steps_at_update.append(trainer.gradient_steps)))
    assert trainer.update == trainer.num_updates == 5
    # Updates end at the first round of the 3 environments that reaches a multiple of 200.
    assert [r["update"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["global_step"] for r in rows] == [201, 402, 600, 801, 1002]
    # One gradient step per decision from the learning_starts-th on.
    assert steps_at_update == [0, 402 - 299, 600 - 299, 801 - 299, 1002 - 299]
    state = trainer.state_dict()
    resumed = TD3Trainer(envs, cfg, trainer.policy)
    resumed.load_state_dict(state)
    assert (resumed.update, resumed.gradient_steps, resumed.global_step) == (5, 703, 1002)
    legacy = {k: v for k, v in state.items() if k not in ("update", "gradient_steps")} | {"n_updates": 9}
    resumed.load_state_dict(legacy)  # a checkpoint from before the update count was stored
    assert (resumed.update, resumed.gradient_steps) == (1002 // 200, 9)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), has_gpus=st.booleans(), noise=st.floats(0.0, 5.0))
def test_actions_stay_on_the_simplex_and_respect_the_gpu_mask(seed, has_gpus, noise):
    torch.manual_seed(seed)
    trainer = TD3Trainer([], TD3Config(exploration_noise=noise, seed=seed))
    torch.nn.init.normal_(trainer.policy.actor[-1].weight, std=3.0)  # far from uniform
    s = np.random.default_rng(seed).normal(size=N_SUMMARY).astype(np.float32) * 5
    for explore in (False, True):
        w = trainer.act(s, gpu_mask(has_gpus), explore=explore)
        assert (w >= 0).all() and abs(w.sum() - 1.0) < 1e-6
        if not has_gpus:
            assert (w[GPU_TERMS] < 1e-9).all()


def test_behaviour_cloning_reaches_its_teacher_on_a_toy_cluster(tmp_path):
    nodes, pods = generate_cluster("gpu", seed=5, n_nodes=24, n_pods=200)
    env = SchedulingEnv(nodes, pods, config=EnvConfig(target_load=1.0), seed=0)
    teacher = make_scheduler("kube-default", SchedulerContext(train_pods=pods))
    log = collect([env], teacher, 1500)
    from fedsched.common.learning.nets import NodeScoringPolicy

    # The node-scoring policy can express kube-default exactly; a weighted score of free and
    # load terms cannot (BalancedAllocation is not among the terms), so it agrees less often.
    for net, floor in ((NodeScoringPolicy, 0.9), (WeightPolicy, 0.8)):
        torch.manual_seed(0)  # before building the net: its initialisation must not depend on other tests
        policy = net()
        stats = fit(policy, log, BCConfig(epochs=25, learning_rate=3e-3))
        assert stats["teacher_agreement"] >= floor, (type(policy).__name__, stats)
    # The weight policy imitating kube-default (LeastAllocated + balance) spreads CPU/memory.
    torch.manual_seed(0)
    w_policy = WeightPolicy()
    fit(w_policy, log, BCConfig(epochs=6, learning_rate=3e-3))
    sched = WeightScheduler(w_policy, None)
    ours = run_packing(nodes, pods, sched, target_load=1.0, seed=1).metrics["alloc_cpu"]
    theirs = run_packing(nodes, pods, teacher, target_load=1.0, seed=1).metrics["alloc_cpu"]
    # 0.967-0.983 of the teacher's allocation was seen across runs (a weighted score of free and
    # load terms cannot express BalancedAllocation exactly); 0.95 still says it packs like it.
    assert ours >= 0.95 * theirs
    # Spreading terms carry the weight: "free" (room left after the placement) and "cool"
    # (headroom under the hot threshold, which in packing mode is the same room measured from
    # 0.85), against "load" and "hot", their packing mirror images. The two kinds of spreading
    # term are nearly collinear here, so how the weight splits between them is arbitrary: about
    # 0.51 / 0.49 in this run, and 0.499 / 0.501 in one full-suite run.
    w = dict(zip(WEIGHT_TERMS, sched.last_weights, strict=True))
    spread = sum(w[f"{kind}_{r}"] for kind in ("free", "cool") for r in ("cpu", "mem"))
    pack = sum(w[f"{kind}_{r}"] for kind in ("load", "hot") for r in ("cpu", "mem"))
    assert spread > 0.9 and pack < 0.05, w


def test_weight_checkpoint_round_trip_and_scheduler(tmp_path):
    torch.manual_seed(1)
    policy = WeightPolicy()
    torch.nn.init.normal_(policy.actor[-1].weight, std=1.0)
    path = save_checkpoint(tmp_path / "td3.pt", policy, algorithm="td3", hyperparameters={"x": 1},
                           typical=None, data="0" * 16)
    loaded, meta, _ = load_checkpoint(path)
    assert meta["kind"] == "weights" and isinstance(loaded, WeightPolicy)
    s = torch.randn(4, N_SUMMARY)
    torch.testing.assert_close(loaded.weights(s), policy.weights(s))
    nodes, pods = generate_cluster("edge", seed=2)
    sched = scheduler_from_checkpoint(path)
    assert isinstance(sched, WeightScheduler)
    res = run_packing(nodes, pods, sched, target_load=0.8, seed=1)
    assert np.isfinite(res.metrics["alloc_cpu"])


def test_weight_policy_onnx_parity_and_gpu_mask(tmp_path):
    from fedsched.common.learning.onnx import OnnxScorer, export_weights_onnx

    torch.manual_seed(4)
    policy = WeightPolicy()
    torch.nn.init.normal_(policy.actor[-1].weight, std=2.0)  # far from uniform weights
    path = export_weights_onnx(policy, tmp_path / "w.onnx")
    scorer = OnnxScorer(path)
    assert scorer.kind == "weights"
    rng = np.random.default_rng(0)
    for has_gpus in (True, False):
        allowed = gpu_mask(has_gpus)
        for _ in range(20):
            s = rng.normal(size=N_SUMMARY).astype(np.float32)
            ref = policy.weights_numpy(s, allowed)
            got = scorer.weights(s, allowed)
            np.testing.assert_allclose(got, ref, atol=1e-5)  # float32 kernels differ by rounding only
            assert abs(got.sum() - 1) < 1e-5 and (has_gpus or (got[GPU_TERMS] < 1e-9).all())
    assert np.ptp(scorer.weights(rng.normal(size=N_SUMMARY).astype(np.float32), gpu_mask(True))) > 0.01


def test_train_cli_bc_weights_then_td3_from_it(tmp_path, capsys):
    from fedsched.cli.main import main
    from fedsched.common.model.synthetic import write_csvs

    nodes, pods = generate_cluster("gpu", seed=11, n_nodes=16, n_pods=140)
    n_csv, p_csv = write_csvs(nodes, pods, tmp_path, "c")
    common = ["--nodes", str(n_csv), "--pods", str(p_csv), "--slice-nodes", "0", "--eval-nodes", "0",
              "--num-envs", "1"]
    assert main(["train", "--algo", "bc", "--policy-kind", "weights", "--teacher", "fgd", "--bc-samples",
                 "300", "--bc-epochs", "2", "--out", str(tmp_path / "bc"), *common]) == 0
    bc_ckpt = tmp_path / "bc" / "checkpoint.pt"
    assert load_checkpoint(bc_ckpt)[1]["kind"] == "weights"
    assert main(["train", "--algo", "td3", "--init", str(bc_ckpt), "--steps", "1200", "--eval-every", "1",
                 "--checkpoint-every", "1", "--out", str(tmp_path / "td3"), *common]) == 0
    policy, meta, opt = load_checkpoint(tmp_path / "td3" / "checkpoint.pt")
    assert isinstance(policy, WeightPolicy) and meta["algorithm"] == "td3" and "actor_opt" in opt
    lines = (tmp_path / "td3" / "progress.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert {"critic_loss", "qf1_loss", "qf2_loss", "actor_loss", "q_mean", "steps_per_s", "w_free_cpu",
            "w_load_gpu"} <= set(header)
    # An update: one collection step of log_every (1000) decisions with its gradient steps;
    # one row each, numbered as PPO's, the last one partial.
    rows = [dict(zip(header, line.split(","), strict=True)) for line in lines[1:]]
    assert [(int(r["update"]), int(r["global_step"])) for r in rows] == [(1, 1000), (2, 1200)]
    assert opt["update"] == 2 and opt["gradient_steps"] == 201  # one per decision from the 1000th on
    assert rows[1]["eval_alloc_gpu"] != ""  # --eval-every 1 evaluates each update
    from tests.cli.test_train_cli import tb_scalar_tags

    assert {"losses/qf1_loss", "losses/qf2_loss", "losses/qf_loss", "losses/qf1_values", "losses/actor_loss",
            "charts/SPS", "charts/episodic_return", "charts/w_free_cpu"} <= tb_scalar_tags(tmp_path / "td3")
    # A node-scoring checkpoint cannot seed TD3.
    from fedsched.common.schedulers import default_policy_path

    capsys.readouterr()
    assert main(["train", "--algo", "td3", "--init", str(default_policy_path()), "--steps", "100",
                 "--out", str(tmp_path / "bad"), *common]) == 2
    assert "weights policy" in capsys.readouterr().err
