"""Weights as ``{name: ndarray}``: to and from a torch module, and ``.npz`` files written
atomically (the hub's checkpoint, a member's state).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedsched.common.files import atomic_file


def weights_of(policy: torch.nn.Module) -> dict[str, np.ndarray]:
    """A copy of a module's parameters and buffers as numpy arrays."""
    return {k: v.detach().cpu().numpy().copy() for k, v in policy.state_dict().items()}


def load_weights(policy: torch.nn.Module, weights: dict[str, np.ndarray]) -> None:
    """Set a module's parameters from :func:`weights_of`'s form."""
    policy.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in weights.items()})


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` atomically (a reader never sees half a file)."""
    with atomic_file(path) as f:
        np.savez(f, **arrays)


def load_npz(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of ``path``; None when it does not exist."""
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
