"""The on-disk decision log (``fedsched.common.learning.decision_log``) and continuous training
(``fedsched train --log``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedsched.agent.learning.bc import collect, record
from fedsched.agent.learning.env import SchedulingEnv
from fedsched.cli.main import main
from fedsched.common.learning.checkpoint import load_checkpoint
from fedsched.common.learning.decision_log import DecisionLog, DecisionLogError
from fedsched.common.learning.features import CONTEXT_FEATURES, NODE_FEATURES, POD_FEATURES
from fedsched.common.learning.kinds import WEIGHTS, kind_of
from fedsched.common.learning.records import Decision
from fedsched.common.model.synthetic import generate_cluster, write_csvs
from fedsched.common.schedulers import make_scheduler


def make_decision(rng: np.random.Generator, best: list[int] | None = None) -> Decision:
    k = int(rng.integers(1, 9))
    nodes = rng.normal(size=(k, len(NODE_FEATURES))).astype(np.float16)
    if best is None:
        best = sorted(rng.choice(k, size=int(rng.integers(1, k + 1)), replace=False).tolist())
    return Decision(nodes, rng.normal(size=len(POD_FEATURES)).astype(np.float32),
                    rng.normal(size=len(CONTEXT_FEATURES)).astype(np.float32), np.array(best, np.int64),
                    has_gpus=bool(rng.integers(2)))


def fill(log: DecisionLog, n: int, seed: int = 0) -> list[tuple[Decision, int, str, dict[str, float]]]:
    """Append n decisions (every third without a best set); returns what was appended."""
    rng = np.random.default_rng(seed)
    added = []
    for i in range(n):
        d = make_decision(rng, best=[] if i % 3 == 2 else None)
        chosen = int(d.best[0]) if len(d.best) else int(rng.integers(len(d.nodes)))
        version = f"v{i % 4}"
        reward = {"alloc": float(i), "oom": 0.5} if i % 2 else ({"alloc": -1.0} if i % 5 else {})
        log.append(d, chosen, version, reward)
        added.append((d, chosen, version, reward))
    return added


def assert_same(got, added) -> None:
    assert len(got) == len(added)
    for r, (d, chosen, version, reward) in zip(got, added, strict=True):
        assert np.array_equal(r.decision.nodes, d.nodes) and r.decision.nodes.dtype == np.float16
        assert np.array_equal(r.decision.pod, d.pod) and np.array_equal(r.decision.context, d.context)
        want_best = d.best if len(d.best) else np.array([chosen])
        assert np.array_equal(r.decision.best, want_best)
        assert r.best_recorded == bool(len(d.best))
        assert r.decision.has_gpus == d.has_gpus
        assert r.chosen == chosen and r.model_version == version and r.reward == reward


def chunk_names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_round_trip(tmp_path):
    log = DecisionLog(tmp_path / "log")
    added = fill(log, 25)
    assert len(log) == 25
    assert_same(log.tail_records(25), added)  # buffered decisions are visible before the flush
    log.flush()
    again = DecisionLog(tmp_path / "log")
    assert len(again) == 25
    assert_same(again.tail_records(25), added)
    decisions = again.tail(25)
    assert all(isinstance(d, Decision) for d in decisions)
    assert np.array_equal(decisions[2].best, [added[2][1]])  # no best set recorded: [chosen]
    assert np.array_equal(decisions[0].best, added[0][0].best)  # the teacher's best set


def test_append_rejects_bad_decisions(tmp_path):
    log = DecisionLog(tmp_path)
    d = make_decision(np.random.default_rng(1), best=[0])
    with pytest.raises(ValueError, match="chosen node"):
        log.append(d, len(d.nodes))
    with pytest.raises(ValueError, match="best set"):
        log.append(Decision(d.nodes, d.pod, d.context, np.array([len(d.nodes)])), 0)
    with pytest.raises(ValueError, match="nodes"):
        log.append(Decision(d.nodes[:, :3], d.pod, d.context, np.array([0])), 0)
    assert len(log) == 0


def test_chunk_rollover(tmp_path):
    log = DecisionLog(tmp_path, chunk_size=4)
    added = fill(log, 10)
    assert chunk_names(tmp_path) == ["chunk-000001.npz", "chunk-000002.npz"]  # full chunks are written
    log.flush()
    assert chunk_names(tmp_path) == ["chunk-000001.npz", "chunk-000002.npz", "chunk-000003.npz"]
    with np.load(tmp_path / "chunk-000003.npz", allow_pickle=False) as z:
        assert len(z["chosen"]) == 2 and z["nodes"].dtype == np.float16
        assert z["node_offsets"][-1] == len(z["nodes"])
    # A new writer keeps filling the partial chunk, then rolls over.
    log2 = DecisionLog(tmp_path, chunk_size=4)
    more = fill(log2, 3, seed=1)
    log2.flush()
    assert chunk_names(tmp_path)[-1] == "chunk-000004.npz"
    with np.load(tmp_path / "chunk-000003.npz", allow_pickle=False) as z:
        assert len(z["chosen"]) == 4
    assert len(DecisionLog(tmp_path)) == 13
    assert_same(DecisionLog(tmp_path).tail_records(13), added + more)


def test_prune_keeps_the_newest(tmp_path):
    log = DecisionLog(tmp_path, chunk_size=4)
    added = fill(log, 10)
    assert log.prune(5) == 5
    assert len(log) == 5 and len(DecisionLog(tmp_path)) == 5
    assert "chunk-000001.npz" not in chunk_names(tmp_path)
    assert_same(DecisionLog(tmp_path).tail_records(100), added[5:])
    assert log.prune(100) == 0  # nothing to drop
    more = fill(log, 2, seed=3)  # appending after a prune continues the newest chunk
    log.flush()
    assert_same(DecisionLog(tmp_path).tail_records(100), added[5:] + more)
    assert log.prune(0) == 7 and len(log) == 0 and chunk_names(tmp_path) == []


def test_tail_bounds(tmp_path):
    assert len(DecisionLog(tmp_path / "missing")) == 0
    assert DecisionLog(tmp_path / "missing").tail(10) == []
    assert not (tmp_path / "missing").exists()  # reading never creates the log
    log = DecisionLog(tmp_path / "log", chunk_size=3)
    added = fill(log, 7)
    log.flush()
    assert_same(log.tail_records(1000), added)
    assert_same(log.tail_records(4), added[3:])
    assert log.tail(0) == []
    with pytest.raises(ValueError):
        log.tail(-1)


def test_leftover_tmp_is_ignored_and_truncated_chunk_is_reported(tmp_path):
    log = DecisionLog(tmp_path, chunk_size=4)
    added = fill(log, 6)
    log.flush()
    (tmp_path / "chunk-000003.npz.tmp").write_bytes(b"half a chunk")  # a crash mid-write
    assert len(DecisionLog(tmp_path)) == 6
    assert_same(DecisionLog(tmp_path).tail_records(6), added)

    chunk = tmp_path / "chunk-000001.npz"
    data = chunk.read_bytes()
    chunk.write_bytes(data[: len(data) // 2])
    assert_same(DecisionLog(tmp_path).tail_records(2), added[4:])  # the intact newest chunk still reads
    with pytest.raises(DecisionLogError, match=r"chunk-000001\.npz.*(corrupt|truncated)"):
        DecisionLog(tmp_path).tail(6)
    with pytest.raises(DecisionLogError, match=r"chunk-000001\.npz"):
        len(DecisionLog(tmp_path))


def test_a_file_is_not_a_log(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(DecisionLogError, match="not a directory"):
        DecisionLog(tmp_path / "f")


def _envs(nodes, pods) -> list[SchedulingEnv]:
    envs = [SchedulingEnv(nodes, pods, seed=10 + i) for i in range(2)]
    for i, env in enumerate(envs):
        env.np_random = np.random.default_rng(i)  # tie-breaking draws
    return envs


def test_record_logs_a_baseline_teacher(tmp_path):
    nodes, pods = generate_cluster("gpu", 3, n_nodes=20, n_pods=150)
    log = DecisionLog(tmp_path, chunk_size=64)
    teacher = make_scheduler("kube-default")
    decisions = record(_envs(nodes, pods), teacher, 200, log)
    assert len(decisions) == 200 and len(DecisionLog(tmp_path)) == 200
    assert len(chunk_names(tmp_path)) == 4  # 64 + 64 + 64 + 8, flushed
    recs = DecisionLog(tmp_path).tail_records(200)
    for d, r in zip(decisions, recs, strict=True):
        assert np.array_equal(r.decision.nodes, d.nodes) and np.array_equal(r.decision.best, d.best)
        assert r.chosen in d.best and r.best_recorded
        assert r.model_version == teacher.name
        assert np.isfinite(r.reward["reward"])
    assert any(len(d.best) > 1 for d in decisions)  # kube-default ties: the whole set is kept
    # The same decisions behaviour cloning's collect() logs from the same states.
    expected = collect(_envs(nodes, pods), make_scheduler("kube-default"), 200)
    for a, b in zip(expected, decisions, strict=True):
        assert np.array_equal(a.nodes, b.nodes) and np.array_equal(a.best, b.best)


# ---- fedsched train --record-log / --log ---------------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    nodes, pods = generate_cluster("gpu", 1, n_nodes=20, n_pods=150)
    return write_csvs(nodes, pods, d, "gpu")


def common_args(data) -> list[str]:
    nodes_csv, pods_csv = data
    return ["--nodes", str(nodes_csv), "--pods", str(pods_csv), "--slice-nodes", "0", "--eval-nodes", "0",
            "--num-envs", "1", "--bc-epochs", "2"]


@pytest.fixture(scope="module")
def bc_run(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("bc")
    logdir, d1 = root / "log", root / "d1"
    rc = main(["train", "--algo", "bc", "--teacher", "kube-default", *common_args(data),
               "--bc-samples", "300", "--record-log", str(logdir), "--out", str(d1)])
    assert rc == 0
    return logdir, d1


def test_bc_records_its_teacher_decisions(bc_run):
    logdir, d1 = bc_run
    recs = DecisionLog(logdir).tail_records(1000)
    assert len(recs) == 300
    assert {r.model_version for r in recs} == {"kube-default"}
    assert all(r.best_recorded and r.chosen in r.decision.best for r in recs)
    assert json.loads((d1 / "summary.json").read_text())["decision_log"] == str(logdir)


def test_finetune_from_the_log(bc_run, data, tmp_path, capsys):
    logdir, d1 = bc_run
    d2 = tmp_path / "d2"
    capsys.readouterr()
    rc = main(["train", "--init", str(d1 / "checkpoint.pt"), "--log", str(logdir), "--window", "500",
               *common_args(data), "--out", str(d2)])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["algorithm"] == "finetune" and summary["decisions"] == 300  # the log is shorter
    assert np.isfinite(summary["eval_before"]) and np.isfinite(summary["eval_after"])
    assert summary["learning_rate"] == 1e-4
    _, meta, _ = load_checkpoint(d2 / "checkpoint.pt")
    _, init_meta, _ = load_checkpoint(d1 / "checkpoint.pt")
    assert meta["algorithm"] == "finetune"
    assert meta["init_checkpoint"] == str(d1 / "checkpoint.pt") and meta["init_algorithm"] == "bc"
    assert meta["window"] == 500 and meta["decision_log"] == str(logdir) and meta["log_decisions"] == 300
    assert meta["data_hash"] == init_meta["data_hash"]  # the same pods file
    assert meta["hyperparameters"]["learning_rate"] == 1e-4
    assert meta["eval_before"] == summary["eval_before"] and meta["eval_after"] == summary["eval_after"]
    _, best_meta, _ = load_checkpoint(d2 / "best.pt")
    assert best_meta["algorithm"] == "finetune"
    assert best_meta["best_eval"]["value"] == max(summary["eval_before"], summary["eval_after"])
    assert (d2 / "finetune.csv").is_file() and (d2 / "summary.json").is_file()


def test_finetune_a_weight_policy_with_an_explicit_lr(data, tmp_path):
    logdir, d1, d2 = tmp_path / "log", tmp_path / "d1", tmp_path / "d2"
    assert main(["train", "--algo", "bc", "--policy-kind", "weights", "--teacher", "best-fit",
                 *common_args(data), "--bc-samples", "200", "--eval-every", "0",
                 "--record-log", str(logdir), "--out", str(d1)]) == 0
    assert main(["train", "--init", str(d1 / "checkpoint.pt"), "--log", str(logdir), "--lr", "3e-3",
                 "--window", "150", "--eval-every", "0", *common_args(data), "--out", str(d2)]) == 0
    policy, meta, _ = load_checkpoint(d2 / "checkpoint.pt")
    assert kind_of(policy) == WEIGHTS and meta["algorithm"] == "finetune"
    assert meta["hyperparameters"]["learning_rate"] == 3e-3 and meta["log_decisions"] == 150


@pytest.mark.parametrize(("extra", "message"), [
    (["--log", "LOG"], "--init"),
    (["--window", "10", "--init", "CKPT"], "--window needs --log"),
    (["--init", "CKPT", "--log", "MISSING"], "no decision log"),
    (["--init", "CKPT", "--log", "EMPTY"], "empty"),
    (["--algo", "ppo", "--init", "CKPT", "--log", "LOG"], "does not combine"),
    (["--algo", "ppo", "--record-log", "LOG2"], "--record-log"),
])
def test_finetune_errors_exit_2(bc_run, data, tmp_path, capsys, extra, message):
    logdir, d1 = bc_run
    (tmp_path / "empty").mkdir()
    subst = {"LOG": str(logdir), "CKPT": str(d1 / "checkpoint.pt"), "MISSING": str(tmp_path / "nope"),
             "EMPTY": str(tmp_path / "empty"), "LOG2": str(tmp_path / "log2")}
    out = tmp_path / "out"
    rc = main(["train", *[subst.get(a, a) for a in extra], *common_args(data), "--out", str(out)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "fedsched train: error:" in err and message in err
    assert not (out / "checkpoint.pt").exists()
