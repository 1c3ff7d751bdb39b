""":meth:`ClusterState.feasible`'s refresh of its kept answers, compiled with numba.

:func:`_refresh_fits` is the cache-hit path of ``ClusterState._feasible_all``: each node whose
``version`` moved since its kept answer is checked again by :meth:`ClusterState.fits_one`'s rule
(free CPU and memory, the pod's GPU models, a sharing pod's one GPU with room or a whole-GPU pod's
free GPUs), and the answer is written with ``alive`` applied, in one pass over the nodes instead
of a comparison, a ``flatnonzero``, the checks and an ``&`` (the replay asks this for every pod it
tries, placed or not). Integer comparisons only, so the same booleans as the numpy form, which
``cluster.py`` keeps for a build without numba (``FIT_KERNEL`` None);
``tests/common/model/test_fit_kernel.py`` compares the two.

May import: numpy, numba.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def fits_node(n: int, node_cpu: np.ndarray, cpu_req: np.ndarray, node_mem: np.ndarray, mem_req: np.ndarray,
              model: np.ndarray, gpu_free: np.ndarray, cpu: int, mem: int, num_gpu: int, gpu_milli: int,
              spec_mask: int, share: bool, milli_per_gpu: int) -> bool:
    """:meth:`ClusterState.fits_one` of node ``n`` (``share``: the pod's ``is_gpu_share``); also
    kube-default's compiled pass (``schedulers/kube_default_kernel.py``) checks nodes with it."""
    if node_cpu[n] - cpu_req[n] < cpu or node_mem[n] - mem_req[n] < mem:
        return False
    if num_gpu == 0:
        return True
    if spec_mask != 0:
        m = model[n]
        if m < 0 or (spec_mask >> m) & 1 != 1:
            return False
    count = 0
    for j in range(gpu_free.shape[1]):
        f = gpu_free[n, j]
        if share:
            if f >= gpu_milli:
                return True
        elif f >= milli_per_gpu:
            count += 1
    return not share and count >= num_gpu


def _refresh_fits(fits: np.ndarray, seen: np.ndarray, version: np.ndarray, alive: np.ndarray,
                  node_cpu: np.ndarray, cpu_req: np.ndarray, node_mem: np.ndarray, mem_req: np.ndarray,
                  model: np.ndarray, gpu_free: np.ndarray, cpu: int, mem: int, num_gpu: int, gpu_milli: int,
                  spec_mask: int, is_share: bool, milli_per_gpu: int, out: np.ndarray) -> None:
    """Kept answers ``fits`` (computed at node versions ``seen``) brought up to ``version``, and
    ``out = fits & alive``."""
    for n in range(len(version)):
        v = version[n]
        if seen[n] != v:
            fits[n] = fits_node(n, node_cpu, cpu_req, node_mem, mem_req, model, gpu_free, cpu, mem, num_gpu,
                                gpu_milli, spec_mask, is_share, milli_per_gpu)
            seen[n] = v
        out[n] = fits[n] and alive[n]


FIT_KERNEL: Callable[..., None] | None
try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; cluster.py's numpy form stands in
    FIT_KERNEL = None
else:
    fits_node = numba.njit(cache=True, inline="always")(fits_node)
    FIT_KERNEL = numba.njit(cache=True)(_refresh_fits)
