"""The suite's pytest-xdist groups (tests/conftest.py): the files that run real services stay in
one group, so a renamed or moved file cannot leave it unnoticed."""

from __future__ import annotations

from tests.conftest import SERVICE_FILES, xdist_group_of
from tests.paths import REPO


def test_every_service_entry_names_a_file_or_folder_that_exists():
    for entry in SERVICE_FILES:
        path = REPO / entry
        assert path.is_dir() if entry.endswith("/") else path.is_file(), entry


def test_service_files_share_one_group_and_every_other_file_is_its_own():
    assert xdist_group_of("tests/agent/k8s/test_real_kube_scheduler.py::test_x[a-b]") == "services"
    assert xdist_group_of("tests/experiment/test_fleet.py::test_y") == "services"
    plain = "tests/common/model/test_cluster.py"
    assert xdist_group_of(f"{plain}::T::test_z") == plain
    helper = "tests/experiment/test_fleet_helpers.py"  # a prefix of a service file's name is not one
    assert xdist_group_of(f"{helper}::test_w") == helper
