"""Which application a Kubernetes pod belongs to, as the int code ``Pod.app`` carries.

The policy predicts a new pod's use from what its running siblings use (``Telemetry.app_usage``,
feature schema 2); the replay simulator knows each pod's application from its trace, the
serving cache derives it from the pod object with :func:`owner_key`:

- a pod with a controller ``ownerReference`` (the one with ``controller: true``) belongs to
  that controller, by kind and name: a ``ReplicaSet`` whose name is the pod's
  ``pod-template-hash`` label appended to a base name (``web-7d9c5b6f8`` with hash
  ``7d9c5b6f8``) is a Deployment's, and the pod belongs to that ``Deployment`` (``web``), so
  the pods of all its rollouts are one application; ``StatefulSet``, ``DaemonSet``, ``Job``,
  a bare ``ReplicaSet`` and any other controller are the owner's kind and name as they are
  (a CronJob's runs are Jobs of their own names: the pod does not name the CronJob);
- a pod without a controller is an application of its own (kind ``Pod``, its name);
- the key is namespaced: ``(namespace, kind, name)``; an object without a readable name has
  none (code -1, unknown).

:class:`AppCodes` numbers the keys 0, 1, ... in order of first sight, stable for the life of
the cache, thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["TEMPLATE_HASH_LABEL", "AppCodes", "AppKey", "owner_key"]

TEMPLATE_HASH_LABEL = "pod-template-hash"  # set by the Deployment controller on its ReplicaSets' pods

AppKey = tuple[str, str, str]  # (namespace, kind, name)


def _str(x: Any) -> str:
    return x if isinstance(x, str) else ""


def owner_key(obj: Any) -> AppKey | None:
    """``(namespace, kind, name)`` of the application the Pod object ``obj`` belongs to, None
    when it cannot be told (no metadata, no name)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return None
    ns = _str(meta.get("namespace"))
    refs = meta.get("ownerReferences")
    refs = refs if isinstance(refs, list) else []
    ctrl = next((r for r in refs if isinstance(r, Mapping) and r.get("controller") is True), None)
    if ctrl is not None:
        kind, name = _str(ctrl.get("kind")), _str(ctrl.get("name"))
        if kind and name:
            if kind == "ReplicaSet":
                labels = meta.get("labels")
                h = _str(labels.get(TEMPLATE_HASH_LABEL)) if isinstance(labels, Mapping) else ""
                if h and name.endswith("-" + h) and len(name) > len(h) + 1:
                    return ns, "Deployment", name[: -len(h) - 1]
            return ns, kind, name
    name = _str(meta.get("name"))
    return (ns, "Pod", name) if name else None


class AppCodes:
    """Application keys -> stable int codes (0, 1, ... in order of first sight); None -> -1."""

    def __init__(self) -> None:
        self._codes: dict[AppKey, int] = {}
        self._next = 0
        self._lock = threading.Lock()

    def code(self, key: AppKey | None) -> int:
        if key is None:
            return -1
        c = self._codes.get(key)
        if c is not None:
            return c
        with self._lock:
            c = self._codes.get(key)
            if c is None:
                c = self._codes[key] = self._next
                self._next += 1
            return c

    def get(self, key: AppKey) -> int | None:
        """The code of ``key`` if it has one (no new code)."""
        return self._codes.get(key)

    def prune(self, keep: Iterable[int]) -> int:
        """Forget the keys whose code is not in ``keep``; returns how many. Codes are never
        reused: a forgotten key seen again gets a new one."""
        keep = set(keep)
        with self._lock:
            drop = [k for k, c in self._codes.items() if c not in keep]
            for k in drop:
                del self._codes[k]
        return len(drop)

    def __len__(self) -> int:
        return len(self._codes)
