"""``fedsched train`` end to end on a small synthetic GPU cluster: outputs, resume, evaluation."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from fedsched.common.cli.main import main
from fedsched.common.learning.checkpoint import load_checkpoint
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.model.metrics import METRICS
from fedsched.common.model.synthetic import generate_cluster, write_csvs
from fedsched.common.schedulers import make_scheduler

PROGRESS_COLUMNS = ("update", "global_step", "approx_kl", "clipfrac", "explained_variance", "steps_per_s",
                    "entropy", "value_loss", "policy_loss", "learning_rate")


def train_args(nodes: Path, pods: Path, out: Path, steps: int = 512, *extra: str) -> list[str]:
    return ["train", "--nodes", str(nodes), "--pods", str(pods), "--steps", str(steps), "--num-envs", "2",
            "--num-steps", "64", "--slice-nodes", "0", "--eval-nodes", "0", "--eval-every", "4",
            "--checkpoint-every", "2", "--out", str(out), *extra]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """20 GPU nodes / 160 pods: the held-out evaluation metric is finite on this cluster."""
    d = tmp_path_factory.mktemp("data")
    nodes, pods = generate_cluster("gpu", 1, n_nodes=20, n_pods=160)
    nodes_csv, pods_csv = write_csvs(nodes, pods, d, "gpu")
    _, other_pods_csv = write_csvs(nodes, pods.select(list(range(150))), d, "other")
    return nodes_csv, pods_csv, other_pods_csv


@pytest.fixture(scope="module")
def first_run(data, tmp_path_factory):
    nodes_csv, pods_csv, _ = data
    out = tmp_path_factory.mktemp("run") / "out"
    rc = main(train_args(nodes_csv, pods_csv, out))
    assert rc == 0
    return out


def test_train_writes_checkpoint_logs_and_summary(first_run):
    out = first_run
    for name in ("checkpoint.pt", "progress.csv", "summary.json", "run.json"):
        assert (out / name).is_file(), name
    assert (out / "tb").is_dir()
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "tb").iterdir())

    rows = read_csv(out / "progress.csv")
    assert [int(r["update"]) for r in rows] == [1, 2, 3, 4]  # 512 steps / (2 envs x 64)
    assert [int(r["global_step"]) for r in rows] == [128, 256, 384, 512]
    for col in PROGRESS_COLUMNS:
        assert col in rows[0], col
        assert all(r[col] != "" for r in rows), col
    assert all(float(r["steps_per_s"]) > 0 for r in rows)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 4 and summary["global_step"] == 512
    assert Path(summary["checkpoint"]) == out / "checkpoint.pt"


def test_train_evaluates_every_eval_every_updates(first_run):
    out = first_run
    summary = json.loads((out / "summary.json").read_text())
    metric = summary["metric"]
    assert metric == "alloc_gpu"
    rows = read_csv(out / "progress.csv")
    evaluated = [int(r["update"]) for r in rows if r[f"eval_{metric}"] != ""]
    assert evaluated == [4]
    value = float(rows[3][f"eval_{metric}"])
    assert math.isfinite(value)
    for ref in ("best-fit", "fgd", "kube-default"):
        assert float(rows[3][f"ref_{ref}"]) == pytest.approx(summary["reference"][ref])
    assert summary["best_eval"] == {"value": value, "update": 4}
    assert (out / "best.pt").is_file() and summary["best_checkpoint"] == str(out / "best.pt")


def test_train_logs_finished_episodes(first_run):
    rows = read_csv(first_run / "episodes.csv")
    assert rows, "256 decisions per env should finish several packing episodes"
    assert {"global_step", "env", "episode_return", "alloc_gpu", "failed_pods"} <= set(rows[0])
    assert {r["env"] for r in rows} <= {"0", "1"}
    steps = [int(r["global_step"]) for r in rows]
    assert steps == sorted(steps) and steps[-1] <= 512


def test_train_checkpoint_metadata(first_run, data):
    _, meta, opt = load_checkpoint(first_run / "checkpoint.pt")
    assert meta["algorithm"] == "ppo"
    assert meta["update"] == 4 and meta["global_step"] == 512
    hp = meta["hyperparameters"]
    assert hp["num_steps"] == 64 and hp["num_envs"] == 2 and hp["slice_nodes"] == 0
    assert hp["total_steps"] == 512
    assert meta["typical_pods"] is not None and meta["data_hash"]
    assert opt is not None and opt["update"] == 4 and "optimizer" in opt
    assert isinstance(make_scheduler(str(first_run / "checkpoint.pt")), PolicyScheduler)


def test_resume_continues_the_run(first_run, data, tmp_path):
    nodes_csv, pods_csv, _ = data
    out = tmp_path / "out"
    shutil.copytree(first_run, out)
    before = read_csv(out / "progress.csv")
    episodes_before = read_csv(out / "episodes.csv")
    rc = main(train_args(nodes_csv, pods_csv, out, 1024, "--resume"))
    assert rc == 0
    rows = read_csv(out / "progress.csv")
    assert rows[: len(before)] == before  # appended, not rewritten
    assert [int(r["update"]) for r in rows] == list(range(1, 9))
    assert int(rows[-1]["global_step"]) == 1024
    assert list(rows[0]) == list(before[0])  # same header
    assert len(read_csv(out / "episodes.csv")) > len(episodes_before)
    _, meta, opt = load_checkpoint(out / "checkpoint.pt")
    assert meta["update"] == 8 and opt["update"] == 8
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 8 and summary["global_step"] == 1024


def test_resume_keeps_the_best_evaluation(first_run, data, tmp_path):
    nodes_csv, pods_csv, _ = data
    out = tmp_path / "out"
    shutil.copytree(first_run, out)
    first_best = json.loads((first_run / "summary.json").read_text())["best_eval"]
    assert main(train_args(nodes_csv, pods_csv, out, 1024, "--resume")) == 0
    summary = json.loads((out / "summary.json").read_text())
    metric = summary["metric"]
    evals = [(int(r["update"]), float(r[f"eval_{metric}"])) for r in read_csv(out / "progress.csv")
             if r[f"eval_{metric}"] != ""]
    best_value = max(v for _, v in evals)
    first_at_best = next(u for u, v in evals if v == best_value)  # a later tie is not "better"
    assert best_value >= first_best["value"]
    assert summary["best_eval"] == {"value": best_value, "update": first_at_best}


def test_resume_with_other_pods_is_refused(first_run, data, tmp_path, capsys):
    nodes_csv, _, other_pods_csv = data
    out = tmp_path / "out"
    shutil.copytree(first_run, out)
    before = (out / "progress.csv").read_text()
    ckpt_before = (out / "checkpoint.pt").read_bytes()
    rc = main(train_args(nodes_csv, other_pods_csv, out, 1024, "--resume"))
    assert rc == 2
    err = capsys.readouterr().err
    assert "fedsched train: error:" in err and "--resume" in err and "other data" in err
    assert (out / "progress.csv").read_text() == before
    assert (out / "checkpoint.pt").read_bytes() == ckpt_before


def test_resume_without_checkpoint_is_refused(data, tmp_path, capsys):
    nodes_csv, pods_csv, _ = data
    rc = main(train_args(nodes_csv, pods_csv, tmp_path / "empty", 512, "--resume"))
    assert rc == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_evaluate_a_trained_checkpoint(first_run, data, tmp_path, capsys):
    nodes_csv, pods_csv, _ = data
    ckpt = str(first_run / "checkpoint.pt")
    out = tmp_path / "eval.json"
    rc = main(["evaluate", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--policy", ckpt,
               "--policy", "best-fit", "--seeds", "2", "--jobs", "1", "--json", str(out)])
    assert rc == 0
    assert ckpt in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert set(result["policies"]) == {ckpt, "best-fit"}
    assert set(result["policies"][ckpt]) == set(METRICS)
    assert len(result["runs"][ckpt]) == 2
    assert 0 < result["policies"][ckpt]["alloc_gpu"]["mean"] <= 100


def test_small_cluster_evaluation_selects_a_best_checkpoint(tmp_path):
    nodes, pods = generate_cluster("gpu", 2, n_nodes=10, n_pods=80)
    nodes_csv, pods_csv = write_csvs(nodes, pods, tmp_path, "small")
    out = tmp_path / "out"
    assert main(train_args(nodes_csv, pods_csv, out, 256, "--eval-every", "1")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert math.isfinite(summary["best_eval"]["value"])
    assert (out / "best.pt").is_file()
