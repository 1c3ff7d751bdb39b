"""The download codec: the global as an INT8 delta from what the member holds (error feedback by
construction), its digests, and the refusal of a delta against a base the member does not hold."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.common.federation.codec import (
    SCALE_SUFFIX,
    DownloadMismatch,
    apply_download,
    digest,
    encode_download,
    nbytes,
)
from fedsched.common.federation.weights import weights_of
from fedsched.common.learning.nets import NodeScoringPolicy

SHAPES = st.dictionaries(st.sampled_from(["a.weight", "a.bias", "b.weight", "c"]),
                         st.lists(st.integers(1, 12), min_size=1, max_size=3).map(tuple), min_size=1)


def half_steps(encoded: dict[str, np.ndarray], weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Half of each element's quantisation step in ``encoded`` (broadcast to the tensor's shape)."""
    out = {}
    for name, w in weights.items():
        scale = encoded[name + SCALE_SUFFIX]
        if scale.ndim == 1 and w.ndim >= 2:
            scale = scale.reshape(-1, *([1] * (w.ndim - 1)))
        out[name] = np.broadcast_to(scale / 2, w.shape)
    return out


@settings(max_examples=60, deadline=None)
@given(shapes=SHAPES, seed=st.integers(0, 2**32 - 1), rounds=st.integers(2, 40),
       drift=st.floats(1e-4, 10.0), level=st.floats(1e-2, 100.0))
def test_the_reconstruction_tracks_the_global_within_half_a_step_every_round(shapes, seed, rounds,
                                                                             drift, level):
    """Over many rounds of random globals the member's reconstruction is within half a quantisation
    step of the true global every round, and the error never grows beyond a fraction of the
    round's change (no drift), however long the run."""
    rng = np.random.default_rng(seed)
    g = {k: (level * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}
    held, prev_err, g_prev = None, 0.0, g
    for t in range(rounds):
        if t:
            g_prev = g
            g = {k: (v + drift * rng.standard_normal(v.shape)).astype(np.float32) for k, v in g.items()}
        encoded, rebuilt = encode_download(g, held)
        assert digest(apply_download(encoded, held)) == digest(rebuilt)  # the member rebuilds it bit for bit
        bound = half_steps(encoded, g)
        for k in g:
            err = np.abs(rebuilt[k] - g[k])
            assert (err <= bound[k] * (1 + 1e-5) + 1e-6 * np.abs(g[k]).max()).all(), (t, k)
        err = max(float(np.abs(rebuilt[k] - g[k]).max()) for k in g)
        if held is not None:  # the delta carries last round's error: this round's is a small part of both
            change = max(float(np.abs(g[k] - held[k]).max()) for k in g)
            assert err <= change / 254 * (1 + 1e-4) + 1e-6 * level, t
            moved = max(float(np.abs(g[k] - g_prev[k]).max()) for k in g)
            assert change <= moved + prev_err * (1 + 1e-4) + 1e-6 * level  # so the error never runs away
        held, prev_err = rebuilt, err


def test_deltas_are_a_quarter_of_fp32_on_the_shipped_model_and_far_finer_than_a_full_copy():
    g = weights_of(NodeScoringPolicy())
    full, held = encode_download(g, None)
    assert nbytes(full) < 0.27 * nbytes(g)
    rng = np.random.default_rng(0)
    g2 = {k: v + np.float32(1e-3) * rng.standard_normal(v.shape).astype(np.float32) for k, v in g.items()}
    delta, rebuilt = encode_download(g2, held)
    assert nbytes(delta) == nbytes(full)
    err_full = max(float(np.abs(held[k] - g[k]).max()) for k in g)
    err_delta = max(float(np.abs(rebuilt[k] - g2[k]).max()) for k in g)
    assert err_delta < err_full / 10


def test_a_delta_against_another_base_is_caught_by_the_digests():
    """The hub's digests name the base a delta applies to and the result: applied to any other base,
    the result's digest differs (the member refuses it, tests/agent/federation/test_download_mod.py)."""
    rng = np.random.default_rng(1)
    g = {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)}
    _, held = encode_download(g, None)
    g2 = {k: v + np.float32(0.1) for k, v in g.items()}
    delta, rebuilt = encode_download(g2, held)
    other = {k: v + np.float32(1e-3) for k, v in held.items()}
    assert digest(other) != digest(held)
    assert digest(apply_download(delta, other)) != digest(rebuilt)
    with pytest.raises(DownloadMismatch):
        apply_download(delta, {"w": held["w"]})  # a tensor missing
    with pytest.raises(DownloadMismatch):
        apply_download(delta, {"w": held["w"][:2], "b": held["b"]})  # another shape
    assert digest(None) == "" and digest(held) == digest({k: v.copy() for k, v in held.items()})


def test_without_a_base_the_download_is_a_full_copy_and_a_changed_model_starts_over():
    rng = np.random.default_rng(2)
    g = {"w": rng.standard_normal((5, 2)).astype(np.float32)}
    full, rebuilt = encode_download(g, None)
    np.testing.assert_array_equal(apply_download(full, None)["w"], rebuilt["w"])
    changed, again = encode_download(g, {"w": np.zeros((3, 2), np.float32)})  # the base no longer fits
    np.testing.assert_array_equal(again["w"], rebuilt["w"])
    assert all(np.array_equal(changed[k], full[k]) for k in full)
    exact, start = encode_download(g, None, full="fp32")  # an exact start: the float32 global
    assert set(exact) == {"w.raw"} and nbytes(exact) == nbytes(g)
    np.testing.assert_array_equal(start["w"], g["w"])
    delta, _ = encode_download(g, start, full="fp32")  # with a base: an INT8 delta either way
    assert set(delta) == {"w.q", "w.scale"}
    with pytest.raises(ValueError, match="full"):
        encode_download(g, None, full="int4")
