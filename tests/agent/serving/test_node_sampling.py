"""kube-scheduler's candidate sampling (``percentageOfNodesToScore``) and the policy.

Above 100 nodes kube-scheduler hands its extenders only a sample of the feasible nodes:
``percentageOfNodesToScore`` of all nodes (adaptive by default: ``50 - nodes/125`` %, at least
5 %, at least 100 nodes), the first ones found from a rotating start (the stand-in in
``tests/kube_scheduler_support.py`` does the same). The policy was trained on every feasible
node (``SchedulingEnv`` masks nothing else out), and two of its inputs depend on the candidate
set: the DeepSets pool of the node embeddings (mean and max over the candidates) and the
``feasible_share`` / ``frag_rate`` context. On the full openb GPU cluster (1213 nodes: the
adaptive default samples 497) the test holds each state fixed, asks the extender once with
every feasible node and once with kube-scheduler's adaptive sample, and counts how often the
pick changes: because the best node was not in the sample, or although it was (the pooled
inputs moved). The sample configuration therefore sets ``percentageOfNodesToScore: 100`` in
the fedsched profile (agent/deploy/kube-scheduler-config.yaml and the chart's values).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from fedsched.agent.cluster.cache import ClusterCache
from fedsched.agent.cluster.k8s_objects import pod_to_json
from fedsched.agent.serving.model_store import load_model, resolve_policy_path
from fedsched.common.learning.features import CONTEXT_FEATURES
from fedsched.common.model.cluster import Pod
from fedsched.common.model.traces import builtin_trace, load_nodes, load_pods, split_by_hash
from tests.extender_support import running
from tests.kube_scheduler_support import (
    KubeSchedulerStandIn,
    extender_weight,
    num_feasible_nodes_to_find,
    shipped_profile,
)

CHART_VALUES = Path(__file__).resolve().parents[3] / "charts" / "fedsched-agent" / "values.yaml"
FEASIBLE_SHARE = CONTEXT_FEATURES.index("feasible_share")


@pytest.mark.parametrize(("nodes", "percentage", "want"), [
    (50, 0, 50), (99, 0, 99), (100, 0, 100), (200, 0, 100), (1213, 0, 497), (5000, 0, 500),
    (20000, 0, 1000), (1213, 100, 1213), (1213, 10, 121), (300, 10, 100),
])
def test_num_feasible_nodes_to_find_is_kube_schedulers(nodes, percentage, want):
    assert num_feasible_nodes_to_find(percentage, nodes) == want


def test_the_shipped_configurations_score_every_feasible_node():
    """The policy needs every candidate (see the module docstring): 100, in both configurations."""
    assert shipped_profile()["percentageOfNodesToScore"] == 100
    assert yaml.safe_load(CHART_VALUES.read_text())["scheduler"]["percentageOfNodesToScore"] == 100


def test_sampled_candidates_change_the_policys_decisions():
    nodes = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), nodes, allow_oversized=True)
    _, trace = split_by_hash(pods, 0.3)
    model = load_model(resolve_policy_path("learned"))
    cache = ClusterCache.from_table(nodes)
    decisions: list = []
    counts = dict.fromkeys(("same", "tie", "best not sampled", "best sampled, pick moved"), 0)
    share_moved = 0
    with running(cache, policy="learned", seed=3, scheduler_name="fedsched") as (server, client):
        server.decider.on_decision.append(lambda _obj, d: decisions.append(d))
        kube = KubeSchedulerStandIn(client, nodes, model.scheduler.select_gpus, extender_weight(), seed=1)
        sampler = KubeSchedulerStandIn(client, nodes, model.scheduler.select_gpus, extender_weight(), seed=1,
                                       percentage=0)
        sampler.state = kube.state  # the same scheduler cache, sampled the adaptive way
        for i in range(300):
            pod = Pod.from_table(trace, i)
            uid = f"pod-{i}"
            sample = sampler.sample(pod)
            if len(sample):
                assert len(sample) == min(497, int(kube.state.feasible(pod).sum()))
                names = [nodes.names[j] for j in sample]
                n0 = len(decisions)
                sampler.prioritize(pod_to_json(pod, uid, nodes.models, uid=uid), names)
                (sampled,) = decisions[n0:]
            n0, n_feasible = len(decisions), int(kube.state.feasible(pod).sum())
            cycle = kube.schedule(pod, uid)  # every feasible node (percentageOfNodesToScore: 100)
            if cycle.node < 0:
                continue
            (full,) = decisions[n0:]
            assert len(cycle.sampled) == n_feasible
            score = dict(zip(full.ranking.nodes.tolist(), full.ranking.scores.tolist(), strict=True))
            best = full.ranking.scores.max()
            pick = sampled.ranking.node
            if pick == full.ranking.node:
                counts["same"] += 1
            elif score[pick] == best:
                counts["tie"] += 1
            elif not np.isin(full.ranking.node, sample):
                counts["best not sampled"] += 1
            else:
                counts["best sampled, pick moved"] += 1
            share_moved += sampled.features.context[FEASIBLE_SHARE] != full.features.context[FEASIBLE_SHARE]
    changed = counts["best not sampled"] + counts["best sampled, pick moved"]
    print(f"\nsampling (adaptive, 497 of 1213 nodes): {counts}; {changed} of {sum(counts.values())} picks "
          f"changed; feasible_share moved in {share_moved}")
    assert sum(counts.values()) == 300
    assert changed > 0  # the reason the shipped configurations set percentageOfNodesToScore: 100
