"""Checkpoints of either policy kind (:func:`save_checkpoint` / :func:`load_checkpoint`).

A checkpoint holds the weights and the metadata needed to rebuild the exact scorer: feature
schema version and names, policy kind, algorithm, hyper-parameters, a hash of the training
data and the training workload's typical pods (the fragmentation features need them).
Loading a checkpoint written with another feature schema fails with a clear message, and so
does every other file that cannot be served (metadata of the wrong type or a negative size, a
tensor missing or of the wrong shape, a NaN or infinite weight): a :class:`CheckpointError`
naming the file and the fault, never a traceback of torch's. Files are read with
``torch.load(weights_only=True)``: no pickled code.
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
    """A checkpoint that cannot be used (wrong schema, corrupt, not a fedsched file).

    ``reason`` says which kind of fault, for the reload metrics: ``missing`` (no such file),
    ``unreadable`` (not a torch file), ``schema`` (another feature schema), ``malformed``
    (metadata, tensor names or shapes that do not build the policy) or ``non_finite``.
    """

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


def _one_line(e: BaseException) -> str:
    """An exception's message on one line (torch's load_state_dict errors span several)."""
    return " ".join(str(e).split()) or type(e).__name__


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


def update_metadata(path: str | Path, updates: dict[str, Any]) -> None:
    """Merge ``updates`` into a checkpoint's metadata, atomically; weights and optimizer state
    are kept as they are. A file that cannot be served is refused (:class:`CheckpointError`)."""
    load_checkpoint(path)
    blob = torch.load(Path(path), map_location="cpu", weights_only=True)
    blob["meta"] = {**blob["meta"], **updates}
    with atomic_file(Path(path)) as f:
        torch.save(blob, f)


def load_checkpoint(path: str | Path) -> tuple[Any, dict[str, Any], dict | None]:
    """(policy, metadata, optimizer state or None); raises CheckpointError if unusable.

    The policy is a :class:`NodeScoringPolicy` or, for ``kind: weights`` checkpoints, a
    :class:`fedsched.common.learning.nets.WeightPolicy`.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint", "missing")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise CheckpointError(
            f"{path}: not a readable fedsched checkpoint ({e.__class__.__name__})", "unreadable") from e
    if not isinstance(blob, dict) or "meta" not in blob or "state_dict" not in blob:
        raise CheckpointError(f"{path}: not a fedsched checkpoint (no metadata)")
    meta, state = blob["meta"], blob["state_dict"]
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: its metadata is a {type(meta).__name__}, not a mapping")
    if not isinstance(state, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise CheckpointError(f"{path}: its state_dict is not a mapping of names to tensors")
    schema_ok = meta.get("feature_schema") == FEATURE_SCHEMA_VERSION
    if not schema_ok or meta.get("node_features") != list(NODE_FEATURES):
        node_features = meta.get("node_features")
        n = len(node_features) if isinstance(node_features, list) else "?"
        raise CheckpointError(
            f"{path}: written with feature schema {meta.get('feature_schema')!r} "
            f"({n} node features), this fedsched uses schema "
            f"{FEATURE_SCHEMA_VERSION} ({len(NODE_FEATURES)} node features); retrain or use a "
            "matching fedsched version", "schema")
    kind = meta.get("kind", NODE_SCORING)
    if not isinstance(kind, str) or kind not in KINDS:
        raise CheckpointError(f"{path}: unknown policy kind {kind!r}")
    config = meta.get("policy")
    if config is not None and not isinstance(config, dict):
        raise CheckpointError(f"{path}: its policy metadata is a {type(config).__name__}, not a mapping")
    weights = sum(t.numel() for t in state.values())
    for name, value in (config or {}).items():  # sizes: torch would try to build (allocate) them
        if isinstance(value, int) and not isinstance(value, bool) and not 0 < value <= weights:
            raise CheckpointError(
                f"{path}: policy metadata {name} = {value} is not a size the {weights} weights can have")
    for name, t in state.items():  # every tensor, used by serving or not (the critic)
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(
                f"{path}: tensor {name} holds non-finite weights (NaN or infinite): refused", "non_finite")
    try:
        policy = build(kind, config)
        policy.load_state_dict(state)
    except Exception as e:  # wrong or missing tensors, unknown config fields, sizes of the wrong type
        raise CheckpointError(
            f"{path}: weights and metadata do not make a {kind} policy: {_one_line(e)}") from e
    try:
        typical = typical_from_dict(meta.get("typical_pods"))
        if typical is not None and len({a.shape for a in vars(typical).values()} | {(len(typical),)}) != 1:
            raise ValueError("its columns are not lists of one length")
    except Exception as e:
        raise CheckpointError(f"{path}: its typical_pods metadata is unusable: {_one_line(e)}") from e
    policy.eval()
    return policy, meta, blob.get("optimizer")
