"""``fedsched evidence``: paired replays printed with the gate's verdict, written into a checkpoint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from fedsched.common.learning.checkpoint import load_checkpoint
from fedsched.common.schedulers import LEARNED_ONLINE, default_policy_path


def _evidence(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedsched.cli.main", "evidence", *args],
                          capture_output=True, text=True, timeout=300)


def test_evidence_is_printed_judged_and_written(tmp_path):
    policy = tmp_path / "p.pt"
    shutil.copy(default_policy_path(LEARNED_ONLINE), policy)
    out = tmp_path / "ev.json"
    proc = _evidence(str(policy), "--profiles", "edge", "--quick", "--seeds", "2", "--jobs", "1", "--write",
                     "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "edge: 8 nodes, 2 seeds: trouble score" in proc.stdout
    assert "gate: shadow: the checkpoint's evidence comes from the quick" in proc.stdout
    assert "[edge] 4/4" in proc.stderr
    _, meta, _ = load_checkpoint(policy)
    ev = meta["evidence"]
    assert ev == json.loads(out.read_text())
    assert ev["recipe"] == f"fedsched evidence {policy} --profiles edge --seeds 2 --quick"
    assert len(ev["profiles"]["edge"]["trouble_score"]["values"]) == 2


def test_bad_input_is_a_clear_error(tmp_path):
    proc = _evidence(str(tmp_path / "missing.pt"))
    assert proc.returncode == 2 and "no such checkpoint" in proc.stderr and "Traceback" not in proc.stderr
    policy = tmp_path / "p.pt"
    shutil.copy(default_policy_path(LEARNED_ONLINE), policy)
    proc = _evidence(str(policy), "--profiles", "mainframe")
    assert proc.returncode == 2 and "unknown profile" in proc.stderr and "Traceback" not in proc.stderr


def test_the_searchs_evidence_is_written_apart_from_the_models(tmp_path):
    """``--search``: the search over the checkpoint is replayed and its figures go under
    ``search_evidence`` with its arguments, beside the model's own evidence, which stays."""
    policy = tmp_path / "p.pt"
    shutil.copy(default_policy_path(LEARNED_ONLINE), policy)
    _, before, _ = load_checkpoint(policy)
    proc = _evidence(str(policy), "--profiles", "edge", "--quick", "--seeds", "2", "--jobs", "1",
                     "--search", "candidates=2,horizon=2", "--write")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"lookahead[candidates=2,horizon=2,futures=1,seed=0]:{policy} seed" in proc.stderr
    _, meta, _ = load_checkpoint(policy)
    ev = meta["search_evidence"]
    assert ev["search"] == "candidates=2,horizon=2,futures=1,seed=0"
    assert ev["recipe"].endswith("--quick --search candidates=2,horizon=2,futures=1,seed=0")
    assert len(ev["profiles"]["edge"]["trouble_score"]["values"]) == 2
    assert meta["evidence"] == before["evidence"]
    proc = _evidence(str(policy), "--search", "candidates=0")
    assert proc.returncode == 2 and "--search 'candidates=0'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_baselines_evidence_goes_to_the_file_shipped_for_it(tmp_path, monkeypatch):
    """A baseline has no checkpoint: ``--write`` puts its evidence in the package's evidence file,
    which the serving gate reads (``baseline_evidence``)."""
    import argparse

    from fedsched.cli import evidence as cli_evidence
    from fedsched.common.sim import evidence

    target = tmp_path / "evidence" / "fgd.json"
    monkeypatch.setattr(evidence, "baseline_evidence_path", lambda name: target)
    parser = argparse.ArgumentParser()
    cli_evidence.register(parser.add_subparsers())
    args = parser.parse_args(["evidence", "fgd", "--profiles", "edge", "--quick", "--seeds", "2",
                              "--jobs", "1", "--write"])
    assert args.func(args) == 0
    ev = json.loads(target.read_text())
    assert ev["policy"] == "fgd" and ev["recipe"] == "fedsched evidence fgd --profiles edge --seeds 2 --quick"
    assert len(ev["profiles"]["edge"]["trouble_score"]["values"]) == 2
    assert evidence.baseline_evidence("fgd") == ev
    target.write_text("{not json")
    assert evidence.baseline_evidence("fgd") is None  # unreadable: no evidence (the gate refuses)


def test_a_baseline_without_evidence_to_give_is_a_clear_error():
    for args, says in ((["kube-default"], "baselines other than kube-default"),
                       (["fgd", "--search", "default"], "a baseline has none")):
        proc = _evidence(*args)
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr
