"""ClientApp mods (Flower's ``Mod``: ``(msg, context, call_next) -> Message``): the run-config defaults,
the wire codec and the experiment knobs, around the member's plain ``train``.

- :func:`run_config_defaults_mod` (the app's, outermost): hands the layers below a context whose
  run config has pyproject's defaults for the keys the runtime did not pass (``run_simulation``
  passes none), so each reads ``context.run_config["key"]``. The runtime's own context is not
  modified (Flower refuses a context whose run config changed); the state is shared.
- :func:`failure_mod` (``fail-rate``): the member fails the round with that probability
  (seeded by round and partition) before doing any work, as a crashed member would; Flower
  turns the exception into an error reply.
- :func:`codec_mod` (``codec``): ``train`` replies with its float32 update (``NAME.raw``); with
  ``codec = "int8"`` (the default) this mod quantises it to INT8 with error feedback (the
  residual lives in the run's ``context.state``, Flower's per-node scratchpad for mods) and
  reports the bytes it sends; ``codec = "fp32"`` (the benchmark's knob) passes the float32
  update through. An update that is not finite cannot be quantised and goes out as it is
  (the hub rejects it).
- :func:`download_mod` (the hub's ``download-codec``, announced in the message's config): with
  ``download-kind`` = ``delta`` the global arrived as an INT8 delta from the member's last
  reconstruction, with ``full`` as a full copy (float32 or INT8)
  (:func:`fedsched.common.federation.codec.encode_download`): the mod rebuilds it, checks it
  against the digests the hub sent (``download-base``: the reconstruction a delta applies to;
  ``download-digest``: the one it must produce), keeps it as ``download.npz`` in the member's
  state directory (a restarted member still holds it) and hands ``train`` the float32 global.
  A delta against a base the member does not hold (or whose result it cannot reproduce) is
  refused: the member skips the round (zero update, ``num-examples`` 0,
  ``download-applied`` 0) and the hub sends it a full copy next time. Every reply reports
  ``bytes-down`` (what arrived) beside ``bytes-down-fp32`` and ``download-applied``. Without
  ``download-kind`` (``download-codec = "fp32"``) the float32 global passes through.
- :func:`poison_mod` (``poison-members``, ``poison-kind``): the listed partitions send NaN,
  10^4-times scaled or sign-flipped updates instead of their own, or (``inflate``) their own
  update claiming 10^6 times the pods they scheduled (the aggregation weight).

Each mod reads its knob from the member's typed run config
(:class:`fedsched.agent.federation.round.MemberRunConfig`). Each knob is a pass-through unless
its run-config key is set (``fail-rate`` > 0, a member listed in ``poison-members``,
``codec = "fp32"`` for the codec). They are attached at import, as a
``ClientApp`` is assembled before any run config exists (one FAB serves runs with different
run configs, and a deployed ClientApp is a new process per message), and each decides per
message from its own key. Order (outermost first): download, failures, codec, poison (a
member that fails its round has still received the global; a poisoned update
is corrupted before it is encoded, as a broken learner's would be). Each mod builds its reply
new (``Message(content, reply_to=msg)``); the inner reply is never edited.

May import: ``fedsched.common``, ``fedsched.agent.federation.round`` and Flower's ClientApp API.
"""

from __future__ import annotations

import copy
from logging import WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.logger import log

from fedsched.agent.federation.round import MemberRunConfig, member_state, partition_id
from fedsched.common.federation.codec import (
    Q_SUFFIX,
    RAW_SUFFIX,
    DownloadMismatch,
    ErrorFeedback,
    apply_download,
    decode_int8,
    digest,
    encode_int8,
    nbytes,
)
from fedsched.common.federation.run_config import with_run_config_defaults

POISON_KINDS = ("nan", "huge", "flip", "inflate")
INFLATE = 1e6  # how many times its pods an inflating member claims
CODECS = ("int8", "fp32")
RESIDUAL_KEY = "codec.int8-residual"  # the error-feedback residual in context.state
DOWNLOAD_KINDS = ("full", "delta")  # config "download-kind" of an INT8 download (absent: float32)
DOWNLOAD_STATE = "download"  # the member's reconstruction of the global, in its state directory


def run_config_defaults_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Call the next layer with pyproject's defaults for the run-config keys the runtime did not pass."""
    return call_next(msg, with_run_config_defaults(context))


def failure_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Fail the round with probability ``fail-rate`` (seeded by round and partition)."""
    rate = MemberRunConfig.from_run_config(context.run_config).fail_rate
    if rate != 0.0:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"run config fail-rate must be in [0, 1], got {rate}")
        rnd, pid = int(msg.content["config"]["server-round"]), partition_id(context.node_config)
        if np.random.default_rng([rnd, pid, 7]).random() < rate:
            raise RuntimeError(f"member {pid}: injected failure in round {rnd} (fail-rate)")
    return call_next(msg, context)


def _update(reply: Message) -> tuple[dict[str, np.ndarray], MetricRecord]:
    arrays = next(iter(reply.content.array_records.values()))
    metrics = next(iter(reply.content.metric_records.values()))
    return decode_int8({k: v.numpy() for k, v in arrays.items()}), metrics


def _reply(msg: Message, arrays: dict[str, np.ndarray], metrics: MetricRecord) -> Message:
    content = RecordDict({"arrays": ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()}),
                          "metrics": metrics})
    return Message(content, reply_to=msg)


def poisoned(delta: dict[str, np.ndarray], kind: str) -> dict[str, np.ndarray]:
    """The update a poisoned member sends instead of ``delta`` (``inflate`` sends its own)."""
    if kind == "nan":
        return {k: np.full_like(v, np.nan) for k, v in delta.items()}
    if kind == "huge":
        return {k: v * np.float32(1e4) for k, v in delta.items()}
    if kind == "flip":
        return {k: -v for k, v in delta.items()}
    if kind == "inflate":
        return delta
    raise ValueError(f"unknown poison-kind {kind!r}: expected {', '.join(POISON_KINDS)}")


def poison_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Replace the update of the partitions in ``poison-members`` by a ``poison-kind`` one."""
    cfg = MemberRunConfig.from_run_config(context.run_config)
    members = {m.strip() for m in cfg.poison_members.split(",") if m.strip()}
    if not members:
        return call_next(msg, context)
    kind = cfg.poison_kind
    if kind not in POISON_KINDS:
        raise ValueError(f"unknown poison-kind {kind!r}: expected {', '.join(POISON_KINDS)}")
    reply = call_next(msg, context)
    if str(partition_id(context.node_config)) not in members or reply.has_error():
        return reply
    delta, metrics = _update(reply)
    bad = {k + RAW_SUFFIX: v for k, v in poisoned(delta, kind).items()}
    if kind == "inflate":  # its own update (encoded by the codec as any other); only the weight lies
        n = float(metrics["num-examples"])  # type: ignore[arg-type]
        return _reply(msg, bad, MetricRecord({**dict(metrics), "num-examples": n * INFLATE}))
    return _reply(msg, bad, MetricRecord(dict(metrics)))


def codec_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Encode the outgoing update with the run config's ``codec`` (see the module docstring)."""
    codec = MemberRunConfig.from_run_config(context.run_config).codec
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}: expected {', '.join(CODECS)}")
    reply = call_next(msg, context)
    if codec == "fp32" or reply.has_error():
        return reply
    delta, metrics = _update(reply)
    if not all(np.isfinite(v).all() for v in delta.values()):
        encoded = {k + RAW_SUFFIX: v for k, v in delta.items()}  # NaN/Inf cannot be quantised
    elif int(metrics["uploaded"]):
        ef = ErrorFeedback()
        if RESIDUAL_KEY in context.state:
            ef.load({k: v.numpy() for k, v in context.state.array_records[RESIDUAL_KEY].items()})
        encoded = ef.encode(delta)
        context.state[RESIDUAL_KEY] = ArrayRecord({k: Array(v) for k, v in ef.state().items()})
    else:  # a skipped upload still sends the same keys (zeros) so replies stay consistent
        encoded = encode_int8(delta)
    return _reply(msg, encoded, MetricRecord({**metrics, "bytes-up": int(nbytes(encoded))}))


class _Refused(Exception):
    pass


def _receive(msg: Message, context: Context) -> tuple[dict[str, np.ndarray], int]:
    """The global model the hub sent (float32) and the bytes it took; a refused download raises
    :class:`_Refused` (see the module docstring)."""
    arrays = {k: v.numpy() for k, v in msg.content["arrays"].items()}
    config = msg.content["config"]
    kind = str(config.get("download-kind", ""))
    if not kind:
        return arrays, nbytes(arrays)
    if kind not in DOWNLOAD_KINDS:
        raise ValueError(f"unknown download-kind {kind!r}: expected {', '.join(DOWNLOAD_KINDS)}")
    state = member_state(context.node_config, MemberRunConfig.from_run_config(context.run_config))
    held = state.load(DOWNLOAD_STATE) if kind == "delta" else None
    if kind == "delta" and digest(held) != str(config["download-base"]):
        raise _Refused(f"a delta against {config['download-base']}, the member holds "
                       f"{digest(held) or 'nothing'}")
    try:
        rebuilt = apply_download(arrays, held)
    except DownloadMismatch as e:
        raise _Refused(str(e)) from None
    if digest(rebuilt) != str(config["download-digest"]):
        raise _Refused(f"the rebuilt global is {digest(rebuilt)}, the hub's is {config['download-digest']}")
    state.save(DOWNLOAD_STATE, rebuilt)
    return rebuilt, nbytes(arrays)


def download_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Rebuild an INT8-encoded global before ``train`` (see the module docstring)."""
    try:
        global_w, received = _receive(msg, context)
    except _Refused as e:
        log(WARNING, "member %s: refused the hub's download (%s); skipping the round, the hub sends "
            "a full copy next time", partition_id(context.node_config), e)
        return _refusal(msg, context)
    inner = Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in global_w.items()}),
                                "config": msg.content["config"]}), metadata=copy.copy(msg.metadata))
    reply = call_next(inner, context)
    if reply.has_error():  # a reply to ``inner``, whose metadata is ``msg``'s
        return reply
    arrays = next(iter(reply.content.array_records.values()))
    metrics = next(iter(reply.content.metric_records.values()))
    out = MetricRecord({**metrics, "bytes-down": int(received), "bytes-down-fp32": int(nbytes(global_w)),
                        "download-applied": 1})
    return Message(RecordDict({"arrays": arrays, "metrics": out}), reply_to=msg)


def _refusal(msg: Message, context: Context) -> Message:
    """A skipped round's reply: a zero update of the model's shapes, no examples."""
    arrays = {k: v.numpy() for k, v in msg.content["arrays"].items()}
    shapes = {k[: -len(Q_SUFFIX)]: v.shape for k, v in arrays.items() if k.endswith(Q_SUFFIX)}
    shapes |= {k[: -len(RAW_SUFFIX)]: v.shape for k, v in arrays.items() if k.endswith(RAW_SUFFIX)}
    zeros = {k: np.zeros(shape, np.float32) for k, shape in shapes.items()}
    codec = MemberRunConfig.from_run_config(context.run_config).codec
    update = {k + RAW_SUFFIX: v for k, v in zeros.items()} if codec == "fp32" else encode_int8(zeros)
    metrics = MetricRecord({
        "num-examples": 0, "mean-reward": 0.0, "bytes-up": int(nbytes(update)),
        "bytes-up-fp32": int(nbytes(zeros)), "bytes-down": int(nbytes(arrays)),
        "bytes-down-fp32": int(nbytes(zeros)), "uploaded": 0, "partition": partition_id(context.node_config),
        "val-score": float("nan"), "joined": 1, "download-applied": 0,
    })
    return _reply(msg, update, metrics)
