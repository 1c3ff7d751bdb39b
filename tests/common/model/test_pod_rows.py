"""``Pod.many_from_table`` builds the same pods as ``Pod.from_table`` row by row; ``PodTable.from_pods``
is their inverse."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedsched.common.model.cluster import Pod, PodTable
from fedsched.common.model.synthetic import generate_cluster


def test_many_from_table_is_from_table() -> None:
    _, pods = generate_cluster("gpu", 3, n_nodes=10, n_pods=400)
    rows = np.random.default_rng(0).permutation(len(pods))[:150]
    many = Pod.many_from_table(pods, rows)
    one = [Pod.from_table(pods, int(i)) for i in rows]
    assert many == one
    assert all(type(getattr(a, f)) is type(getattr(b, f)) for a, b in zip(many, one, strict=True)
               for f in a.__dataclass_fields__)


def test_a_table_of_pods_gives_the_same_pods_back() -> None:
    _, pods = generate_cluster("web", 4, n_nodes=10, n_pods=300)
    rows = np.random.default_rng(1).permutation(len(pods))[:100]
    picked = Pod.many_from_table(pods, rows)
    table = PodTable.from_pods(picked)
    assert len(table) == 100 and table.names[:2] == ("0", "1")
    assert Pod.many_from_table(table, np.arange(100)) == [dataclasses.replace(p, index=i)
                                                          for i, p in enumerate(picked)]
    assert PodTable.from_pods(picked[:2], names=["a", "b"]).names == ("a", "b")
    assert len(PodTable.from_pods([])) == 0
    with pytest.raises(ValueError, match="1 names for 2 pods"):
        PodTable.from_pods(picked[:2], names=["a"])
