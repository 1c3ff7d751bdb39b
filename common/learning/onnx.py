"""A policy's per-pod function as an ONNX model, and an onnxruntime runner for it.

Both agent kinds export: a node-scoring policy as its scoring function (below), and a
weight policy (the TD3 actor) as ``summary`` float32 [S] + ``allowed`` bool [T] ->
``weights`` float32 [T] on the simplex (:func:`export_weights_onnx`, run with
:meth:`OnnxScorer.weights`). The model's ``fedsched.kind`` property tells them apart.

:func:`export_onnx` writes the function :meth:`NodeScoringPolicy.score_numpy` computes: inputs
``nodes`` float32 [N, F] (N dynamic; every node given is feasible), ``pod`` float32 [P] and
``context`` float32 [C], output ``logits`` float32 [N]. The feature schema version and the
feature names (and, when given, the checkpoint's metadata) travel in the model's
``metadata_props`` under ``fedsched.*`` keys.

:class:`OnnxScorer` runs such a model with onnxruntime on one thread and refuses a model
written for another feature schema. It needs neither torch nor onnx (only onnxruntime), so a
serving process can score without them.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedsched.common.files import atomic_file
from fedsched.common.learning.features import (
    CONTEXT_FEATURES,
    FEATURE_SCHEMA_VERSION,
    NODE_FEATURES,
    POD_FEATURES,
)

if TYPE_CHECKING:
    from fedsched.common.learning.nets import NodeScoringPolicy

PREFIX = "fedsched."
INPUTS = ("nodes", "pod", "context")
OUTPUT = "logits"
WEIGHT_INPUTS = ("summary", "allowed")
WEIGHT_OUTPUT = "weights"
PARITY_ATOL = 1e-4  # float32 kernels (MKL/MLAS/numpy BLAS) differ by rounding, ~1e-6 on these logits
# Checkpoint metadata copied into the model (JSON-encoded); the rest (hyper-parameters,
# optimizer) is training detail.
META_KEYS = ("algorithm", "data_hash", "created", "policy", "typical_pods", "teacher", "scoring")
"""Checkpoint metadata embedded in the model's properties; ``scoring`` holds the scorer's options
(``kube_weight``: kube-default's score / 100 times it is added to these logits when fedsched
scores; a runtime that reads the ONNX alone must add it too)."""


class OnnxSchemaError(ValueError):
    """An ONNX model that is not a fedsched policy or was exported with another feature schema."""


def export_onnx(policy: NodeScoringPolicy, path: str | Path, opset: int = 17,
                meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``policy``'s single-pod scoring function to ``path`` (atomically); ``meta`` is
    the checkpoint metadata (optional) whose :data:`META_KEYS` are embedded too."""
    import torch
    from torch import nn

    class SinglePod(nn.Module):
        """[N, F], [P], [C] -> logits [N]: adds the batch dimension and an all-true mask."""

        def __init__(self, policy: NodeScoringPolicy) -> None:
            super().__init__()
            self.policy = policy

        def forward(self, nodes: torch.Tensor, pod: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
            mask = torch.ones_like(nodes[:, 0], dtype=torch.bool)[None]
            logits, _ = self.policy(nodes[None], pod[None], context[None], mask)
            return logits[0]

    cfg = policy.cfg
    if (cfg.n_node, cfg.n_pod, cfg.n_ctx) != (len(NODE_FEATURES), len(POD_FEATURES), len(CONTEXT_FEATURES)):
        raise OnnxSchemaError(f"policy input sizes {(cfg.n_node, cfg.n_pod, cfg.n_ctx)} do not match "
                              f"feature schema {FEATURE_SCHEMA_VERSION}")
    example = (torch.zeros(4, cfg.n_node), torch.zeros(cfg.n_pod), torch.zeros(cfg.n_ctx))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # torch >= 2.9 defaults to the torch.export-based exporter, which needs onnxscript;
        # the TorchScript exporter handles this small graph exactly and warns it is legacy.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(SinglePod(policy).eval(), example, buf, dynamo=False, opset_version=opset,
                          input_names=list(INPUTS), output_names=[OUTPUT],
                          dynamic_axes={"nodes": {0: "n_nodes"}, OUTPUT: {0: "n_nodes"}})
    return _write(buf.getvalue(), "node-scoring", meta, path,
                  "fedsched node-scoring policy: logits of one pod over N feasible nodes")


def export_weights_onnx(policy: Any, path: str | Path, opset: int = 17,
                        meta: Mapping[str, Any] | None = None) -> Path:
    """Write a weight policy's actor (summary, allowed terms -> simplex weights) to ``path``."""
    import torch
    from torch import nn

    from fedsched.common.learning.nets import N_SUMMARY, WEIGHT_TERMS

    class Actor(nn.Module):
        def __init__(self, policy: Any) -> None:
            super().__init__()
            self.policy = policy

        def forward(self, summary: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
            return self.policy.weights(summary[None], allowed[None])[0]

    if (policy.cfg.n_summary, policy.cfg.n_terms) != (N_SUMMARY, len(WEIGHT_TERMS)):
        raise OnnxSchemaError(f"weight policy sizes {(policy.cfg.n_summary, policy.cfg.n_terms)} do not "
                              f"match feature schema {FEATURE_SCHEMA_VERSION}")
    example = (torch.zeros(N_SUMMARY), torch.ones(len(WEIGHT_TERMS), dtype=torch.bool))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(Actor(policy).eval(), example, buf, dynamo=False, opset_version=opset,
                          input_names=list(WEIGHT_INPUTS), output_names=[WEIGHT_OUTPUT])
    return _write(buf.getvalue(), "weights", meta, path,
                  "fedsched weight policy: resource weights on the simplex for one pod")


def _write(model_bytes: bytes, kind: str, meta: Mapping[str, Any] | None, path: str | Path,
           doc: str) -> Path:
    """Attach the fedsched metadata, check and save atomically."""
    import onnx

    from fedsched.common.learning.nets import WEIGHT_TERMS

    model = onnx.load_from_string(model_bytes)
    props = {
        "kind": kind, "feature_schema": FEATURE_SCHEMA_VERSION, "node_features": list(NODE_FEATURES),
        "pod_features": list(POD_FEATURES), "context_features": list(CONTEXT_FEATURES),
        **({"weight_terms": list(WEIGHT_TERMS)} if kind == "weights" else {}),
        **{k: meta[k] for k in META_KEYS if meta and k in meta},
    }
    onnx.helper.set_model_props(model, {PREFIX + k: json.dumps(v) for k, v in props.items()})
    model.doc_string = doc
    onnx.checker.check_model(model)
    path = Path(path)
    with atomic_file(path) as f:
        f.write(model.SerializeToString())  # no external data: policies are far below 2 GB
    return path


class OnnxScorer:
    """Logits from an exported policy with onnxruntime (one thread, sequential execution)."""

    def __init__(self, path: str | Path) -> None:
        import onnxruntime as ort

        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no such ONNX model")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            self.session = ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types for a bad file
            raise OnnxSchemaError(f"{self.path}: not a readable ONNX model ({e.__class__.__name__})") from e
        raw = self.session.get_modelmeta().custom_metadata_map
        self.metadata: dict[str, Any] = {k[len(PREFIX):]: json.loads(v) for k, v in raw.items()
                                         if k.startswith(PREFIX)}
        self._check_schema()

    def _check_schema(self) -> None:
        m = self.metadata
        if "feature_schema" not in m:
            raise OnnxSchemaError(f"{self.path}: not a fedsched policy (no {PREFIX}feature_schema metadata); "
                                  "export it with `fedsched export`")
        names = (m.get("node_features"), m.get("pod_features"), m.get("context_features"))
        if m["feature_schema"] != FEATURE_SCHEMA_VERSION or names != (
                list(NODE_FEATURES), list(POD_FEATURES), list(CONTEXT_FEATURES)):
            raise OnnxSchemaError(
                f"{self.path}: exported with feature schema {m['feature_schema']} "
                f"({len(m.get('node_features') or [])} node features), this fedsched uses schema "
                f"{FEATURE_SCHEMA_VERSION} ({len(NODE_FEATURES)} node features); re-export from a "
                "matching checkpoint or use a matching fedsched version")
        self.kind = m.get("kind", "node-scoring")
        want = (list(WEIGHT_INPUTS), [WEIGHT_OUTPUT]) if self.kind == "weights" else (list(INPUTS), [OUTPUT])
        got = [i.name for i in self.session.get_inputs()], [o.name for o in self.session.get_outputs()]
        if got != want:
            raise OnnxSchemaError(f"{self.path}: inputs/outputs {got}, expected {want[0]} -> {want[1]}")

    def logits(self, nodes: np.ndarray, pod: np.ndarray, context: np.ndarray) -> np.ndarray:
        """float32 logits [N] of one pod over the N given (feasible) nodes."""
        feed = {"nodes": np.ascontiguousarray(nodes, dtype=np.float32),
                "pod": np.ascontiguousarray(pod, dtype=np.float32),
                "context": np.ascontiguousarray(context, dtype=np.float32)}
        if self.kind != "node-scoring":
            raise OnnxSchemaError(f"{self.path}: a {self.kind} model has no node logits; use weights()")
        return self.session.run([OUTPUT], feed)[0]

    def weights(self, summary: np.ndarray, allowed: np.ndarray) -> np.ndarray:
        """float32 simplex weights [T] of a weight policy for one pod."""
        if self.kind != "weights":
            raise OnnxSchemaError(f"{self.path}: a {self.kind} model has no weights; use logits()")
        feed = {"summary": np.ascontiguousarray(summary, dtype=np.float32),
                "allowed": np.ascontiguousarray(allowed, dtype=bool)}
        return self.session.run([WEIGHT_OUTPUT], feed)[0]
