"""The simulated members: five non-IID clusters of realistic size (40-500 nodes), two of them
data-scarce with at most a tenth of the others' decisions per round, and small smoke variants
that keep their profiles."""

from __future__ import annotations

import pytest

from fedsched.common.federation.members import MEMBERS, member_cluster, member_spec
from fedsched.common.federation.run_config import app_defaults


@pytest.mark.parametrize("pid", range(len(MEMBERS)))
def test_a_full_member_is_a_realistic_cluster_and_its_small_variant_the_same_profile(pid) -> None:
    full, small = member_cluster(pid), member_cluster(pid, size="small")
    assert 40 <= len(full.nodes) <= 500 and 6 <= len(small.nodes) <= 10
    assert full.name == small.name == f"{MEMBERS[pid].name}-{pid}"  # one state directory whatever the size
    assert full.spec is small.spec is MEMBERS[pid]
    assert (full.nodes.total_gpu_milli > 0) == (small.nodes.total_gpu_milli > 0)
    for m in (full, small):
        assert min(len(m.train), len(m.val), len(m.test)) > 0
    assert len(full.test) > 2 * len(small.test)


def test_the_defaults_give_the_scarce_members_at_most_a_tenth_of_the_decisions() -> None:
    table = app_defaults()
    assert table["member-size"] == "full"
    assert sum(s.scarce for s in MEMBERS) == 2 and sum(s.late for s in MEMBERS) == 1
    assert 10 * int(table["scarce-decisions"]) <= int(table["local-decisions"])


def test_partitions_past_the_table_cycle_through_it_on_other_clusters() -> None:
    assert member_spec(len(MEMBERS) + 1) is MEMBERS[1]
    a, b = member_cluster(1, size="small"), member_cluster(len(MEMBERS) + 1, size="small")
    assert (a.name, b.name) == ("web-1", f"web-{len(MEMBERS) + 1}")
    assert len(a.test) != len(b.test) or bool((a.test.cpu != b.test.cpu).any())  # another generator seed


def test_an_unknown_size_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="member size must be one of full, small"):
        member_cluster(0, size="huge")
