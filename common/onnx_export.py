"""The policy's single-pod scoring function as an ONNX model, and an onnxruntime scorer for it.

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

from .features import CONTEXT_FEATURES, FEATURE_SCHEMA_VERSION, NODE_FEATURES, POD_FEATURES

if TYPE_CHECKING:
    from .policy import NodeScoringPolicy

PREFIX = "fedsched."
INPUTS = ("nodes", "pod", "context")
OUTPUT = "logits"
PARITY_ATOL = 1e-4  # float32 kernels (MKL/MLAS/numpy BLAS) differ by rounding, ~1e-6 on these logits
# Checkpoint metadata copied into the model (JSON-encoded); the rest (hyper-parameters,
# optimizer) is training detail.
META_KEYS = ("algorithm", "data_hash", "created", "policy", "typical_pods", "teacher")


class OnnxSchemaError(ValueError):
    """An ONNX model that is not a fedsched policy or was exported with another feature schema."""


def export_onnx(policy: NodeScoringPolicy, path: str | Path, opset: int = 17,
                meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``policy``'s single-pod scoring function to ``path`` (atomically); ``meta`` is
    the checkpoint metadata (optional) whose :data:`META_KEYS` are embedded too."""
    import onnx
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
    model = onnx.load_from_string(buf.getvalue())
    props = {
        "feature_schema": FEATURE_SCHEMA_VERSION, "node_features": list(NODE_FEATURES),
        "pod_features": list(POD_FEATURES), "context_features": list(CONTEXT_FEATURES),
        **{k: meta[k] for k in META_KEYS if meta and k in meta},
    }
    onnx.helper.set_model_props(model, {PREFIX + k: json.dumps(v) for k, v in props.items()})
    model.doc_string = "fedsched node-scoring policy: logits of one pod over N feasible nodes"
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    onnx.save(model, tmp)
    tmp.replace(path)
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
        got = [i.name for i in self.session.get_inputs()], [o.name for o in self.session.get_outputs()]
        if got != (list(INPUTS), [OUTPUT]):
            raise OnnxSchemaError(f"{self.path}: inputs/outputs {got}, expected {list(INPUTS)} -> {OUTPUT}")

    def logits(self, nodes: np.ndarray, pod: np.ndarray, context: np.ndarray) -> np.ndarray:
        """float32 logits [N] of one pod over the N given (feasible) nodes."""
        feed = {"nodes": np.ascontiguousarray(nodes, dtype=np.float32),
                "pod": np.ascontiguousarray(pod, dtype=np.float32),
                "context": np.ascontiguousarray(context, dtype=np.float32)}
        return self.session.run([OUTPUT], feed)[0]
