"""Load node and pod lists in the openb CSV schema, with strict validation.

Schema (Alibaba cluster-trace-gpu-v2023, see ``common/data/openb/SOURCE.md``):

- nodes: ``sn,cpu_milli,memory_mib,gpu,model`` (``model`` may be empty or absent for
  CPU-only nodes). Optional ``disk_io_mbps`` and ``net_mbps`` columns give disk and
  network capacity; when absent every node gets ``DEFAULT_DISK_IO_MBPS`` and
  ``DEFAULT_NET_MBPS`` (openb records neither).
- pods: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` required; ``gpu_spec``
  (acceptable models separated by ``|``), ``qos``, ``creation_time``,
  ``deletion_time`` (seconds, may be empty), ``disk_io_mbps``, ``net_mbps`` optional.
  Also optional, what a real cluster knows about a pod: ``app`` (or ``owner``; the
  application / owning controller, any text, numbered in order of first appearance into
  ``PodTable.app``; an empty cell is an unknown owner, -1), ``cpu_limit_milli`` and
  ``memory_limit_mib`` (empty or 0: unknown; a limit below the request is an error), and a
  recording's measured use (``fedsched record``): ``cpu_use_milli`` / ``memory_use_mib``, the
  pod's own mean use, else ``app_cpu_use_ratio`` / ``app_mem_use_ratio``, its application's use
  per non-zero request (empty: not measured; the replay usage model then draws the pod's level).
  Other columns (``pod_phase``, ``scheduled_time``, ...) are ignored.

**Invented application ids.** openb has no owner column (its pod names are
``openb-pod-NNNN``, with no controller prefix), yet the replay usage model gives pods of one
application a shared usage level. When a pods file has neither ``app`` nor ``owner``,
:func:`infer_apps` invents one, deterministically (no randomness, same on every machine):
pods with an identical request shape (CPU, memory, GPU count, GPU share, ``gpu_spec``, QoS)
belong to one application while they keep arriving within ``APP_GAP_S`` (1 hour) of the
previous pod of that shape; a longer gap starts a new application (a Deployment scaled out,
a batch of identical job pods). Pods without a creation time group by shape alone. On
openb ``default`` this gives 3,255 applications for 8,152 pods (162 shapes).

Any error raises :class:`TraceError` naming the file, the 1-based line and the column;
a loader either returns a complete table or raises, never a partial one.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import math
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import numpy as np

from fedsched.common.model.cluster import (
    DEFAULT_MEMORY_REQUEST_MIB,
    DEFAULT_MILLI_CPU_REQUEST,
    MAX_GPUS_PER_NODE,
    MILLI_PER_GPU,
    QOS_ALIASES,
    NodeTable,
    PodTable,
)

DEFAULT_DISK_IO_MBPS = 1000.0
DEFAULT_NET_MBPS = 10000.0
APP_GAP_S = 3600.0  # infer_apps: a longer gap between pods of one shape starts a new application

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(ValueError):
    """Bad trace input; the message names file, line and column."""

    def __init__(self, path: str | Path, message: str, line: int | None = None,
                 column: str | None = None) -> None:
        where = str(path)
        if line is not None:
            where += f", line {line}"
        if column is not None:
            where += f", column '{column}'"
        super().__init__(f"{where}: {message}")
        self.path, self.line, self.column = str(path), line, column


def builtin_trace(name: str) -> Path:
    """Path of a CSV shipped with fedsched, e.g. ``openb_pod_list_default.csv``."""
    p = Path(str(resources.files("fedsched.common").joinpath("data", "openb", name)))
    if not p.exists():
        available = sorted(x.name for x in p.parent.glob("*.csv"))
        raise FileNotFoundError(f"no built-in trace {name!r}; available: {', '.join(available)}")
    return p


def _read_rows(path: str | Path,
               required: tuple[str, ...]) -> tuple[list[str], list[list[str]], list[int]]:
    """Header, non-blank data rows and each row's line number in the file."""
    path = Path(path)
    if not path.exists():
        raise TraceError(path, "file not found")
    if path.is_dir():
        raise TraceError(path, "is a directory, not a CSV file")
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:  # -sig: tolerate a byte-order mark
            reader = csv.reader(f)
            try:
                return _parse_rows(path, reader, required)
            except csv.Error as e:  # a field past the csv module's limit, a NUL byte, a stray quote
                raise TraceError(path, _csv_problem(e), line=reader.line_num) from None
    except UnicodeDecodeError as e:
        raise TraceError(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise TraceError(path, f"cannot be read ({e.strerror or e})") from None


def _csv_problem(e: csv.Error) -> str:
    if "field limit" in str(e):
        return (f"a field longer than {csv.field_size_limit()} characters (no value of this schema "
                f"is that long: a quote left open, or not a trace file)")
    return f"not a readable CSV row ({e})"


def _parse_rows(path: Path, reader: Iterator[list[str]],
                required: tuple[str, ...]) -> tuple[list[str], list[list[str]], list[int]]:
    header = next(reader, None)
    if header is None or not [h for h in header if h.strip()]:
        raise TraceError(path, "empty file (no header row)")
    header = [h.strip() for h in header]
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(path, f"missing column(s) {', '.join(missing)}; header is "
                         f"{','.join(header)}", line=1, column=missing[0])
    rows, lines = [], []
    for r in reader:
        if any(x.strip() for x in r):
            rows.append(r)
            lines.append(reader.line_num)  # type: ignore[attr-defined]
    if not rows:
        raise TraceError(path, "no data rows", line=2)
    return header, rows, lines


class _Columns:
    """Typed column access over csv rows with error reporting."""

    def __init__(self, path: str | Path, header: list[str], rows: list[list[str]],
                 lines: list[int]) -> None:
        self.path, self.rows, self.lines = path, rows, lines
        self.idx = {h: i for i, h in enumerate(header)}
        for k, r in enumerate(rows):
            if len(r) < len(header):
                # Short rows are allowed only if the missing trailing cells are optional;
                # pad them so the typed accessors can report the exact column.
                rows[k] = r + [""] * (len(header) - len(r))

    def has(self, col: str) -> bool:
        return col in self.idx

    def text(self, col: str, default: str = "") -> list[str]:
        if col not in self.idx:
            return [default] * len(self.rows)
        i = self.idx[col]
        return [r[i].strip() for r in self.rows]

    def number(self, col: str, *, integer: bool, optional: bool = False,
               default: float = math.nan) -> np.ndarray:
        out = np.empty(len(self.rows), dtype=np.int64 if integer else np.float64)
        if col not in self.idx:
            out[:] = default
            return out
        i = self.idx[col]
        for k, r in enumerate(self.rows):
            s = r[i].strip()
            line = self.lines[k]
            if s == "":
                if optional:
                    out[k] = default
                    continue
                raise TraceError(self.path, "empty value", line=line, column=col)
            try:
                v = float(s)
            except ValueError:
                raise TraceError(self.path, f"not a number: {s!r}", line=line, column=col) from None
            if not math.isfinite(v):
                raise TraceError(self.path, f"not a finite number: {s!r}", line=line, column=col)
            if v < 0:
                raise TraceError(self.path, f"negative value {s}", line=line, column=col)
            if integer and v != int(v):
                raise TraceError(self.path, f"not an integer: {s!r}", line=line, column=col)
            if integer and v >= 2**53:
                raise TraceError(self.path, f"value {s} too large", line=line, column=col)
            out[k] = int(v) if integer else v
        return out


def load_nodes(path: str | Path) -> NodeTable:
    """Load a nodes CSV (openb schema) into a :class:`NodeTable`."""
    header, rows, lines = _read_rows(path, NODE_COLUMNS)
    cols = _Columns(path, header, rows, lines)
    names = cols.text("sn")
    for k, n in enumerate(names):
        if not n:
            raise TraceError(path, "empty node name", line=lines[k], column="sn")
    seen: dict[str, int] = {}
    for k, n in enumerate(names):
        if n in seen:
            raise TraceError(path, f"duplicate node name {n!r} (first on line {seen[n]})",
                             line=lines[k], column="sn")
        seen[n] = lines[k]
    cpu = cols.number("cpu_milli", integer=True)
    mem = cols.number("memory_mib", integer=True)
    gpu = cols.number("gpu", integer=True)
    for k in np.flatnonzero(gpu > MAX_GPUS_PER_NODE):
        raise TraceError(path, f"{gpu[k]} GPUs on one node; at most {MAX_GPUS_PER_NODE} supported",
                         line=lines[int(k)], column="gpu")
    model_names = cols.text("model")
    models = tuple(sorted({m for m, g in zip(model_names, gpu, strict=True) if g > 0 and m}))
    if len(models) > 62:
        raise TraceError(path, f"{len(models)} GPU models; at most 62 supported", column="model")
    lookup = {m: i for i, m in enumerate(models)}
    model = np.array([lookup.get(m, -1) if g > 0 else -1
                      for m, g in zip(model_names, gpu, strict=True)], dtype=np.int64)
    disk = cols.number("disk_io_mbps", integer=False, optional=True, default=DEFAULT_DISK_IO_MBPS)
    net = cols.number("net_mbps", integer=False, optional=True, default=DEFAULT_NET_MBPS)
    for col, arr in (("cpu_milli", cpu), ("memory_mib", mem)):
        for k in np.flatnonzero(arr == 0):
            raise TraceError(path, "node capacity must be positive", line=lines[int(k)], column=col)
    return NodeTable(names=tuple(names), cpu=cpu, mem=mem, gpu=gpu, model=model, models=models,
                     disk_io=disk, net=net)


def load_pods(path: str | Path, nodes: NodeTable, *, allow_oversized: bool = False) -> PodTable:
    """Load a pods CSV (openb schema); ``nodes`` resolves GPU models and checks sizes.

    A pod that would not fit even on an empty node of ``nodes`` is an input error, unless
    ``allow_oversized``: then it is kept and simply fails when scheduled. Real traces hold
    such pods (openb ``gpuspec33`` asks for 120 cores on G2 nodes that have 96), and the
    published FGD protocol counts them as arrived-and-failed.
    """
    header, rows, lines = _read_rows(path, POD_COLUMNS)
    cols = _Columns(path, header, rows, lines)
    names = cols.text("name")
    for k, n in enumerate(names):
        if not n:
            raise TraceError(path, "empty pod name", line=lines[k], column="name")
    cpu = cols.number("cpu_milli", integer=True)
    mem = cols.number("memory_mib", integer=True)
    num_gpu = cols.number("num_gpu", integer=True)
    gpu_milli = cols.number("gpu_milli", integer=True)
    for k in range(len(rows)):
        line = lines[k]
        if gpu_milli[k] > MILLI_PER_GPU:
            raise TraceError(path, f"gpu_milli {gpu_milli[k]} exceeds one GPU ({MILLI_PER_GPU})",
                             line=line, column="gpu_milli")
        if num_gpu[k] > 0 and gpu_milli[k] == 0:
            raise TraceError(path, "num_gpu > 0 with gpu_milli 0", line=line, column="gpu_milli")
        if num_gpu[k] == 0 and gpu_milli[k] > 0:
            raise TraceError(path, "gpu_milli > 0 with num_gpu 0", line=line, column="num_gpu")
        if num_gpu[k] > 1 and gpu_milli[k] != MILLI_PER_GPU:
            raise TraceError(path, "a multi-GPU pod must take whole GPUs (gpu_milli 1000)",
                             line=line, column="gpu_milli")
    lookup = {m: i for i, m in enumerate(nodes.models)}
    spec_mask = np.zeros(len(rows), dtype=np.int64)
    for k, s in enumerate(cols.text("gpu_spec")):
        if not s:
            continue
        wanted = [x.strip() for x in s.split("|") if x.strip()]
        mask = 0
        for m in wanted:
            if m in lookup:
                mask |= 1 << lookup[m]
        if mask == 0 and num_gpu[k] > 0:
            raise TraceError(path, f"gpu_spec {s!r} names no GPU model of the cluster "
                             f"({', '.join(nodes.models) or 'none'})", line=lines[k],
                             column="gpu_spec")
        spec_mask[k] = mask
    qos = np.empty(len(rows), dtype=np.int64)
    for k, q in enumerate(cols.text("qos")):
        code = QOS_ALIASES.get(q.lower())
        if code is None:
            raise TraceError(path, f"unknown QoS class {q!r}; expected one of "
                             "BE, BestEffort, Burstable, LS, LSR, Guaranteed", line=lines[k],
                             column="qos")
        qos[k] = code
    creation = cols.number("creation_time", integer=False, optional=True)
    deletion = cols.number("deletion_time", integer=False, optional=True)
    for k in np.flatnonzero(deletion < creation):
        raise TraceError(path, "deletion_time before creation_time", line=lines[int(k)],
                         column="deletion_time")
    disk = cols.number("disk_io_mbps", integer=False, optional=True, default=0.0)
    net = cols.number("net_mbps", integer=False, optional=True, default=0.0)
    cpu_limit = cols.number("cpu_limit_milli", integer=True, optional=True, default=0)
    mem_limit = cols.number("memory_limit_mib", integer=True, optional=True, default=0)
    for col, lim, req in (("cpu_limit_milli", cpu_limit, cpu), ("memory_limit_mib", mem_limit, mem)):
        for k in np.flatnonzero((lim > 0) & (lim < req)):
            raise TraceError(path, f"limit {lim[k]} below the request {req[k]}", line=lines[int(k)],
                             column=col)
    owner_col = "app" if cols.has("app") else "owner" if cols.has("owner") else None
    # Measured use (a recording: fedsched record): the pod's own mean, else its application's
    # use per non-zero request times the pod's non-zero request, else unknown (NaN).
    measured = []
    for own_col, ratio_col, req, nz in (
            ("cpu_use_milli", "app_cpu_use_ratio", cpu, DEFAULT_MILLI_CPU_REQUEST),
            ("memory_use_mib", "app_mem_use_ratio", mem, DEFAULT_MEMORY_REQUEST_MIB)):
        own = cols.number(own_col, integer=False, optional=True)
        ratio = cols.number(ratio_col, integer=False, optional=True)
        measured.append(np.where(np.isfinite(own), own, ratio * np.where(req > 0, req, nz)))
    pods = PodTable(names=tuple(names), cpu=cpu, mem=mem, num_gpu=num_gpu, gpu_milli=gpu_milli,
                    spec_mask=spec_mask, qos=qos, creation=creation, deletion=deletion,
                    disk_io=disk, net=net, cpu_limit=cpu_limit, mem_limit=mem_limit,
                    cpu_use=measured[0], mem_use=measured[1])
    app = _app_codes(cols.text(owner_col)) if owner_col else infer_apps(pods)
    pods = dataclasses.replace(pods, app=app)
    if not allow_oversized:
        _check_fits_some_node(path, pods, nodes, lines)
    return pods


def _app_codes(owners: list[str]) -> np.ndarray:
    """Owner texts numbered 0, 1, ... in order of first appearance; empty text is -1."""
    lookup: dict[str, int] = {}
    return np.array([-1 if not o else lookup.setdefault(o, len(lookup)) for o in owners], dtype=np.int64)


def infer_apps(pods: PodTable, gap_s: float = APP_GAP_S) -> np.ndarray:
    """Invented application codes for a trace without owners (module docstring).

    Pods with an identical request shape (CPU, memory, GPUs, GPU share, ``gpu_spec``, QoS)
    are one application while each arrives within ``gap_s`` of the previous pod of that
    shape (by creation time; pods without one group by shape alone). Codes are numbered in
    order of first appearance in the file; deterministic.
    """
    n = len(pods)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    keys = np.stack([pods.cpu, pods.mem, pods.num_gpu, pods.gpu_milli, pods.spec_mask, pods.qos], axis=1)
    _, shape = np.unique(keys, axis=0, return_inverse=True)
    shape = shape.ravel()
    t = pods.creation.astype(np.float64)
    timed = ~np.isnan(t)
    order = np.lexsort((np.arange(n), np.where(timed, t, -np.inf), shape))  # by shape, then time
    s_o, t_o = shape[order], t[order]
    new = np.ones(n, dtype=bool)
    same = s_o[1:] == s_o[:-1]
    both = timed[order][1:] & timed[order][:-1]
    new[1:] = ~same | (both & (t_o[1:] - t_o[:-1] > gap_s)) | (timed[order][1:] != timed[order][:-1])
    raw = np.empty(n, dtype=np.int64)
    raw[order] = np.cumsum(new) - 1
    # renumber in order of first appearance in the file
    _, first = np.unique(raw, return_index=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[raw]


def _check_fits_some_node(path: str | Path, pods: PodTable, nodes: NodeTable, lines: list[int]) -> None:
    """Raise for the first pod that fits no empty node, naming the limiting column."""
    # Group identical requests so this stays fast on large traces.
    keys = np.stack([pods.cpu, pods.mem, pods.num_gpu, pods.gpu_milli, pods.spec_mask], axis=1)
    uniq, first = np.unique(keys, axis=0, return_index=True)
    for (cpu, mem, ng, _milli, mask), k in zip(uniq, first, strict=True):
        cpu_ok = nodes.cpu >= cpu
        mem_ok = nodes.mem >= mem
        gpu_ok = nodes.gpu >= ng
        if ng > 0 and mask:
            gpu_ok &= (nodes.model >= 0) & (((mask >> np.maximum(nodes.model, 0)) & 1) == 1)
        if (cpu_ok & mem_ok & gpu_ok).any():
            continue
        # Report the first pod (in file order) with this request.
        k = int(np.flatnonzero((keys == keys[k]).all(axis=1))[0])
        # Name the limits that no node the pod may use (GPU count and model) satisfies.
        usable = gpu_ok if gpu_ok.any() else np.ones_like(gpu_ok)
        bad = [c for c, ok in (("cpu_milli", cpu_ok), ("memory_mib", mem_ok), ("num_gpu", gpu_ok))
               if not (ok & usable).any()] or ["cpu_milli", "memory_mib", "num_gpu"]
        raise TraceError(path, f"pod {pods.names[k]!r} is larger than every node "
                         f"(cpu {cpu}m, mem {mem} MiB, {ng} GPU); no node can ever run it "
                         "(pass allow_oversized / --allow-oversized to keep such pods as "
                         "unschedulable)", line=lines[k], column=",".join(bad))


def hash_fraction(name: str) -> float:
    """A stable pseudo-random number in [0, 1) from a pod name (same on every machine)."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_by_hash(pods: PodTable, test_fraction: float = 0.3) -> tuple[PodTable, PodTable]:
    """(train, test) by a stable hash of the pod name: a pod is in test iff its hash < fraction."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test fraction must be in (0, 1), got {test_fraction}")
    h = np.array([hash_fraction(n) for n in pods.names])
    test = h < test_fraction
    if test.all() or not test.any():
        raise ValueError(f"the hash split of {len(pods)} pods left one side empty")
    return pods.select(np.flatnonzero(~test)), pods.select(np.flatnonzero(test))


def split_train_val_test(pods: PodTable, test_fraction: float = 0.3,
                         val_fraction: float = 0.1) -> tuple[PodTable, PodTable, PodTable]:
    """(train, validation, test) by the same stable hash as :func:`split_by_hash`.

    Test is exactly ``split_by_hash``'s test part (hash < test_fraction); validation takes
    the next ``val_fraction`` of the hash range, so model selection never sees test pods.
    """
    if test_fraction <= 0.0 or val_fraction <= 0.0 or test_fraction + val_fraction >= 1.0:
        raise ValueError(f"bad split fractions: test {test_fraction}, validation {val_fraction}")
    h = np.array([hash_fraction(n) for n in pods.names])
    test = h < test_fraction
    val = (h >= test_fraction) & (h < test_fraction + val_fraction)
    train = ~(test | val)
    if not (test.any() and val.any() and train.any()):
        raise ValueError(f"the hash split of {len(pods)} pods left a part empty")
    return (pods.select(np.flatnonzero(train)), pods.select(np.flatnonzero(val)),
            pods.select(np.flatnonzero(test)))


def resolve_path(spec: str | Path) -> Path:
    """A CSV path, or ``builtin:NAME`` for a trace shipped with fedsched."""
    s = str(spec)
    if s.startswith("builtin:"):
        return builtin_trace(s.removeprefix("builtin:"))
    return Path(s)

def slice_cluster(nodes: NodeTable, k: int, seed: int) -> NodeTable:
    """``k`` nodes drawn without replacement (all when k <= 0 or k >= size), in id order."""
    if k <= 0 or k >= len(nodes):
        return nodes
    idx = np.sort(np.random.default_rng(seed).choice(len(nodes), k, replace=False))
    return nodes.select(idx)


def fits_somewhere(pods: PodTable, nodes: NodeTable) -> PodTable:
    """The pods an empty node of ``nodes`` can hold (slices may lack a pod's GPU model)."""
    keep = np.zeros(len(pods), dtype=bool)
    for i in range(len(pods)):
        ok = (nodes.cpu >= pods.cpu[i]) & (nodes.mem >= pods.mem[i]) & (nodes.gpu >= pods.num_gpu[i])
        if pods.num_gpu[i] and pods.spec_mask[i]:
            ok &= (nodes.model >= 0) & (((pods.spec_mask[i] >> np.maximum(nodes.model, 0)) & 1) == 1)
        keep[i] = ok.any()
    return pods.select(np.flatnonzero(keep))
