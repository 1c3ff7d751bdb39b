"""Synthetic profiles refuse parameters that are not finite numbers (issue 26: a NaN
``diurnal_peak_hour`` made the diurnal arrivals' rejection sampling loop forever): every numeric
field of every profile, a number or inside a tuple, NaN or infinite, is a ValueError naming it,
before anything is drawn."""

from __future__ import annotations

import dataclasses
import math

import pytest

from fedsched.common.model.synthetic import PROFILES, WebProfile, generate_cluster

BAD = (math.nan, math.inf, -math.inf)


def _numeric_fields() -> list[tuple[str, str]]:
    out = []
    for name, profile in PROFILES.items():
        for f in dataclasses.fields(profile):
            value = getattr(profile, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                out.append((name, f.name))
    return out


@pytest.mark.parametrize("bad", BAD, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(("profile", "field"), _numeric_fields())
def test_a_non_finite_number_is_refused_naming_the_field(profile: str, field: str, bad: float) -> None:
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(PROFILES[profile], **{field: bad})


@pytest.mark.parametrize("bad", BAD, ids=["nan", "inf", "-inf"])
def test_a_non_finite_number_inside_a_tuple_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="node_shapes"):
        dataclasses.replace(PROFILES["web"], node_shapes=((16, 64), (bad, 64)))
    with pytest.raises(ValueError, match="gpu_node_shapes"):
        dataclasses.replace(PROFILES["gpu"], gpu_node_shapes=((4, 48, bad),))


def test_the_diurnal_peak_hour_and_period_are_checked_before_anything_is_drawn() -> None:
    with pytest.raises(ValueError, match="diurnal_peak_hour"):
        generate_cluster("web", 0, n_nodes=5, n_pods=50, diurnal_peak_hour=math.nan)
    with pytest.raises(ValueError, match="diurnal"):  # a phase past float range: a NaN rate
        WebProfile(diurnal_period_hours=1e-310)
    _nodes, pods = generate_cluster("web", 0, n_nodes=5, n_pods=50, diurnal_peak_hour=1e6)
    assert len(pods.cpu) == 50  # large but finite: served
