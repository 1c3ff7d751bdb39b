"""How the federation schedules with a model's weights: one constructor for every place that
does (a member's collection and validation, the experiment's evaluation, the hub's central
evaluation), so that each scores the same way the served checkpoint does.

May import: ``fedsched.common.learning`` and ``fedsched.common.federation``.
"""

from __future__ import annotations

import numpy as np

from fedsched.common.federation.members import reference_typical
from fedsched.common.federation.weights import load_weights
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.model.fragmentation import TypicalPods

Weights = dict[str, np.ndarray]


def policy_of(weights: Weights) -> NodeScoringPolicy:
    """``weights`` as a node-scoring policy, in eval mode."""
    policy = NodeScoringPolicy()
    load_weights(policy, weights)
    return policy.eval()


def member_scheduler(weights: Weights, kube_weight: float = 0.0, typical: TypicalPods | None = None,
                     name: str = "policy") -> PolicyScheduler:
    """``weights`` scheduling as served: the logits plus ``kube_weight`` times kube-default's
    score / 100 (:class:`~fedsched.common.learning.scorers.PolicyScheduler`), features against
    ``typical`` (default: the members' reference typical pods)."""
    return PolicyScheduler(policy_of(weights), typical if typical is not None else reference_typical(),
                           name=name, kube_weight=kube_weight)
