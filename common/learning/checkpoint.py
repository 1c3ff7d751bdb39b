"""Checkpoints of either policy kind (:func:`save_checkpoint` / :func:`load_checkpoint`).

A checkpoint holds the weights and the metadata needed to rebuild the exact scorer: feature
schema version and names, policy kind, algorithm, hyper-parameters, a hash of the training
data and the training workload's typical pods (the fragmentation features need them).
Loading a checkpoint written with another feature schema fails with a clear message.
Files are read with ``torch.load(weights_only=True)``: no pickled code.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsched.common.files import atomic_file
from fedsched.common.learning.features import (
    CONTEXT_FEATURES,
    FEATURE_SCHEMA_VERSION,
    NODE_FEATURES,
    POD_FEATURES,
)
from fedsched.common.learning.kinds import KINDS, NODE_SCORING, build, kind_of
from fedsched.common.model.cluster import PodTable
from fedsched.common.model.fragmentation import TypicalPods

CHECKPOINT_FORMAT = 1


# ---- checkpoints ---------------------------------------------------------------------------

class CheckpointError(ValueError):
    """A checkpoint that cannot be used (wrong schema, corrupt, not a fedsched file)."""


def data_hash(*tables: PodTable) -> str:
    """A short stable hash of pod tables (names and requests): which data a policy saw."""
    h = hashlib.sha256()
    for t in tables:
        h.update("\n".join(t.names).encode())
        for a in (t.cpu, t.mem, t.num_gpu, t.gpu_milli, t.spec_mask):
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def typical_to_dict(t: TypicalPods | None) -> dict[str, list] | None:
    if t is None:
        return None
    return {k: getattr(t, k).tolist() for k in ("cpu", "gpu_milli", "num_gpu", "spec_mask", "freq")}


def typical_from_dict(d: dict[str, list] | None) -> TypicalPods | None:
    if d is None:
        return None
    return TypicalPods(**{k: np.asarray(v, dtype=np.float64 if k == "freq" else np.int64)
                          for k, v in d.items()})


def save_checkpoint(path: str | Path, policy: nn.Module, *, algorithm: str,
                    hyperparameters: dict[str, Any], typical: TypicalPods | None, data: str,
                    extra: dict[str, Any] | None = None, optimizer: dict | None = None) -> Path:
    """Write weights + metadata atomically (a crash never leaves a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": CHECKPOINT_FORMAT, "feature_schema": FEATURE_SCHEMA_VERSION,
        "node_features": list(NODE_FEATURES), "pod_features": list(POD_FEATURES),
        "context_features": list(CONTEXT_FEATURES), "algorithm": algorithm,
        "hyperparameters": hyperparameters, "kind": kind_of(policy),
        "policy": asdict(policy.cfg),
        "typical_pods": typical_to_dict(typical), "data_hash": data,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **(extra or {}),
    }
    blob = {"meta": meta, "state_dict": policy.state_dict()}
    if optimizer is not None:
        blob["optimizer"] = optimizer
    with atomic_file(path) as f:
        torch.save(blob, f)
    return path


def load_checkpoint(path: str | Path) -> tuple[Any, dict[str, Any], dict | None]:
    """(policy, metadata, optimizer state or None); raises CheckpointError if unusable.

    The policy is a :class:`NodeScoringPolicy` or, for ``kind: weights`` checkpoints, a
    :class:`fedsched.common.learning.nets.WeightPolicy`.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise CheckpointError(f"{path}: not a readable fedsched checkpoint ({e.__class__.__name__})") from e
    if not isinstance(blob, dict) or "meta" not in blob or "state_dict" not in blob:
        raise CheckpointError(f"{path}: not a fedsched checkpoint (no metadata)")
    meta = blob["meta"]
    schema_ok = meta.get("feature_schema") == FEATURE_SCHEMA_VERSION
    if not schema_ok or meta.get("node_features") != list(NODE_FEATURES):
        raise CheckpointError(
            f"{path}: written with feature schema {meta.get('feature_schema')} "
            f"({len(meta.get('node_features', []))} node features), this fedsched uses schema "
            f"{FEATURE_SCHEMA_VERSION} ({len(NODE_FEATURES)} node features); retrain or use a "
            "matching fedsched version")
    kind = meta.get("kind", NODE_SCORING)
    if kind not in KINDS:
        raise CheckpointError(f"{path}: unknown policy kind {kind!r}")
    policy = build(kind, meta["policy"])
    policy.load_state_dict(blob["state_dict"])
    policy.eval()
    return policy, meta, blob.get("optimizer")
