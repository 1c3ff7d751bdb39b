"""kube-default's per-decision pass over all nodes, compiled with numba (``KubeDefault.top_nodes``).

One loop over the nodes: a node whose ``ClusterState.version`` moved since its entry was kept
is checked again (``ClusterState.fits_one``'s rule, :func:`~fedsched.common.model.fit_kernel.fits_node`)
and scored again
(:func:`~fedsched.common.schedulers.kube_default.kube_default_score_one`), then the alive nodes
with the highest score are collected in id order. The arithmetic is
``kube_default_score_one``'s, operation for operation: integer ``//`` on non-negative int64
operands, ``/`` of two integers below 2**53 in float64 (both exact conversions, one correctly
rounded division, as numpy's and Python's), truncation by ``int``; no fast-math. So the scores
are the same bits as the numpy form's (``tests/common/sim/test_replay_top_nodes.py``
checks them and the tie set against :func:`~fedsched.common.schedulers.base.rank`).

``top_kernel`` is None when numba cannot be imported; ``KubeDefault`` then keeps the numpy form.

May import: numpy, numba, :mod:`fedsched.common.model.fit_kernel`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedsched.common.model.fit_kernel import fits_node

MILLI_PER_GPU = 1000  # fedsched.common.model.cluster.MILLI_PER_GPU (a test checks they agree)
DEFAULT_MILLI_CPU_REQUEST = 100  # ... .DEFAULT_MILLI_CPU_REQUEST
DEFAULT_MEMORY_REQUEST_MIB = 200  # ... .DEFAULT_MEMORY_REQUEST_MIB


def _top(eff: np.ndarray, seen: np.ndarray, version: np.ndarray, alive: np.ndarray, cap_cpu: np.ndarray,
         cap_mem: np.ndarray, cpu_req: np.ndarray, mem_req: np.ndarray, cpu_req_nz: np.ndarray,
         mem_req_nz: np.ndarray, gpu_free: np.ndarray, model: np.ndarray, p_cpu: int, p_mem: int,
         num_gpu: int, gpu_milli: int, spec_mask: int, out: np.ndarray) -> int:
    """Bring ``eff`` (score where the pod fits, -inf elsewhere) up to date where ``seen`` differs
    from ``version``; write the ids of the alive nodes with the top score to ``out``; return how
    many (0: the pod fits on no alive node)."""
    p_cpu_nz = p_cpu if p_cpu > 0 else DEFAULT_MILLI_CPU_REQUEST
    p_mem_nz = p_mem if p_mem > 0 else DEFAULT_MEMORY_REQUEST_MIB
    best_effort = p_cpu == 0 and p_mem == 0
    share = num_gpu == 1 and gpu_milli < MILLI_PER_GPU
    best = -np.inf
    k = 0
    for i in range(eff.shape[0]):
        v = version[i]
        if seen[i] != v:
            cc, cm = cap_cpu[i], cap_mem[i]
            rc, rm = cpu_req[i], mem_req[i]
            ok = fits_node(i, cap_cpu, cpu_req, cap_mem, mem_req, model, gpu_free, p_cpu, p_mem, num_gpu,
                           gpu_milli, spec_mask, share, MILLI_PER_GPU)
            if ok:
                s_cpu = max(cc - (cpu_req_nz[i] + p_cpu_nz), 0) * 100 // max(cc, 1)
                s_mem = max(cm - (mem_req_nz[i] + p_mem_nz), 0) * 100 // max(cm, 1)
                if cc == 0:
                    fit = s_mem
                elif cm == 0:
                    fit = s_cpu
                else:
                    fit = (s_cpu + s_mem) // 2
                if best_effort:
                    eff[i] = float(fit)
                else:
                    if cc == 0 or cm == 0:
                        with_pod = without = 100
                    else:
                        std = abs(min((rc + p_cpu) / cc, 1.0) - min((rm + p_mem) / cm, 1.0)) / 2
                        with_pod = int((1 - std) * 100.0)
                        std = abs(min(rc / cc, 1.0) - min(rm / cm, 1.0)) / 2
                        without = int((1 - std) * 100.0)
                    eff[i] = float(fit + (50 + (50 + with_pod - without) // 2))
            else:
                eff[i] = -np.inf
            seen[i] = v
        if alive[i]:
            e = eff[i]
            if e > best:
                best = e
                out[0] = i
                k = 1
            elif e == best and k > 0:
                out[k] = i
                k += 1
    return k


top_kernel: Callable[..., int] | None
try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; the numpy form stands in
    top_kernel = None
else:
    top_kernel = numba.njit(cache=True)(_top)
