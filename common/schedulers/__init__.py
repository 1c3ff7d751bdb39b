"""Baseline schedulers behind the one scorer interface, and the registry of names.

``make_scheduler(name, ctx)`` builds a scheduler from a baseline name (learned policies
register themselves here too, and a checkpoint path resolves to its policy).

May import: ``fedsched.common.model``; ``fedsched.common.learning.scorers`` only lazily, inside
the resolver of learned policies (baselines never load torch), and ``fedsched.common.sim.portfolio``
only lazily, inside the resolver of ``best-of[...]`` (its choice simulates; the simulator imports
this package).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fedsched.common.schedulers.balanced_allocation import BalancedAllocation, BalancedAllocationArgs
from fedsched.common.schedulers.base import (
    Placement,
    Scheduler,
    SchedulerArgs,
    SchedulerContext,
    default_gpu_choice,
    place,
)
from fedsched.common.schedulers.best_fit import BestFit, BestFitArgs
from fedsched.common.schedulers.dot_product import DotProduct, DotProductArgs
from fedsched.common.schedulers.fgd import FGD, FGDArgs
from fedsched.common.schedulers.gpu_clustering import GpuClustering, GpuClusteringArgs
from fedsched.common.schedulers.gpu_packing import GpuPacking, GpuPackingArgs
from fedsched.common.schedulers.koordinator_load_aware import KoordinatorLoadAware, KoordinatorLoadAwareArgs
from fedsched.common.schedulers.kube_default import KubeDefault, KubeDefaultArgs
from fedsched.common.schedulers.least_allocated import LeastAllocated, LeastAllocatedArgs
from fedsched.common.schedulers.load_variation_risk_balancing import (
    LoadVariationRiskBalancing,
    LoadVariationRiskBalancingArgs,
)
from fedsched.common.schedulers.lookahead import PREFIX as LOOKAHEAD_PREFIX
from fedsched.common.schedulers.lookahead import Lookahead, LookaheadArgs, parse_name
from fedsched.common.schedulers.most_allocated import MostAllocated, MostAllocatedArgs
from fedsched.common.schedulers.prefer_hot import PreferHot
from fedsched.common.schedulers.random_score import RandomScore, RandomScoreArgs
from fedsched.common.schedulers.target_load_packing import TargetLoadPacking, TargetLoadPackingArgs

BASELINES: dict[str, type[Scheduler]] = {
    cls.name: cls
    for cls in (KubeDefault, LeastAllocated, MostAllocated, BalancedAllocation, BestFit,
                DotProduct, GpuPacking, GpuClustering, FGD, TargetLoadPacking,
                LoadVariationRiskBalancing, KoordinatorLoadAware, RandomScore)
}
# Reference points for benchmarks and metric tests, not heuristics anyone runs.
REFERENCES: dict[str, type[Scheduler]] = {PreferHot.name: PreferHot}



LEARNED = "learned"  # the name of the node-scoring policy shipped with fedsched
LEARNED_TD3 = "learned-td3"  # the shipped TD3 weight policy (trained in replay mode)
LEARNED_ONLINE = "learned-online"  # the shipped online node-scoring policy (agent/learning/online.py)
SHIPPED = {LEARNED: "default.pt", LEARNED_TD3: "td3-replay.pt", LEARNED_ONLINE: "online.pt"}


def default_policy_path(name: str = LEARNED) -> Path:
    """A shipped checkpoint (common/data/policies/default.pt for 'learned')."""
    from importlib import resources

    return Path(str(resources.files("fedsched.common").joinpath("data", "policies", SHIPPED[name])))


def _checkpoint(name: str, ctx: SchedulerContext) -> Scheduler | None:
    """A learned policy from its checkpoint file (torch is imported only here)."""
    if name in SHIPPED:
        path = default_policy_path(name)
        if not path.exists():
            raise ValueError(f"the shipped policy is missing ({path}); see common/data/policies/README.md")
        from fedsched.common.learning.scorers import scheduler_from_checkpoint

        sched = scheduler_from_checkpoint(path, ctx)
        sched.name = name
        return sched
    if not (name.endswith(".pt") or Path(name).is_file()):
        return None
    from fedsched.common.learning.scorers import scheduler_from_checkpoint

    return scheduler_from_checkpoint(name, ctx)


def _lookahead(name: str, ctx: SchedulerContext) -> Scheduler | None:
    """``lookahead:<base>`` or ``lookahead[key=value,...]:<base>``: the decision-time search over any
    scheduler this registry builds (``lookahead.parse_name``)."""
    parsed = parse_name(name)
    if parsed is None:
        return None
    args, base = parsed
    sched = Lookahead(ctx, lambda: make_scheduler(base, ctx), args)
    if args != LookaheadArgs():
        sched.name = name  # the arguments are part of what a result was measured with
    return sched


def split_names(text: str) -> list[str]:
    """A comma-separated list of scheduler names, as the benchmarks' ``--policies`` take it: the
    commas inside a name's brackets (``lookahead[candidates=8,horizon=20]:fgd``) do not split it;
    blanks around names and empty entries are dropped. Unbalanced brackets are a ``ValueError``."""
    names, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"{text!r}: ']' without its '['")
        if ch == "," and depth == 0:
            names.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError(f"{text!r}: '[' without its ']'")
    names.append("".join(cur).strip())
    return [n for n in names if n]


def _best_of(name: str, ctx: SchedulerContext) -> Scheduler | None:
    """``best-of[a,b,...]``: the member whose packing simulation of ``ctx.train_pods`` on the
    cluster allocates most (the simulator is imported only here)."""
    if not name.startswith("best-of["):
        return None
    from fedsched.common.sim import portfolio

    parsed = portfolio.parse_name(name)
    assert parsed is not None
    members, args = parsed
    sched = portfolio.BestOf(ctx, members, args)
    sched.name = name
    return sched


# Resolvers for names that are not baselines (e.g. checkpoint paths of learned policies).
# The search first: its names end in its base's name, which may be a checkpoint path ("*.pt").
RESOLVERS: list[Callable[[str, SchedulerContext], Scheduler | None]] = [_best_of, _lookahead, _checkpoint]


def make_scheduler(name: str, ctx: SchedulerContext | None = None,
                   args: SchedulerArgs | None = None) -> Scheduler:
    """A scheduler from a baseline name or anything a registered resolver accepts.

    ``args`` must be exactly ``BASELINES[name].Args`` (or None for the defaults); anything else,
    or arguments for a policy that is not a baseline, is a ``TypeError``.
    """
    ctx = ctx or SchedulerContext()
    if name in BASELINES or name in REFERENCES:
        return (BASELINES.get(name) or REFERENCES[name])(ctx, args=args)
    if args is not None:
        raise TypeError(f"only baselines take scheduler arguments; {name!r} is not one "
                        f"(got {type(args).__name__}); baselines: {', '.join(sorted(BASELINES))}")
    for resolve in RESOLVERS:
        sched = resolve(name, ctx)
        if sched is not None:
            return sched
    raise ValueError(f"unknown policy {name!r}; baselines: {', '.join(sorted(BASELINES))}, "
                     f"{', '.join(map(repr, SHIPPED))} (shipped policies), a checkpoint path (*.pt) or "
                     f"{LOOKAHEAD_PREFIX}<any of these> (the decision-time search) or "
                     f"best-of[<name>,<name>,...] (the one whose packing simulation allocates most)")


__all__ = [
    "BASELINES",
    "LEARNED",
    "LEARNED_ONLINE",
    "REFERENCES",
    "RESOLVERS",
    "BalancedAllocationArgs",
    "BestFitArgs",
    "DotProductArgs",
    "FGDArgs",
    "GpuClusteringArgs",
    "GpuPackingArgs",
    "KoordinatorLoadAware",
    "KoordinatorLoadAwareArgs",
    "KubeDefaultArgs",
    "LeastAllocatedArgs",
    "LoadVariationRiskBalancing",
    "LoadVariationRiskBalancingArgs",
    "Lookahead",
    "LookaheadArgs",
    "MostAllocatedArgs",
    "Placement",
    "RandomScoreArgs",
    "Scheduler",
    "SchedulerArgs",
    "SchedulerContext",
    "TargetLoadPackingArgs",
    "default_gpu_choice",
    "default_policy_path",
    "make_scheduler",
    "place",
    "split_names",
]
