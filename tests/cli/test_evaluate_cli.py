"""``fedsched evaluate`` end to end on small CSV files, and its error handling."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedsched.cli.main import main
from fedsched.common.model.metrics import METRICS, mean_ci95
from fedsched.common.model.traces import hash_fraction, split_by_hash
from tests.builders import make_pods


def write_cluster(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model,extra\n"
                     + "".join(f"n{i},32000,131072,{4 if i % 2 else 0},{'T4' if i % 2 else ''},x\n"
                               for i in range(8)))
    rng = np.random.default_rng(0)
    lines = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,creation_time,deletion_time"]
    for i in range(120):
        g = int(rng.choice([0, 1, 1, 2]))
        milli = 0 if g == 0 else (int(rng.choice([300, 500, 1000])) if g == 1 else 1000)
        cpu, mem = int(rng.choice([1000, 4000])), int(rng.choice([1024, 8192]))
        lines.append(f"p{i},{cpu},{mem},{g},{milli},,LS,,")
    pods = tmp_path / "pods.csv"
    pods.write_text("\n".join(lines) + "\n")
    return nodes, pods


def test_evaluate_prints_table_and_writes_json_and_plot(tmp_path, capsys):
    nodes, pods = write_cluster(tmp_path)
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["evaluate", "--nodes", str(nodes), "--pods", str(pods), "--mode", "packing",
               "--policy", "kube-default", "--policy", "fgd", "--seeds", "3", "--jobs", "1",
               "--json", str(out), "--plot", str(png)])
    assert rc == 0
    table = capsys.readouterr().out
    assert "kube-default" in table and "fgd" in table and "alloc_gpu" in table
    data = json.loads(out.read_text())
    assert set(data["policies"]) == {"kube-default", "fgd"}
    for pol in data["policies"].values():
        assert set(pol) == set(METRICS)
        assert set(pol["alloc_gpu"]) == {"mean", "ci95"}
        assert 0 < pol["alloc_gpu"]["mean"] <= 100
    assert len(data["runs"]["fgd"]) == 3
    assert png.stat().st_size > 1000


def test_bad_input_is_a_clear_error_not_a_traceback(tmp_path, capsys):
    nodes, pods = write_cluster(tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,abc,1,0,0\n")
    assert main(["evaluate", "--nodes", str(nodes), "--pods", str(bad), "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert "bad.csv, line 2, column 'cpu_milli'" in err and "not a number" in err
    assert main(["evaluate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    assert main(["evaluate", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "0"]) == 2


@pytest.mark.parametrize(("args", "message"), [
    (["--seeds", "0"], "--seeds must be in [1, 10,000], got 0"),
    (["--seeds", "1000000000"], "--seeds must be in [1, 10,000]"),  # once: a billion-seed list first
    (["--first-seed", "-5"], "--first-seed must be at least 0, got -5"),
    (["--target-load", "nan"], "--target-load must be in (0, 10], got nan"),  # once: drew pods forever
    (["--target-load", "1e9"], "--target-load must be in (0, 10], got 1000000000.0"),
    (["--target-load", "-1"], "--target-load must be in (0, 10]"),
    (["--jobs", "0"], "--jobs must be at least 1, got 0"),
])
def test_a_bad_number_is_one_clear_line_and_nothing_runs(tmp_path, capsys, args, message):
    """Hostile numbers on the command line: each is refused before any file is read or any run
    starts, with one line naming the flag (a NaN target load used to draw pods forever, a
    billion seeds to build a billion-seed list first, a negative first seed to end in numpy's
    message without the flag's name)."""
    nodes, pods = write_cluster(tmp_path)
    assert main(["evaluate", "--nodes", str(nodes), "--pods", str(pods), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("which", ["--nodes", "--pods", "--train-pods"])
def test_a_huge_field_or_a_directory_is_one_line_naming_the_file_not_a_traceback(tmp_path, capsys, which):
    """Issue 26, item 7: a CSV with a 2 MB field (past the csv module's field limit) and a
    directory given as a CSV end with one line naming the file (and the line), exit status 2."""
    nodes, pods = write_cluster(tmp_path)
    files = {"--nodes": nodes, "--pods": pods, "--train-pods": pods}
    huge = tmp_path / "huge.csv"
    huge.write_text(files[which].read_text().replace("\n", "\n" + "x" * 2_000_000 + ",1,1,0,0\n", 1))
    for bad, message in [(huge, "huge.csv, line 2: a field longer than"),
                         (tmp_path, f"{tmp_path}: is a directory, not a CSV file")]:
        args = {**files, which: bad}
        assert main(["evaluate", *(x for k, v in args.items() for x in (k, str(v))), "--seeds", "1"]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err[:2000]


def test_hash_split_is_stable_and_disjoint():
    pods = make_pods([1000] * 200, [1] * 200, [0] * 200, [0] * 200)
    train, test = split_by_hash(pods, 0.3)
    assert set(train.names).isdisjoint(test.names) and len(train) + len(test) == 200
    assert 0.15 < len(test) / 200 < 0.45
    assert hash_fraction("openb-pod-0000") == hash_fraction("openb-pod-0000")
    train2, _ = split_by_hash(pods, 0.3)
    assert train2.names == train.names


def test_mean_ci95_uses_student_t():
    mean, half = mean_ci95([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert abs(half - 4.302652729911275 * 1.0 / np.sqrt(3)) < 1e-9
    assert mean_ci95([5.0]) == (5.0, 0.0)
