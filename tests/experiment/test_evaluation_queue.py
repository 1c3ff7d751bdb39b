"""The main job's evaluation as one queue of replays (:class:`MemberEvaluation`, its policies
added in two steps as the job adds them) gives, member by member, the figures of the
member-by-member form: the best heuristic chosen on validation pods (:func:`_choose` of the
heuristics' validation replays) and :func:`evaluate_member` of the policies with that heuristic
after kube-default, in the order added. Two small members, two seeds."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ProcessPoolExecutor

from fedsched.common.compute import single_threaded_worker
from fedsched.common.federation.members import member_cluster
from fedsched.coordinator.server_app import initial_weights
from fedsched.experiment.baselines import (
    HEURISTICS,
    MemberEvaluation,
    _choose,
    _replay,
    evaluate_member,
)
from fedsched.experiment.config import FederateConfig


def test_one_queue_gives_the_member_by_member_figures() -> None:
    cfg = dataclasses.replace(FederateConfig.quick(), eval_seeds=2, workers=2)
    ids = [2, 3]  # edge (CPU only) and the GPU inventory: the two smallest test sets
    members = [member_cluster(i, size=cfg.member_size) for i in ids]
    start = initial_weights("random", cfg.seed, "online")
    scaled = {k: 0.5 * v for k, v in start.items()}  # another learned policy, added later
    heard: list[str] = []
    with ProcessPoolExecutor(cfg.workers, initializer=single_threaded_worker) as pool:
        queue = MemberEvaluation(members, cfg, pool, ids=ids)
        queue.add([{"kube-default": "kube-default", "random start": start} for _ in ids])
        queue.add([{"scaled": scaled} for _ in ids])
        queued = queue.finish(heard.append)
        for k, (i, m) in enumerate(zip(ids, members, strict=True)):
            best, scores = _choose(list(pool.map(_replay, [(i, cfg.member_size, h, 0, "val", cfg.kube_weight)
                                                           for h in HEURISTICS])))
            ps = {"kube-default": "kube-default",
                  **({f"best heuristic ({best})": best} if best != "kube-default" else {}),
                  "random start": start, "scaled": scaled}
            alone = evaluate_member(i, cfg, ps, pool, m.nodes.total_gpu_milli > 0)
            assert queued[k][:2] == (best, scores)
            assert list(queued[k][2]) == list(alone) and queued[k][2] == alone, m.name
    total = sum(len(figures) * 2 for _, _, figures in queued)  # the test replays, the chosen heuristics' too
    assert heard and heard[-1] == f"evaluation: {total} of {total} test replays done", heard
