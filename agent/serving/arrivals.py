"""The pods a serving agent was asked to place, kept as the arrivals its simulations draw from.

The decision-time search (:mod:`fedsched.agent.serving.search`) draws its rollouts' arrivals from
them and the packing check (:mod:`fedsched.agent.serving.packing_check`) replays them on the
cluster's nodes: the cluster's own arrival stream, as the benchmarks draw from a workload's
training pods. The last ``max_pool`` pods are kept, each once however often kube-scheduler retried
it (keyed by a hash of its uid, so a long uid cannot grow memory); the table handed out is rebuilt
when an eighth of it is new, and there is none until ``min_pool`` pods have been asked for.

:meth:`ArrivalPool.record` may be called from any request thread.

May import: ``fedsched.common``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from fedsched.common.model.cluster import Pod, PodTable

MAX_POOL = 4096  # arrivals kept (the most recent)
MIN_POOL = 32  # arrivals seen before there is a pool


class ArrivalPool:
    """The last pods asked for; see the module doc."""

    def __init__(self, max_pool: int = MAX_POOL, min_pool: int = MIN_POOL) -> None:
        if not 1 <= min_pool <= max_pool:
            raise ValueError(f"the arrival pool's bounds must satisfy 1 <= min_pool <= max_pool, "
                             f"got {min_pool} and {max_pool}")
        self.max_pool, self.min_pool = max_pool, min_pool
        # hash(uid) -> pod, least recently asked first
        self._seen: OrderedDict[int, Pod] = OrderedDict()
        self._lock = threading.Lock()
        self._new = 0  # pods first asked for since the table was built
        self._pool: PodTable | None = None

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)

    def record(self, uid: str, pod: Pod) -> None:
        """``pod`` (uid ``uid``) was asked for: one more arrival."""
        key = hash(uid)
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                self._seen[key] = pod
                return
            self._seen[key] = pod
            self._new += 1
            if len(self._seen) > self.max_pool:
                self._seen.popitem(last=False)

    def pool(self) -> PodTable | None:
        """The arrivals (rebuilt when an eighth of them is new), None while fewer than ``min_pool``
        pods have been asked for."""
        with self._lock:
            if len(self._seen) < self.min_pool:
                return None
            if self._pool is None or self._new * 8 >= len(self._pool):
                self._pool = PodTable.from_pods(list(self._seen.values()))
                self._new = 0
            return self._pool
