"""One federated round on a member, independent of Flower's message plumbing: the member's
settings, its state, and the one skeleton every way of learning shares.

:func:`member_round` is the round, for every member:

1. **load** the member's own weights ``W_local`` from its state directory;
2. **personalise**: start from ``eta * W_local + (1 - eta) * W_global`` (``W_global`` alone the
   first time);
3. **learn** from that start: the :class:`Learner`'s step, the one thing that varies
   (:mod:`fedsched.agent.federation.learners`: PPO in packing mode, credit regression on the
   member's own rewards in its replay twin, or fine-tuning on a deployed member's decision log),
   with FedProx's proximal term anchored at ``W_global`` when the round's ``mu`` > 0;
4. **save** the result as the new ``W_local``;
5. **the update** is what the round learned, ``W_local_new - start`` (float32; the ClientApp's
   codec mod quantises it for the wire), not ``W_local_new - W_global``: that adds the
   member's personalisation offset ``eta * (W_local - W_global)``, and the honest members'
   offsets from a global that is about their mean point away from each other. They cancel in
   the average (with steady weights the global moves the same), but they bent every honest
   update away from the others (in the main job from the shipped start every cosine to the
   others' median was below 0, down to -0.30, beside the hub's direction floor of -0.3);
   without them the cosines sit around 0 (-0.15 to +0.24): the members learn different things;
6. **decide on the upload** (sparse communication): every ``upload-every`` rounds, or earlier
   when the change accumulated since the last upload passes ``upload-norm``; the accumulated
   change is kept in the state directory and uploaded whole, and a skipped upload sends zeros
   and counts 0 examples (a learner may always upload: the deployed member's fine-tuning does);
7. the learner's **report** on the new personalised mix ``eta * W_local_new + (1 - eta) *
   W_global``: its validation score (online mode), the checkpoint a deployed member's extender
   serves.

A late member before its join round (:attr:`Learner.joins_at`) trains nothing and sends nothing.

Also here: :class:`MemberRunConfig` (the member's settings, read once from the Flower run
config), :class:`MemberState` (what outlives a run in the member's state directory: ``W_local``
and the change accumulated since its last upload, ``.npz`` written atomically; the INT8
error-feedback residual belongs to the wire codec, in the run's ``context.state``; the
downloaded global's reconstruction, ``download.npz``, belongs to the download codec),
:class:`RoundInfo` (what the hub's message says about the round, and the round's seed),
:func:`load_member`, :func:`member_state` (the state directory alone) and :func:`partition_id`.

May import: ``fedsched.common`` (the learners, which import ``fedsched.agent.learning``, live
in :mod:`fedsched.agent.federation.learners`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import numpy as np

from fedsched.common.federation.codec import personalised_mix
from fedsched.common.federation.members import Member, member_cluster, member_from_node_config, member_spec
from fedsched.common.federation.run_config import Value, with_defaults
from fedsched.common.federation.weights import load_npz, save_npz

Weights = dict[str, np.ndarray]
Config = Mapping[str, Value]

_CASTS = {"int": int, "float": float, "str": str}
# A run's training seed offsets every member's round seed by this much, far past any round's
# 1000 * round + partition, and the largest stays a valid numpy seed (< 2**32).
TRAINING_SEED_STRIDE = 1_000_000
MAX_TRAINING_SEED = 4000


@dataclass(frozen=True)
class MemberRunConfig:
    """A member's settings: its keys of the Flower run config (field ``local_steps`` is key
    ``local-steps``), typed. Read once per message with :meth:`from_run_config`; the defaults
    are pyproject's ``[tool.flwr.app.config]`` (:mod:`fedsched.common.federation.run_config`),
    never a second copy here."""

    eta: float
    """personalisation: a member starts each round from ``eta * W_local + (1 - eta) * W_global``, in [0, 1]"""
    mode: str
    """what a simulated member learns from: ``online`` (credit regression on its own rewards in its
    replay twin) or ``packing`` (PPO in packing mode)"""
    member_size: str
    """a simulated member's cluster: ``full`` (its realistic size) or ``small`` (the smoke variant)"""
    local_decisions: int
    """online: pods a member schedules and learns from per round"""
    scarce_decisions: int
    """online: the same for a data-scarce member"""
    late_round: int
    """online: the round the late member joins"""
    local_epochs: int
    """online: passes of the credit regression over the member's experience"""
    local_learning_rate: float
    """online: Adam step size of the credit regression"""
    kube_weight: float
    """online: kube-default's score / 100 times this beside the model's logits wherever a member's
    model schedules (its own collection and validation, the experiment's evaluation, the hub's
    central evaluation, the checkpoint a deployed member serves); 0: the logits alone"""
    training_seed: int
    """seeds the member's rounds (:meth:`RoundInfo.for_member`): another value is another training
    run of the same configuration, in [1, :data:`MAX_TRAINING_SEED`]"""
    validate: int
    """online: 1 reports the personalised model's validation score every round (the member's own
    validation pods, one replay); 0 reports none (NaN), for runs whose scores nobody reads"""
    local_steps: int
    """packing: PPO decisions per member per round"""
    ppo_rollout_steps: int
    """packing: decisions per PPO rollout (capped at ``local_steps``)"""
    ppo_learning_rate: float
    """packing: PPO's Adam step size"""
    ppo_update_epochs: int
    """packing: passes over each rollout in its PPO update"""
    ppo_num_minibatches: int
    """packing: minibatches per epoch of a PPO update"""
    finetune_learning_rate: float
    """a deployed member: Adam step size of the credit regression on its decision log"""
    finetune_epochs: int
    """a deployed member: passes of that regression"""
    finetune_window: int
    """a deployed member: the newest decisions of its log with a known outcome it learns from (its
    node config's ``window`` overrides it)"""
    upload_every: int
    """sparse communication: upload every this many rounds ..."""
    upload_norm: float
    """... or earlier, once the change accumulated since the last upload passes this norm"""
    state_dir: str
    """where each member keeps ``W_local`` and its experience (a folder per member, by name)"""
    codec: str
    """the wire format of an upload: ``int8`` (with error feedback) or ``fp32`` (the benchmark's knob)"""
    poison_members: str
    """experiment knob: comma-separated partition ids that send a poisoned update ..."""
    poison_kind: str
    """... of this kind: ``nan``, ``huge`` (10^4 times scaled), ``flip`` (sign-flipped) or ``inflate``
    (its own update, claiming 10^6 times the pods it scheduled)"""
    fail_rate: float
    """experiment knob: the probability a member fails a round before doing any work"""

    @staticmethod
    def key(name: str) -> str:
        """The run-config key of field ``name``."""
        return name.replace("_", "-")

    @classmethod
    def from_run_config(cls, run_config: Config) -> MemberRunConfig:
        """The member's settings from a Flower run config (``context.run_config``); pyproject's
        defaults fill the keys it lacks, and a key pyproject does not define fails, as under
        ``flwr run``. Values are cast to the field's type; they are checked where they are used."""
        complete = with_defaults(run_config)
        return cls(**{f.name: _CASTS[str(f.type)](complete[cls.key(f.name)]) for f in fields(cls)})

    @classmethod
    def defaults(cls) -> MemberRunConfig:
        """pyproject's defaults (needs the Flower app directory, i.e. a checkout)."""
        return cls.from_run_config({})


def partition_id(node_config: Config) -> int:
    """The member's partition id (simulation numbers its nodes; a deployed member may set one)."""
    return int(node_config.get("partition-id", 0))


class MemberState:
    """A member's persistent state in ``directory`` (survives restarts and runs)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)

    def load(self, name: str) -> Weights | None:
        return load_npz(self.dir / f"{name}.npz")

    def save(self, name: str, arrays: Weights) -> None:
        save_npz(self.dir / f"{name}.npz", arrays)


def member_state(node_config: Config, cfg: MemberRunConfig) -> MemberState:
    """The member's state directory without building its cluster (what :func:`load_member`
    returns beside it): ``state_dir``/the member's name (a deployed member's ``cluster-name``,
    else its nodes CSV's stem; in simulation its partition's cluster name)."""
    nodes_csv = node_config.get("nodes-csv")
    if nodes_csv:
        name = str(node_config.get("cluster-name", Path(str(nodes_csv)).stem))
    else:
        pid = partition_id(node_config)
        name = f"{member_spec(pid).name}-{pid}"
    return MemberState(Path(cfg.state_dir) / name)


def load_member(node_config: Config, cfg: MemberRunConfig) -> tuple[Member, MemberState]:
    """Which cluster this member is (its node config's own data when deployed, else the
    simulated cluster of its ``partition-id``) and its state directory (``state_dir``/its name)."""
    member = member_from_node_config(node_config) or member_cluster(partition_id(node_config),
                                                                    size=cfg.member_size)
    return member, MemberState(Path(cfg.state_dir) / member.name)


@dataclass(frozen=True)
class RoundInfo:
    """What the hub's message says about this round, and the round's seed."""

    server_round: int
    seed: int
    """seeds everything random in the member's round"""
    mu: float = 0.0
    """FedProx: weight of ``mu / 2 * ||w - W_global||^2`` in the local objective (0: FedAvg's plain fit)"""

    @classmethod
    def for_member(cls, server_round: int, partition: int, mu: float = 0.0,
                   training_seed: int = 1) -> RoundInfo:
        """A member's round: seeded by the round, the member's partition and the run's training
        seed (seed 1 gives the seeds every run had before there was one)."""
        if not 1 <= training_seed <= MAX_TRAINING_SEED:
            raise ValueError(f"run config training-seed must be in [1, {MAX_TRAINING_SEED}], "
                             f"got {training_seed}")
        offset = TRAINING_SEED_STRIDE * (training_seed - 1)
        return cls(server_round, 1000 * server_round + partition + offset, mu)


@dataclass
class Learned:
    """What a learning step produced."""

    weights: Weights  # the new W_local
    examples: int  # decisions learned from this round (the aggregation weight)
    mean_reward: float  # their mean reward (the credit in online mode; 0 where there is none)


class Learner(ABC):
    """The learning step of a member's round, the one thing that varies between rounds
    (:mod:`fedsched.agent.federation.learners`)."""

    always_uploads: ClassVar[bool] = False
    """True: every round uploads (no sparse communication)"""
    joins_at: int = 1
    """the first round the member takes part in (a late member's join round)"""

    @abstractmethod
    def learn(self, start: Weights, global_w: Weights, state: MemberState, info: RoundInfo) -> Learned:
        """Learn from ``start`` (the personalised mix); FedProx's term, when ``info.mu`` > 0, is
        anchored at ``global_w``."""

    def after_round(self, personalised: Weights, state: MemberState, info: RoundInfo) -> float:
        """The learner's report on the new personalised mix: its validation score (NaN: none)."""
        return math.nan


@dataclass
class RoundResult:
    delta: Weights  # the learning since the last upload, W_local_new - start summed (zeros: no upload)
    examples: int  # decisions trained on this round (the aggregation weight; 0 without an upload)
    mean_reward: float
    upload: bool
    val_score: float = math.nan  # the personalised model's validation score (online mode)
    joined: bool = True  # False: a late member before its join round (nothing trained, nothing sent)


def sparse_upload(state: MemberState, change: Weights, *, server_round: int, upload_every: int,
                  norm_threshold: float) -> Weights | None:
    """Sparse communication: the change accumulated since the last upload (this round's
    included), to send every ``upload_every`` rounds or earlier once its norm passes
    ``norm_threshold``; None in a round without an upload (the accumulated change is kept in
    the state directory, so no round's learning is lost to the global)."""
    pending = state.load("pending") or {k: np.zeros_like(v) for k, v in change.items()}
    pending = {k: pending[k] + change[k] for k in change}
    norm = float(np.sqrt(sum(float((v * v).sum()) for v in pending.values())))
    upload = server_round % max(upload_every, 1) == 0 or norm > norm_threshold
    state.save("pending", {k: np.zeros_like(v) for k, v in pending.items()} if upload else pending)
    return pending if upload else None


def member_round(learner: Learner, state: MemberState, global_w: Weights, cfg: MemberRunConfig,
                 info: RoundInfo) -> RoundResult:
    """One federated round on the member (the module docstring's steps)."""
    if not 0.0 <= cfg.eta <= 1.0:
        raise ValueError(f"run config eta must be in [0, 1], got {cfg.eta}")
    if info.server_round < learner.joins_at:
        return RoundResult({k: np.zeros_like(v, dtype=np.float32) for k, v in global_w.items()}, 0, 0.0,
                           False, joined=False)
    local = state.load("local")
    start = personalised_mix(local, global_w, cfg.eta) if local is not None else global_w
    learned = learner.learn(start, global_w, state, info)
    state.save("local", learned.weights)
    change = {k: (learned.weights[k] - start[k]).astype(np.float32) for k in global_w}
    update = change if learner.always_uploads else sparse_upload(
        state, change, server_round=info.server_round, upload_every=cfg.upload_every,
        norm_threshold=cfg.upload_norm)
    score = learner.after_round(personalised_mix(learned.weights, global_w, cfg.eta), state, info)
    if update is None:
        return RoundResult({k: np.zeros_like(v) for k, v in change.items()}, 0, learned.mean_reward, False,
                           score)
    return RoundResult(update, learned.examples, learned.mean_reward, True, score)
