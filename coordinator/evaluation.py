"""The hub's central evaluation: the global model's GPU allocation on a held-out openb slice.
"""

from __future__ import annotations

import numpy as np

from fedsched.common.federation.weights import load_weights
from fedsched.common.learning.nets import NodeScoringPolicy
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.model.fragmentation import TypicalPods
from fedsched.common.model.traces import (
    builtin_trace,
    fits_somewhere,
    load_nodes,
    load_pods,
    slice_cluster,
    split_by_hash,
)
from fedsched.common.sim.packing import run_packing


def central_evaluator(n_nodes: int = 200, seed: int = 7):
    """policy weights -> GPU allocation % on a held-out openb slice (test pods, packing)."""
    nodes = slice_cluster(load_nodes(builtin_trace("openb_node_list_gpu_node.csv")), n_nodes, 99_000 + seed)
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
    train, test = split_by_hash(fits_somewhere(pods, nodes), 0.3)
    typical = TypicalPods.from_pods(train)

    def evaluate(weights: dict[str, np.ndarray]) -> dict[str, float]:
        policy = NodeScoringPolicy()
        load_weights(policy, weights)
        m = run_packing(nodes, test, PolicyScheduler(policy, typical), target_load=1.3, seed=seed,
                        typical=typical).metrics
        return {"alloc_gpu": float(m["alloc_gpu"]), "gpu_frag_amount": float(m["gpu_frag_amount"])}

    return evaluate
