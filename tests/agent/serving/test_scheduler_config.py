"""The shipped KubeSchedulerConfiguration (agent/deploy/kube-scheduler-config.yaml), checked
against a strict model of kubescheduler.config.k8s.io/v1.

kube-scheduler cannot be installed here, so this module mirrors what it does with the file:

- decoding: the Go types of ``k8s.io/kube-scheduler/config/v1`` (types.go, read at
  kubernetes/kubernetes 08ced910cf7f) and ``k8s.io/component-base/config/v1alpha1`` as
  dataclasses; unknown or duplicate fields, wrong JSON types, integers out of range and Go
  durations that ``time.ParseDuration`` refuses are errors, as in kube-scheduler's strict
  decoding (``kubernetes-validate --strict`` has no schema for this component config);
- defaulting: ``SetDefaults_KubeSchedulerConfiguration`` (pkg/scheduler/apis/config/v1/defaults.go);
- validation: ``ValidateKubeSchedulerConfiguration`` (pkg/scheduler/apis/config/validation)
  with component-base's client-connection and leader-election checks: positive parallelism,
  named and unique profiles, percentages in 0..100, one queue sort for all profiles, no plugin
  removed in v1, backoffs, and for extenders a positive weight when prioritizing, at most one
  binder, and valid unique extended-resource names.

Plugin ``args`` are kept as raw objects (their per-plugin decoding is not modelled). Then the
properties the deployment relies on are asserted on the real file.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.paths import REPO

CONFIG = REPO / "agent" / "deploy" / "kube-scheduler-config.yaml"

MAX_EXTENDER_PRIORITY = 10  # k8s.io/kube-scheduler/extender/v1
MAX_NODE_SCORE = 100  # framework.MaxNodeScore
AGENT_BUDGET_S = 0.010  # the agent's own time budget per extender call


class ConfigError(ValueError):
    """The file would be rejected by kube-scheduler (decoding or validation)."""


# ---- Go scalar types ---------------------------------------------------------------------------

INT32 = "int32"
INT64 = "int64"
FLOAT32 = "float32"
Int32 = Annotated[int, INT32]
Int64 = Annotated[int, INT64]
Float32 = Annotated[float, FLOAT32]
_INT_RANGE = {INT32: (-(2**31), 2**31 - 1), INT64: (-(2**63), 2**63 - 1)}

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                   "h": 3600.0}
_NUMBER = re.compile(r"(\d*)(?:\.(\d*))?")
_UNIT = re.compile(r"[^0-9.]*")


def parse_go_duration(text: str) -> float:
    """Seconds of a Go duration string, accepted and refused as by ``time.ParseDuration``
    ("100ms", "1m30s", "-1.5h", "0"; not "100", "1 s", "1d"), with Go's error messages."""
    s = text
    sign = 1.0
    if s[:1] in ("+", "-"):
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f'time: invalid duration "{text}"')
    total = 0.0
    while s:
        num = _NUMBER.match(s)
        assert num is not None  # the pattern matches the empty string
        whole, frac = num.group(1), num.group(2)
        if not whole and not frac:
            raise ValueError(f'time: invalid duration "{text}"')
        s = s[num.end():]
        unit = _UNIT.match(s).group(0)  # type: ignore[union-attr]
        if not unit:
            raise ValueError(f'time: missing unit in duration "{text}"')
        if unit not in _DURATION_UNITS:
            raise ValueError(f'time: unknown unit "{unit}" in duration "{text}"')
        total += float(f"{whole or 0}.{frac or 0}") * _DURATION_UNITS[unit]
        s = s[len(unit):]
    return sign * total


@dataclass(frozen=True)
class Duration:
    """metav1.Duration: a JSON string parsed by time.ParseDuration."""

    text: str = "0s"

    @property
    def seconds(self) -> float:
        return parse_go_duration(self.text)


@dataclass(frozen=True)
class RawExtension:
    """runtime.RawExtension (plugin args): any JSON object, kept as is."""

    value: dict[str, Any] = field(default_factory=dict)


# ---- the Go types ----------------------------------------------------------------------------
# Field names are the JSON names of the Go struct tags, so the model reads like the YAML.

@dataclass
class LeaderElectionConfiguration:  # component-base/config/v1alpha1
    leaderElect: bool | None = None
    leaseDuration: Duration = field(default_factory=Duration)
    renewDeadline: Duration = field(default_factory=Duration)
    retryPeriod: Duration = field(default_factory=Duration)
    resourceLock: str = ""
    resourceName: str = ""
    resourceNamespace: str = ""


@dataclass
class ClientConnectionConfiguration:  # component-base/config/v1alpha1
    kubeconfig: str = ""
    acceptContentTypes: str = ""
    contentType: str = ""
    qps: Float32 = 0.0
    burst: Int32 = 0


@dataclass
class Plugin:
    name: str = ""
    weight: Int32 | None = None


@dataclass
class PluginSet:
    enabled: list[Plugin] = field(default_factory=list)
    disabled: list[Plugin] = field(default_factory=list)


@dataclass
class Plugins:
    preEnqueue: PluginSet = field(default_factory=PluginSet)
    queueSort: PluginSet = field(default_factory=PluginSet)
    preFilter: PluginSet = field(default_factory=PluginSet)
    filter: PluginSet = field(default_factory=PluginSet)
    postFilter: PluginSet = field(default_factory=PluginSet)
    preScore: PluginSet = field(default_factory=PluginSet)
    score: PluginSet = field(default_factory=PluginSet)
    reserve: PluginSet = field(default_factory=PluginSet)
    permit: PluginSet = field(default_factory=PluginSet)
    preBind: PluginSet = field(default_factory=PluginSet)
    bind: PluginSet = field(default_factory=PluginSet)
    postBind: PluginSet = field(default_factory=PluginSet)
    multiPoint: PluginSet = field(default_factory=PluginSet)
    # Workload-scheduling extension points (feature gate TopologyAwareWorkloadScheduling).
    placementGenerate: PluginSet = field(default_factory=PluginSet)
    placementScore: PluginSet = field(default_factory=PluginSet)
    placementFeasible: PluginSet = field(default_factory=PluginSet)
    podGroupPostFilter: PluginSet = field(default_factory=PluginSet)


@dataclass
class PluginConfig:
    name: str = ""
    args: RawExtension = field(default_factory=RawExtension)


@dataclass
class KubeSchedulerProfile:
    schedulerName: str | None = None
    percentageOfNodesToScore: Int32 | None = None
    percentageOfPlacementsToScore: Int32 | None = None
    plugins: Plugins | None = None
    pluginConfig: list[PluginConfig] = field(default_factory=list)


@dataclass
class ExtenderTLSConfig:
    insecure: bool = False
    serverName: str = ""
    certFile: str = ""
    keyFile: str = ""
    caFile: str = ""
    certData: bytes = b""
    keyData: bytes = b""
    caData: bytes = b""


@dataclass
class ExtenderManagedResource:
    name: str = ""
    ignoredByScheduler: bool = False


@dataclass
class Extender:
    urlPrefix: str = ""
    filterVerb: str = ""
    preemptVerb: str = ""
    prioritizeVerb: str = ""
    weight: Int64 = 0
    bindVerb: str = ""
    enableHTTPS: bool = False
    tlsConfig: ExtenderTLSConfig | None = None
    httpTimeout: Duration = field(default_factory=Duration)
    nodeCacheCapable: bool = False
    managedResources: list[ExtenderManagedResource] = field(default_factory=list)
    ignorable: bool = False


@dataclass
class KubeSchedulerConfiguration:
    # metav1.TypeMeta, embedded inline (json:"")
    apiVersion: str = ""
    kind: str = ""
    parallelism: Int32 | None = None
    leaderElection: LeaderElectionConfiguration = field(default_factory=LeaderElectionConfiguration)
    clientConnection: ClientConnectionConfiguration = field(default_factory=ClientConnectionConfiguration)
    # componentbaseconfigv1alpha1.DebuggingConfiguration, embedded inline (json:"")
    enableProfiling: bool | None = None
    enableContentionProfiling: bool | None = None
    percentageOfNodesToScore: Int32 | None = None
    percentageOfPlacementsToScore: Int32 | None = None
    podInitialBackoffSeconds: Int64 | None = None
    podMaxBackoffSeconds: Int64 | None = None
    profiles: list[KubeSchedulerProfile] = field(default_factory=list)
    extenders: list[Extender] = field(default_factory=list)
    delayCacheUntilActive: bool = False


# ---- strict decoding ---------------------------------------------------------------------------

class _StrictLoader(yaml.SafeLoader):
    """YAML with duplicate keys rejected (kube-scheduler's strict decoding does the same)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in out:
            raise ConfigError(f'duplicate field "{key}" (line {key_node.start_mark.line + 1})')
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, tag = typing.get_args(tp)[0], typing.get_args(tp)[1]
        v = _convert(base, value, path)
        if tag in _INT_RANGE and not _INT_RANGE[tag][0] <= v <= _INT_RANGE[tag][1]:
            raise ConfigError(f"{path}: {v} overflows {tag}")
        return v
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _convert(inner[0], value, path)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: cannot unmarshal {type(value).__name__} into a list")
        return [_convert(typing.get_args(tp)[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: cannot unmarshal {type(value).__name__} into Go value of type bool")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: cannot unmarshal {type(value).__name__} into Go value of type int")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: cannot unmarshal {type(value).__name__} into Go value of type "
                              "float32")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: cannot unmarshal {type(value).__name__} into Go value of type string")
        return value
    if tp is bytes:  # Go []byte: a base64 (standard encoding) JSON string
        if not isinstance(value, str):
            raise ConfigError(f"{path}: []byte must be a base64 string")
        try:
            return base64.b64decode(value, validate=True)
        except ValueError as e:
            raise ConfigError(f"{path}: illegal base64 data: {e}") from None
    if tp is Duration:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: cannot unmarshal {type(value).__name__} into Go value of type string "
                              "(metav1.Duration)")
        try:
            parse_go_duration(value)
        except ValueError as e:
            raise ConfigError(f"{path}: {e}") from None
        return Duration(value)
    if tp is RawExtension:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: args must be an object")
        return RawExtension(value)
    if dataclasses.is_dataclass(tp):
        return decode(tp, value, path)
    raise TypeError(f"no conversion for {tp!r}")


def decode(cls: type, data: Any, path: str = "") -> Any:
    """Strictly decode ``data`` (parsed YAML) into dataclass ``cls``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or '<root>'}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls, include_extras=True)
    known = {f.name for f in dataclasses.fields(cls)}
    prefix = path + "." if path else ""
    for key in data:
        if not isinstance(key, str) or key not in known:  # case-sensitive, as strict decoding is
            raise ConfigError(f'unknown field "{prefix}{key}"')
    kwargs = {name: _convert(hints[name], value, prefix + name)
              for name, value in data.items() if value is not None}
    return cls(**kwargs)


def load_config(text: str) -> KubeSchedulerConfiguration:
    """Decode, check the group/version/kind, default and validate, as kube-scheduler does."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"invalid YAML: {e}") from None
    cfg = decode(KubeSchedulerConfiguration, data)
    if cfg.apiVersion != "kubescheduler.config.k8s.io/v1" or cfg.kind != "KubeSchedulerConfiguration":
        raise ConfigError(f"no kind {cfg.kind!r} is registered for version {cfg.apiVersion!r}")
    set_defaults(cfg)
    errors = validate(cfg)
    if errors:
        raise ConfigError("; ".join(errors))
    return cfg


# ---- defaulting and validation ----------------------------------------------------------------

INVALID_PLUGINS_V1 = ("AzureDiskLimits", "CinderLimits", "EBSLimits", "GCEPDLimits")
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def set_defaults(cfg: KubeSchedulerConfiguration) -> None:
    """SetDefaults_KubeSchedulerConfiguration, minus the plugin lists themselves."""
    if cfg.parallelism is None:
        cfg.parallelism = 16
    if not cfg.profiles:
        cfg.profiles.append(KubeSchedulerProfile())
    if len(cfg.profiles) == 1 and cfg.profiles[0].schedulerName is None:
        cfg.profiles[0].schedulerName = "default-scheduler"
    if cfg.percentageOfNodesToScore is None:
        cfg.percentageOfNodesToScore = 0  # config.DefaultPercentageOfNodesToScore (adaptive)
    le = cfg.leaderElection
    if not le.resourceLock:
        le.resourceLock = "leases"
    if not le.resourceNamespace:
        le.resourceNamespace = "kube-system"
    if not le.resourceName:
        le.resourceName = "kube-scheduler"
    cc = cfg.clientConnection
    if not cc.contentType:
        cc.contentType = "application/vnd.kubernetes.protobuf"
    if cc.qps == 0.0:
        cc.qps = 50.0
    if cc.burst == 0:
        cc.burst = 100
    # RecommendedDefaultLeaderElectionConfiguration
    if le.leaseDuration.seconds == 0:
        le.leaseDuration = Duration("15s")
    if le.renewDeadline.seconds == 0:
        le.renewDeadline = Duration("10s")
    if le.retryPeriod.seconds == 0:
        le.retryPeriod = Duration("2s")
    if le.leaderElect is None:
        le.leaderElect = True
    if cfg.podInitialBackoffSeconds is None:
        cfg.podInitialBackoffSeconds = 1
    if cfg.podMaxBackoffSeconds is None:
        cfg.podMaxBackoffSeconds = 10
    if cfg.enableProfiling is None:
        cfg.enableProfiling = True
    if cfg.enableProfiling and cfg.enableContentionProfiling is None:
        cfg.enableContentionProfiling = True


def is_extended_resource_name(name: str) -> list[str]:
    """validateExtendedResourceName: a qualified name, not native, valid as a quota name."""
    def qualified(n: str) -> list[str]:
        prefix, _, short = n.rpartition("/")
        errs = []
        if "/" in n and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
            errs.append(f"{n!r}: prefix part must be a DNS-1123 subdomain")
        if not short or len(short) > 63 or not _QUALIFIED_NAME.match(short):
            errs.append(f"{n!r}: name part must consist of alphanumerics, '-', '_' or '.' (at most 63)")
        return errs

    errs = qualified(name)
    if errs:
        return errs
    native = "/" not in name or "kubernetes.io/" in name
    if native or name.startswith("requests.") or qualified("requests." + name):
        return [f"{name!r} is an invalid extended resource name"]
    return []


def validate(cfg: KubeSchedulerConfiguration) -> list[str]:
    """ValidateKubeSchedulerConfiguration (after defaulting); the list of errors."""
    errs: list[str] = []
    if cfg.clientConnection.burst < 0:
        errs.append("clientConnection.burst: must be non-negative")
    le = cfg.leaderElection
    if le.leaderElect:
        if le.leaseDuration.seconds <= 0:
            errs.append("leaderElection.leaseDuration: must be greater than zero")
        if le.renewDeadline.seconds <= 0:
            errs.append("leaderElection.renewDeadline: must be greater than zero")
        if le.retryPeriod.seconds <= 0:
            errs.append("leaderElection.retryPeriod: must be greater than zero")
        if le.leaseDuration.seconds <= le.renewDeadline.seconds:
            errs.append("leaderElection.leaseDuration: must be greater than `RenewDeadline`")
        if le.resourceLock != "leases":
            errs.append('leaderElection.resourceLock: resourceLock value must be "leases"')
    assert cfg.parallelism is not None
    if cfg.parallelism <= 0:
        errs.append("parallelism: should be an integer value greater than zero")
    if not cfg.profiles:
        errs.append("profiles: Required value")
    seen: dict[str, int] = {}
    for i, prof in enumerate(cfg.profiles):
        if not prof.schedulerName:
            errs.append(f"profiles[{i}].schedulerName: Required value")
        elif prof.schedulerName in seen:
            errs.append(f"profiles[{i}].schedulerName: Duplicate value: profiles[{seen[prof.schedulerName]}]")
        else:
            seen[prof.schedulerName] = i
        pct = prof.percentageOfNodesToScore
        if pct is not None and not 0 <= pct <= 100:
            errs.append(f"profiles[{i}].percentageOfNodesToScore: {pct} not in valid range [0-100]")
        if prof.plugins is not None:
            for f in dataclasses.fields(Plugins):
                for k, p in enumerate(getattr(prof.plugins, f.name).enabled):
                    if p.name in INVALID_PLUGINS_V1:
                        errs.append(f"profiles[{i}].plugins.{f.name}.enabled[{k}]: "
                                    f"{p.name} was invalid in version kubescheduler.config.k8s.io/v1")
        names: set[str] = set()
        for k, pc in enumerate(prof.pluginConfig):
            if pc.name in names:
                errs.append(f"profiles[{i}].pluginConfig[{k}]: Duplicate value: {pc.name!r}")
            names.add(pc.name)
            if pc.name in INVALID_PLUGINS_V1:
                errs.append(f"profiles[{i}].pluginConfig[{k}]: {pc.name} was invalid in version v1")
    if cfg.profiles:
        def queue_sort(p: KubeSchedulerProfile) -> PluginSet:
            return p.plugins.queueSort if p.plugins is not None else PluginSet()

        first = queue_sort(cfg.profiles[0])
        if len(first.enabled) > 1:
            errs.append("profiles[0].plugins.queueSort.Enabled: only one queue sort plugin can be enabled")
        for i, prof in enumerate(cfg.profiles[1:], start=1):
            if queue_sort(prof) != first:
                errs.append(f"profiles[{i}].plugins.queueSort: must be the same for all profiles")
    pct = cfg.percentageOfNodesToScore
    if pct is not None and not 0 <= pct <= 100:
        errs.append(f"percentageOfNodesToScore: {pct} not in valid range [0-100]")
    assert cfg.podInitialBackoffSeconds is not None and cfg.podMaxBackoffSeconds is not None
    if cfg.podInitialBackoffSeconds <= 0:
        errs.append("podInitialBackoffSeconds: must be greater than 0")
    if cfg.podMaxBackoffSeconds < cfg.podInitialBackoffSeconds:
        errs.append("podMaxBackoffSeconds: must be greater than or equal to PodInitialBackoffSeconds")
    binders = 0
    managed: set[str] = set()
    for i, ext in enumerate(cfg.extenders):
        if ext.prioritizeVerb and ext.weight <= 0:
            errs.append(f"extenders[{i}].weight: {ext.weight}: must have a positive weight applied to it")
        if ext.bindVerb:
            binders += 1
        for k, res in enumerate(ext.managedResources):
            where = f"extenders[{i}].managedResources[{k}].name"
            errs += [f"{where}: {e}" for e in is_extended_resource_name(res.name)]
            if res.name in managed:
                errs.append(f"{where}: duplicate extender managed resource name")
            managed.add(res.name)
    if binders > 1:
        errs.append(f"extenders: found {binders} extenders implementing bind: "
                    "only one extender can implement bind")
    return errs


# ---- the shipped file -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shipped() -> KubeSchedulerConfiguration:
    return load_config(CONFIG.read_text())


def test_shipped_config_decodes_strictly_and_validates(shipped: KubeSchedulerConfiguration) -> None:
    assert shipped.apiVersion == "kubescheduler.config.k8s.io/v1"
    assert [p.schedulerName for p in shipped.profiles] == ["default-scheduler", "fedsched"]
    assert shipped.leaderElection.leaderElect and shipped.leaderElection.resourceLock == "leases"
    assert shipped.parallelism == 16 and shipped.podMaxBackoffSeconds == 10  # upstream defaults


def test_one_top_level_extender_with_the_agents_verbs(shipped: KubeSchedulerConfiguration) -> None:
    (ext,) = shipped.extenders
    url = urlsplit(ext.urlPrefix)
    assert (url.scheme, url.hostname, url.port, url.path) == (
        "https", "fedsched-agent.fedsched-system.svc", 8443, "/scheduler")
    assert (ext.filterVerb, ext.prioritizeVerb) == ("filter", "prioritize")
    # No binder and no preemption hook: an extender that binds would bind every profile's pods.
    assert ext.bindVerb == "" and ext.preemptVerb == ""
    assert ext.nodeCacheCapable and ext.ignorable and ext.enableHTTPS
    assert ext.managedResources == []  # every pod is sent; the agent ignores non-fedsched pods


def test_extender_tls_is_mutual_and_file_based(shipped: KubeSchedulerConfiguration) -> None:
    (ext,) = shipped.extenders
    tls = ext.tlsConfig
    assert tls is not None and not tls.insecure
    assert tls.serverName == urlsplit(ext.urlPrefix).hostname
    files = (tls.certFile, tls.keyFile, tls.caFile)
    assert all(f and Path(f).parent == Path("/etc/fedsched/tls") for f in files)
    assert len(set(files)) == 3
    assert (tls.certData, tls.keyData, tls.caData) == (b"", b"", b"")  # files only, no inline secrets


def test_extender_timeout_fits_the_agent_budget(shipped: KubeSchedulerConfiguration) -> None:
    timeout = shipped.extenders[0].httpTimeout.seconds
    # Below a second (a hung agent must not stall every pod for the 5 s default), and at least
    # 10x the agent's 10 ms budget so that TLS, the network and JSON never turn a met budget
    # into a timeout.
    assert 10 * AGENT_BUDGET_S <= timeout < 1.0
    assert timeout == pytest.approx(0.1)


def test_policy_choice_dominates_kube_score_plugins(shipped: KubeSchedulerConfiguration) -> None:
    (ext,) = shipped.extenders
    fedsched = next(p for p in shipped.profiles if p.schedulerName == "fedsched")
    assert fedsched.plugins is not None
    score = fedsched.plugins.score
    assert [p.name for p in score.disabled] == ["*"]  # no default score plugin comes back
    assert fedsched.plugins.multiPoint == PluginSet()  # and none through multiPoint
    assert all(p.weight is not None and p.weight > 0 for p in score.enabled)
    plugin_max = MAX_NODE_SCORE * sum(p.weight or 0 for p in score.enabled)
    assert plugin_max == 200
    per_point = ext.weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)  # kube adds score * weight * 10
    chosen, best_other = MAX_EXTENDER_PRIORITY * per_point, (MAX_EXTENDER_PRIORITY - 1) * per_point
    assert best_other + plugin_max < chosen  # 25*10*9 + 200 = 2450 < 2500


def test_shipped_file_says_why_the_extender_is_neutral_for_other_pods() -> None:
    text = CONFIG.read_text()
    assert "spec.schedulerName: fedsched" in text and "neutral" in text


# ---- the model rejects what kube-scheduler rejects -------------------------------------------

DELETE = object()


def mutated(*edits: tuple[str, Any]) -> str:
    """The shipped file with edits applied: ("extenders.0.weight", 0); DELETE removes a key."""
    data = yaml.safe_load(CONFIG.read_text())
    for path, value in edits:
        *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
        node = data
        for k in parents:
            node = node[k]
        if value is DELETE:
            del node[last]
        elif isinstance(node, list) and last == len(node):
            node.append(value)
        else:
            node[last] = value
    return yaml.safe_dump(data)


URL = "https://fedsched-agent.fedsched-system.svc:8443/scheduler"
SCORE = "profiles.1.plugins.score"


@pytest.mark.parametrize("edits", [
    pytest.param([("healthzBindAddress", "0.0.0.0:10251")], id="healthzBindAddress"),  # not in v1
    pytest.param([("metricsBindAddress", "0.0.0.0:10251")], id="metricsBindAddress"),  # not in v1
    pytest.param([("extenders.0.timeout", "100ms")], id="extender-timeout"),
    pytest.param([("extenders.0.urlprefix", URL), ("extenders.0.urlPrefix", DELETE)], id="urlprefix-case"),
    pytest.param([("extenders.0.tlsConfig.clientCert", "/x")], id="tls-clientCert"),
    pytest.param([("profiles.1.extenders", [])], id="profile-extenders"),  # extenders are top-level in v1
    pytest.param([(f"{SCORE}.enabled.0.args", {})], id="plugin-args"),
])
def test_unknown_fields_are_rejected(edits: list[tuple[str, Any]]) -> None:
    with pytest.raises(ConfigError, match="unknown field"):
        load_config(mutated(*edits))


@pytest.mark.parametrize(("edits", "message"), [
    pytest.param([("extenders.0.weight", 0)], "must have a positive weight", id="weight-0"),
    pytest.param([("extenders.0.weight", DELETE)], "must have a positive weight", id="weight-missing"),
    pytest.param([("extenders.0.weight", -3)], "must have a positive weight", id="weight-negative"),
    pytest.param([("extenders.0.bindVerb", "bind"),
                  ("extenders.1", {"urlPrefix": "https://b:8443", "bindVerb": "bind"})],
                 "only one extender can implement bind", id="two-binders"),
    pytest.param([("profiles.1.schedulerName", "default-scheduler")], "Duplicate value",
                 id="duplicate-profile"),
    pytest.param([("profiles.1.schedulerName", DELETE)], "schedulerName: Required", id="unnamed-profile"),
    pytest.param([("profiles.1.percentageOfNodesToScore", 101)], "not in valid range", id="percentage"),
    pytest.param([("parallelism", 0)], "greater than zero", id="parallelism"),
    pytest.param([("podInitialBackoffSeconds", 5), ("podMaxBackoffSeconds", 2)], "greater than or equal",
                 id="backoff"),
    pytest.param([("leaderElection.resourceLock", "endpoints")], 'must be "leases"', id="resource-lock"),
    pytest.param([("leaderElection.leaseDuration", "5s"), ("leaderElection.renewDeadline", "10s")],
                 "greater than `RenewDeadline`", id="lease-vs-renew"),
    pytest.param([("profiles.1.plugins.queueSort", {"enabled": [{"name": "PrioritySort"}]})],
                 "must be the same for all profiles", id="queue-sort"),
    pytest.param([(f"{SCORE}.enabled.2", {"name": "EBSLimits"})], "was invalid", id="removed-plugin"),
    pytest.param([("extenders.0.managedResources", [{"name": "cpu"}])], "invalid extended resource name",
                 id="native-managed-resource"),
    pytest.param([("extenders.0.managedResources", [{"name": "nvidia.com/gpu"}, {"name": "nvidia.com/gpu"}])],
                 "duplicate extender managed resource name", id="duplicate-managed-resource"),
])
def test_invalid_configs_are_rejected(edits: list[tuple[str, Any]], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(mutated(*edits))


def test_valid_variations_are_accepted() -> None:
    resources = [{"name": "nvidia.com/gpu"}, {"name": "example.com/foo", "ignoredByScheduler": True}]
    cfg = load_config(mutated(("extenders.0.managedResources", resources),
                              ("extenders.0.httpTimeout", "1m30s"),
                              ("extenders.0.tlsConfig.caData", "LS0tLS1CRUdJTg=="),
                              ("extenders.1", {"urlPrefix": "http://binder:8080", "bindVerb": "bind"})))
    assert cfg.extenders[0].httpTimeout.seconds == 90.0
    assert cfg.extenders[0].tlsConfig is not None and cfg.extenders[0].tlsConfig.caData == b"-----BEGIN"
    assert [r.name for r in cfg.extenders[0].managedResources] == ["nvidia.com/gpu", "example.com/foo"]


@pytest.mark.parametrize(("edits", "message"), [
    pytest.param([("extenders.0.httpTimeout", "100")], "missing unit", id="duration-no-unit"),
    pytest.param([("extenders.0.httpTimeout", 100)], "cannot unmarshal int", id="duration-int"),
    pytest.param([("extenders.0.httpTimeout", "1 s")], 'unknown unit " s"', id="duration-space"),
    pytest.param([("extenders.0.httpTimeout", "100msec")], 'unknown unit "msec"', id="duration-unit"),
    pytest.param([("extenders.0.weight", "25")], "cannot unmarshal str", id="weight-str"),
    pytest.param([("extenders.0.weight", 2.5)], "cannot unmarshal float", id="weight-float"),
    pytest.param([("extenders.0.nodeCacheCapable", "true")], "type bool", id="bool-str"),
    pytest.param([("parallelism", 2**31)], "overflows int32", id="int32-overflow"),
    pytest.param([("profiles", {"schedulerName": "fedsched"})], "into a list", id="list-type"),
    pytest.param([("extenders.0.tlsConfig.caData", "not base64!")], "illegal base64", id="base64"),
    pytest.param([("apiVersion", "kubescheduler.config.k8s.io/v1beta3")], "no kind", id="api-version"),
])
def test_wrong_types_are_rejected(edits: list[tuple[str, Any]], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(mutated(*edits))


def test_duplicate_yaml_keys_are_rejected() -> None:
    text = CONFIG.read_text().replace("    weight: 25\n", "    weight: 25\n    weight: 0\n")
    with pytest.raises(ConfigError, match='duplicate field "weight"'):
        load_config(text)


def test_go_durations_parse_as_time_ParseDuration_does() -> None:
    cases = {"100ms": 0.1, "0": 0.0, "-0": 0.0, "1m30s": 90.0, "1.5s": 1.5, ".5s": 0.5, "1.s": 1.0,
             "2h45m": 9900.0, "-1.5h": -5400.0, "300us": 3e-4, "300µs": 3e-4, "10ns": 1e-8, "+5s": 5.0,
             "1h0m0.25s": 3600.25}
    for text, seconds in cases.items():
        assert parse_go_duration(text) == pytest.approx(seconds), text
    refused = {"": "invalid duration", "s": "invalid duration", ".s": "invalid duration",
               "--1s": "invalid duration", "100": "missing unit", "1s2": "missing unit",
               "1 s": 'unknown unit " s"', "1d": 'unknown unit "d"', "5sec": 'unknown unit "sec"'}
    for text, message in refused.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_go_duration(text)


def test_a_minimal_config_gets_upstream_defaults() -> None:
    cfg = load_config("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n")
    assert [p.schedulerName for p in cfg.profiles] == ["default-scheduler"]
    assert (cfg.parallelism, cfg.podInitialBackoffSeconds, cfg.podMaxBackoffSeconds) == (16, 1, 10)
    assert cfg.leaderElection.leaderElect and cfg.leaderElection.leaseDuration.seconds == 15
    assert (cfg.clientConnection.qps, cfg.clientConnection.burst) == (50.0, 100)
    # Two profiles without names get no default name: validation asks for them.
    with pytest.raises(ConfigError, match="schedulerName: Required"):
        load_config("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
                    "profiles: [{}, {schedulerName: b}]\n")
