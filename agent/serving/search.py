"""The decision-time search in a serving agent (``fedsched serve --search``).

The search is the one the packing benchmark runs (:class:`~fedsched.common.schedulers.lookahead.Lookahead`,
``lookahead[...]:<policy>``): the served model's best candidates are each tried in a shadow copy of
the cache's :class:`~fedsched.common.model.cluster.ClusterState`, followed by arrivals the model
places, and the best-valued one gets the top score. Serving makes two choices of its own:

- **The arrivals** are drawn from the pods this agent was asked to place (the pods of its scheduler
  profile, the last ``max_pool``, each pod once however often kube-scheduler retried it): the
  cluster's own arrival stream, as the benchmark draws them from the workload's training pods.
  The pool is rebuilt when an eighth of it is new. Until ``min_pool`` pods have been asked for
  (a fresh agent) there is nothing to draw from and the model's own scorer answers.
- **The draws of a decision** come from a stream fixed by the decision's place in the agent's
  decision stream (:meth:`Lookahead.reseed`), so a ranking computed as soon as filter answers and
  one computed when prioritize asks are the same.

Everything here runs on the decider's policy worker, under the cache lock (:meth:`scheduler`), except
:meth:`record`, which any request thread may call.

May import: ``fedsched.common`` and the serving model store.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from fedsched.agent.serving.model_store import LoadedModel
from fedsched.common.model.cluster import Pod, PodTable
from fedsched.common.schedulers import Lookahead, LookaheadArgs, Scheduler, SchedulerContext

MAX_POOL = 4096  # arrivals kept to draw from (the most recent)
MIN_POOL = 32  # arrivals seen before the search runs


class ServingSearch:
    """The search over whichever model is served; see the module doc."""

    def __init__(self, args: LookaheadArgs, max_pool: int = MAX_POOL, min_pool: int = MIN_POOL) -> None:
        if not 1 <= min_pool <= max_pool:
            raise ValueError(f"the search's pool bounds must satisfy 1 <= min_pool <= max_pool, "
                             f"got {min_pool} and {max_pool}")
        self.args = args
        self.max_pool, self.min_pool = max_pool, min_pool
        # hash(uid) -> pod, least recently asked first (a hash: a request's uid may be long)
        self._seen: OrderedDict[int, Pod] = OrderedDict()
        self._lock = threading.Lock()
        self._new = 0  # pods first asked for since the pool was built
        self._pool: PodTable | None = None
        self._search: tuple[LoadedModel, Lookahead] | None = None

    @property
    def spec(self) -> str:
        return self.args.spec()

    def record(self, uid: str, pod: Pod) -> None:
        """``pod`` (uid ``uid``) was asked for: one more arrival to draw from."""
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
        """The arrivals to draw from (rebuilt when an eighth of them is new), None while fewer than
        ``min_pool`` pods have been asked for."""
        with self._lock:
            if len(self._seen) < self.min_pool:
                return None
            if self._pool is None or self._new * 8 >= len(self._pool):
                self._pool = PodTable.from_pods(list(self._seen.values()))
                self._new = 0
            return self._pool

    def scheduler(self, model: LoadedModel, key: int) -> Scheduler:
        """What ranks the decision at place ``key`` of the decision stream: the search over ``model``
        (its draws fixed by ``key``), or ``model``'s own scorer while the pool is too small or the
        model cannot make a second scorer."""
        pool = self.pool()
        if pool is None or model.make_scheduler is None:
            return model.scheduler
        if self._search is None or self._search[0] is not model:
            make = model.make_scheduler
            self._search = (model, Lookahead(SchedulerContext(train_pods=pool), make, self.args))
        search = self._search[1]
        if search.pool is not pool:
            search.set_pool(pool)
        search.reseed(key)
        return search
