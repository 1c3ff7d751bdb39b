"""The FGD fragmentation model against a direct transcription of its definition."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.common.fragmentation import FragmentationModel, TypicalPods, fragmentation_ratio

from .conftest import make_pods


def naive_frag(typ: TypicalPods, cpu_left: int, left: np.ndarray, model: int) -> float:
    """F_n(M) = sum_m p_m F_n(m), written out case by case (reference section 4)."""
    idle = float(left.sum())
    total = 0.0
    for c in range(len(typ)):
        q = typ.gpu_milli[c]
        if q == 0:  # a CPU-only task cannot use any GPU
            total += typ.freq[c] * idle
            continue
        spec = typ.spec_mask[c]
        model_ok = spec == 0 or (model >= 0 and (spec >> model) & 1)
        fits = model_ok and (left >= q).sum() >= typ.num_gpu[c] and cpu_left >= typ.cpu[c]
        total += typ.freq[c] * (float(left[left < q].sum()) if fits else idle)
    return total


def test_typical_pods_cover_95_percent_including_the_crossing_class():
    # 50 x A, 30 x B, 15 x C, 5 x D: A+B = 80% < 95%, +C = 95% reaches it -> D excluded.
    cpu = [1000] * 50 + [2000] * 30 + [3000] * 15 + [4000] * 5
    pods = make_pods(cpu, [1] * 100, [1] * 100, [500] * 100)
    typ = TypicalPods.from_pods(pods)
    assert list(typ.cpu) == [1000, 2000, 3000]
    np.testing.assert_allclose(typ.freq, [50 / 95, 30 / 95, 15 / 95])
    # One short of 95%: C crosses the threshold and is still included, D is not.
    pods2 = make_pods([*cpu[:-1], 1000], [1] * 100, [1] * 100, [500] * 100)
    assert len(TypicalPods.from_pods(pods2)) == 3


def test_zero_cpu_counts_as_100m_in_typical_pods():
    typ = TypicalPods.from_pods(make_pods([0, 0], [1, 1], [0, 0], [0, 0]))
    assert list(typ.cpu) == [100]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_vectorised_fragmentation_equals_definition(seed):
    rng = np.random.default_rng(seed)
    n = 40
    cpu = rng.choice([0, 1000, 4000, 8000], n)
    milli = np.where(cpu % 8000 == 0, rng.choice([0, 300, 500, 1000], n), rng.choice([200, 1000], n))
    num = np.where(milli == 0, 0, np.where(milli == 1000, rng.choice([1, 2, 4], n), 1))
    milli = np.where(num == 0, 0, milli)
    spec = rng.choice([0, 1, 2, 3], n)
    typ = TypicalPods.from_pods(make_pods(cpu, [1] * n, num, milli, spec_mask=spec))
    fm = FragmentationModel(typ, n_models=2)
    k = 25
    left = rng.choice([0, 100, 250, 500, 700, 1000], size=(k, 8))
    left[:, rng.integers(1, 9):] = 0
    cpu_left = rng.integers(0, 20000, k)
    model = rng.integers(-1, 2, k)
    got = fm.node_frag(cpu_left, left, model)
    want = [naive_frag(typ, int(cpu_left[i]), left[i], int(model[i])) for i in range(k)]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_fragmentation_ratio_formula():
    cap = np.array([100.0, 100.0])
    # CPU 50% available, memory 25% available -> 1 - 0.25 / 0.5 = 0.5
    assert fragmentation_ratio(np.array([50.0, 50.0]), cap, np.array([25.0, 25.0]), cap) == 0.5
    assert fragmentation_ratio(np.array([10.0, 10.0]), cap, np.array([10.0, 10.0]), cap) == 0.0
    assert fragmentation_ratio(np.zeros(2), cap, np.zeros(2), cap) == 0.0
