"""Behaviour cloning: warm-start the node-scoring policy from a teacher scheduler.

The teacher (any scheduler behind the scorer interface, typically FGD or kube-default, or
in replay mode the oracle, which reads the simulator's hidden usage parameters: the policy then
learns to make from observable features the decisions a scheduler that knew every pod's true
use would make) runs the same environments the RL agent trains in; every decision is logged as (the
policy's observation of the feasible nodes, the set of nodes the teacher scores best).
The policy is then fitted by maximising the probability it gives to the teacher's best
set, ``-log sum_{a in best} pi(a | s)``: teachers with integer scores tie often, and
the set keeps that information instead of one arbitrary tie member.

Only feasible nodes are stored (what the policy sees), so the log holds variable-length
node sets; minibatches are padded to their longest member.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fedsched.agent.learning.env import SchedulingEnv
from fedsched.common.learning.decision_log import DecisionLog
from fedsched.common.learning.kinds import WEIGHTS, kind_of
from fedsched.common.learning.records import Decision
from fedsched.common.schedulers import Scheduler
from fedsched.common.schedulers.base import Placement


@dataclass
class BCConfig:
    samples: int = 20_000
    """teacher decisions to log (over all environments)"""
    epochs: int = 8
    """passes over the log"""
    batch_size: int = 128
    """decisions per minibatch"""
    learning_rate: float = 1e-3
    """Adam step size"""
    seed: int = 1
    """seeds the data order and initialisation"""


def _attach(teacher: Scheduler, env: SchedulingEnv) -> None:
    """Hand a teacher that reads the simulator (the replay oracle: a privileged teacher whose
    decisions the policy learns to make from what it can observe) the environment's simulator,
    as ``run_replay`` does."""
    attach = getattr(teacher, "attach_simulator", None)
    if attach is not None:
        attach(env.sim)


def collect(envs: list[SchedulingEnv], teacher: Scheduler, samples: int,
            progress: Callable[[int], None] | None = None) -> list[Decision]:
    """Roll the teacher through ``envs`` (round robin) and log its decisions."""
    log: list[Decision] = []
    obs = [env.reset()[0] for env in envs]
    while len(log) < samples:
        for i, env in enumerate(envs):
            pod, state, cand, feats = env.decision
            _attach(teacher, env)
            scores = np.asarray(teacher.score(state, pod, cand), dtype=np.float64)
            best = np.flatnonzero(scores == scores.max())
            log.append(Decision(feats.nodes.astype(np.float16), feats.pod, feats.context, best,
                                has_gpus=state.nodes.total_gpu_milli > 0))
            node = int(cand[best[env.np_random.integers(len(best))]])
            # Step with the teacher's own GPU choice, so the logged states are the teacher's.
            gpus = teacher.select_gpus(state, pod, node)
            _, _, term, trunc, _ = env.step_placement(Placement(node, gpus))
            if term or trunc:
                obs[i] = env.reset()[0]
            if progress is not None and len(log) % 1000 == 0:
                progress(len(log))
            if len(log) >= samples:
                break
    return log


def _batch(log: list[Decision], idx: np.ndarray) -> tuple[torch.Tensor, ...]:
    k = max(len(log[i].nodes) for i in idx)
    f = log[idx[0]].nodes.shape[1]
    nodes = np.zeros((len(idx), k, f), np.float32)
    mask = np.zeros((len(idx), k), bool)
    target = np.zeros((len(idx), k), bool)
    for j, i in enumerate(idx):
        d = log[i]
        nodes[j, : len(d.nodes)] = d.nodes
        mask[j, : len(d.nodes)] = True
        target[j, d.best] = True
    pod = np.stack([log[i].pod for i in idx])
    ctx = np.stack([log[i].context for i in idx])
    return (torch.from_numpy(nodes), torch.from_numpy(pod), torch.from_numpy(ctx), torch.from_numpy(mask),
            torch.from_numpy(target))


def _weight_batch(log: list[Decision], idx: np.ndarray) -> tuple[torch.Tensor, ...]:
    """(x [B, K, T] per-node weight terms, summary [B, S], allowed [B, T], mask, target)."""
    from fedsched.common.learning.features import Features
    from fedsched.common.learning.nets import gpu_mask, weight_inputs

    k = max(len(log[i].nodes) for i in idx)
    xs, sums, allowed = [], [], []
    mask = np.zeros((len(idx), k), bool)
    target = np.zeros((len(idx), k), bool)
    for j, i in enumerate(idx):
        d = log[i]
        x, summary = weight_inputs(Features(d.nodes.astype(np.float32), d.pod, d.context))
        pad = np.zeros((k, x.shape[1]), np.float32)
        pad[: len(x)] = x
        xs.append(pad)
        sums.append(summary)
        allowed.append(gpu_mask(d.has_gpus))
        mask[j, : len(x)] = True
        target[j, d.best] = True
    return (torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(sums)),
            torch.from_numpy(np.stack(allowed)), torch.from_numpy(mask), torch.from_numpy(target))


def fit(policy: torch.nn.Module, log: list[Decision], cfg: BCConfig,
        on_epoch: Callable[[dict[str, float]], None] | None = None,
        temperature: float = 0.02) -> dict[str, float]:
    """Fit ``policy`` to the logged decisions; returns the last epoch's statistics.

    A node-scoring policy is fitted through its logits. A weight policy is fitted through
    the scores its weights imply: the node distribution is ``softmax(x . w / temperature)``
    (a small temperature: a weighted score's differences between nodes are fractions).
    """
    weights = kind_of(policy) == WEIGHTS
    rng = np.random.default_rng(cfg.seed)
    params = policy.actor.parameters() if weights else policy.parameters()
    opt = torch.optim.Adam(params, lr=cfg.learning_rate)
    stats: dict[str, float] = {}
    policy.train()
    for epoch in range(cfg.epochs):
        t0 = time.perf_counter()
        perm = rng.permutation(len(log))
        losses, hits = [], []
        for start in range(0, len(perm), cfg.batch_size):
            idx = perm[start:start + cfg.batch_size]
            if weights:
                x, summary, allowed, mask, target = _weight_batch(log, idx)
                w = policy.weights(summary, allowed)
                logits = torch.where(mask, (x @ w[..., None])[..., 0] / temperature,
                                     torch.full(mask.shape, -1e9))
            else:
                nodes, pod, ctx, mask, target = _batch(log, idx)
                logits, _ = policy(nodes, pod, ctx, mask)
            logp = torch.log_softmax(logits, dim=-1)
            loss = -torch.logsumexp(torch.where(target, logp, torch.full_like(logp, -1e9)), dim=-1).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
            opt.step()
            losses.append(float(loss.detach()))
            hits.append(float(target.gather(1, logits.argmax(dim=1, keepdim=True)).float().mean()))
        stats = {"epoch": epoch + 1, "loss": float(np.mean(losses)),
                 "teacher_agreement": float(np.mean(hits)), "seconds": time.perf_counter() - t0}
        if on_epoch is not None:
            on_epoch(stats)
    policy.eval()
    return stats

def record(envs: list[SchedulingEnv], scheduler: Scheduler, n: int, log: DecisionLog, *,
           model_version: str | None = None,
           progress: Callable[[int], None] | None = None) -> list[Decision]:
    """Roll ``scheduler`` through ``envs`` (round robin) for ``n`` decisions and log them.

    Each decision is appended with the node the scheduler took (a random member of its
    tied best set, drawn from the environment's generator), its whole best set, its name
    as ``model_version`` (unless given) and the environment's reward for the step
    (column ``reward``). The loop and its random draws are those of
    :func:`fedsched.agent.learning.bc.collect`: from the same environment states it returns the same list.
    """
    version = getattr(scheduler, "name", "") if model_version is None else model_version
    out: list[Decision] = []
    for env in envs:
        env.reset()
    while len(out) < n:
        for env in envs:
            pod, state, cand, feats = env.decision
            _attach(scheduler, env)
            scores = np.asarray(scheduler.score(state, pod, cand), dtype=np.float64)
            best = np.flatnonzero(scores == scores.max())
            d = Decision(feats.nodes.astype(np.float16), feats.pod, feats.context, best,
                         has_gpus=state.nodes.total_gpu_milli > 0)
            out.append(d)
            pick = int(best[env.np_random.integers(len(best))])
            node = int(cand[pick])
            gpus = scheduler.select_gpus(state, pod, node)
            _, reward, term, trunc, _ = env.step_placement(Placement(node, gpus))
            log.append(d, pick, str(version), {"reward": float(reward)})
            if term or trunc:
                env.reset()
            if progress is not None and len(out) % 1000 == 0:
                progress(len(out))
            if len(out) >= n:
                break
    log.flush()
    return out
