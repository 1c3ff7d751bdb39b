"""``Pod.many_from_table`` builds the same pods as ``Pod.from_table`` row by row."""

from __future__ import annotations

import numpy as np

from fedsched.common.model.cluster import Pod
from fedsched.common.model.synthetic import generate_cluster


def test_many_from_table_is_from_table() -> None:
    _, pods = generate_cluster("gpu", 3, n_nodes=10, n_pods=400)
    rows = np.random.default_rng(0).permutation(len(pods))[:150]
    many = Pod.many_from_table(pods, rows)
    one = [Pod.from_table(pods, int(i)) for i in rows]
    assert many == one
    assert all(type(getattr(a, f)) is type(getattr(b, f)) for a, b in zip(many, one, strict=True)
               for f in a.__dataclass_fields__)
