"""Flags from dataclass fields (common/dataclass_flags.py): help from attribute docstrings
(else trailing comments), types from annotations, defaults from the dataclass, round trips."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from fedsched.common.dataclass_flags import (
    add_dataclass_flags,
    build,
    field_help,
    flag_name,
    given,
    to_argv,
)


@dataclass
class Args:
    out: Path
    """where to write"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 4
    """the number of parallel game environments"""
    anneal_lr: bool = True
    """toggle learning rate annealing"""
    target_kl: float | None = None
    """the target KL divergence threshold"""
    clip: float | None = 0.2  # a trailing comment stands in for a docstring
    mode: Literal["packing", "replay"] = "packing"
    """which simulator"""
    window: tuple[float, float] | None = None
    """trace-time [start, end)"""
    sizes: tuple[int, ...] = (64, 64)
    """hidden layer sizes"""
    label: str = "run 100%"
    """a percent sign in help must not break argparse"""
    extra: dict = field(default_factory=dict)


@dataclass
class MoreArgs(Args):
    num_envs: int = 8
    """a subclass's own doc and default win"""


def parser_for(cls=Args, **kw) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    add_dataclass_flags(p, cls, exclude=("extra",), **kw)
    return p


def test_field_help_reads_docstrings_and_falls_back_to_comments():
    docs = field_help(Args)
    assert docs["learning_rate"] == "the learning rate of the optimizer"
    assert docs["clip"] == "a trailing comment stands in for a docstring"
    assert "extra" not in docs
    assert field_help(MoreArgs)["num_envs"] == "a subclass's own doc and default win"
    assert field_help(MoreArgs)["learning_rate"] == "the learning rate of the optimizer"


def test_every_field_becomes_a_flag_with_its_help_and_default():
    p = parser_for()
    actions = {a.dest: a for a in p._actions}
    docs = field_help(Args)
    for f in dataclasses.fields(Args):
        if f.name == "extra":
            assert f.name not in actions
            continue
        a = actions[f.name]
        assert flag_name(f.name) in a.option_strings
        assert a.help.startswith(docs[f.name].replace("%", "%%")), f.name
    text = p.format_help()
    assert "--learning-rate FLOAT" in text and "(default: 0.00025)" in text
    assert "--anneal-lr, --no-anneal-lr" in text and "(default: true)" in text
    assert "--mode {packing,replay}" in text
    assert "run 100%" in text
    assert actions["out"].required


def test_defaults_come_from_the_dataclass():
    ns = parser_for().parse_args(["--out", "x"])
    assert given(Args, ns, exclude=("extra",)) == {"out": Path("x")}
    assert build(Args, ns, exclude=("extra",)) == Args(out=Path("x"))
    assert build(MoreArgs, parser_for(MoreArgs).parse_args(["--out", "x"]), exclude=("extra",)).num_envs == 8


def test_types_bools_optionals_tuples_and_choices():
    p = parser_for()
    argv = ["--out", "o", "--learning-rate", "1e-3", "--num-envs", "2", "--no-anneal-lr",
            "--target-kl", "0.01", "--clip", "none", "--mode", "replay", "--window", "10", "20.5",
            "--sizes", "32", "16", "8"]
    a = build(Args, p.parse_args(argv), exclude=("extra",))
    assert a == Args(out=Path("o"), learning_rate=1e-3, num_envs=2, anneal_lr=False, target_kl=0.01,
                     clip=None, mode="replay", window=(10.0, 20.5), sizes=(32, 16, 8))
    assert build(Args, p.parse_args(["--out", "o", "--anneal-lr", "--clip", "0.3"]),
                 exclude=("extra",)).clip == 0.3
    for bad in (["--num-envs", "two"], ["--mode", "other"], ["--window", "1"]):
        with pytest.raises(SystemExit):
            p.parse_args(["--out", "o", *bad])


def test_prefix_aliases_and_precedence():
    p = argparse.ArgumentParser()
    add_dataclass_flags(p, Args, prefix="ppo", exclude=("extra", "out"), aliases={"num_envs": "--envs"})
    ns = p.parse_args(["--ppo-learning-rate", "0.1", "--envs", "3"])
    assert given(Args, ns, prefix="ppo", exclude=("extra", "out")) == {"learning_rate": 0.1, "num_envs": 3}
    # The field's own flag beats `defaults`, which beat the dataclass default.
    a = build(Args, ns, prefix="ppo", exclude=("extra", "out"),
              defaults={"out": Path("o"), "learning_rate": 0.5, "target_kl": 0.02})
    assert (a.learning_rate, a.target_kl, a.num_envs) == (0.1, 0.02, 3)


def test_round_trip():
    a = Args(out=Path("/tmp/r"), learning_rate=0.1 + 0.2, num_envs=7, anneal_lr=False, target_kl=0.03,
             clip=None, mode="replay", window=(1.5, 2.0), sizes=(3,), label="x y")
    argv = to_argv(a, exclude=("extra",))
    assert build(Args, parser_for().parse_args(argv), exclude=("extra",)) == a
    b = Args(out=Path("o"))
    assert build(Args, parser_for().parse_args(to_argv(b, exclude=("extra",))), exclude=("extra",)) == b


def test_the_hyper_parameter_dataclasses_round_trip():
    from fedsched.agent.learning.bc import BCConfig
    from fedsched.agent.learning.env import RewardConfig
    from fedsched.agent.learning.ppo import PPOConfig
    from fedsched.agent.learning.td3 import TD3Config
    from fedsched.common.sim.replay import ReplayConfig

    cases = [PPOConfig(gamma=0.9, target_kl=None, anneal_lr=False, clip_coef=0.1),
             TD3Config(tau=0.01, policy_noise=0.3, learning_starts=7, actor_lr=1e-4, critic_lr=2e-4),
             BCConfig(epochs=3), RewardConfig(oom=2.5),
             ReplayConfig(window_s=(0.0, 3600.0), max_pods=10, autoscale=True, horizon_s=float("inf"))]
    for obj in cases:
        p = argparse.ArgumentParser()
        add_dataclass_flags(p, type(obj), prefix="x")
        assert build(type(obj), p.parse_args(to_argv(obj, prefix="x")), prefix="x") == obj
        assert build(type(obj), p.parse_args([]), prefix="x") == type(obj)()


def test_replay_config_flags_get_help_from_comments_or_docstrings():
    from fedsched.common.sim.replay import ReplayConfig

    docs = field_help(ReplayConfig)
    assert all(docs.get(f.name) for f in dataclasses.fields(ReplayConfig)), \
        [f.name for f in dataclasses.fields(ReplayConfig) if not docs.get(f.name)]


def test_unsupported_types_and_unknown_names_are_refused():
    with pytest.raises(TypeError, match="extra"):
        add_dataclass_flags(argparse.ArgumentParser(), Args)
    with pytest.raises(ValueError, match="nope"):
        add_dataclass_flags(argparse.ArgumentParser(), Args, exclude=("extra", "nope"))
    with pytest.raises(ValueError, match="nope"):
        add_dataclass_flags(argparse.ArgumentParser(), Args, exclude=("extra",), aliases={"nope": "--n"})

    @dataclass
    class Bad:
        x: int | str = 1

    with pytest.raises(TypeError, match=r"X \| None"):
        add_dataclass_flags(argparse.ArgumentParser(), Bad)
