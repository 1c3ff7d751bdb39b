"""The registry of policy kinds: which network and config class each checkpoint kind names.

A checkpoint's ``kind`` (``node-scoring`` or ``weights``) is looked up here to rebuild its
network, and :func:`kind_of` names the kind of a live network, so no caller tests attributes
of a policy to find out what it is. The scorer adapter of each kind is registered beside the
adapters (:data:`fedsched.common.learning.scorers.SCORERS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from fedsched.common.learning.nets import NodeScoringPolicy, PolicyConfig, WeightPolicy, WeightPolicyConfig

NODE_SCORING = "node-scoring"  # scores each node directly (PPO, behaviour cloning)
WEIGHTS = "weights"  # outputs resource weights per pod (TD3, the interpretable agent)


@dataclass(frozen=True)
class PolicyKind:
    """One kind of policy network: its name in checkpoints, class and config dataclass."""

    name: str
    net: type[nn.Module]
    config: type


KINDS: dict[str, PolicyKind] = {
    k.name: k for k in (PolicyKind(NODE_SCORING, NodeScoringPolicy, PolicyConfig),
                        PolicyKind(WEIGHTS, WeightPolicy, WeightPolicyConfig))
}


def policy_kind(name: str) -> PolicyKind:
    """The registered kind ``name``; ValueError naming the known kinds otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown policy kind {name!r}: expected {' or '.join(KINDS)}") from None


def kind_of(policy: nn.Module) -> str:
    """The kind of a policy network (by its class)."""
    for k in KINDS.values():
        if isinstance(policy, k.net):
            return k.name
    raise ValueError(f"{type(policy).__name__} is not a registered policy kind ({', '.join(KINDS)})")


def build(name: str, config: dict[str, Any] | None = None) -> nn.Module:
    """A fresh network of kind ``name`` from its config fields (defaults when None)."""
    k = policy_kind(name)
    return k.net(k.config(**(config or {})))
