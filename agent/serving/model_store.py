"""The policy a serving agent uses, swappable while requests are in flight (hot reload).

:class:`ModelStore` loads a checkpoint (``*.pt``, either kind) or a shipped policy name
(``learned``, ``learned-td3``) into a scorer and names it with a version: the first 12 hex
digits of the file's SHA-256, so the same weights always carry the same version wherever
they run. :meth:`ModelStore.reload` loads the file again and swaps the scorer in one
reference assignment: a request that already holds the old scorer finishes with it, the next
one gets the new one, nothing waits or fails. A reload that fails, whatever the fault (corrupt
file, other feature schema, a tensor of the wrong shape, NaN or infinite weights), keeps the old
model, logs why and reports it to ``on_error`` with a reason (the reload metrics' label).
:meth:`ModelStore.watch` polls the file (size and mtime) and reloads on change: a federation
round writes the personalised weights with an atomic rename, so the watcher never reads a
half-written file, and a bad file never stops it: the next good one is loaded.

:meth:`ModelStore.admin_path` confines what ``/admin/reload`` may name to the policy directory
(the directory of the file the store started with) and the shipped policy names; every other
path gets one :class:`PathNotAllowed` whose message does not depend on the path, so the admin verb
tells nobody which files exist.
"""

from __future__ import annotations

import hashlib
import logging
import os
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
    # Another scorer of the same weights, with caches of its own (the decision-time search needs
    # one for the live state and one for its rollouts); None: only ``scheduler`` exists.
    make_scheduler: Callable[[], Scheduler] | None = field(default=None, compare=False)

    @property
    def kind(self) -> str:
        return WEIGHTS if isinstance(self.scheduler, WeightScheduler) else NODE_SCORING


class PathNotAllowed(ValueError):
    """A reload path outside the policy directory (the same message for every such path)."""


def resolve_policy_path(policy: str) -> Path:
    """A checkpoint path from a path or a shipped policy name."""
    if policy in SHIPPED:
        return default_policy_path(policy)
    return Path(policy)


def file_version(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def load_model(path: Path, backend: str = "numpy") -> LoadedModel:
    """Raises :class:`CheckpointError` (naming the file and the fault) when the file cannot be
    served, whatever the fault."""
    from fedsched.common.learning.checkpoint import load_checkpoint, typical_from_dict
    from fedsched.common.learning.scorers import scoring_options

    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint", "missing")
    try:
        version = file_version(path)
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise CheckpointError(f"{path}: cannot be read ({why})", "unreadable") from e
    policy, meta, _ = load_checkpoint(path)
    try:
        typical = typical_from_dict(meta.get("typical_pods"))
        options = {"backend": backend} if kind_of(policy) == NODE_SCORING else {}
        options.update(scoring_options(meta, kind_of(policy)))

        def make() -> Scheduler:
            return scorer_for(policy, typical, SchedulerContext(), name=f"{path.name}@{version}", **options)

        sched = make()
    except Exception as e:  # the checkpoint loaded but makes no scorer
        raise CheckpointError(f"{path}: cannot be served ({type(e).__name__}: {e})") from e
    return LoadedModel(sched, version, str(path), time.time(), meta, make)


class ModelStore:
    """The current model of a serving agent; see the module doc."""

    def __init__(
        self, policy: str, backend: str = "numpy", on_change: Callable[[LoadedModel], None] | None = None
    ) -> None:
        self.path = resolve_policy_path(policy)
        self.backend = backend
        self.on_change = on_change  # called with the new model after a swap
        self.prepare: Callable[[LoadedModel], None] | None = None  # called before a swap (warm-up)
        self.on_error: Callable[[str, str], None] | None = None  # (reason, message) when a reload fails
        self.current = load_model(self.path, backend)
        # What /admin/reload may name. The directory resolved, not the file: a ConfigMap's policy
        # file is a symlink into a dated directory below it, which changes with every update.
        self.directory = Path(os.path.realpath(self.path.absolute().parent))
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

    def admin_path(self, path: str) -> str:
        """``path`` as ``/admin/reload`` may load it: a shipped policy name, or a file under the
        policy directory (a relative path is taken there; symbolic links are followed before the
        check). Anything else raises :class:`PathNotAllowed` with one message for every path,
        whether it exists or not."""
        if path in SHIPPED:
            return path
        refused = PathNotAllowed(f"only files in the policy directory {self.directory} or shipped "
                                 f"policy names ({', '.join(sorted(SHIPPED))}) may be loaded")
        candidate = self.directory / path  # an absolute path replaces the directory
        try:
            real = Path(os.path.realpath(candidate))
        except (ValueError, OSError):  # a NUL byte, a symlink loop
            raise refused from None
        if real == self.directory or not real.is_relative_to(self.directory):
            raise refused
        return str(candidate)  # as named: a symlink in the directory is followed when loaded

    def reload(self, path: str | None = None, strict: bool = False) -> tuple[bool, str]:
        """(changed, message). Loads ``path`` (default: the current file) and swaps it in.

        Any failure keeps the current model, is logged and reported to ``on_error``; then
        ``strict`` raises it as a :class:`CheckpointError` (``/admin/reload`` answers it with a
        4xx), otherwise ``(False, why)`` comes back.
        """
        with self._lock:
            target = self.path
            try:
                target = resolve_policy_path(path) if path else self.path
                new = load_model(target, self.backend)
                unchanged = new.version == self.current.version and new.path == self.current.path
                if not unchanged and self.prepare is not None:
                    self.prepare(new)
            except Exception as e:  # whatever the fault: the old model serves on
                if target == self.path:
                    self._stamp = self._file_stamp()  # retried when the file changes again
                error = e if isinstance(e, CheckpointError) else CheckpointError(
                    f"{target}: cannot be loaded ({type(e).__name__}: {e})",
                    "unreadable" if isinstance(e, OSError) else "internal")
                log.warning("model reload from %s failed (%s), keeping %s: %s",
                            target, error.reason, self.current.version, error)
                if self.on_error is not None:
                    self.on_error(error.reason, str(error))
                if strict and error is e:
                    raise
                if strict:
                    raise error from e
                return False, str(error)
            old = self.current
            self.path = target
            self._stamp = self._file_stamp()
            if unchanged:
                return False, f"unchanged ({old.version})"
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
                    try:
                        self.reload()
                    except Exception:  # on_change failing after the swap: the watcher goes on
                        log.exception("model watcher: reload of %s failed", self.path)

        self._thread = threading.Thread(target=loop, name="fedsched-model-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
