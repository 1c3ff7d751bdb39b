"""The record of one logged decision, shared by behaviour cloning, the on-disk decision log and
the serving outcomes: the features of the feasible nodes the policy saw, the pod's and the
cluster context's features and which of those nodes were best (the teacher's best set, or the
node the pod was bound to).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Decision:
    """One decision as the policy saw it, with the best node set (indices into ``nodes``)."""

    nodes: np.ndarray  # float16 [K, F] features of the feasible nodes
    pod: np.ndarray
    context: np.ndarray
    best: np.ndarray  # int64 indices (into the K rows) of the teacher's best nodes
    has_gpus: bool = True  # the cluster has GPUs (weight policies mask GPU terms otherwise)
