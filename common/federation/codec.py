"""Weight codec for federated uploads: symmetric INT8 quantisation with error feedback.

A model's weights travel as a flat ``dict[str, np.ndarray]`` (the names of
``module.state_dict()``). :func:`encode_int8` turns every float tensor into an ``int8``
tensor plus an ``float32`` scale (one per tensor, or one per output channel) under the keys
``NAME.q`` / ``NAME.scale``: ``q = round(x / scale)`` with ``scale = max|x| / 127``, so
the reconstruction error of each element is at most ``scale / 2``. Non-float tensors pass
through unchanged under ``NAME.raw``. :func:`decode_int8` inverts it.

:class:`ErrorFeedback` keeps, per tensor, the part of the last upload the quantiser lost
and adds it to the next one before quantising (error-feedback compression), so the sum of
what the server receives tracks the sum of the true updates to within one quantisation
step instead of drifting: quantisation error does not bias training.

Downloads (:func:`encode_download` on the hub, :func:`apply_download` on both sides): the
hub sends the global model ``G`` to a member that holds a reconstruction ``R`` (what it rebuilt
last time) as the INT8 delta ``Q(G - R)`` (per output channel), and the member's new
reconstruction is ``R + deQ(Q(G - R))``. Because each delta is taken against what the member
really holds, not against the previous global, last round's quantisation error is part of
this round's delta (error feedback for free): ``|R_new - G|`` is at most half a step of the
*delta's* scale every round, and never accumulates. A member without a reconstruction gets a
full copy: the float32 global (an exact start) or ``Q(G)`` (the delta against zero, the same
code). :func:`digest` names a reconstruction (a hash of its names, shapes, dtypes and bytes)
so that a delta carries the digest of the base it applies to and of the result it must
produce; a member refuses a delta
whose base it does not hold, or whose result it cannot reproduce, instead of training on a
corrupted model (:func:`apply_download` raises :class:`DownloadMismatch`).

Also here, the two other pieces of weight arithmetic both sides need: the personalised
mix ``W = eta * W_local + (1 - eta) * W_global`` and the FedProx proximal term
``mu / 2 * ||w - w_global||^2``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

Q_SUFFIX, SCALE_SUFFIX, RAW_SUFFIX = ".q", ".scale", ".raw"
QMAX = 127


def quantize_int8(x: np.ndarray, per_channel: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(q int8, scale float32): symmetric quantisation, per tensor or per output channel (axis 0)."""
    x = np.asarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError("cannot quantise non-finite weights")
    # A scale that underflows float32 (|x| below ~1e-36) falls back to 1: such values
    # quantise to 0 with an error far below half a step.
    if per_channel and x.ndim >= 2:
        amax = np.abs(x).reshape(x.shape[0], -1).max(axis=1)
        scale = (amax / np.float32(QMAX)).astype(np.float32)
        scale[scale == 0] = 1.0
        q = np.round(x / scale.reshape(-1, *([1] * (x.ndim - 1))))
    else:
        amax = np.float32(np.abs(x).max()) if x.size else np.float32(0.0)
        scale = np.array(amax / np.float32(QMAX), dtype=np.float32)
        if scale == 0:
            scale = np.array(1.0, dtype=np.float32)
        q = np.round(x / scale)
    return np.clip(q, -QMAX, QMAX).astype(np.int8), scale


def dequantize_int8(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    q = np.asarray(q, dtype=np.float32)
    scale = np.asarray(scale, dtype=np.float32)
    if scale.ndim == 1 and q.ndim >= 2:
        scale = scale.reshape(-1, *([1] * (q.ndim - 1)))
    return q * scale


def encode_int8(weights: Mapping[str, np.ndarray], per_channel: bool = False) -> dict[str, np.ndarray]:
    """Quantise every float tensor; see the module docstring for the key layout."""
    out: dict[str, np.ndarray] = {}
    for name, x in weights.items():
        x = np.asarray(x)
        if np.issubdtype(x.dtype, np.floating):
            out[name + Q_SUFFIX], out[name + SCALE_SUFFIX] = quantize_int8(x, per_channel)
        else:
            out[name + RAW_SUFFIX] = x
    return out


def decode_int8(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of :func:`encode_int8` (float tensors come back as float32)."""
    out: dict[str, np.ndarray] = {}
    for key, x in arrays.items():
        if key.endswith(Q_SUFFIX):
            name = key[: -len(Q_SUFFIX)]
            if name + SCALE_SUFFIX not in arrays:
                raise ValueError(f"{name}: int8 tensor without its scale")
            out[name] = dequantize_int8(x, arrays[name + SCALE_SUFFIX])
        elif key.endswith(RAW_SUFFIX):
            out[key[: -len(RAW_SUFFIX)]] = np.asarray(x)
        elif not key.endswith(SCALE_SUFFIX):
            suffixes = f"{Q_SUFFIX}/{SCALE_SUFFIX}/{RAW_SUFFIX}"
            raise ValueError(f"{key}: not an encoded tensor (expected a {suffixes} key)")
    return out


def nbytes(arrays: Mapping[str, np.ndarray]) -> int:
    """Payload size of a set of arrays (what an upload carries, before framing)."""
    return int(sum(np.asarray(x).nbytes for x in arrays.values()))


class ErrorFeedback:
    """Carries each tensor's quantisation residual into the next upload."""

    def __init__(self, per_channel: bool = False) -> None:
        self.per_channel = per_channel
        self.residual: dict[str, np.ndarray] = {}

    def encode(self, update: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Encode ``update + residual``; keep what the quantiser lost for next time."""
        corrected = {}
        for name, x in update.items():
            x = np.asarray(x)
            if np.issubdtype(x.dtype, np.floating):
                x = x.astype(np.float32) + self.residual.get(name, 0.0)
            corrected[name] = x
        encoded = encode_int8(corrected, self.per_channel)
        decoded = decode_int8(encoded)
        for name, x in corrected.items():
            if np.issubdtype(np.asarray(x).dtype, np.floating):
                self.residual[name] = (x - decoded[name]).astype(np.float32)
        return encoded

    def state(self) -> dict[str, np.ndarray]:
        """The residuals, to persist beside the local weights."""
        return dict(self.residual)

    def load(self, residual: Mapping[str, np.ndarray]) -> None:
        self.residual = {k: np.asarray(v, dtype=np.float32) for k, v in residual.items()}


class DownloadMismatch(ValueError):
    """A downloaded delta that cannot be applied to what the member holds."""


def digest(weights: Mapping[str, np.ndarray] | None) -> str:
    """A short name of a set of weights (names, shapes, dtypes and bytes); "" for none."""
    if weights is None:
        return ""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(weights):
        x = np.ascontiguousarray(weights[name])
        h.update(f"{name}|{x.dtype.str}|{x.shape}|".encode())
        h.update(x.tobytes())
    return h.hexdigest()


def encode_download(global_: Mapping[str, np.ndarray], base: Mapping[str, np.ndarray] | None,
                    full: str = "int8") -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(what the hub sends, what the member will hold): the INT8 delta ``Q(global - base)`` (per
    output channel) or, without a base, the full copy: ``Q(global)`` (``full = "int8"``) or the
    float32 global itself (``full = "fp32"``: an exact start); non-float tensors travel whole
    (``NAME.raw``). The second item is :func:`apply_download`'s result, bit for bit."""
    if full not in ("int8", "fp32"):
        raise ValueError(f"full must be 'int8' or 'fp32', got {full!r}")
    if base is not None and (set(base) != set(global_) or any(
            np.shape(base[k]) != np.shape(global_[k]) for k in global_)):
        base = None  # the model changed shape: start over with a full copy
    if base is None and full == "fp32":
        arrays = {k: np.asarray(g) for k, g in global_.items()}
        exact = {k + RAW_SUFFIX: g.astype(np.float32) if np.issubdtype(g.dtype, np.floating) else g
                 for k, g in arrays.items()}
        return exact, apply_download(exact, None)
    diff = {}
    for name, g in global_.items():
        g = np.asarray(g)
        if np.issubdtype(g.dtype, np.floating):
            g = g.astype(np.float32)
            diff[name] = g - np.asarray(base[name], dtype=np.float32) if base is not None else g
        else:
            diff[name] = g
    encoded = encode_int8(diff, per_channel=True)
    return encoded, apply_download(encoded, base)


def apply_download(encoded: Mapping[str, np.ndarray],
                   base: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """The reconstruction a download produces: ``base + deQ(delta)`` (``deQ(full)`` without a
    base; raw tensors replace). Raises :class:`DownloadMismatch` when ``base`` lacks a tensor
    of the delta or has another shape."""
    decoded = decode_int8(encoded)
    if base is None:
        return {k: (v.astype(np.float32) if np.issubdtype(v.dtype, np.floating) else v)
                for k, v in decoded.items()}
    if set(base) != set(decoded):
        differ = sorted(set(base) ^ set(decoded))
        raise DownloadMismatch(f"the delta's tensors differ from the base's: {differ}")
    out = {}
    for name, d in decoded.items():
        if name + RAW_SUFFIX in encoded:
            out[name] = d
            continue
        b = np.asarray(base[name], dtype=np.float32)
        if b.shape != d.shape:
            raise DownloadMismatch(f"{name}: base shape {b.shape} != delta shape {d.shape}")
        out[name] = (b + d).astype(np.float32)
    return out


def personalised_mix(local: Mapping[str, np.ndarray], global_: Mapping[str, np.ndarray],
                     eta: float) -> dict[str, np.ndarray]:
    """``eta * local + (1 - eta) * global`` per tensor (eta in [0, 1]; keys and shapes must match)."""
    if not 0.0 <= eta <= 1.0 or eta != eta:
        raise ValueError(f"eta must be in [0, 1], got {eta}")
    if set(local) != set(global_):
        raise ValueError(f"local and global weights differ in tensors: {sorted(set(local) ^ set(global_))}")
    out = {}
    for name, g in global_.items():
        lo, g = np.asarray(local[name]), np.asarray(g)
        if lo.shape != g.shape:
            raise ValueError(f"{name}: local shape {lo.shape} != global shape {g.shape}")
        out[name] = eta * lo + (1.0 - eta) * g if np.issubdtype(g.dtype, np.floating) else g
    return out


def proximal_term(params: Mapping[str, object], anchor: Mapping[str, object], mu: float):
    """FedProx's ``mu / 2 * sum ||w - w_anchor||^2`` over the named tensors (torch or numpy).

    With torch tensors the result is differentiable: its gradient with respect to ``w`` is
    ``mu * (w - w_anchor)``, anchored at the global weights received this round.
    """
    total = 0.0
    for name, w in params.items():
        d = w - anchor[name]
        total = total + (d * d).sum()
    return 0.5 * mu * total
