"""INT8 codec with error feedback, personalised mixing and the FedProx term."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedsched.common.federation.codec import (
    ErrorFeedback,
    decode_int8,
    dequantize_int8,
    encode_int8,
    nbytes,
    personalised_mix,
    proximal_term,
    quantize_int8,
)
from fedsched.common.learning.nets import NodeScoringPolicy

FLOATS = hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=16),
                    elements=st.floats(-100, 100, width=32))


@settings(max_examples=100, deadline=None)
@given(x=FLOATS, per_channel=st.booleans())
def test_round_trip_error_is_at_most_half_a_step(x, per_channel):
    q, scale = quantize_int8(x, per_channel)
    assert q.dtype == np.int8 and scale.dtype == np.float32
    err = np.abs(dequantize_int8(q, scale) - x)
    step = scale if scale.ndim == 0 else scale.reshape(-1, *([1] * (x.ndim - 1)))
    assert (err <= step / 2 + 1e-6 * (1 + np.abs(x))).all()


def test_encode_decode_model_and_size():
    policy = NodeScoringPolicy()
    weights = {k: v.numpy() for k, v in policy.state_dict().items()}
    enc = encode_int8(weights)
    dec = decode_int8(enc)
    assert set(dec) == set(weights)
    for k, v in weights.items():
        assert np.abs(dec[k] - v).max() <= np.abs(v).max() / 127 / 2 + 1e-7
    ratio = nbytes(enc) / nbytes(weights)
    assert ratio <= 0.26, ratio  # int8 values + one fp32 scale per tensor
    with pytest.raises(ValueError, match="without its scale"):
        decode_int8({"w.q": enc[next(iter(enc))]})
    with pytest.raises(ValueError, match="non-finite"):
        quantize_int8(np.array([1.0, np.nan], np.float32))


def test_error_feedback_keeps_the_running_sum_unbiased():
    rng = np.random.default_rng(0)
    ef = ErrorFeedback()
    true_sum = np.zeros(1000, np.float32)
    sent_sum = np.zeros(1000, np.float32)
    plain_sum = np.zeros(1000, np.float32)
    for _ in range(200):
        # Small updates next to one large coordinate: plain int8 rounds most of them away.
        u = (rng.normal(size=1000) * 0.01).astype(np.float32)
        u[0] = 1.0
        true_sum += u
        sent_sum += decode_int8(ef.encode({"w": u}))["w"]
        plain_sum += decode_int8(encode_int8({"w": u}))["w"]
    step = 1.0 / 127
    ef_err = np.abs(sent_sum - true_sum).max()
    plain_err = np.abs(plain_sum - true_sum).max()
    assert ef_err <= step  # bounded by one quantisation step, whatever the number of rounds
    assert plain_err > 5 * ef_err
    np.testing.assert_allclose(ef.state()["w"], true_sum - sent_sum, atol=1e-5)


def test_personalised_mix_and_eta_bounds():
    local = {"a": np.array([1.0, 3.0]), "n": np.array([7])}
    glob = {"a": np.array([3.0, 1.0]), "n": np.array([5])}
    mixed = personalised_mix(local, glob, 0.2)
    np.testing.assert_allclose(mixed["a"], [2.6, 1.4])
    assert mixed["n"][0] == 5  # integer buffers follow the global model
    np.testing.assert_allclose(personalised_mix(local, glob, 1.0)["a"], local["a"])
    np.testing.assert_allclose(personalised_mix(local, glob, 0.0)["a"], glob["a"])
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="eta"):
            personalised_mix(local, glob, bad)
    with pytest.raises(ValueError, match="shape"):
        personalised_mix({"a": np.zeros(3)}, {"a": np.zeros(2)}, 0.5)


def test_proximal_term_gradient_is_mu_times_the_difference():
    torch.manual_seed(0)
    w = {"a": torch.randn(4, 3, requires_grad=True), "b": torch.randn(5, requires_grad=True)}
    anchor = {k: torch.randn_like(v) for k, v in w.items()}
    mu = 0.3
    term = proximal_term(w, anchor, mu)
    term.backward()
    for k in w:
        torch.testing.assert_close(w[k].grad, mu * (w[k].detach() - anchor[k]))
    expected = 0.5 * mu * sum(float(((w[k].detach() - anchor[k]) ** 2).sum()) for k in w)
    assert abs(float(term.detach()) - expected) < 1e-5
