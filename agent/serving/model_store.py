"""The policy a serving agent uses, swappable while requests are in flight (hot reload).

:class:`ModelStore` loads a checkpoint (``*.pt``, either kind) or a shipped policy name
(``learned``, ``learned-td3``) into a scorer and names it with a version: the first 12 hex
digits of the file's SHA-256, so the same weights always carry the same version wherever
they run. :meth:`ModelStore.reload` loads the file again and swaps the scorer in one
reference assignment: a request that already holds the old scorer finishes with it, the next
one gets the new one, nothing waits or fails. A reload that fails (corrupt file, other
feature schema) keeps the old model and says why. :meth:`ModelStore.watch` polls the file
(size and mtime) and reloads on change: a federation round writes the personalised weights
with an atomic rename, so the watcher never reads a half-written file.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fedsched.common.learning.checkpoint import CheckpointError
from fedsched.common.learning.kinds import NODE_SCORING, WEIGHTS, kind_of
from fedsched.common.learning.scorers import WeightScheduler, scorer_for
from fedsched.common.schedulers import SHIPPED, Scheduler, SchedulerContext, default_policy_path

log = logging.getLogger("fedsched.serve")


@dataclass(frozen=True)
class LoadedModel:
    scheduler: Scheduler  # a PolicyScheduler or a WeightScheduler
    version: str
    path: str
    loaded_at: float
    meta: dict = field(default_factory=dict, compare=False)  # the checkpoint's metadata (the roll-out gate)

    @property
    def kind(self) -> str:
        return WEIGHTS if isinstance(self.scheduler, WeightScheduler) else NODE_SCORING


def resolve_policy_path(policy: str) -> Path:
    """A checkpoint path from a path or a shipped policy name."""
    if policy in SHIPPED:
        return default_policy_path(policy)
    return Path(policy)


def file_version(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def load_model(path: Path, backend: str = "numpy") -> LoadedModel:
    """Raises :class:`CheckpointError` when the file cannot be served."""
    from fedsched.common.learning.checkpoint import load_checkpoint, typical_from_dict

    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint")
    version = file_version(path)
    policy, meta, _ = load_checkpoint(path)
    typical = typical_from_dict(meta.get("typical_pods"))
    options = {"backend": backend} if kind_of(policy) == NODE_SCORING else {}
    sched = scorer_for(policy, typical, SchedulerContext(), name=f"{path.name}@{version}", **options)
    return LoadedModel(sched, version, str(path), time.time(), meta)


class ModelStore:
    """The current model of a serving agent; see the module doc."""

    def __init__(
        self, policy: str, backend: str = "numpy", on_change: Callable[[LoadedModel], None] | None = None
    ) -> None:
        self.path = resolve_policy_path(policy)
        self.backend = backend
        self.on_change = on_change  # called with the new model after a swap
        self.prepare: Callable[[LoadedModel], None] | None = None  # called before a swap (warm-up)
        self.on_error: Callable[[str], None] | None = None  # called when a reload fails
        self.current = load_model(self.path, backend)
        self._stamp = self._file_stamp()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def version(self) -> str:
        return self.current.version

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def reload(self, path: str | None = None) -> tuple[bool, str]:
        """(changed, message). Loads ``path`` (default: the current file) and swaps it in."""
        with self._lock:
            target = resolve_policy_path(path) if path else self.path
            try:
                new = load_model(target, self.backend)
            except (CheckpointError, OSError) as e:
                if target == self.path:
                    self._stamp = self._file_stamp()  # retried when the file changes again
                log.warning("model reload from %s failed, keeping %s: %s", target, self.current.version, e)
                if self.on_error is not None:
                    self.on_error(str(e))
                return False, str(e)
            old = self.current
            self.path = target
            self._stamp = self._file_stamp()
            if new.version == old.version and new.path == old.path:
                return False, f"unchanged ({old.version})"
            if self.prepare is not None:
                self.prepare(new)
            self.current = new
            log.info("model reloaded: %s -> %s from %s", old.version, new.version, target)
            if self.on_change is not None:
                self.on_change(new)
            return True, f"{old.version} -> {new.version}"

    def watch(self, interval_s: float = 2.0) -> None:
        """Reload whenever the checkpoint file changes (a background thread)."""
        if self._thread is not None:
            return

        def loop() -> None:
            while not self._stop.wait(interval_s):
                stamp = self._file_stamp()
                if stamp is not None and stamp != self._stamp:
                    self.reload()

        self._thread = threading.Thread(target=loop, name="fedsched-model-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
