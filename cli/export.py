"""``fedsched export``: write a policy checkpoint's scoring function as an ONNX model."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fedsched.common.schedulers import LEARNED, SHIPPED, default_policy_path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a policy to ONNX", description=__doc__,
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--policy", default=LEARNED,
                   help=f"checkpoint path or a shipped policy name ({', '.join(sorted(SHIPPED))})")
    p.add_argument("--onnx", required=True, metavar="OUT.onnx", help="output file")
    p.add_argument("--opset", type=int, default=17)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from fedsched.common.learning.checkpoint import load_checkpoint
    from fedsched.common.learning.nets import NodeScoringPolicy
    from fedsched.common.learning.onnx import PARITY_ATOL, OnnxScorer, export_onnx, export_weights_onnx

    path = default_policy_path(args.policy) if args.policy in SHIPPED else Path(args.policy)
    policy, meta, _ = load_checkpoint(path)
    rng = np.random.default_rng(0)
    if not isinstance(policy, NodeScoringPolicy):  # a weight policy (TD3 actor)
        from fedsched.common.learning.nets import N_SUMMARY, WEIGHT_TERMS

        out = export_weights_onnx(policy, args.onnx, opset=args.opset, meta=meta)
        print(f"wrote {out} ({out.stat().st_size / 1024:.1f} KiB, opset {args.opset}) from {path}")
        summary = rng.normal(size=(32, N_SUMMARY)).astype(np.float32)
        allowed = np.ones(len(WEIGHT_TERMS), bool)
        with torch.inference_mode():
            ref = policy.weights(torch.from_numpy(summary), torch.from_numpy(allowed)[None]).numpy()
        scorer = OnnxScorer(out)
        got = np.stack([scorer.weights(s, allowed) for s in summary])
        diff = float(np.abs(got - ref).max())
        ok = diff <= PARITY_ATOL
        print(f"parity vs torch on 32 random summaries: max |weight diff| = {diff:.2e} "
              f"({'ok' if ok else 'FAILED'}, tolerance {PARITY_ATOL:g})")
        return 0 if ok else 1
    out = export_onnx(policy, args.onnx, opset=args.opset, meta=meta)
    print(f"wrote {out} ({out.stat().st_size / 1024:.1f} KiB, opset {args.opset}) from {path}")
    if meta.get("scoring"):
        print(f"note: the model holds the network's logits; fedsched scores with {meta['scoring']} "
              "(kube_weight: kube-default's score / 100 times it added to the logits), kept in the "
              "model's fedsched.scoring property")

    # parity vs torch on a random 100-node input
    cfg = policy.cfg
    nodes, pod, ctx = (rng.random(s, dtype=np.float32) for s in ((100, cfg.n_node), cfg.n_pod, cfg.n_ctx))
    with torch.inference_mode():
        ref = policy(torch.from_numpy(nodes)[None], torch.from_numpy(pod)[None], torch.from_numpy(ctx)[None],
                     torch.ones(1, 100, dtype=torch.bool))[0][0].numpy()
    diff = float(np.abs(OnnxScorer(out).logits(nodes, pod, ctx) - ref).max())
    ok = diff <= PARITY_ATOL
    print(f"parity vs torch on 100 random nodes: max |logit diff| = {diff:.2e} "
          f"({'ok' if ok else 'FAILED'}, tolerance {PARITY_ATOL:g})")
    return 0 if ok else 1
