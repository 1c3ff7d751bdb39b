"""The decision-time search in a serving agent (``fedsched serve --search``).

The search is the one the packing benchmark runs (:class:`~fedsched.common.schedulers.lookahead.Lookahead`,
``lookahead[...]:<policy>``): the served model's best candidates are each tried in a shadow copy of
the cache's :class:`~fedsched.common.model.cluster.ClusterState`, followed by arrivals the model
places, and the best-valued one gets the top score. Serving makes two choices of its own:

- **The arrivals** are drawn from the pods this agent was asked to place
  (:class:`~fedsched.agent.serving.arrivals.ArrivalPool`: the pods of its scheduler profile, the
  last ``max_pool``, each pod once however often kube-scheduler retried it): the cluster's own
  arrival stream, as the benchmark draws them from the workload's training pods. Until
  ``min_pool`` pods have been asked for (a fresh agent) the model's own scorer answers.
- **The draws of a decision** come from a stream fixed by the decision's place in the agent's
  decision stream (:meth:`Lookahead.reseed`), so a ranking computed as soon as filter answers and
  one computed when prioritize asks are the same.

Everything here runs on the decider's policy worker, under the cache lock (:meth:`scheduler`), except
:meth:`record`, which any request thread may call.

May import: ``fedsched.common``, the serving model store and the arrival pool.
"""

from __future__ import annotations

from fedsched.agent.serving.arrivals import MAX_POOL, MIN_POOL, ArrivalPool
from fedsched.agent.serving.model_store import LoadedModel
from fedsched.common.model.cluster import Pod, PodTable
from fedsched.common.schedulers import Lookahead, LookaheadArgs, Scheduler, SchedulerContext

__all__ = ["MAX_POOL", "MIN_POOL", "ServingSearch"]


class ServingSearch:
    """The search over whichever model is served; see the module doc."""

    def __init__(self, args: LookaheadArgs, max_pool: int = MAX_POOL, min_pool: int = MIN_POOL,
                 arrivals: ArrivalPool | None = None) -> None:
        self.args = args
        self.arrivals = arrivals if arrivals is not None else ArrivalPool(max_pool, min_pool)
        self._search: tuple[LoadedModel, Lookahead] | None = None

    @property
    def spec(self) -> str:
        return self.args.spec()

    @property
    def max_pool(self) -> int:
        return self.arrivals.max_pool

    @property
    def min_pool(self) -> int:
        return self.arrivals.min_pool

    def record(self, uid: str, pod: Pod) -> None:
        """``pod`` (uid ``uid``) was asked for: one more arrival to draw from."""
        self.arrivals.record(uid, pod)

    def pool(self) -> PodTable | None:
        """The arrivals to draw from (:meth:`ArrivalPool.pool`)."""
        return self.arrivals.pool()

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
