"""Tiny clusters built directly from arrays (shared by the tests)."""

from __future__ import annotations

import numpy as np

from fedsched.common.model.cluster import NodeTable, PodTable


def make_nodes(cpu, mem, gpu, model=None, models=("A", "B")) -> NodeTable:
    n = len(cpu)
    gpu = np.asarray(gpu, dtype=np.int64)
    model = np.asarray(model if model is not None else [0 if g > 0 else -1 for g in gpu], dtype=np.int64)
    return NodeTable(names=tuple(f"n{i}" for i in range(n)), cpu=np.asarray(cpu, dtype=np.int64),
                     mem=np.asarray(mem, dtype=np.int64), gpu=gpu, model=model, models=tuple(models),
                     disk_io=np.full(n, 1000.0), net=np.full(n, 10000.0))


def make_pods(cpu, mem, num_gpu, gpu_milli, spec_mask=None, qos=None) -> PodTable:
    n = len(cpu)
    return PodTable(
        names=tuple(f"p{i}" for i in range(n)), cpu=np.asarray(cpu, dtype=np.int64),
        mem=np.asarray(mem, dtype=np.int64), num_gpu=np.asarray(num_gpu, dtype=np.int64),
        gpu_milli=np.asarray(gpu_milli, dtype=np.int64),
        spec_mask=np.asarray(spec_mask if spec_mask is not None else [0] * n, dtype=np.int64),
        qos=np.asarray(qos if qos is not None else [1] * n, dtype=np.int64),
        creation=np.full(n, np.nan), deletion=np.full(n, np.nan))
