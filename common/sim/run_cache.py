"""A cache of baselines' runs, so a benchmark or the gate's evidence replays only what is new.

A baseline's run (:func:`fedsched.common.sim.evaluate.run_one`) is a pure function of the
evaluation's cluster and pods, its options, the scheduler's name, the seed and the code: the same
inputs give the same bits (the simulators and the baselines draw from seeded generators only).
``fedsched evidence`` replays kube-default beside every policy it judges, half of its time; the
online benchmark replays the same heuristics for every policy tried. :class:`RunCache` keeps each
such run's :class:`~fedsched.common.sim.evaluate.RunOutput` in a JSON file under a key that
hashes every input (:func:`spec_key`) and the code that computes it (:func:`code_fingerprint`:
the source of ``fedsched.common``, numpy's, numba's and Python's versions and the CPU
architecture), so a change to any of them misses the cache rather than reusing a stale figure.

What is cached: the registered baselines only (``BASELINES``: kube-default and the heuristics).
A learned policy or a checkpoint is never cached (a file beside the code may change under the
same name), nor the oracle or a search.

What :func:`fedsched.common.sim.evaluate.evaluate` does with a cache: runs found in it are not
replayed, except one (the first in the order of the runs: policies, then seeds), which is
replayed and compared with its cached figures; if any metric differs (beyond 1e-9 relative: a
last-bit difference is float summation order, not another result) the cache is not trusted for
this evaluation, every run is replayed and the cache rewritten. The result counts what came from
the cache (``cached_runs``). An entry that cannot be read, is not an object of the expected form
or was stored for another key is a miss (logged), never an error. Writes go through
:func:`fedsched.common.files.atomic_write`, so two processes sharing a cache never leave half a file.

Where: ``FEDSCHED_RUN_CACHE`` if set, else ``$XDG_CACHE_HOME/fedsched/runs``, else
``~/.cache/fedsched/runs`` (:func:`default_cache_dir`).

How big: every code version keys its own entries (about 3 KB a run), so the cache is bounded.
:meth:`RunCache.prune` (called by ``evaluate`` after it stored new runs) removes the least
recently used entries (a hit refreshes an entry's time) once the entries pass ``max_bytes``
(``FEDSCHED_RUN_CACHE_MAX_MB`` if set, else :data:`DEFAULT_MAX_BYTES`), down to
:data:`PRUNE_TO` of it, and temporary files a killed writer left behind an hour ago or more.

May import: ``fedsched.common`` (the baseline names, the atomic write) and the standard library.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import platform
import re
import stat
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedsched.common.files import atomic_write

if TYPE_CHECKING:
    from fedsched.common.sim.evaluate import EvalSpec, RunOutput

log = logging.getLogger("fedsched.run_cache")

CACHE_FORMAT = 1
DEFAULT_MAX_BYTES = 1_000_000_000
"""The entries' total size past which :meth:`RunCache.prune` removes the least recently used (1,000 MB,
in the megabytes of ``FEDSCHED_RUN_CACHE_MAX_MB``)."""
PRUNE_TO = 0.75
"""What a prune leaves, as a fraction of the limit (so the next runs do not prune again at once)."""
MAX_ENTRY_BYTES = 16 << 20
"""The largest entry :meth:`RunCache.get` reads (a run's entry is a few KB; a packing run's curve and
idle-GPU account some tens)."""
STALE_TMP_S = 3600.0
"""A writer's temporary file this old (seconds) was left by a killed process: a prune removes it."""
REL_TOL = 1e-9
"""How far a replayed figure may be from its cached one and still agree (relative; see the docstring)."""


def default_cache_dir() -> Path:
    """``FEDSCHED_RUN_CACHE``, else ``$XDG_CACHE_HOME/fedsched/runs``, else ``~/.cache/fedsched/runs``."""
    env = os.environ.get("FEDSCHED_RUN_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedsched" / "runs"


def cacheable(policy: str) -> bool:
    """Whether a run of ``policy`` may be cached: a registered baseline."""
    from fedsched.common.schedulers import BASELINES

    return policy in BASELINES


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of what a baseline's run depends on besides its inputs: every Python source of
    ``fedsched.common`` (path and content), numpy's, numba's (if installed) and Python's versions
    and the CPU architecture."""
    import fedsched.common as common

    root = Path(common.__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(str(path.relative_to(root)).encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    try:
        import numba

        numba_version = numba.__version__
    except ImportError:
        numba_version = "none"
    h.update(f"numpy {np.__version__} numba {numba_version} python {sys.version} "
             f"{platform.machine()}".encode())
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    """Hash ``value`` unambiguously: arrays by dtype, shape and bytes; dataclasses field by field;
    mappings with sorted keys; sequences element by element; scalars by type and repr."""
    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        h.update(f"array {arr.dtype.str} {arr.shape}|".encode())
        if arr.dtype == object:
            for v in arr.ravel():
                _feed(h, v)
        else:
            h.update(arr.tobytes())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        h.update(f"dataclass {type(value).__qualname__}|".encode())
        for f in dataclasses.fields(value):
            h.update(f"{f.name}=".encode())
            _feed(h, getattr(value, f.name))
    elif isinstance(value, dict):
        h.update(f"dict {len(value)}|".encode())
        for k in sorted(value, key=repr):
            _feed(h, k)
            _feed(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(f"{type(value).__name__} {len(value)}|".encode())
        for v in value:
            _feed(h, v)
    elif value is None or isinstance(value, (bool, int, float, str, np.generic)):
        h.update(f"{type(value).__name__} {value!r}|".encode())
    else:
        raise TypeError(f"cannot fingerprint a {type(value).__name__} in an evaluation spec")


def spec_key(spec: EvalSpec) -> str:
    """A hash of everything of ``spec`` a single run reads (the cluster, the pods, the mode and
    its options, the statistics pods and split) and of the code (:func:`code_fingerprint`); not
    the policies or seeds, which key each entry beside it."""
    h = hashlib.sha256()
    h.update(f"format {CACHE_FORMAT} code {code_fingerprint()}|".encode())
    for name in ("nodes", "pods", "mode", "target_load", "test_fraction", "train_pods", "replay_options"):
        h.update(f"{name}=".encode())
        _feed(h, getattr(spec, name))
    return h.hexdigest()


def agree(a: dict[str, Any], b: dict[str, Any], rel_tol: float = REL_TOL) -> bool:
    """Whether two runs' metrics are the same figures: the same keys, each value equal, both NaN,
    or floats within ``rel_tol`` of each other."""
    if set(a) != set(b):
        return False
    for k, x in a.items():
        y = b[k]
        if isinstance(x, (int, float)) and isinstance(y, (int, float)):
            if math.isnan(x) and math.isnan(y):
                continue
            if not math.isclose(x, y, rel_tol=rel_tol, abs_tol=0.0):
                return False
        elif x != y:
            return False
    return True


def default_max_bytes() -> int:
    """``FEDSCHED_RUN_CACHE_MAX_MB`` (megabytes, a positive number) in bytes, else
    :data:`DEFAULT_MAX_BYTES`."""
    env = os.environ.get("FEDSCHED_RUN_CACHE_MAX_MB", "").strip()
    if not env:
        return DEFAULT_MAX_BYTES
    try:
        mb = float(env)
    except ValueError:
        mb = math.nan
    if not (math.isfinite(mb) and mb > 0):
        raise ValueError(f"FEDSCHED_RUN_CACHE_MAX_MB={env!r}: expected a positive number of megabytes")
    return max(1, int(mb * 1e6))


class RunCache:
    """Baselines' runs, one JSON file each under ``root``, at most about ``max_bytes`` of them
    (see the module docstring)."""

    def __init__(self, root: str | Path | None = None, max_bytes: int | None = None) -> None:
        if root is not None and not str(root).strip():
            raise ValueError("the run cache's directory is empty (give a path, or no cache)")
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                      or max_bytes <= 0):
            raise ValueError(f"the run cache's max_bytes must be a positive integer, got {max_bytes!r}")
        self.root = Path(root) if root is not None else default_cache_dir()
        self.max_bytes = default_max_bytes() if max_bytes is None else max_bytes

    def _path(self, key: str, policy: str, seed: int) -> Path:
        name = hashlib.sha256(f"{key}|{policy}|{int(seed)}".encode()).hexdigest()
        return self.root / name[:2] / f"{name}.json"

    def get(self, key: str, policy: str, seed: int) -> RunOutput | None:
        """The cached run of ``policy`` on ``seed`` under ``key``, or None (not cacheable, not
        there, or not readable as one: logged)."""
        from fedsched.common.sim.evaluate import RunOutput

        if not cacheable(policy):
            return None
        path = self._path(key, policy, seed)
        try:
            text = _read_entry(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("run cache: cannot read %s (%s); replaying", path, e)
            return None
        try:
            entry = json.loads(text)
            if not isinstance(entry, dict) or entry.get("format") != CACHE_FORMAT:
                raise ValueError("not a cache entry of this format")
            if entry.get("key") != key or entry.get("policy") != policy or entry.get("seed") != int(seed):
                raise ValueError("stored for another run")
            run = entry["run"]
            metrics = run["metrics"]
            if not isinstance(metrics, dict) or not all(
                    isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                    for k, v in metrics.items()):
                raise ValueError("metrics are not a mapping of names to numbers")
            curve = run.get("curve")
            if curve is not None and not (isinstance(curve, list)
                                          and all(isinstance(v, (int, float)) for v in curve)):
                raise ValueError("curve is not a list of numbers")
            for name in ("idle_gpu", "choice"):
                if run.get(name) is not None and not isinstance(run[name], dict):
                    raise ValueError(f"{name} is not an object")
            out = RunOutput(policy, int(seed), dict(metrics),
                            None if curve is None else [float(v) for v in curve],
                            run.get("idle_gpu"), run.get("choice"))
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            log.warning("run cache: ignoring %s (%s); replaying", path, e)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the last entry a prune removes
        return out

    def put(self, key: str, out: RunOutput) -> bool:
        """Store ``out`` (a cacheable policy's run) under ``key``; whether it was written (a failure
        to write is logged, never raised: the run's figures are in hand)."""
        if not cacheable(out.policy):
            return False
        path = self._path(key, out.policy, out.seed)
        entry = {"format": CACHE_FORMAT, "key": key, "policy": out.policy, "seed": int(out.seed),
                 "run": {"metrics": out.metrics, "curve": out.curve, "idle_gpu": out.idle_gpu,
                         "choice": out.choice}}
        try:
            atomic_write(path, json.dumps(entry, allow_nan=True, default=_plain).encode())
        except (OSError, TypeError, ValueError) as e:
            log.warning("run cache: cannot write %s (%s)", path, e)
            return False
        return True

    def prune(self, now: float | None = None) -> tuple[int, int]:
        """Remove the least recently used entries once their total size passes ``max_bytes``,
        down to :data:`PRUNE_TO` of it, and writers' temporary files older than
        :data:`STALE_TMP_S`. Returns (files removed, bytes freed). Only what the cache itself
        writes is touched: regular files named as its entries or its writers' temporaries, in its
        own two-letter directories (never through a symbolic link: a directory shared with others
        cannot steer it at their files). A file another process removed first is skipped, one it
        cannot remove is left (never an error)."""
        now = time.time() if now is None else now
        entries: list[tuple[float, int, Path]] = []
        removed = freed = 0
        try:
            shards = [d for d in self.root.iterdir() if _SHARD.fullmatch(d.name) and _is_plain_dir(d)]
        except OSError:
            return 0, 0
        for shard in shards:
            try:
                names = list(shard.iterdir())
            except OSError:
                continue
            for path in names:
                entry, tmp = _ENTRY.fullmatch(path.name), _TMP.fullmatch(path.name)
                if not (entry or tmp):
                    continue
                try:
                    st = path.lstat()
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if tmp:
                    if now - st.st_mtime >= STALE_TMP_S and _unlink(path):
                        removed, freed = removed + 1, freed + st.st_size
                else:
                    entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        if total > self.max_bytes:
            entries.sort(key=lambda e: (e[0], str(e[2])))
            goal = PRUNE_TO * self.max_bytes
            for _, size, path in entries:
                if total <= goal:
                    break
                if _unlink(path):
                    removed, freed = removed + 1, freed + size
                    total -= size
                elif not path.exists():  # another process's prune got there first
                    total -= size
        if removed:
            log.info("run cache: removed %d files (%.1f MB) from %s (limit %.1f MB)", removed, freed / 1e6,
                     self.root, self.max_bytes / 1e6)
        return removed, freed


_SHARD = re.compile(r"[0-9a-f]{2}")
_ENTRY = re.compile(r"[0-9a-f]{64}\.json")
_TMP = re.compile(r"\.[0-9a-f]{64}\.json\.\d+\.[0-9a-f]+\.tmp")  # common.files.atomic_file's temporary


def _read_entry(path: Path) -> str:
    """An entry's text: a regular file (opened without following a link, without blocking on a
    pipe) of at most :data:`MAX_ENTRY_BYTES`; otherwise a ``ValueError`` that says why (a cache
    directory shared with others may hold anything)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_ENTRY_BYTES:
            raise ValueError(f"{st.st_size} bytes, more than an entry's {MAX_ENTRY_BYTES}")
        data = f.read(MAX_ENTRY_BYTES + 1)
    if len(data) > MAX_ENTRY_BYTES:
        raise ValueError(f"more than an entry's {MAX_ENTRY_BYTES} bytes")
    return data.decode("utf-8")


def _is_plain_dir(path: Path) -> bool:
    """A directory that is not a symbolic link."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def _unlink(path: Path) -> bool:
    """Remove ``path``; False if it is gone already or cannot be removed."""
    try:
        path.unlink()
    except OSError:
        return False
    return True


def _plain(x: Any) -> Any:
    """numpy scalars and arrays inside a run's extra fields, as JSON takes them."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON serialisable")
