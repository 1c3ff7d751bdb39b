"""``bench/agent_quality.py``'s column arguments (a label, a checkpoint, a shipped name, a
decision-time search with or without arguments, whose ``=`` signs are not a label's, or a
``best-of[...]`` choice) and its constructed CPU-bound inventories."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from tests.paths import REPO

if str(REPO / "bench") not in sys.path:  # the benchmark imports its harness as the script would
    sys.path.insert(0, str(REPO / "bench"))
_spec = importlib.util.spec_from_file_location("bench_agent_quality", REPO / "bench" / "agent_quality.py")
assert _spec is not None and _spec.loader is not None
agent_quality = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(agent_quality)


@pytest.mark.parametrize("arg,expected", [
    ("runs/a/checkpoint.pt", ("checkpoint", "runs/a/checkpoint.pt")),
    ("mine=runs/a/checkpoint.pt", ("mine", "runs/a/checkpoint.pt")),
    ("learned", ("learned", "learned")),
    ("lookahead:fgd", ("lookahead:fgd", "lookahead:fgd")),
    ("lookahead[candidates=8,futures=2]:fgd",
     ("lookahead[candidates=8,futures=2]:fgd", "lookahead[candidates=8,futures=2]:fgd")),
    ("wide=lookahead[candidates=8]:fgd", ("wide", "lookahead[candidates=8]:fgd")),
    ("best-of[fgd,kube-default;seeds=3]",
     ("best-of[fgd,kube-default;seeds=3]", "best-of[fgd,kube-default;seeds=3]")),
    ("pick=best-of[fgd,kube-default]", ("pick", "best-of[fgd,kube-default]")),
])
def test_columns(arg, expected):
    assert agent_quality.parse_policy(arg) == expected


def test_a_cpu_bound_inventory_is_what_its_docstring_says_and_a_function_of_its_seed():
    nodes, pods = agent_quality.cpu_bound_inventory(1)
    again_nodes, again_pods = agent_quality.cpu_bound_inventory(1)
    np.testing.assert_array_equal(nodes.gpu, again_nodes.gpu)
    np.testing.assert_array_equal(pods.spec_mask, again_pods.spec_mask)
    assert not np.array_equal(nodes.gpu, agent_quality.cpu_bound_inventory(7)[0].gpu)
    full = agent_quality.load_nodes(agent_quality.builtin_trace(agent_quality.GPU_NODES))
    cut = nodes.gpu != full.gpu
    assert (nodes.gpu[cut] == 1).all() and 0.4 < (nodes.gpu == 1).mean() < 0.7
    assert (pods.num_gpu == 0).mean() == 0.5
    pinned = pods.spec_mask > 0
    assert pinned.mean() > 0.99 and (np.bitwise_count(pods.spec_mask[pinned]) == 1).all()
    model = np.log2(pods.spec_mask[pinned]).astype(int)
    for m in np.unique(model):  # a pinned pod fits an empty node of its model
        of_model = nodes.model == m
        assert (pods.cpu[pinned][model == m] <= nodes.cpu[of_model].max()).all()
        assert (pods.num_gpu[pinned][model == m] <= nodes.gpu[of_model].max()).all()
    spec = agent_quality.scenario_spec("cpubound/openb-1")
    assert len(spec.nodes) == len(nodes) and len(spec.pods) == len(pods)
    with pytest.raises(ValueError, match="cpubound/openb-CSEED"):
        agent_quality.scenario_spec("cpubound/openb-x")
