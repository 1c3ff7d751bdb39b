"""A durable, bounded on-disk log of scheduling decisions (for continuous training).

The online agent (and ``fedsched train --algo bc --record-log DIR``) appends every decision
it makes; ``fedsched train --init CKPT --log DIR --window N`` fine-tunes a checkpoint on
the most recent N of them by behaviour cloning.

Format: a directory of numbered chunk files ``chunk-000001.npz``, ``chunk-000002.npz``, ...
(``np.savez``, readable with ``allow_pickle=False``), oldest first. A chunk of ``n``
decisions holds:

- ``format`` (int, :data:`LOG_FORMAT`), ``feature_schema`` (int) and ``node_features``,
  ``pod_features``, ``context_features`` (str arrays): the feature schema of the rows;
- ``nodes``: float16 ``[sum K_i, F]`` the feasible nodes' features of every decision,
  concatenated; ``node_offsets``: int64 ``[n + 1]``, decision i owns rows
  ``node_offsets[i]:node_offsets[i + 1]``;
- ``pod``: float32 ``[n, P]``, ``context``: float32 ``[n, C]``;
- ``chosen``: int64 ``[n]``, the node that was picked (an index into the decision's rows);
- ``best``: int64 flat indices of the teacher's tied best nodes with ``best_offsets``
  ``[n + 1]`` (an empty range: no best set was recorded);
- ``has_gpus``: bool ``[n]``; ``model_version``: str ``[n]`` (who decided);
- ``reward``: float64 ``[n, R]`` with ``reward_columns`` str ``[R]`` (NaN: not known).

The newest chunk fills up to ``chunk_size`` decisions: :meth:`DecisionLog.flush` rewrites it
(a full chunk is never touched again, except by :meth:`DecisionLog.prune`). Every write
goes to a temporary file moved into place atomically
(:func:`fedsched.common.files.atomic_file`), so a crash leaves either the old or the new
chunk, never a half-written one; leftover ``.tmp`` files are ignored.
One writer per directory; readers may run beside it.

May import: numpy, ``fedsched.common.files`` and ``fedsched.common.learning``'s features and
records (no torch: the serving agent writes it, training and the federated members read it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedsched.common.files import atomic_file
from fedsched.common.learning.features import (
    CONTEXT_FEATURES,
    FEATURE_SCHEMA_VERSION,
    NODE_FEATURES,
    POD_FEATURES,
)
from fedsched.common.learning.records import Decision

LOG_FORMAT = 1
_CHUNK = re.compile(r"^chunk-(\d{6,})\.npz$")
_KEYS = ("format", "feature_schema", "node_features", "pod_features", "context_features", "nodes",
         "node_offsets", "pod", "context", "chosen", "best", "best_offsets", "has_gpus", "model_version",
         "reward", "reward_columns")


class DecisionLogError(ValueError):
    """A decision log that cannot be read (corrupt or truncated chunk, other feature schema)."""


@dataclass
class LoggedDecision:
    """One logged decision with everything the log holds about it."""

    decision: Decision  # best: the teacher's best set if recorded, else [chosen]
    chosen: int  # the node that was picked (index into decision.nodes)
    model_version: str = ""
    reward: dict[str, float] = field(default_factory=dict)  # known reward terms only (no NaN)
    best_recorded: bool = True  # False: decision.best is [chosen], not a teacher's set


def _chunk_name(i: int) -> str:
    return f"chunk-{i:06d}.npz"


class DecisionLog:
    """The decision log in directory ``path`` (created on the first write); see the module doc."""

    def __init__(self, path: str | Path, chunk_size: int = 2000) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise DecisionLogError(f"{self.path}: not a directory (a decision log is a directory of chunks)")
        self.chunk_size = chunk_size
        self._open: list[LoggedDecision] | None = None  # the newest chunk's decisions (the one filling)
        self._open_id = 0
        self._dirty = False  # _open holds decisions not on disk yet
        self._counts: dict[Path, tuple[tuple[int, int], int]] = {}  # file -> ((mtime_ns, size), n)

    # ---- writing ------------------------------------------------------------------------
    def append(self, decision: Decision, chosen: int, model_version: str = "",
               reward: dict[str, float] | None = None) -> None:
        """Add one decision (buffered: on disk after :meth:`flush` or when its chunk fills).

        ``decision.best`` is the teacher's best set; ``None`` or empty when there is none.
        """
        nodes = np.asarray(decision.nodes)
        pod, ctx = np.asarray(decision.pod), np.asarray(decision.context)
        if nodes.ndim != 2 or nodes.shape[1] != len(NODE_FEATURES) or not len(nodes):
            raise ValueError(f"decision.nodes must be [K >= 1, {len(NODE_FEATURES)}], got {nodes.shape}")
        if pod.shape != (len(POD_FEATURES),) or ctx.shape != (len(CONTEXT_FEATURES),):
            raise ValueError(f"decision.pod/context must have {len(POD_FEATURES)}/{len(CONTEXT_FEATURES)} "
                             f"features, got {pod.shape}/{ctx.shape}")
        chosen = int(chosen)
        if not 0 <= chosen < len(nodes):
            raise ValueError(f"chosen node {chosen} is not one of the decision's {len(nodes)} nodes")
        best = np.zeros(0, np.int64) if decision.best is None else np.asarray(decision.best, np.int64)
        if best.ndim != 1 or (len(best) and (best.min() < 0 or best.max() >= len(nodes))):
            raise ValueError(f"best set {best.tolist()} is not a set of the decision's {len(nodes)} nodes")
        recorded = bool(len(best))
        rec = LoggedDecision(
            Decision(nodes.astype(np.float16), pod.astype(np.float32), ctx.astype(np.float32),
                     best.copy() if recorded else np.array([chosen], np.int64),
                     has_gpus=bool(decision.has_gpus)),
            chosen, str(model_version), {str(k): float(v) for k, v in (reward or {}).items()},
            best_recorded=recorded)
        if self._open is None:
            self._adopt_newest()
        assert self._open is not None
        self._open.append(rec)
        self._dirty = True
        if len(self._open) >= self.chunk_size:
            self._write_open()
            self._open, self._open_id = [], self._open_id + 1

    def flush(self) -> None:
        """Write the buffered decisions (atomically rewriting the newest, partly filled chunk)."""
        if self._dirty and self._open:
            self._write_open()

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()

    def prune(self, max_decisions: int) -> int:
        """Keep only the newest ``max_decisions`` decisions; returns how many were dropped.

        Chunks entirely older than the kept window are deleted (oldest first, so a crash
        leaves a consistent, only longer log); the chunk straddling the boundary is
        rewritten atomically without its older part.
        """
        if max_decisions < 0:
            raise ValueError(f"max_decisions must be >= 0, got {max_decisions}")
        self.flush()
        chunks = self._chunks()
        counts = [self._count(p) for _, p in chunks]
        excess = sum(counts) - max_decisions
        dropped = 0
        for (i, p), n in zip(chunks, counts, strict=True):
            if excess <= 0:
                break
            if n <= excess:
                p.unlink()
                self._counts.pop(p, None)
            else:
                self._write(i, self._read(p)[excess:])
            d = min(n, excess)
            dropped += d
            excess -= d
        self._open = None  # re-read the newest chunk on the next append
        return dropped

    # ---- reading ------------------------------------------------------------------------
    def __len__(self) -> int:
        on_disk = {p: self._count(p) for _, p in self._chunks()}
        if self._dirty and self._open is not None:
            on_disk[self.path / _chunk_name(self._open_id)] = len(self._open)
        return sum(on_disk.values())

    def tail(self, n: int) -> list[Decision]:
        """The most recent ``n`` decisions (fewer if the log is shorter), oldest first."""
        return [r.decision for r in self.tail_records(n)]

    def tail_records(self, n: int) -> list[LoggedDecision]:
        """As :meth:`tail`, with the chosen node, model version and reward of each decision."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if n == 0:
            return []
        chunks = dict(self._chunks())
        if self._dirty and self._open is not None:
            chunks[self._open_id] = None  # type: ignore[assignment]  # the buffered chunk
        out: list[list[LoggedDecision]] = []
        have = 0
        for i in sorted(chunks, reverse=True):
            p = chunks[i]
            recs = list(self._open or []) if p is None else self._read(p)
            out.append(recs[max(0, len(recs) - (n - have)):])
            have += len(out[-1])
            if have >= n:
                break
        return [r for part in reversed(out) for r in part]

    # ---- internals ----------------------------------------------------------------------
    def _chunks(self) -> list[tuple[int, Path]]:
        """(number, path) of the chunk files on disk, oldest first (``.tmp`` files ignored)."""
        if not self.path.is_dir():
            return []
        found = []
        for p in self.path.iterdir():
            m = _CHUNK.match(p.name)
            if m:
                found.append((int(m.group(1)), p))
        return sorted(found)

    def _adopt_newest(self) -> None:
        chunks = self._chunks()
        if not chunks:
            self._open, self._open_id = [], 1
            return
        i, p = chunks[-1]
        if self._count(p) < self.chunk_size:
            self._open, self._open_id = self._read(p), i  # keep filling it
        else:
            self._open, self._open_id = [], i + 1
        self._dirty = False

    def _write_open(self) -> None:
        assert self._open is not None
        self._write(self._open_id, self._open)
        self._dirty = False

    def _write(self, i: int, recs: list[LoggedDecision]) -> None:
        path = self.path / _chunk_name(i)
        self.path.mkdir(parents=True, exist_ok=True)
        n_rows = [len(r.decision.nodes) for r in recs]
        n_best = [len(r.decision.best) if r.best_recorded else 0 for r in recs]
        columns = sorted({k for r in recs for k in r.reward})
        reward = np.full((len(recs), len(columns)), np.nan)
        for j, r in enumerate(recs):
            for c, k in enumerate(columns):
                if k in r.reward:
                    reward[j, c] = r.reward[k]
        arrays = {
            "format": np.array(LOG_FORMAT), "feature_schema": np.array(FEATURE_SCHEMA_VERSION),
            "node_features": np.array(NODE_FEATURES, dtype=str),
            "pod_features": np.array(POD_FEATURES, dtype=str),
            "context_features": np.array(CONTEXT_FEATURES, dtype=str),
            "nodes": np.concatenate([r.decision.nodes for r in recs]).astype(np.float16),
            "node_offsets": np.concatenate([[0], np.cumsum(n_rows)]).astype(np.int64),
            "pod": np.stack([r.decision.pod for r in recs]).astype(np.float32),
            "context": np.stack([r.decision.context for r in recs]).astype(np.float32),
            "chosen": np.array([r.chosen for r in recs], np.int64),
            "best": np.concatenate([np.asarray(r.decision.best, np.int64) if r.best_recorded
                                    else np.zeros(0, np.int64) for r in recs]),
            "best_offsets": np.concatenate([[0], np.cumsum(n_best)]).astype(np.int64),
            "has_gpus": np.array([r.decision.has_gpus for r in recs], bool),
            "model_version": np.array([r.model_version for r in recs], dtype=str),
            "reward": reward, "reward_columns": np.array(columns, dtype=str),
        }
        with atomic_file(path) as f:
            np.savez(f, **arrays)
        self._counts.pop(path, None)

    def _load(self, p: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
        try:
            with np.load(p, allow_pickle=False) as z:
                missing = [k for k in keys if k not in z.files]
                if missing:
                    raise DecisionLogError(f"{p}: not a decision log chunk (missing {', '.join(missing)})")
                return {k: z[k] for k in keys}
        except (DecisionLogError, FileNotFoundError):
            raise
        except Exception as e:  # numpy / zipfile raise many types for a damaged file
            raise DecisionLogError(f"{p}: corrupt or truncated decision log chunk "
                                   f"({e.__class__.__name__}: {e})") from e

    def _count(self, p: Path) -> int:
        st = p.stat()
        key = (st.st_mtime_ns, st.st_size)
        cached = self._counts.get(p)
        if cached is not None and cached[0] == key:
            return cached[1]
        n = len(self._load(p, ("chosen",))["chosen"])
        self._counts[p] = (key, n)
        return n

    def _read(self, p: Path) -> list[LoggedDecision]:
        a = self._load(p, _KEYS)
        if (int(a["feature_schema"]) != FEATURE_SCHEMA_VERSION
                or a["node_features"].tolist() != list(NODE_FEATURES)
                or a["pod_features"].tolist() != list(POD_FEATURES)
                or a["context_features"].tolist() != list(CONTEXT_FEATURES)):
            raise DecisionLogError(
                f"{p}: written with feature schema {int(a['feature_schema'])} "
                f"({len(a['node_features'])} node features), this fedsched uses schema "
                f"{FEATURE_SCHEMA_VERSION} ({len(NODE_FEATURES)} node features)")
        n = len(a["chosen"])
        no, bo = a["node_offsets"], a["best_offsets"]
        shapes_ok = (len(no) == n + 1 and len(bo) == n + 1 and no[-1] == len(a["nodes"])
                     and bo[-1] == len(a["best"]) and len(a["pod"]) == n and len(a["context"]) == n
                     and len(a["has_gpus"]) == n and len(a["model_version"]) == n
                     and a["reward"].shape == (n, len(a["reward_columns"])))
        if not shapes_ok:
            raise DecisionLogError(f"{p}: inconsistent decision log chunk (array lengths disagree)")
        columns = a["reward_columns"].tolist()
        recs = []
        for j in range(n):
            chosen = int(a["chosen"][j])
            best = a["best"][bo[j]:bo[j + 1]].copy()
            recorded = bool(len(best))
            reward = {k: float(v) for k, v in zip(columns, a["reward"][j], strict=True) if not np.isnan(v)}
            recs.append(LoggedDecision(
                Decision(a["nodes"][no[j]:no[j + 1]].copy(), a["pod"][j].copy(), a["context"][j].copy(),
                         best if recorded else np.array([chosen], np.int64), has_gpus=bool(a["has_gpus"][j])),
                chosen, str(a["model_version"][j]), reward, best_recorded=recorded))
        return recs


def summarize(records: list[LoggedDecision]) -> dict[str, Any]:
    """Counts per model version and how many decisions carry a teacher's best set."""
    versions: dict[str, int] = {}
    for r in records:
        versions[r.model_version] = versions.get(r.model_version, 0) + 1
    return {"decisions": len(records), "model_versions": versions,
            "with_best_set": sum(r.best_recorded for r in records)}
