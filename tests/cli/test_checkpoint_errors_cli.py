"""``fedsched serve`` and ``fedsched evaluate`` refuse a malformed checkpoint with ``fedsched X:
error: ...`` naming the file, exit 2, no traceback (issue 26, item 7)."""

from __future__ import annotations

import pytest

from fedsched.cli.main import main
from tests.checkpoint_support import write_corrupt
from tests.cli.test_evaluate_cli import write_cluster
from tests.cli.test_serve_cli import NODES, fedsched


@pytest.mark.parametrize(
    "corruption", ["wrong-shape", "missing-key", "policy-metadata-str", "negative-size", "nan"]
)
def test_serve_refuses_a_malformed_checkpoint_without_a_traceback(tmp_path, corruption):
    bad = write_corrupt(tmp_path / "bad.pt", corruption)
    r = fedsched("serve", "--policy", str(bad), "--cluster-csv", NODES, "--insecure", "--port", "0")
    assert r.returncode == 2, r.stderr
    assert "fedsched serve: error: " in r.stderr and str(bad) in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("corruption", ["wrong-shape", "typical-pods-list", "kind-list", "inf"])
def test_evaluate_refuses_a_malformed_checkpoint_without_a_traceback(tmp_path, capsys, corruption):
    nodes, pods = write_cluster(tmp_path)
    bad = write_corrupt(tmp_path / "bad.pt", corruption)
    rc = main(["evaluate", "--nodes", str(nodes), "--pods", str(pods), "--policy", str(bad), "--seeds", "1",
               "--jobs", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "fedsched evaluate: error: " in err and str(bad) in err, err
