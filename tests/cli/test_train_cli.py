"""``fedsched train`` end to end on a small synthetic GPU cluster: outputs, resume, evaluation,
TensorBoard tags; its flags, derived from the hyper-parameter dataclasses."""

from __future__ import annotations

import csv
import json
import math
import shutil
from dataclasses import fields, replace
from pathlib import Path

import pytest

from fedsched.agent.learning.bc import BCConfig
from fedsched.agent.learning.env import EnvConfig, RewardConfig
from fedsched.agent.learning.ppo import PPOConfig
from fedsched.agent.learning.td3 import TD3Config
from fedsched.agent.learning.training import FINETUNE_LEARNING_RATE, TrainSpec
from fedsched.cli.main import main
from fedsched.cli.train import SPEC_EXCLUDE, build_spec
from fedsched.common.dataclass_flags import field_help, flag_name, to_argv
from fedsched.common.learning.checkpoint import load_checkpoint
from fedsched.common.learning.scorers import PolicyScheduler
from fedsched.common.model.metrics import METRICS
from fedsched.common.model.synthetic import generate_cluster, write_csvs
from fedsched.common.schedulers import make_scheduler
from fedsched.common.sim.replay import ReplayConfig

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


# ---- tensorboard tags -----------------------------------------------------------------------

def tb_scalar_tags(run: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    return set(acc.Tags()["scalars"])


def test_tensorboard_tags_follow_cleanrl(first_run):
    tags = tb_scalar_tags(first_run)
    assert {"losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/old_approx_kl",
            "losses/approx_kl", "losses/clipfrac", "losses/explained_variance", "charts/learning_rate",
            "charts/SPS", "charts/episodic_return", "charts/episodic_alloc_gpu", "eval/alloc_gpu",
            "eval/ref_fgd"} <= tags, tags
    assert not any(t.startswith(("train/", "episode/")) for t in tags)


# ---- flags from the dataclasses -------------------------------------------------------------

CONFIGS = (("ppo", PPOConfig), ("td3", TD3Config), ("bc", BCConfig), ("reward", RewardConfig))


def parse_train(*argv: str):
    from fedsched.cli.main import build_parser

    return build_parser(only="train").parse_args(["train", "--out", "o", *argv])


def changed(obj):
    """``obj`` with every field moved off its default."""
    values = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        values[f.name] = (not v if isinstance(v, bool) else v + 1 if isinstance(v, int)
                          else v * 2 + 0.5 if isinstance(v, float) else v)
        if f.name in ("gamma", "gae_lambda", "tau"):  # a fraction stays one (checked by the CLI)
            values[f.name] = v / 2
    return replace(obj, **values)


@pytest.mark.parametrize("cls", [PPOConfig, TD3Config, BCConfig, RewardConfig, EnvConfig, TrainSpec])
def test_hyper_parameter_dataclasses_document_every_field_with_a_docstring(cls):
    import ast
    import inspect
    import itertools
    import textwrap

    node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    body = node.body
    documented = {stmt.target.id for stmt, after in itertools.pairwise(body)
                  if isinstance(stmt, ast.AnnAssign) and isinstance(after, ast.Expr)
                  and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)}
    assert {f.name for f in fields(cls)} <= documented


def test_help_lists_every_ppo_td3_bc_and_reward_field_with_its_doc(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    text = "".join(capsys.readouterr().out.split())  # argparse wraps lines (also at dashes)
    for prefix, cls in (*CONFIGS, ("replay", ReplayConfig), ("", TrainSpec)):
        docs = field_help(cls)
        for f in fields(cls):
            if cls is TrainSpec and f.name in SPEC_EXCLUDE:
                continue
            assert flag_name(f.name, prefix) in text, (cls.__name__, f.name)
            assert "".join(docs[f.name].split()) in text, (cls.__name__, f.name)
    for old in ("--seed", "--steps", "--lr", "--hidden", "--num-envs", "--num-steps", "--ent-coef",
                "--critic-warmup", "--slice-nodes", "--bc-samples", "--bc-epochs", "--replay-load",
                "--time-compression", "--start-quantile", "--time-budget", "--target-load",
                "--test-fraction"):
        assert old in text, old


def test_no_flags_give_the_dataclass_defaults():
    spec = build_spec(parse_train())
    assert (spec.ppo, spec.td3, spec.bc, spec.reward, spec.replay) == \
        (PPOConfig(), TD3Config(), BCConfig(), RewardConfig(), {})
    for f in fields(TrainSpec):
        if f.name not in (*SPEC_EXCLUDE, "out"):
            assert getattr(spec, f.name) == f.default, f.name
    assert spec.time_budget_s is None and spec.out == Path("o")


def test_every_hyper_parameter_is_settable():
    want = {prefix: changed(cls()) for prefix, cls in CONFIGS}
    argv = [a for prefix, obj in want.items() for a in to_argv(obj, prefix=prefix)]
    argv += ["--ppo-target-kl", "none", "--replay-max-pods", "50", "--replay-window-s", "0", "600",
             "--replay-autoscale", "--val-fraction", "0.2", "--eval-seed", "7", "--no-resume"]
    spec = build_spec(parse_train(*argv))
    assert spec.ppo == replace(want["ppo"], target_kl=None)
    assert (spec.td3, spec.bc, spec.reward) == (want["td3"], want["bc"], want["reward"])
    assert spec.replay == {"max_pods": 50, "window_s": (0.0, 600.0), "autoscale": True}
    assert (spec.val_fraction, spec.eval_seed, spec.resume) == (0.2, 7, False)


def test_shared_flags_and_their_precedence():
    spec = build_spec(parse_train("--seed", "3", "--ppo-seed", "5", "--lr", "1e-3", "--td3-critic-lr", "2e-3",
                                  "--hidden", "32", "--steps", "1000"))
    assert (spec.ppo.seed, spec.td3.seed, spec.bc.seed) == (5, 3, 3)
    assert (spec.ppo.learning_rate, spec.td3.actor_lr, spec.td3.critic_lr) == (1e-3, 1e-3, 2e-3)
    assert spec.bc.learning_rate == BCConfig().learning_rate  # --lr is not behaviour cloning's
    assert (spec.ppo.hidden, spec.td3.hidden) == (32, 32)
    assert (spec.ppo.total_steps, spec.td3.total_steps) == (1000, 1000)


def test_the_flag_names_of_the_scripts_and_readme_still_work():
    # scripts/train_default_policy.sh
    spec = build_spec(parse_train("--algo", "bc", "--teacher", "fgd", "--seed", "1", "--num-envs", "4",
                                  "--slice-nodes", "200", "--bc-samples", "20000", "--bc-epochs", "8"))
    assert (spec.algo, spec.teacher, spec.num_envs, spec.slice_nodes) == ("bc", "fgd", 4, 200)
    assert (spec.bc.samples, spec.bc.epochs, spec.bc.seed) == (20000, 8, 1)
    # scripts/train_td3_policy.sh
    replay = ["--mode", "replay", "--replay-load", "0.4", "--time-compression", "10", "--start-quantile",
              "0.01", "--slice-nodes", "200", "--eval-nodes", "300", "--seed", "1"]
    spec = build_spec(parse_train("--algo", "td3", "--init", "bc.pt", *replay, "--lr", "1e-4", "--eval-every",
                                  "5", "--checkpoint-every", "5", "--steps", "400000", "--time-budget", "12"))
    assert spec.replay == {"target_load": 0.4, "time_compression": 10.0, "start_quantile": 0.01}
    assert (spec.td3.actor_lr, spec.td3.critic_lr, spec.td3.total_steps, spec.time_budget_s) == \
        (1e-4, 1e-4, 400000, 720.0)
    assert (spec.mode, spec.init, spec.eval_nodes, spec.eval_every) == ("replay", Path("bc.pt"), 300, 5)
    # bench/results/README.md
    spec = build_spec(parse_train("--algo", "ppo", "--init", "bc.pt", "--lr", "3e-5", "--ent-coef", "0",
                                  "--critic-warmup", "20", "--num-steps", "512", "--seed", "1"))
    assert (spec.ppo.learning_rate, spec.ppo.ent_coef, spec.ppo.critic_warmup, spec.ppo.num_steps) == \
        (3e-5, 0.0, 20, 512)
    # continuous training: a small default rate, or --lr
    spec = build_spec(parse_train("--init", "c.pt", "--log", "d", "--window", "10"))
    assert (spec.algo, spec.bc.learning_rate, spec.window) == ("finetune", FINETUNE_LEARNING_RATE, 10)
    assert build_spec(parse_train("--init", "c.pt", "--log", "d", "--lr", "3e-3")).bc.learning_rate == 3e-3


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--num-envs", "0"], ["--num-steps", "0"]])
def test_non_positive_sizes_are_refused(argv):
    with pytest.raises(ValueError, match="must be positive"):
        build_spec(parse_train(*argv))


@pytest.mark.parametrize(("argv", "message"), [
    (["--hidden", "0"], "--ppo-hidden must be at least 1, got 0"),  # once trained a network of no width
    (["--seed", "-1"], "--ppo-seed must be at least 0, got -1"),
    (["--slice-nodes", "-3"], "--slice-nodes must be at least 0, got -3"),
    (["--ppo-gamma", "nan"], "--ppo-gamma must be a finite number, got nan"),  # once a tensor dump
    (["--ppo-gamma", "1.5"], "--ppo-gamma must be in [0, 1], got 1.5"),
    (["--td3-tau", "-0.1"], "--td3-tau must be in [0, 1]"),
    (["--lr", "0"], "--ppo-learning-rate must be above 0, got 0.0"),
    (["--reward-oom", "inf"], "--reward-oom must be a finite number, got inf"),
    (["--target-load", "nan"], "--target-load must be a finite number, got nan"),
    (["--target-load", "1e9"], "--target-load must be in (0, 10], got 1000000000.0"),
    (["--num-envs", "100000"], "--num-envs must be at most 1024, got 100000"),
    (["--time-budget", "-1"], "--time-budget must be above 0 minutes, got -1"),  # once: status 0 at once
    (["--time-budget", "0"], "--time-budget must be above 0 minutes, got 0"),  # once meant no limit
    (["--time-budget", "nan"], "--time-budget must be above 0 minutes, got nan"),
])
def test_numbers_nothing_can_train_with_are_refused_by_their_flag(argv, message):
    """Hostile numbers: each refused before any data is read, naming its flag."""
    with pytest.raises(ValueError) as refused:
        build_spec(parse_train(*argv))
    assert message in str(refused.value)
