"""Tests of the synthetic non-IID cluster generators (fedsched.common.model.synthetic)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedsched.common.model.cluster import QOS_CLASSES, NodeTable, PodTable
from fedsched.common.model.synthetic import (
    PROFILES,
    EdgeProfile,
    GpuProfile,
    WebProfile,
    diurnal_rate,
    generate_cluster,
    write_csvs,
)
from fedsched.common.model.traces import load_nodes, load_pods

NAMES = tuple(PROFILES)
BE, BURSTABLE, LS, GUARANTEED = range(len(QOS_CLASSES))


def assert_nodes_equal(a: NodeTable, b: NodeTable) -> None:
    assert a.names == b.names
    assert a.models == b.models
    for f in ("cpu", "mem", "gpu", "model", "disk_io", "net"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype, f
        np.testing.assert_array_equal(x, y, err_msg=f)


def assert_pods_equal(a: PodTable, b: PodTable) -> None:
    assert a.names == b.names
    for f in ("cpu", "mem", "num_gpu", "gpu_milli", "spec_mask", "qos", "creation", "deletion",
              "disk_io", "net", "app", "cpu_limit", "mem_limit", "cpu_use", "mem_use"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype, f
        np.testing.assert_array_equal(x, y, err_msg=f)  # NaN == NaN here


def fits_some_empty_node(nodes: NodeTable, pods: PodTable) -> np.ndarray:
    """Per pod: does it fit at least one empty node (CPU, memory, GPU count and model)?"""
    ok = (nodes.cpu[None, :] >= pods.cpu[:, None]) & (nodes.mem[None, :] >= pods.mem[:, None])
    ok &= nodes.gpu[None, :] >= pods.num_gpu[:, None]
    model_bit = (pods.spec_mask[:, None] >> np.maximum(nodes.model, 0)[None, :]) & 1
    model_ok = (pods.num_gpu[:, None] == 0) | (pods.spec_mask[:, None] == 0) | (
        (nodes.model[None, :] >= 0) & (model_bit == 1))
    return (ok & model_ok).any(axis=1)


@pytest.fixture(scope="module")
def clusters() -> dict[str, tuple[NodeTable, PodTable]]:
    return {name: generate_cluster(name, seed=7) for name in NAMES}


# ---- determinism ---------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_same_seed_identical(name: str) -> None:
    n1, p1 = generate_cluster(name, seed=11)
    n2, p2 = generate_cluster(name, seed=11)
    assert_nodes_equal(n1, n2)
    assert_pods_equal(p1, p2)


@pytest.mark.parametrize("name", NAMES)
def test_different_seeds_differ(name: str) -> None:
    # Fix the sizes so the difference is in the drawn values, not only in the counts.
    n1, p1 = generate_cluster(name, seed=1, n_nodes=10, n_pods=200)
    n2, p2 = generate_cluster(name, seed=2, n_nodes=10, n_pods=200)
    assert not np.array_equal(p1.creation, p2.creation)
    assert not (np.array_equal(p1.cpu, p2.cpu) and np.array_equal(p1.mem, p2.mem))
    assert not (np.array_equal(n1.cpu, n2.cpu) and np.array_equal(n1.mem, n2.mem))


def test_profiles_use_independent_streams() -> None:
    _, a = generate_cluster("web", seed=3, n_nodes=10, n_pods=100)
    _, b = WebProfile().generate(3, n_nodes=10, n_pods=100)
    assert_pods_equal(a, b)  # generate_cluster is the profile's generate
    _, c = generate_cluster("edge", seed=3, n_nodes=10, n_pods=100)
    assert not np.array_equal(a.creation, c.creation)


@pytest.mark.parametrize("name", NAMES)
def test_counts_and_overrides(name: str) -> None:
    nodes, pods = generate_cluster(name, seed=0, n_nodes=12, n_pods=345)
    assert len(nodes) == 12 and len(pods) == 345
    profile = PROFILES[name]
    nodes, pods = generate_cluster(name, seed=0)
    assert profile.nodes_min <= len(nodes) <= profile.nodes_max
    assert len(pods) == round(profile.pods_per_node * len(nodes))
    assert len(set(nodes.names)) == len(nodes) and len(set(pods.names)) == len(pods)


def test_generate_cluster_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown synthetic profile"):
        generate_cluster("hpc", seed=0)
    with pytest.raises(TypeError, match="no_such_field"):
        generate_cluster("web", seed=0, no_such_field=1)
    with pytest.raises(ValueError, match="seed"):
        generate_cluster("web", seed=-1)
    with pytest.raises(ValueError, match="n_nodes"):
        generate_cluster("gpu", seed=0, n_nodes=0)
    with pytest.raises(ValueError, match="diurnal_amplitude"):
        WebProfile(diurnal_amplitude=1.0)
    with pytest.raises(ValueError, match="share_milli_max"):
        GpuProfile(share_milli_max=1000)
    with pytest.raises(ValueError, match="node_shape_weights"):
        EdgeProfile(node_shape_weights=(1.0,))


def test_profiles_are_frozen_and_documented() -> None:
    import fedsched.common.model.synthetic as synthetic

    for profile in PROFILES.values():
        with pytest.raises(dataclasses.FrozenInstanceError):
            profile.nodes_min = 1  # type: ignore[misc]
        for f in dataclasses.fields(profile):
            assert f"``{f.name}``" in synthetic.__doc__, f"{profile.name}.{f.name} undocumented"


def test_overrides_take_effect() -> None:
    _, pods = generate_cluster("gpu", seed=5, n_nodes=20, n_pods=400, spec_fraction=1.0,
                               cpu_pod_fraction=0.0)
    assert (pods.num_gpu > 0).all()
    assert (pods.spec_mask > 0).all()
    # every constraint names exactly one model
    assert all(bin(int(m)).count("1") == 1 for m in pods.spec_mask)


# ---- CSV round trip ------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_csv_round_trip(tmp_path, name: str, seed: int) -> None:
    nodes, pods = generate_cluster(name, seed=seed)
    nodes_path, pods_path = write_csvs(nodes, pods, tmp_path / "sub", f"{name}{seed}")
    assert nodes_path == tmp_path / "sub" / f"{name}{seed}_nodes.csv"
    assert pods_path == tmp_path / "sub" / f"{name}{seed}_pods.csv"
    header = pods_path.read_text().splitlines()[0]
    assert header == ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,creation_time,"
                      "deletion_time,disk_io_mbps,net_mbps,app,cpu_limit_milli,memory_limit_mib,"
                      "cpu_use_milli,memory_use_mib")
    assert nodes_path.read_text().splitlines()[0] == "sn,cpu_milli,memory_mib,gpu,model,disk_io_mbps,net_mbps"
    loaded_nodes = load_nodes(nodes_path)
    assert_nodes_equal(nodes, loaded_nodes)
    assert_pods_equal(pods, load_pods(pods_path, loaded_nodes))


def test_write_csvs_handles_nan_times(tmp_path) -> None:
    nodes, pods = generate_cluster("edge", seed=0, n_nodes=3, n_pods=5)
    creation = pods.creation.copy()
    creation[1] = np.nan
    deletion = pods.deletion.copy()
    deletion[[1, 2]] = np.nan
    pods = dataclasses.replace(pods, creation=creation, deletion=deletion)
    a, b = write_csvs(nodes, pods, tmp_path, "x")
    assert_pods_equal(pods, load_pods(b, load_nodes(a)))


# ---- validity ------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", range(5))
def test_every_pod_fits_some_empty_node(name: str, seed: int) -> None:
    nodes, pods = generate_cluster(name, seed=seed)
    assert fits_some_empty_node(nodes, pods).all()
    # the loader's own semantics
    assert (pods.gpu_milli <= 1000).all()
    assert ((pods.num_gpu > 0) == (pods.gpu_milli > 0)).all()
    assert (pods.gpu_milli[pods.num_gpu > 1] == 1000).all()
    assert (pods.cpu > 0).all() and (pods.mem > 0).all()
    assert (pods.deletion > pods.creation).all()
    assert (np.diff(pods.creation) >= 0).all()  # arrival order
    assert (pods.creation >= 0).all()
    assert (pods.creation <= PROFILES[name].trace_hours * 3600).all()


def test_fit_guarantee_under_extreme_overrides() -> None:
    # Huge requests get clipped to a node, never produce an unloadable pod.
    nodes, pods = generate_cluster("gpu", seed=1, n_nodes=6, n_pods=300, cores_per_gpu_median=500.0,
                                   mem_per_gpu_median_gib=5000.0, spec_fraction=1.0)
    assert fits_some_empty_node(nodes, pods).all()
    nodes, pods = generate_cluster("web", seed=1, n_nodes=3, n_pods=300, node_shapes=((2, 2),),
                                   node_shape_weights=(1.0,), cpu_median_milli=3000.0)
    assert fits_some_empty_node(nodes, pods).all()
    assert pods.cpu.max() <= 2000 and pods.mem.max() <= 2048
    # 8-GPU jobs on a cluster of 4-GPU nodes are re-drawn among feasible sizes.
    nodes, pods = generate_cluster("gpu", seed=2, n_nodes=10, n_pods=300, gpu_node_shapes=((4, 48, 384),),
                                   gpu_node_shape_weights=(1.0,))
    assert pods.num_gpu.max() <= 4 and fits_some_empty_node(nodes, pods).all()
    nodes, pods = generate_cluster("gpu", seed=2, n_nodes=10, n_pods=50, gpu_node_shapes=((2, 48, 384),),
                                   gpu_node_shape_weights=(1.0,), job_gpu_counts=(8,),
                                   job_gpu_weights=(1.0,))
    assert pods.num_gpu.max() == 2 and fits_some_empty_node(nodes, pods).all()
    # a one-node gpu cluster still has a GPU node
    nodes, pods = generate_cluster("gpu", seed=3, n_nodes=1, n_pods=20, cpu_node_fraction=1.0)
    assert nodes.gpu[0] > 0 and fits_some_empty_node(nodes, pods).all()


# ---- non-IID: the documented differences -----------------------------------------------

def test_web_is_cpu_only_with_io_demand(clusters) -> None:
    nodes, pods = clusters["web"]
    assert nodes.gpu.sum() == 0 and nodes.models == ()
    assert (pods.num_gpu == 0).all() and (pods.spec_mask == 0).all()
    assert set(np.unique(nodes.cpu // 1000)) <= {16, 32, 64}
    assert 40 <= len(nodes) <= 200
    assert (pods.disk_io > 0).mean() > 0.95 and (pods.net > 0).mean() > 0.95
    assert np.median(pods.cpu) <= 500  # small pods
    qos = np.bincount(pods.qos, minlength=4) / len(pods)
    assert qos[BURSTABLE] == qos.max()
    assert qos[BE] > 0.05 and qos[LS] > 0.1


def test_gpu_is_dominated_by_gpu_requests(clusters) -> None:
    nodes, pods = clusters["gpu"]
    gpu_nodes = nodes.gpu > 0
    assert set(np.unique(nodes.gpu[gpu_nodes])) <= {4, 8}
    assert 1 <= len(nodes.models) <= 2
    assert (~gpu_nodes).sum() >= 1  # a few CPU nodes
    assert gpu_nodes.mean() > 0.8
    assert (pods.num_gpu > 0).mean() > 0.8  # GPU share of requests is high
    assert set(np.unique(pods.num_gpu[pods.gpu_milli == 1000])) <= {1, 2, 4, 8}
    assert (pods.num_gpu >= 4).mean() > 0.2  # multi-GPU jobs
    sharing = (pods.num_gpu == 1) & (pods.gpu_milli < 1000)
    assert 0.1 < sharing.mean() < 0.35
    assert 0.1 < (pods.spec_mask[pods.num_gpu > 0] > 0).mean() < 0.4
    qos = np.bincount(pods.qos, minlength=4) / len(pods)
    assert qos[LS] == qos.max()


def test_edge_has_small_nodes_and_pods(clusters) -> None:
    nodes, pods = clusters["edge"]
    assert 5 <= len(nodes) <= 15
    assert nodes.cpu.max() <= 8000 and nodes.mem.max() <= 32 * 1024
    assert nodes.gpu.max() <= 1
    assert pods.cpu.max() <= 2000 and pods.mem.max() <= 4096
    assert (pods.num_gpu[pods.num_gpu > 0] == 1).all() and (pods.gpu_milli < 1000).all()
    qos = np.bincount(pods.qos, minlength=4) / len(pods)
    assert qos[BE] == qos.max() and qos[GUARANTEED] == 0


def test_profiles_differ_pairwise(clusters) -> None:
    web, gpu, edge = (clusters[n][1] for n in ("web", "gpu", "edge"))
    web_n, gpu_n, edge_n = (clusters[n][0] for n in ("web", "gpu", "edge"))
    # node sizes: edge < web < gpu
    assert np.median(edge_n.cpu) < np.median(web_n.cpu) < np.median(gpu_n.cpu)
    # pod CPU sizes: edge and web pods are sub-core, gpu jobs ask for many cores
    assert np.median(edge.cpu) <= np.median(web.cpu) < 1000 < 5000 < np.median(gpu.cpu)
    # memory: gpu jobs ask for tens of GiB, web pods for hundreds of MiB
    assert np.median(gpu.mem) > 20 * np.median(web.mem)
    # lifetimes: edge minutes, web about an hour, gpu hours
    life = {n: np.median(clusters[n][1].deletion - clusters[n][1].creation) for n in clusters}
    assert life["edge"] < 600 < life["web"] < 2 * 3600 < life["gpu"]
    # QoS mixes: different dominant class per profile
    dominant = {n: int(np.argmax(np.bincount(clusters[n][1].qos, minlength=4))) for n in clusters}
    assert len(set(dominant.values())) == 3
    # per-pod I/O scale: gpu jobs stream far more data than web or edge pods
    assert np.median(gpu.disk_io) > 10 * np.median(web.disk_io) > np.median(edge.disk_io)


# ---- arrival processes -----------------------------------------------------------------

def test_diurnal_rate_function() -> None:
    r = diurnal_rate(np.array([14.0, 2.0, 8.0]) * 3600, amplitude=0.5, peak_hour=14.0)
    np.testing.assert_allclose(r, [1.5, 0.5, 1.0], atol=1e-12)


def test_web_arrivals_follow_day_night_cycle() -> None:
    profile = WebProfile(diurnal_amplitude=0.6, diurnal_peak_hour=14.0, trace_hours=96.0)
    _, pods = profile.generate(seed=4, n_nodes=10, n_pods=20000)
    hour = (pods.creation / 3600.0) % 24
    day = ((hour >= 11) & (hour < 17)).sum()  # around the 14:00 peak
    night = ((hour >= 23) | (hour < 5)).sum()  # around the 02:00 trough
    # expected ratio of the two 6-hour windows is (1 + 0.6*0.9) / (1 - 0.6*0.9) ~ 3.3
    assert 2.5 < day / night < 4.5
    # the hourly histogram peaks near 14:00 and bottoms out near 02:00
    counts = np.bincount(hour.astype(int), minlength=24)
    assert abs(int(np.argmax(counts)) - 14) <= 2
    assert min(abs(int(np.argmin(counts)) - 2), 24 - abs(int(np.argmin(counts)) - 2)) <= 2
    # without amplitude the cycle disappears
    _, flat = WebProfile(diurnal_amplitude=0.0, trace_hours=96.0).generate(4, n_nodes=10, n_pods=20000)
    h = (flat.creation / 3600.0) % 24
    assert 0.85 < ((h >= 11) & (h < 17)).sum() / ((h >= 23) | (h < 5)).sum() < 1.15


def _cv(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


def test_edge_arrivals_are_bursty_and_gpu_poisson() -> None:
    _, edge = generate_cluster("edge", seed=1, n_nodes=10, n_pods=3000)
    _, gpu = generate_cluster("gpu", seed=1, n_nodes=10, n_pods=3000)
    # Poisson inter-arrival times have CV 1; clustered bursts push it well above.
    assert 0.85 < _cv(gpu.creation) < 1.15
    assert _cv(edge.creation) > 1.5
    _, smooth = generate_cluster("edge", seed=1, n_nodes=10, n_pods=3000, burst_fraction=0.0)
    assert 0.85 < _cv(smooth.creation) < 1.15


# ---- applications ----------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_replicas_of_an_application_share_shape_and_qos(clusters, name: str) -> None:
    _, pods = clusters[name]
    assert (pods.app >= 0).all()
    first = np.unique(pods.app, return_index=True)[1]
    assert (np.diff(first) > 0).all() and pods.app[0] == 0  # numbered in order of first appearance
    n_apps = int(pods.app.max()) + 1
    assert n_apps == pytest.approx(len(pods) / PROFILES[name].pods_per_app, rel=0.3)
    for col in ("cpu", "mem", "num_gpu", "gpu_milli", "spec_mask", "qos", "disk_io", "net"):
        x = getattr(pods, col)
        np.testing.assert_array_equal(x, x[first][pods.app], err_msg=col)
    sizes = np.bincount(pods.app)
    assert sizes.max() > 4 * sizes.mean()  # heavy-tailed application sizes


def test_applications_leave_the_per_pod_draws_alone() -> None:
    # pods_per_app=1: every pod its own application; times and nodes equal either way
    n1, solo = generate_cluster("web", seed=4, n_nodes=10, n_pods=300, pods_per_app=1.0)
    n2, grouped = generate_cluster("web", seed=4, n_nodes=10, n_pods=300)
    np.testing.assert_array_equal(solo.app, np.arange(300))
    assert_nodes_equal(n1, n2)
    np.testing.assert_array_equal(solo.creation, grouped.creation)
    np.testing.assert_array_equal(solo.deletion, grouped.deletion)
    # every replica carries a request some pod of the per-pod draw had
    assert set(grouped.cpu.tolist()) <= set(solo.cpu.tolist())
    with pytest.raises(ValueError, match="pods_per_app"):
        WebProfile(pods_per_app=0.5)
