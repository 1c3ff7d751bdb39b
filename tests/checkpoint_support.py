"""Malformed checkpoints for the refusal tests: a shipped checkpoint, loaded and corrupted one way.

Each corruption names what a careless operator or a broken training run could leave in the policy
file (a tensor of the wrong shape, a missing tensor, metadata of the wrong type, a negative size,
non-finite weights); :func:`write_corrupt` writes one with ``torch.save`` (atomically, as a
federation round writes the real thing).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedsched.common.schedulers import LEARNED_ONLINE, default_policy_path


def _blob() -> dict[str, Any]:
    return torch.load(default_policy_path(LEARNED_ONLINE), map_location="cpu", weights_only=True)


def _wrong_shape(b: dict) -> None:
    b["state_dict"]["head_out.weight"] = torch.zeros(1, 63)


def _missing_key(b: dict) -> None:
    del b["state_dict"]["head_out.bias"]


def _policy_meta_str(b: dict) -> None:
    b["meta"]["policy"] = "hidden=64"


def _meta_list(b: dict) -> None:
    b["meta"] = [1, 2, 3]


def _kind_list(b: dict) -> None:
    b["meta"]["kind"] = ["node-scoring"]


def _typical_list(b: dict) -> None:
    b["meta"]["typical_pods"] = [1, 2, 3]


def _state_dict_list(b: dict) -> None:
    b["state_dict"] = list(b["state_dict"].values())


def _negative_size(b: dict) -> None:
    b["meta"]["policy"]["hidden"] = -4


def _nan(b: dict) -> None:
    b["state_dict"]["head_out.bias"][0] = float("nan")


def _inf(b: dict) -> None:
    b["state_dict"]["enc_node.weight"][3, 5] = float("-inf")


def _nan_critic(b: dict) -> None:  # a tensor serving never uses: refused all the same
    b["state_dict"]["critic.2.bias"][0] = float("nan")


# name -> (corruption, a phrase the refusal must contain)
CORRUPTIONS: dict[str, tuple[Callable[[dict], None], str]] = {
    "wrong-shape": (_wrong_shape, "head_out.weight"),
    "missing-key": (_missing_key, "head_out.bias"),
    "policy-metadata-str": (_policy_meta_str, "metadata"),
    "metadata-list": (_meta_list, "metadata"),
    "kind-list": (_kind_list, "kind"),
    "typical-pods-list": (_typical_list, "typical_pods"),
    "state-dict-list": (_state_dict_list, "state_dict"),
    "negative-size": (_negative_size, "hidden"),
    "nan": (_nan, "non-finite"),
    "inf": (_inf, "non-finite"),
    "nan-critic": (_nan_critic, "critic.2.bias"),
}
NON_FINITE = ("nan", "inf", "nan-critic")


def write_corrupt(path: Path, corruption: str) -> Path:
    """The shipped online policy with ``corruption`` applied, written to ``path`` atomically."""
    blob = _blob()
    CORRUPTIONS[corruption][0](blob)
    return write_blob(path, blob)


def write_scaled(path: Path, factor: float) -> Path:
    """A valid checkpoint: the shipped online policy with every weight times ``factor``."""
    blob = _blob()
    blob["state_dict"] = {k: v * factor for k, v in blob["state_dict"].items()}
    return write_blob(path, blob)


def write_blob(path: Path, blob: dict) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(blob, tmp)
    os.replace(tmp, path)
    return path
