"""The run cache: baselines' runs taken from it give the figures a replay gives, bit for bit; a
changed input, code or environment misses it or is caught by the replayed check; nothing it holds
can break an evaluation."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsched.common.files import atomic_file
from fedsched.common.schedulers import LEARNED_ONLINE, default_policy_path
from fedsched.common.sim.evaluate import EvalSpec, RunOutput, evaluate
from fedsched.common.sim.evidence import collect
from fedsched.common.sim.run_cache import (
    DEFAULT_MAX_BYTES,
    MAX_ENTRY_BYTES,
    PRUNE_TO,
    STALE_TMP_S,
    RunCache,
    agree,
    cacheable,
    default_cache_dir,
    spec_key,
)
from fedsched.common.sim.scenarios import SCENARIOS, build

POLICIES = ["kube-default", "least-allocated"]
SEEDS = [100, 101]


def _spec(seed: int = 31, **replay) -> EvalSpec:
    spec = build(SCENARIOS["edge"], quick=True, seed=seed)
    spec.replay_options |= replay
    spec.policies, spec.seeds, spec.reference = list(POLICIES), list(SEEDS), "kube-default"
    return spec


def _same(a, b) -> bool:
    """Equal figures, NaN included (NaN != NaN)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _entries(cache: RunCache) -> list:
    return sorted(p for p in cache.root.rglob("*.json"))


@pytest.fixture(scope="module")
def fresh():
    """The figures of a replay without any cache."""
    return evaluate(_spec(), jobs=1)


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A cache holding every run of :func:`_spec` (copy it before changing it)."""
    root = tmp_path_factory.mktemp("filled")
    evaluate(_spec(), jobs=1, cache=RunCache(root))
    return root


def _copy_of(filled, tmp_path) -> RunCache:
    shutil.copytree(filled, tmp_path / "cache")
    return RunCache(tmp_path / "cache")


def test_cached_runs_give_the_replays_figures_bit_for_bit(tmp_path, fresh):
    cache = RunCache(tmp_path)
    first = evaluate(_spec(), jobs=1, cache=cache)
    assert first["cached_runs"] == 0 and len(_entries(cache)) == 4
    seen = []
    second = evaluate(_spec(), jobs=2, cache=cache, progress=lambda k, n, o: seen.append((k, n)))
    assert second["cached_runs"] == 3  # all four runs cached, one replayed to check them
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    for res in (first, second):
        assert _same(res["runs"], fresh["runs"])
        assert _same(res["paired"], fresh["paired"])


def test_another_input_misses_the_cache(tmp_path, filled):
    cache = _copy_of(filled, tmp_path)
    assert evaluate(_spec(seed=32), jobs=1, cache=cache)["cached_runs"] == 0  # another cluster
    assert evaluate(_spec(target_load=0.7), jobs=1, cache=cache)["cached_runs"] == 0  # another option
    spec = _spec()
    spec.seeds = [100, 102]  # one seed cached per policy: one taken, one replayed to check it
    assert evaluate(spec, jobs=1, cache=cache)["cached_runs"] == 1


def test_another_code_misses_the_cache(tmp_path, filled, monkeypatch):
    import fedsched.common.sim.run_cache as run_cache

    cache = _copy_of(filled, tmp_path)
    assert run_cache.code_fingerprint() == run_cache.code_fingerprint()  # stable within a process
    monkeypatch.setattr(run_cache, "code_fingerprint", lambda: "another version of fedsched.common")
    assert evaluate(_spec(), jobs=1, cache=cache)["cached_runs"] == 0


def test_a_cached_figure_that_a_replay_contradicts_is_not_trusted(tmp_path, fresh, filled, caplog):
    cache = _copy_of(filled, tmp_path)
    key = spec_key(_spec())
    # What another environment (a library, a CPU the fingerprint does not see) would have stored:
    # every entry off by a little more than the tolerance.
    for path in _entries(cache):
        entry = json.loads(path.read_text())
        metrics = entry["run"]["metrics"]
        metrics["hot_cpu_node_s"] = metrics["hot_cpu_node_s"] * (1 + 1e-6) + 1.0
        path.write_text(json.dumps(entry))
    seen = []
    with caplog.at_level(logging.WARNING, logger="fedsched.evaluate"):
        res = evaluate(_spec(), jobs=1, cache=cache, progress=lambda k, n, o: seen.append((k, n)))
    assert res["cached_runs"] == 0 and "differs from its cached figures" in caplog.text
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]  # the check, then the three cached runs replayed
    assert _same(res["runs"], fresh["runs"])
    for p in POLICIES:  # rewritten with the replayed figures
        for s in SEEDS:
            assert _same(cache.get(key, p, s).metrics, fresh["runs"][p][str(s)])


@pytest.mark.parametrize("bad", [
    "", "{", "[]", "null", '{"format": 99}',
    '{"format": 1, "key": "another", "policy": "kube-default", "seed": 100, "run": {"metrics": {}}}',
    "METRICS_AS_STRING", "CURVE_AS_STRING", "IDLE_AS_LIST", "WRONG_POLICY",
    "[" * 100_000 + "]" * 100_000,  # nested past the decoder's recursion limit
    "\udcff", "TOO_LARGE", "A_PIPE", "A_LINK",
], ids=lambda bad: bad if len(bad) <= 100 else f"{bad[:4]}...{bad[-4:]} ({len(bad)} chars)")
def test_an_entry_it_cannot_use_is_a_miss_never_an_error(tmp_path, fresh, filled, bad, caplog):
    cache = _copy_of(filled, tmp_path)
    key = spec_key(_spec())
    for path in _entries(cache):
        entry = json.loads(path.read_text())
        text = {"METRICS_AS_STRING": json.dumps({**entry, "run": {**entry["run"], "metrics": {"a": "1"}}}),
                "CURVE_AS_STRING": json.dumps({**entry, "run": {**entry["run"], "curve": "x"}}),
                "IDLE_AS_LIST": json.dumps({**entry, "run": {**entry["run"], "idle_gpu": [1]}}),
                "WRONG_POLICY": json.dumps({**entry, "policy": "fgd"})}.get(bad, bad)
        if bad == "TOO_LARGE":  # a valid entry padded past the size an entry may have
            path.write_text(json.dumps(entry) + " " * MAX_ENTRY_BYTES)
        elif bad == "A_PIPE":  # reading would block for ever
            path.unlink()
            os.mkfifo(path)
        elif bad == "A_LINK":  # to a valid entry elsewhere: never followed
            (tmp_path / "elsewhere.json").write_text(json.dumps(entry))
            path.unlink()
            path.symlink_to(tmp_path / "elsewhere.json")
        else:
            path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with caplog.at_level(logging.WARNING, logger="fedsched.run_cache"):
        assert cache.get(key, "kube-default", 100) is None
        res = evaluate(_spec(), jobs=1, cache=cache)
    assert "ignoring" in caplog.text or "cannot read" in caplog.text
    assert res["cached_runs"] == 0
    assert _same(res["runs"], fresh["runs"])
    assert cache.get(key, "kube-default", 100) is not None  # replaced by the replay's


def test_an_unwritable_cache_costs_the_cache_not_the_result(tmp_path, fresh, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = RunCache(blocker / "runs")
    with caplog.at_level(logging.WARNING, logger="fedsched.run_cache"):
        res = evaluate(_spec(), jobs=1, cache=cache)
    assert "cannot write" in caplog.text and _same(res["paired"], fresh["paired"])


def test_only_baselines_are_cached(tmp_path):
    policy = tmp_path / "p.pt"
    shutil.copy(default_policy_path(LEARNED_ONLINE), policy)
    assert cacheable("kube-default") and cacheable("fgd")
    assert not cacheable(str(policy)) and not cacheable(LEARNED_ONLINE) and not cacheable("oracle")
    assert not cacheable("lookahead:fgd")
    cache = RunCache(tmp_path / "cache")
    spec = _spec()
    spec.policies, spec.seeds = ["kube-default", str(policy)], [100]
    evaluate(spec, jobs=1, cache=cache)
    key = spec_key(spec)
    assert cache.get(key, "kube-default", 100) is not None
    assert len(_entries(cache)) == 1
    # a stored entry for a policy that is not cacheable is never read back
    cache.put(key, RunOutput("kube-default", 101, {"x": 1.0}, None))
    assert cache.get(key, str(policy), 101) is None


def test_the_evidence_takes_kube_defaults_runs_from_the_cache(tmp_path):
    cache = RunCache(tmp_path)
    first = collect("least-allocated", ["edge"], seeds=2, jobs=1, quick=True, cache=cache)
    second = collect("least-allocated", ["edge"], seeds=2, jobs=1, quick=True, cache=cache)
    assert first["profiles"]["edge"]["cached_runs"] == 0 and second["profiles"]["edge"]["cached_runs"] == 3
    first["profiles"]["edge"].pop("cached_runs")
    second["profiles"]["edge"].pop("cached_runs")
    assert _same(first, second)


def test_the_default_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDSCHED_RUN_CACHE", str(tmp_path / "a"))
    assert default_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("FEDSCHED_RUN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "fedsched" / "runs"
    assert RunCache().root == default_cache_dir()
    with pytest.raises(ValueError, match="empty"):
        RunCache(" ")


def test_agree_is_equality_up_to_the_last_bits():
    assert agree({"a": 1.0, "b": float("nan"), "c": 3}, {"a": 1.0 + 1e-15, "b": float("nan"), "c": 3})
    assert not agree({"a": 1.0}, {"a": 1.0 + 1e-6})
    assert not agree({"a": 1.0}, {"a": 1.0, "b": 2.0})
    assert not agree({"a": float("nan")}, {"a": 0.0})
    assert not agree({"a": 0.0}, {"a": 1e-300})  # no absolute tolerance: 0 is 0


@settings(max_examples=60, deadline=None)
@given(a=st.dictionaries(st.text(max_size=4), st.one_of(st.floats(allow_nan=False), st.integers(),
                                                        st.tuples(st.integers(), st.integers())), max_size=4),
       b=st.dictionaries(st.text(max_size=4), st.one_of(st.floats(allow_nan=False), st.integers(),
                                                        st.tuples(st.integers(), st.integers())), max_size=4))
def test_the_key_tells_apart_options_that_differ(a, b):
    base = _SPEC_CACHE.setdefault("spec", _spec())
    x = EvalSpec(**{**base.__dict__, "replay_options": a})
    y = EvalSpec(**{**base.__dict__, "replay_options": b})
    same = {k: (type(v), repr(v)) for k, v in a.items()} == {k: (type(v), repr(v)) for k, v in b.items()}
    assert (spec_key(x) == spec_key(y)) == same


_SPEC_CACHE: dict[str, EvalSpec] = {}


def _fill(cache: RunCache, n: int, size: int = 1000, t0: float = 1_000_000.0) -> list:
    """``n`` entries of ``size`` bytes, the i-th last used at ``t0 + i``."""
    paths = []
    for i in range(n):
        path = cache.root / f"{i % 7:02d}" / f"{i:064x}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        os.utime(path, (t0 + i, t0 + i))
        paths.append(path)
    return paths


def test_a_prune_removes_the_least_recently_used_down_to_its_share_of_the_limit(tmp_path):
    cache = RunCache(tmp_path, max_bytes=10_000)
    paths = _fill(cache, 20)  # 20 kB, twice the limit
    assert cache.prune() == (13, 13_000)  # down to 7 kB, PRUNE_TO = 0.75 of 10 kB
    assert [p.exists() for p in paths] == [False] * 13 + [True] * 7
    assert cache.prune() == (0, 0)  # under the limit: nothing to do
    under = RunCache(tmp_path / "under", max_bytes=10_000)
    _fill(under, 10)  # exactly at the limit is not past it
    assert under.prune() == (0, 0)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 5000), max_size=30), limit=st.integers(1, 40_000))
def test_a_prune_keeps_the_most_recent_entries_within_the_limit(tmp_path_factory, sizes, limit):
    root = tmp_path_factory.mktemp("prune")
    cache = RunCache(root, max_bytes=limit)
    paths = []
    for i, size in enumerate(sizes):
        paths += _fill(RunCache(root / "x"), 1, size=size, t0=1e6 + i)
        dest = root / f"{i % 5:02d}" / f"{i:064x}.json"
        dest.parent.mkdir(exist_ok=True)
        paths[-1].rename(dest)
        paths[-1] = dest
    cache.prune()
    kept = [p.exists() for p in paths]
    total = sum(s for s, k in zip(sizes, kept, strict=True) if k)
    assert total <= limit
    if sum(sizes) > limit:
        assert total <= 0.75 * limit
        assert kept == sorted(kept)  # every removed entry is older than every kept one
    else:
        assert all(kept)


def test_a_hit_marks_the_entry_used(tmp_path, filled):
    cache = _copy_of(filled, tmp_path)
    key = spec_key(_spec())
    for path in _entries(cache):
        os.utime(path, (1e6, 1e6))
    assert cache.get(key, "kube-default", 100) is not None
    used = [p for p in _entries(cache) if p.stat().st_mtime > 1e6]
    assert len(used) == 1
    cache.max_bytes = int(used[0].stat().st_size / PRUNE_TO) + 1  # a prune leaves room for one entry
    cache.prune()
    assert _entries(cache) == used and cache.get(key, "kube-default", 100) is not None


def test_a_prune_touches_only_its_own_files_and_clears_stale_temporaries(tmp_path):
    root, outside = tmp_path / "cache", tmp_path / "outside"
    cache = RunCache(root, max_bytes=1000)
    paths = _fill(cache, 3)
    outside.mkdir()
    victim = outside / f"{0:064x}.json"  # named like an entry, outside the cache
    victim.write_bytes(b"y" * 5000)
    os.utime(victim, (1.0, 1.0))  # older than every entry
    (root / "ff").symlink_to(outside)  # a shard that is a link: never followed
    (paths[0].parent / f"{99:064x}.json").symlink_to(victim)  # an entry that is a link: never removed
    (paths[0].parent / "notes.json").write_text("{}")  # not an entry's name
    (root / "notes").mkdir()  # not a shard's name
    stale = paths[1].parent / f".{paths[1].name}.123.abcd1234.tmp"
    fresh_tmp = paths[1].parent / f".{paths[1].name}.456.abcd1234.tmp"
    for p, age in ((stale, 2 * STALE_TMP_S), (fresh_tmp, 10.0)):
        p.write_bytes(b"half")
        os.utime(p, (2e6 - age, 2e6 - age))
    removed, freed = cache.prune(now=2e6)
    assert (removed, freed) == (3 + 1, 3000 + 4)  # every entry (3 kB against 750 B) and the stale temporary
    assert not stale.exists() and fresh_tmp.exists() and victim.read_bytes() == b"y" * 5000
    assert (paths[0].parent / "notes.json").exists() and (paths[0].parent / f"{99:064x}.json").is_symlink()
    assert RunCache(tmp_path / "missing").prune() == (0, 0)


def test_a_prune_counts_what_another_process_removed_first(tmp_path, monkeypatch):
    cache = RunCache(tmp_path, max_bytes=4000)
    paths = _fill(cache, 6)  # 6 kB: down to 3 kB, the three oldest
    real_unlink = type(paths[0]).unlink

    def racing_unlink(self, *args, **kwargs):
        real_unlink(self)
        if self == paths[0]:  # another process removed it just before this one
            raise FileNotFoundError(self)

    monkeypatch.setattr(type(paths[0]), "unlink", racing_unlink)
    assert cache.prune() == (2, 2000)
    assert [p.exists() for p in paths] == [False] * 3 + [True] * 3


def test_evaluate_keeps_the_cache_within_its_limit(tmp_path, fresh):
    cache = RunCache(tmp_path, max_bytes=2500)  # room for fewer than the 4 runs
    res = evaluate(_spec(), jobs=1, cache=cache)
    assert _same(res["paired"], fresh["paired"])
    assert 0 < sum(p.stat().st_size for p in _entries(cache)) <= 2500


@pytest.mark.parametrize("value", ["0", "-5", "lots", "nan", "inf"])
def test_a_bad_size_limit_is_a_clear_error(monkeypatch, tmp_path, value):
    monkeypatch.setenv("FEDSCHED_RUN_CACHE_MAX_MB", value)
    with pytest.raises(ValueError, match="FEDSCHED_RUN_CACHE_MAX_MB"):
        RunCache(tmp_path)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_bytes"):
            RunCache(tmp_path, max_bytes=bad)


def test_the_size_limit_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("FEDSCHED_RUN_CACHE_MAX_MB", raising=False)
    assert RunCache(tmp_path).max_bytes == DEFAULT_MAX_BYTES
    monkeypatch.setenv("FEDSCHED_RUN_CACHE_MAX_MB", "2.5")
    assert RunCache(tmp_path).max_bytes == 2_500_000 and RunCache(tmp_path, max_bytes=7).max_bytes == 7


def test_a_prune_knows_the_atomic_writes_temporaries(tmp_path):
    """A writer killed mid-write leaves :func:`fedsched.common.files.atomic_file`'s temporary: a
    prune an hour later recognises it by name (if the writer's naming changes, this fails)."""
    cache = RunCache(tmp_path)
    target = tmp_path / "ab" / f"{7:064x}.json"
    with pytest.raises(FileNotFoundError), atomic_file(target) as f:
        f.write(b"{}")
        assert cache.prune(now=time.time() + 2 * STALE_TMP_S) == (1, 0)
    assert not any(target.parent.iterdir())
