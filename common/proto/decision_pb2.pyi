from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PodSpec(_message.Message):
    __slots__ = ("name", "namespace", "uid", "scheduler_name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_models", "qos")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_NAME_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    NUM_GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    GPU_MODELS_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    uid: str
    scheduler_name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_models: _containers.RepeatedScalarFieldContainer[str]
    qos: str
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., uid: _Optional[str] = ..., scheduler_name: _Optional[str] = ..., cpu_milli: _Optional[int] = ..., memory_mib: _Optional[int] = ..., num_gpu: _Optional[int] = ..., gpu_milli: _Optional[int] = ..., gpu_models: _Optional[_Iterable[str]] = ..., qos: _Optional[str] = ...) -> None: ...

class ScoreNodesRequest(_message.Message):
    __slots__ = ("spec", "pod_json", "node_names")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    POD_JSON_FIELD_NUMBER: _ClassVar[int]
    NODE_NAMES_FIELD_NUMBER: _ClassVar[int]
    spec: PodSpec
    pod_json: bytes
    node_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, spec: _Optional[_Union[PodSpec, _Mapping]] = ..., pod_json: _Optional[bytes] = ..., node_names: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeScore(_message.Message):
    __slots__ = ("node", "score")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    node: str
    score: int
    def __init__(self, node: _Optional[str] = ..., score: _Optional[int] = ...) -> None: ...

class ScoreNodesResponse(_message.Message):
    __slots__ = ("scores", "model_version", "source", "fallback_reason")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[NodeScore]
    model_version: str
    source: str
    fallback_reason: str
    def __init__(self, scores: _Optional[_Iterable[_Union[NodeScore, _Mapping]]] = ..., model_version: _Optional[str] = ..., source: _Optional[str] = ..., fallback_reason: _Optional[str] = ...) -> None: ...

class GetSchedulingWeightsRequest(_message.Message):
    __slots__ = ("spec", "pod_json", "node_names")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    POD_JSON_FIELD_NUMBER: _ClassVar[int]
    NODE_NAMES_FIELD_NUMBER: _ClassVar[int]
    spec: PodSpec
    pod_json: bytes
    node_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, spec: _Optional[_Union[PodSpec, _Mapping]] = ..., pod_json: _Optional[bytes] = ..., node_names: _Optional[_Iterable[str]] = ...) -> None: ...

class GetSchedulingWeightsResponse(_message.Message):
    __slots__ = ("weights", "model_version", "fallback_reason")
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    weights: _containers.ScalarMap[str, float]
    model_version: str
    fallback_reason: str
    def __init__(self, weights: _Optional[_Mapping[str, float]] = ..., model_version: _Optional[str] = ..., fallback_reason: _Optional[str] = ...) -> None: ...

class FilterNodesRequest(_message.Message):
    __slots__ = ("spec", "pod_json", "node_names")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    POD_JSON_FIELD_NUMBER: _ClassVar[int]
    NODE_NAMES_FIELD_NUMBER: _ClassVar[int]
    spec: PodSpec
    pod_json: bytes
    node_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, spec: _Optional[_Union[PodSpec, _Mapping]] = ..., pod_json: _Optional[bytes] = ..., node_names: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeRefusal(_message.Message):
    __slots__ = ("node", "reason")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node: str
    reason: str
    def __init__(self, node: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class FilterNodesResponse(_message.Message):
    __slots__ = ("refused",)
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    refused: _containers.RepeatedCompositeFieldContainer[NodeRefusal]
    def __init__(self, refused: _Optional[_Iterable[_Union[NodeRefusal, _Mapping]]] = ...) -> None: ...
