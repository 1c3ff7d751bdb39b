"""Tests of the strict openb CSV loader (fedsched.common.model.traces)."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsched.common.model.cluster import QOS_CLASSES
from fedsched.common.model.traces import (
    DEFAULT_DISK_IO_MBPS,
    DEFAULT_NET_MBPS,
    TraceError,
    builtin_trace,
    infer_apps,
    load_nodes,
    load_pods,
)

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,creation_time,deletion_time"
NODES_OK = [
    "n0,32000,131072,0,",
    "n1,64000,262144,8,V100",
    "n2,96000,524288,4,A100",
]
POD_FILES = ("default", "gpushare40", "gpushare80", "gpuspec10", "gpuspec33", "multigpu20",
             "multigpu50", "cpu050", "cpu250")


def write(path: Path, header: str | None, rows: list[str]) -> Path:
    lines = ([header] if header is not None else []) + rows
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def nodes_file(tmp_path) -> Path:
    return write(tmp_path / "nodes.csv", NODE_HEADER, NODES_OK)


@pytest.fixture
def nodes(nodes_file):
    return load_nodes(nodes_file)


def expect_error(fn, path: Path, *, line: int | None, column: str | None, match: str) -> TraceError:
    """``fn()`` raises a TraceError whose message names file, line and column."""
    with pytest.raises(TraceError) as info:
        fn()
    err = info.value
    msg = str(err)
    assert isinstance(err, ValueError)
    assert str(path) in msg and err.path == str(path)
    assert err.line == line and err.column == column
    if line is not None:
        assert f"line {line}" in msg
    if column is not None:
        assert f"column '{column}'" in msg
    assert match in msg, msg
    return err


# ---- the built-in openb files ------------------------------------------------------------

@pytest.fixture(scope="module")
def openb_nodes():
    return load_nodes(builtin_trace("openb_node_list_all_node.csv"))


def test_builtin_node_lists(openb_nodes) -> None:
    assert len(openb_nodes) == 1523
    assert int(openb_nodes.gpu.sum()) == 6212
    assert openb_nodes.models == ("A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32")
    assert ((openb_nodes.model >= 0) == (openb_nodes.gpu > 0)).all()
    assert (openb_nodes.disk_io == DEFAULT_DISK_IO_MBPS).all()
    assert (openb_nodes.net == DEFAULT_NET_MBPS).all()
    gpu_only = load_nodes(builtin_trace("openb_node_list_gpu_node.csv"))
    assert len(gpu_only) == 1213 and (gpu_only.gpu > 0).all()
    assert int(gpu_only.gpu.sum()) == 6212


def test_builtin_default_pods(openb_nodes) -> None:
    pods = load_pods(builtin_trace("openb_pod_list_default.csv"), openb_nodes)
    assert len(pods) == 8152
    assert pods.names[0] == "openb-pod-0000"
    assert not np.isnan(pods.creation).any()
    assert (pods.disk_io == 0).all() and (pods.net == 0).all()
    assert set(np.unique(pods.qos)) <= set(range(len(QOS_CLASSES)))


@pytest.mark.parametrize("name", ["multigpu20", "multigpu50"])
def test_builtin_five_column_files(openb_nodes, name: str) -> None:
    path = builtin_trace(f"openb_pod_list_{name}.csv")
    assert path.read_text().splitlines()[0] == "name,cpu_milli,memory_mib,num_gpu,gpu_milli"
    pods = load_pods(path, openb_nodes)
    assert len(pods) == {"multigpu20": 8324, "multigpu50": 9061}[name]
    assert np.isnan(pods.creation).all() and np.isnan(pods.deletion).all()
    assert (pods.qos == QOS_CLASSES.index("Burstable")).all()  # empty QoS is Burstable
    assert (pods.spec_mask == 0).all()


@pytest.mark.parametrize("name", POD_FILES)
def test_builtin_pod_files_load(openb_nodes, name: str) -> None:
    path = builtin_trace(f"openb_pod_list_{name}.csv")
    rows = len(path.read_text().splitlines()) - 1
    if name.startswith("gpuspec"):
        # openb-pod-1639 asks for 120 cores and 720 GiB on G2 nodes, which have 96 and 384 GiB.
        expect_error(lambda: load_pods(path, openb_nodes), path, line=1641,
                     column="cpu_milli,memory_mib",
                     match="'openb-pod-1639' is larger than every node")
        pods = load_pods(path, openb_nodes, allow_oversized=True)
    else:
        pods = load_pods(path, openb_nodes)
    assert len(pods) == rows


def test_builtin_trace_unknown_name() -> None:
    with pytest.raises(FileNotFoundError, match=r"openb_pod_list_default\.csv"):
        builtin_trace("nope.csv")


# ---- valid inputs --------------------------------------------------------------------

def test_extra_columns_are_ignored(tmp_path, nodes) -> None:
    n = write(tmp_path / "n.csv", "rack," + NODE_HEADER + ",comment",
              [f"r1,{r},whatever" for r in NODES_OK])
    loaded = load_nodes(n)
    assert loaded.names == nodes.names and loaded.models == nodes.models
    np.testing.assert_array_equal(loaded.cpu, nodes.cpu)
    np.testing.assert_array_equal(loaded.model, nodes.model)
    p = write(tmp_path / "p.csv", POD_HEADER + ",pod_phase,scheduled_time,foo",
              ["p0,1000,1024,1,500,V100,LS,10,20,Running,11,x",
               "p1,2000,2048,0,0,,BE,5,,Failed,,y"])
    pods = load_pods(p, loaded)
    assert pods.names == ("p0", "p1")
    np.testing.assert_array_equal(pods.cpu, [1000, 2000])
    np.testing.assert_array_equal(pods.gpu_milli, [500, 0])
    assert pods.spec_mask[0] == 1 << loaded.models.index("V100")
    np.testing.assert_array_equal(pods.qos, [QOS_CLASSES.index("LS"), QOS_CLASSES.index("BE")])


def test_empty_times_are_nan(tmp_path, nodes) -> None:
    p = write(tmp_path / "p.csv", POD_HEADER,
              ["p0,1000,1024,0,0,,,,", "p1,1000,1024,0,0,,,100,", "p2,1000,1024,0,0,,,100,250.5"])
    pods = load_pods(p, nodes)
    assert math.isnan(pods.creation[0]) and math.isnan(pods.deletion[0])
    assert pods.creation[1] == 100 and math.isnan(pods.deletion[1])
    assert pods.deletion[2] == 250.5


def test_optional_columns_and_defaults(tmp_path) -> None:
    n = write(tmp_path / "n.csv", "sn,cpu_milli,memory_mib,gpu,disk_io_mbps,net_mbps",
              ["a,4000,8192,0,,", "b,4000,8192,2,300.5,2500"])
    nodes = load_nodes(n)  # no model column; a GPU node without model gets -1
    np.testing.assert_array_equal(nodes.model, [-1, -1])
    assert nodes.models == ()
    np.testing.assert_array_equal(nodes.disk_io, [DEFAULT_DISK_IO_MBPS, 300.5])
    np.testing.assert_array_equal(nodes.net, [DEFAULT_NET_MBPS, 2500.0])
    p = write(tmp_path / "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,disk_io_mbps,net_mbps",
              ["x,100,100,2,1000,1.5,", "y,100,100,1,250,,"])
    pods = load_pods(p, nodes)
    np.testing.assert_array_equal(pods.disk_io, [1.5, 0.0])
    np.testing.assert_array_equal(pods.net, [0.0, 0.0])
    assert (pods.qos == QOS_CLASSES.index("Burstable")).all()


def test_qos_aliases(tmp_path, nodes) -> None:
    names = ["BE", "BestEffort", "Burstable", "LS", "LSR", "Guaranteed", "guaranteed", ""]
    p = write(tmp_path / "p.csv", POD_HEADER,
              [f"p{k},100,100,0,0,,{q},," for k, q in enumerate(names)])
    np.testing.assert_array_equal(load_pods(p, nodes).qos, [0, 0, 1, 2, 2, 3, 3, 1])


# ---- bad inputs: each names file, line and column --------------------------------------

def test_missing_file(tmp_path) -> None:
    path = tmp_path / "absent.csv"
    expect_error(lambda: load_nodes(path), path, line=None, column=None, match="file not found")


@pytest.mark.parametrize("column", ["sn", "cpu_milli", "memory_mib", "gpu"])
def test_missing_node_column(tmp_path, column: str) -> None:
    cols = NODE_HEADER.split(",")
    keep = [i for i, c in enumerate(cols) if c != column]
    rows = [",".join(r.split(",")[i] for i in keep) for r in NODES_OK]
    path = write(tmp_path / "n.csv", ",".join(cols[i] for i in keep), rows)
    expect_error(lambda: load_nodes(path), path, line=1, column=column, match="missing column")


@pytest.mark.parametrize("column", ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"])
def test_missing_pod_column(tmp_path, nodes, column: str) -> None:
    cols = [c for c in POD_HEADER.split(",") if c != column]
    path = write(tmp_path / "p.csv", ",".join(cols), [",".join(["1"] * len(cols))])
    expect_error(lambda: load_pods(path, nodes), path, line=1, column=column, match="missing column")


@pytest.mark.parametrize(("row", "column", "match"), [
    ("n3,lots,1024,0,", "cpu_milli", "not a number: 'lots'"),
    ("n3,1000,1.5,0,", "memory_mib", "not an integer"),
    ("n3,1000,1024,inf,", "gpu", "not a finite number"),
    ("n3,1000,1024,nan,", "gpu", "not a finite number"),
    ("n3,1000,,0,", "memory_mib", "empty value"),
    ("n3,-1000,1024,0,", "cpu_milli", "negative value -1000"),
    ("n3,1000,-1,0,", "memory_mib", "negative value"),
    ("n3,1000,1024,-2,", "gpu", "negative value"),
    ("n3,0,1024,0,", "cpu_milli", "must be positive"),
    ("n3,1000,1024,9,V100", "gpu", "at most 8"),
    (",1000,1024,0,", "sn", "empty node name"),
    ("n1,1000,1024,0,", "sn", "duplicate node name 'n1' (first on line 3)"),
    ("n3,1000,1024,0,,fast,", "disk_io_mbps", "not a number"),
    ("n3,1000,1024,0,,,-5", "net_mbps", "negative value"),
])
def test_bad_node_values(tmp_path, row: str, column: str, match: str) -> None:
    header = NODE_HEADER + ",disk_io_mbps,net_mbps" if row.count(",") > 4 else NODE_HEADER
    path = write(tmp_path / "n.csv", header, [*NODES_OK, row])
    expect_error(lambda: load_nodes(path), path, line=5, column=column, match=match)


@pytest.mark.parametrize(("row", "column", "match"), [
    ("bad,x1,1024,0,0,,,,", "cpu_milli", "not a number: 'x1'"),
    ("bad,1000,1024,one,1000,,,,", "num_gpu", "not a number"),
    ("bad,-1,1024,0,0,,,,", "cpu_milli", "negative value -1"),
    ("bad,1000,1024,0,0,,,-3,", "creation_time", "negative value"),
    ("bad,1000,1024,1,1200,,,,", "gpu_milli", "gpu_milli 1200 exceeds one GPU (1000)"),
    ("bad,1000,1024,1,0,,,,", "gpu_milli", "num_gpu > 0 with gpu_milli 0"),
    ("bad,1000,1024,0,500,,,,", "num_gpu", "gpu_milli > 0 with num_gpu 0"),
    ("bad,1000,1024,2,500,,,,", "gpu_milli", "multi-GPU pod must take whole GPUs"),
    ("bad,1000,1024,0,0,,Premium,,", "qos", "unknown QoS class 'Premium'"),
    ("bad,1000,1024,1,1000,H100,,,", "gpu_spec", "gpu_spec 'H100' names no GPU model"),
    ("bad,1000,1024,1,1000,H100|B200,,,", "gpu_spec", "names no GPU model of the cluster (A100, V100)"),
    ("bad,1000,1024,0,0,,,100,50", "deletion_time", "deletion_time before creation_time"),
    (",1000,1024,0,0,,,,", "name", "empty pod name"),
    ("bad,1000", "memory_mib", "empty value"),  # short row: the first missing required cell
])
def test_bad_pod_values(tmp_path, nodes, row: str, column: str, match: str) -> None:
    path = write(tmp_path / "p.csv", POD_HEADER, ["ok0,1000,1024,0,0,,,,", "ok1,1000,1024,1,1000,,,,", row])
    expect_error(lambda: load_pods(path, nodes), path, line=4, column=column, match=match)


def test_empty_file(tmp_path, nodes) -> None:
    path = write(tmp_path / "e.csv", None, [])
    # A file-level error: the loader names the file but no line or column.
    expect_error(lambda: load_nodes(path), path, line=None, column=None, match="empty file")
    expect_error(lambda: load_pods(path, nodes), path, line=None, column=None, match="empty file")
    blank = write(tmp_path / "b.csv", None, [" , ,"])
    expect_error(lambda: load_nodes(blank), blank, line=None, column=None, match="empty file")


def test_header_only_file(tmp_path, nodes) -> None:
    path = write(tmp_path / "h.csv", NODE_HEADER, [])
    expect_error(lambda: load_nodes(path), path, line=2, column=None, match="no data rows")
    pods = write(tmp_path / "hp.csv", POD_HEADER, ["", ",,,,"])  # blank rows are not data
    expect_error(lambda: load_pods(pods, nodes), pods, line=2, column=None, match="no data rows")


@pytest.mark.parametrize(("row", "column"), [
    ("big,128000,1024,0,0,,,,", "cpu_milli"),
    ("big,1000,600000,0,0,,,,", "memory_mib"),
    ("big,1000,1024,8,1000,A100,,,", "num_gpu"),  # the 8-GPU node is a V100
])
def test_pod_larger_than_every_node(tmp_path, nodes, row: str, column: str) -> None:
    path = write(tmp_path / "p.csv", POD_HEADER, ["ok,1000,1024,0,0,,,,", row, "ok2,1000,1024,0,0,,,,"])
    expect_error(lambda: load_pods(path, nodes), path, line=3, column=column,
                 match="pod 'big' is larger than every node")
    pods = load_pods(path, nodes, allow_oversized=True)
    assert pods.names == ("ok", "big", "ok2")
    assert pods.cpu[1] == int(row.split(",")[1]) and pods.mem[1] == int(row.split(",")[2])


def test_oversized_reports_first_offending_line(tmp_path, nodes) -> None:
    rows = ["ok,1000,1024,0,0,,,,"] * 3 + ["big1,1000,999999,0,0,,,,", "big0,200000,1024,0,0,,,,"]
    path = write(tmp_path / "p.csv", POD_HEADER, rows)
    expect_error(lambda: load_pods(path, nodes), path, line=5, column="memory_mib", match="'big1'")


def test_gpu_spec_on_cpu_pod_is_not_an_error(tmp_path, nodes) -> None:
    path = write(tmp_path / "p.csv", POD_HEADER, ["p,1000,1024,0,0,H100,,,"])
    assert load_pods(path, nodes).spec_mask[0] == 0


def test_gpu_spec_keeps_known_models(tmp_path, nodes) -> None:
    path = write(tmp_path / "p.csv", POD_HEADER, ["p,1000,1024,1,1000, A100 | H100 |V100,,,"])
    assert load_pods(path, nodes).spec_mask[0] == 0b11  # A100 and V100, H100 dropped


# ---- file-level robustness: blank lines, huge numbers, encodings ------------------------

def test_line_numbers_count_blank_lines(tmp_path) -> None:
    path = write(tmp_path / "n.csv", NODE_HEADER, ["a,1000,1024,0,", "", "b,x,1024,0,"])
    expect_error(lambda: load_nodes(path), path, line=4, column="cpu_milli", match="not a number")


def test_huge_integer_is_a_trace_error(tmp_path) -> None:
    path = write(tmp_path / "n.csv", NODE_HEADER, ["a,1e30,1024,0,"])
    expect_error(lambda: load_nodes(path), path, line=2, column="cpu_milli", match="too large")


def test_non_utf8_is_a_trace_error(tmp_path) -> None:
    path = tmp_path / "n.csv"
    path.write_bytes(f"{NODE_HEADER}\na,\xff,1024,0,\n".encode("latin-1"))
    with pytest.raises(TraceError):
        load_nodes(path)


def test_utf8_bom_header(tmp_path) -> None:
    path = tmp_path / "n.csv"
    path.write_text(f"{NODE_HEADER}\na,1000,1024,0,\n", encoding="utf-8-sig")
    assert load_nodes(path).names == ("a",)


# ---- property: random valid tables survive a CSV round trip ----------------------------

MODELS = ("A100", "T4", "V100")
FLOATS = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def cluster_tables(draw):
    n_nodes = draw(st.integers(1, 6))
    node_rows = []
    for k in range(n_nodes):
        gpus = draw(st.integers(0, 8))
        node_rows.append({
            "sn": f"node-{k}", "cpu": draw(st.integers(1, 10**6)), "mem": draw(st.integers(1, 10**7)),
            "gpu": gpus, "model": draw(st.sampled_from(MODELS)) if gpus else "",
            "disk": draw(FLOATS), "net": draw(FLOATS),
        })
    pod_rows = []
    for k in range(draw(st.integers(1, 10))):
        host = node_rows[draw(st.integers(0, n_nodes - 1))]  # the pod must fit this node
        kind = draw(st.sampled_from(["cpu", "share", "whole"])) if host["gpu"] else "cpu"
        num_gpu, milli, spec = 0, 0, ""
        if kind == "share":
            num_gpu, milli = 1, draw(st.integers(1, 999))
        elif kind == "whole":
            num_gpu, milli = draw(st.integers(1, host["gpu"])), 1000
        if num_gpu and draw(st.booleans()):
            others = draw(st.lists(st.sampled_from(MODELS), max_size=2))
            spec = "|".join(dict.fromkeys([host["model"], *others]))
        creation = draw(st.one_of(st.none(), FLOATS))
        deletion = None
        if creation is not None:
            deletion = draw(st.one_of(st.none(), FLOATS.map(lambda x, c=creation: c + x)))
        pod_rows.append({
            "name": f"pod-{k}", "cpu": draw(st.integers(0, host["cpu"])),
            "mem": draw(st.integers(0, host["mem"])), "num_gpu": num_gpu, "milli": milli, "spec": spec,
            "qos": draw(st.sampled_from(QOS_CLASSES)), "creation": creation, "deletion": deletion,
            "disk": draw(FLOATS), "net": draw(FLOATS),
        })
    return node_rows, pod_rows


def _num(x: float | None) -> str:
    return "" if x is None else repr(x)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_tables())
def test_random_tables_round_trip(tables) -> None:
    node_rows, pod_rows = tables
    with tempfile.TemporaryDirectory() as d:
        npath = write(Path(d) / "n.csv", NODE_HEADER + ",disk_io_mbps,net_mbps", [
            f"{r['sn']},{r['cpu']},{r['mem']},{r['gpu']},{r['model']},{r['disk']!r},{r['net']!r}"
            for r in node_rows])
        ppath = write(Path(d) / "p.csv", POD_HEADER + ",disk_io_mbps,net_mbps", [
            f"{r['name']},{r['cpu']},{r['mem']},{r['num_gpu']},{r['milli']},{r['spec']},{r['qos']},"
            f"{_num(r['creation'])},{_num(r['deletion'])},{r['disk']!r},{r['net']!r}" for r in pod_rows])
        nodes = load_nodes(npath)
        pods = load_pods(ppath, nodes)
    assert nodes.names == tuple(r["sn"] for r in node_rows)
    np.testing.assert_array_equal(nodes.cpu, [r["cpu"] for r in node_rows])
    np.testing.assert_array_equal(nodes.mem, [r["mem"] for r in node_rows])
    np.testing.assert_array_equal(nodes.gpu, [r["gpu"] for r in node_rows])
    np.testing.assert_array_equal(nodes.disk_io, [r["disk"] for r in node_rows])
    np.testing.assert_array_equal(nodes.net, [r["net"] for r in node_rows])
    assert nodes.models == tuple(sorted({r["model"] for r in node_rows if r["gpu"]}))
    assert [nodes.models[m] if m >= 0 else "" for m in nodes.model] == [r["model"] for r in node_rows]

    assert pods.names == tuple(r["name"] for r in pod_rows)
    for field, key in (("cpu", "cpu"), ("mem", "mem"), ("num_gpu", "num_gpu"), ("gpu_milli", "milli"),
                       ("disk_io", "disk"), ("net", "net")):
        np.testing.assert_array_equal(getattr(pods, field), [r[key] for r in pod_rows], err_msg=field)
    nan = float("nan")
    np.testing.assert_array_equal(pods.creation, [nan if r["creation"] is None else r["creation"]
                                                  for r in pod_rows])
    np.testing.assert_array_equal(pods.deletion, [nan if r["deletion"] is None else r["deletion"]
                                                  for r in pod_rows])
    np.testing.assert_array_equal(pods.qos, [QOS_CLASSES.index(r["qos"]) for r in pod_rows])
    # models the cluster lacks are dropped from a constraint
    spec = [sum(1 << nodes.models.index(m) for m in r["spec"].split("|") if m in nodes.models)
            for r in pod_rows]
    np.testing.assert_array_equal(pods.spec_mask, spec)


# ---- applications and limits -------------------------------------------------------------

def test_app_owner_and_limit_columns(tmp_path, nodes) -> None:
    p = write(tmp_path / "p.csv", POD_HEADER + ",app,cpu_limit_milli,memory_limit_mib",
              ["p0,1000,1024,0,0,,LS,0,,web,2000,",
               "p1,1000,1024,0,0,,LS,5,,web,,2048",
               "p2,500,512,0,0,,BE,9,,batch,0,0",
               "p3,500,512,0,0,,BE,9,,,,"])
    pods = load_pods(p, nodes)
    np.testing.assert_array_equal(pods.app, [0, 0, 1, -1])  # first-appearance codes; empty: unknown
    np.testing.assert_array_equal(pods.cpu_limit, [2000, 0, 0, 0])
    np.testing.assert_array_equal(pods.mem_limit, [0, 2048, 0, 0])
    q = write(tmp_path / "q.csv", POD_HEADER + ",owner",
              ["a,100,100,0,0,,,,,job-7", "b,100,100,0,0,,,,,job-7"])
    np.testing.assert_array_equal(load_pods(q, nodes).app, [0, 0])  # 'owner' is an alias


def test_measured_use_columns_of_a_recording(tmp_path, nodes) -> None:
    # own mean use first, else the application's use per non-zero request times the pod's
    # non-zero request (100 milli / 200 MiB for a pod that requests none), else unknown
    header = POD_HEADER + ",cpu_use_milli,memory_use_mib,app_cpu_use_ratio,app_mem_use_ratio"
    p = write(tmp_path / "p.csv", header,
              ["p0,1000,1024,0,0,,LS,0,,300,700,0.5,0.5",
               "p1,1000,1024,0,0,,LS,0,,,,0.5,0.25",
               "p2,0,0,0,0,,BE,0,,,,2,3",
               "p3,1000,1024,0,0,,LS,0,,,,,"])
    pods = load_pods(p, nodes)
    np.testing.assert_array_equal(pods.cpu_use[:3], [300.0, 500.0, 200.0])
    np.testing.assert_array_equal(pods.mem_use[:3], [700.0, 256.0, 600.0])
    assert np.isnan(pods.cpu_use[3]) and np.isnan(pods.mem_use[3])
    bad = write(tmp_path / "b.csv", POD_HEADER + ",cpu_use_milli", ["p0,1000,1024,0,0,,,,,-3"])
    expect_error(lambda: load_pods(bad, nodes), bad, line=2, column="cpu_use_milli", match="negative")
    assert np.isnan(load_pods(write(tmp_path / "o.csv", POD_HEADER, ["p0,1,1,0,0,,,,"]), nodes).cpu_use).all()


def test_limit_below_request_is_an_error(tmp_path, nodes) -> None:
    p = write(tmp_path / "p.csv", POD_HEADER + ",cpu_limit_milli", ["p0,1000,1024,0,0,,,,,500"])
    expect_error(lambda: load_pods(p, nodes), p, line=2, column="cpu_limit_milli",
                 match="limit 500 below the request 1000")


def test_old_csvs_load_with_invented_apps(tmp_path, nodes) -> None:
    # No app/owner column: identical shapes arriving within an hour of each other are one
    # application; a longer gap, another shape or QoS starts a new one.
    p = write(tmp_path / "p.csv", POD_HEADER, [
        "a,1000,1024,0,0,,LS,0,", "b,1000,1024,0,0,,LS,1800,", "c,1000,1024,0,0,,LS,3000,",
        "d,1000,1024,0,0,,LS,9000,",  # 6000 s after c: new application
        "e,1000,1024,0,0,,BE,100,",  # another QoS
        "f,2000,1024,0,0,,LS,100,",  # another shape
        "g,1000,1024,0,0,,LS,,", "h,1000,1024,0,0,,LS,,"])  # no times: by shape alone
    pods = load_pods(p, nodes)
    np.testing.assert_array_equal(pods.app, [0, 0, 0, 1, 2, 3, 4, 4])
    assert (pods.cpu_limit == 0).all() and (pods.mem_limit == 0).all()


def test_openb_app_ids_are_deterministic(openb_nodes) -> None:
    path = builtin_trace("openb_pod_list_default.csv")
    a, b = load_pods(path, openb_nodes), load_pods(path, openb_nodes)
    np.testing.assert_array_equal(a.app, b.app)
    np.testing.assert_array_equal(infer_apps(a), a.app)
    assert int(a.app.max()) + 1 == 3255 and a.app.min() == 0  # 8,152 pods, 162 shapes
    # codes in order of first appearance; every application has one shape and QoS
    first = np.unique(a.app, return_index=True)[1]
    assert (np.diff(first) > 0).all()
    for k in range(0, 3255, 97):
        sel = a.app == k
        for col in (a.cpu, a.mem, a.num_gpu, a.gpu_milli, a.qos):
            assert len(np.unique(col[sel])) == 1
    # files without times group by shape alone
    m = load_pods(builtin_trace("openb_pod_list_multigpu20.csv"), openb_nodes)
    keys = np.stack([m.cpu, m.mem, m.num_gpu, m.gpu_milli], axis=1)
    assert int(m.app.max()) + 1 == len(np.unique(keys, axis=0))
