"""One configuration model for every role: file (YAML), then environment, then flags.

Keys are camelCase in the file (as in the Helm chart's rendered config), MTSCHED_UPPER_SNAKE in
the environment and `--set key=value` on the command line (camelCase or snake_case keys: controller/cli.py).
Invalid configuration raises ConfigError listing every problem, so a role stops at start-up with a message
instead of misbehaving.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from urllib.parse import parse_qs, unquote

import yaml

from shared.domain.models import (
    CORES_PER_CARD,
    DEFAULT_MAX_INST,
    DEFAULT_MODEL,
    CardModel,
    ModelError,
    parse_memory_per_card,
)
from shared.domain.shapes import MAX_NODES
from shared.domain.upkeep import LOST_AFTER_MAX, LOST_AFTER_MIN

POLICIES = ("binpack", "spread")
# The shortest wait before the leader's extender hands the Lease over (shared/domain/leadership.py): a fault every
# replica shares (Redis, their one ServiceAccount's RBAC) reaches an idle replica's readiness only after its own
# checks (the access review every 30 s) and the kubelet's readiness probe (2 x 5 s); before that its pod still
# looks Ready, and a shorter wait could hand the Lease to a replica no better off.
LEADER_YIELD_MIN = 60
_RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_NAME = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"  # a DNS subdomain name: a node's, a pod's, a namespace's
_ADDR_RE = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]*):\d{1,5}$")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Config:
    memory_per_card: tuple[CardModel, ...] = (CardModel(DEFAULT_MODEL),)
    resource_count_name: str = "mthreads.com/vgpu"
    resource_memory_name: str = "mthreads.com/sgpu-memory"
    resource_core_name: str = "mthreads.com/sgpu-core"
    whole_card_resource_name: str = "mthreads.com/gpu"
    scheduler_name: str = "hami-scheduler"
    node_scheduler_policy: str = "binpack"
    gpu_scheduler_policy: str = "spread"
    # The filter returns the best k feasible nodes by the node policy (shared/domain/topk.py); 0: all of them.
    # 0 here keeps the library's behaviour; the chart sets 1 (measured: docs/rules.md, Top-k filter)
    filter_top_k: int = 0
    default_cores: int = 1
    max_slices_per_card: int = DEFAULT_MAX_INST
    force_overwrite_default_scheduler: bool = True
    redis_url: str = "redis://127.0.0.1:6379/0"
    # The password, when redisUrl carries none: best from a file (a mounted Secret) or the environment
    # (MTSCHED_REDIS_PASSWORD from a Secret); never in repr() and never logged.
    redis_password: str = field(default="", repr=False)
    redis_password_file: str = ""
    # rediss:// only: the CA that signed the server's certificate (a file, or PEM text, e.g. from a
    # Secret-backed MTSCHED_REDIS_CA), and a client certificate for servers with tls-auth-clients.
    redis_ca_file: str = ""
    redis_ca: str = ""
    redis_cert_file: str = ""
    redis_key_file: str = ""
    key_prefix: str = "mt"
    pending_ttl_seconds: int = 120
    reconcile_seconds: int = 30
    # the extenders place no slice pod once no ready watcher has stamped the ledger this long (shared/domain/upkeep.py)
    watchers_lost_after_seconds: int = 90
    listen: str = ""  # "" = the role's default (shared/serving/listen.py): extender loopback, webhook all addresses
    metrics_listen: str = "0.0.0.0:9395"
    tls_cert_file: str = ""
    tls_key_file: str = ""
    extender_client_ca_file: str = ""  # the extender requires client certificates signed by this CA
    extender_allow_unauthenticated: bool = False  # explicit opt-in: non-loopback extender without mTLS
    # and, when set, the caller's certificate must name one of these (its subject CN or a DNS SAN)
    extender_client_names: tuple[str, ...] = ()
    webhook_client_ca_file: str = ""  # the webhook requires client certificates (the API server's) from this CA
    webhook_client_names: tuple[str, ...] = ()
    kubeconfig: str = ""
    events_enabled: bool = True
    # A Normal BindingSucceed event per bound pod (HAMi's). Off by default: kube-scheduler's own
    # Scheduled event already says where the pod went, and one more event per pod cost the API server,
    # etcd and the extender ~1 ms of CPU per pod (docs/benchmarks.md). Failures are always events.
    success_events: bool = False
    # The kube-scheduler calling the extender requeues every pod it turned away on any Node's update (1.34 or newer:
    # shared/domain/nudge.py; the chart derives it from its kube-scheduler's image tag): the watchers then nudge it
    # with one Node patch for all Nodes that gained room (controller/nudger.py cluster_wide). false: Node by Node,
    # which works with every kube-scheduler
    nudge_any_node: bool = False
    # The webhook enforces namespace quotas in the limits./bare forms (shared/domain/quota.py); it
    # then needs the API server (list resourcequotas and pods). false: those forms hold nothing.
    quota_check: bool = True
    # the node agent (controller/node_agent.py): its node (MTSCHED_NODE_NAME from the downward API),
    # where the vendor's knobs are, and how often they are read again
    node_name: str = ""
    card_knobs_path: str = "/proc/sgpu_km"
    card_knobs_seconds: int = 30
    log_level: str = "info"
    # The extender beside the leader kube-scheduler hands the leadership over while it cannot do its job and
    # another replica can (controller/leadership.py): unready this many seconds (0: never), the Lease
    # (`<namespace>/<name>`, the scheduler's leaderElection resource), the replicas' pods (a label selector in
    # that namespace) and its own pod's name (MTSCHED_POD_NAME, from the downward API). The chart sets them all.
    leader_yield_seconds: int = 0
    leader_lease: str = ""
    leader_peers: str = ""
    pod_name: str = ""

    @property
    def models(self) -> tuple[CardModel, ...]:
        return self.memory_per_card

    @property
    def slice_resources(self) -> tuple[str, str, str]:
        return (self.resource_count_name, self.resource_memory_name, self.resource_core_name)


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


# Keys whose spelling keeps an acronym in capitals (camel() would write pendingTtlSeconds).
SPELLED = {"pendingTtlSeconds": "pendingTTLSeconds", "extenderClientCaFile": "extenderClientCAFile",
           "webhookClientCaFile": "webhookClientCAFile", "redisCaFile": "redisCAFile", "redisCa": "redisCA"}


def key_of(name: str) -> str:
    """The file/flag key of a Config field."""
    return SPELLED.get(camel(name), camel(name))


_KEYS = {key_of(f.name): f.name for f in fields(Config)}
_TYPES = {f.name: f.type for f in fields(Config)}


def _shown(name: str, raw: object) -> str:
    """A value as an error message quotes it, a password never: redisPassword's not at all, a redisUrl's redacted."""
    if name == "redis_password":
        return "'***'"
    if name == "redis_url":
        return repr(redact_url(raw)) if isinstance(raw, str) else f"'***' (a {type(raw).__name__})"
    return repr(raw)


def _coerce(name: str, raw: object, errors: list[str]) -> object:
    kind = _TYPES[name]
    if name == "memory_per_card":
        try:
            return parse_memory_per_card(raw)
        except ModelError as e:
            errors.append(str(e))
            return None
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if str(raw).lower() in ("1", "true", "yes", "on"):
            return True
        if str(raw).lower() in ("0", "false", "no", "off"):
            return False
        errors.append(f"{key_of(name)}: {raw!r} is not a boolean (true/false)")
        return None
    if kind == "tuple[str, ...]":
        return _names(name, raw, errors)
    if kind == "int":
        if isinstance(raw, bool):
            errors.append(f"{key_of(name)}: {raw!r} is not a whole number")
            return None
        try:
            return int(str(raw))
        except ValueError:
            errors.append(f"{key_of(name)}: {raw!r} is not a whole number")
            return None
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        # YAML reads an unquoted true/yes/on as a boolean: "True" would become a key prefix or a name
        errors.append(f"{key_of(name)}: {_shown(name, raw)} is not a string (quote it in YAML)")
        return None
    return str(raw)


# brackets, braces (helm's list syntax), quotes: a list written wrongly, not a name
_CERT_NAME_RE = re.compile(r"^[^\s,\[\]{}\"']{1,253}$")


def _unquoted(item: str) -> str:
    """An item of `[a,b]` as YAML or JSON may quote it (`["a", "b"]`): the quotes are no part of the name."""
    item = item.strip()
    if len(item) >= 2 and item[0] == item[-1] and item[0] in "\"'":
        return item[1:-1]
    return item


def _names(name: str, raw: object, errors: list[str]) -> tuple[str, ...] | None:
    """A list of certificate names: a YAML list, or one comma-separated string (a flag or variable), which may
    be written as a list in brackets (`[a,b]`, as in YAML): read otherwise, `[a` would be a name no
    certificate carries, and the API server would be locked out."""
    text = raw.strip() if isinstance(raw, str) else None
    items: object = raw
    if text is not None and text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
        items = [_unquoted(x) for x in text.split(",")]
    elif text is not None:
        items = text.split(",")
    if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) for x in items):
        errors.append(f"{key_of(name)}: {raw!r} is not a list of names")
        return None
    names = tuple(x.strip() for x in items if x.strip())
    if items and not names and not (text is not None and not text.strip()):
        # [""] or "," names no certificate: read as unset it would admit any certificate of the CA
        errors.append(f"{key_of(name)}: {raw!r} names no certificate; leave it unset (or empty) to admit any "
                      "certificate of the client CA")
        return None
    bad = [x for x in names if not _CERT_NAME_RE.match(x)]
    if bad or len(names) > 32:
        errors.append(f"{key_of(name)}: {bad[0] if bad else raw!r} is not allowed: at most 32 names, each 1-253 "
                      "characters without spaces, commas, brackets, braces or quotes (a certificate's Common "
                      "Name or DNS name)")
        return None
    return names


def _validate(cfg: Config, errors: list[str]) -> None:
    for key in ("resource_count_name", "resource_memory_name", "resource_core_name",
                "whole_card_resource_name"):
        value = getattr(cfg, key)
        if not _RESOURCE_RE.match(value):
            errors.append(f"{key_of(key)}: {value!r} is not an extended resource name like mthreads.com/vgpu")
    keys = ("resource_count_name", "resource_memory_name", "resource_core_name", "whole_card_resource_name")
    seen: dict[str, str] = {}
    for key in keys:
        value = getattr(cfg, key)
        if value in seen:
            errors.append(f"{key_of(key)}: {value!r} is already {seen[value]}; resource names must be distinct")
        else:
            seen[value] = key_of(key)
    for key in ("node_scheduler_policy", "gpu_scheduler_policy"):
        if getattr(cfg, key) not in POLICIES:
            errors.append(f"{key_of(key)}: {getattr(cfg, key)!r} is not one of {', '.join(POLICIES)}")
    if not 0 <= cfg.filter_top_k <= MAX_NODES:
        errors.append(f"filterTopK: {cfg.filter_top_k} is outside 0..{MAX_NODES} (0: every feasible node)")
    if not 1 <= cfg.default_cores <= CORES_PER_CARD:
        errors.append(f"defaultCores: {cfg.default_cores} is outside 1..{CORES_PER_CARD}")
    if not 1 <= cfg.max_slices_per_card <= DEFAULT_MAX_INST:
        errors.append(f"maxSlicesPerCard: {cfg.max_slices_per_card} is outside 1..{DEFAULT_MAX_INST} "
                      "(vendor max_inst)")
    if not 5 <= cfg.pending_ttl_seconds <= 3600:
        errors.append(f"pendingTTLSeconds: {cfg.pending_ttl_seconds} is outside 5..3600")
    if not 2 <= cfg.reconcile_seconds <= 3600:
        errors.append(f"reconcileSeconds: {cfg.reconcile_seconds} is outside 2..3600")
    if not LOST_AFTER_MIN <= cfg.watchers_lost_after_seconds <= LOST_AFTER_MAX:
        errors.append(f"watchersLostAfterSeconds: {cfg.watchers_lost_after_seconds} is outside "
                      f"{LOST_AFTER_MIN}..{LOST_AFTER_MAX}")
    if not 1 <= cfg.card_knobs_seconds <= 3600:
        errors.append(f"cardKnobsSeconds: {cfg.card_knobs_seconds} is outside 1..3600")
    if cfg.node_name and not re.match(rf"^{_NAME}$", cfg.node_name):
        errors.append(f"nodeName: {cfg.node_name!r} is not a valid node name")
    if not cfg.card_knobs_path.startswith("/"):
        errors.append(f"cardKnobsPath: {cfg.card_knobs_path!r} must be an absolute path")
    if not cfg.scheduler_name or not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", cfg.scheduler_name):
        errors.append(f"schedulerName: {cfg.scheduler_name!r} is not a valid scheduler name")
    if not cfg.redis_url.startswith(("redis://", "rediss://", "unix://", "redis+sentinel://", "redis+cluster://")):
        errors.append(f"redisUrl: {redact_url(cfg.redis_url)!r} must start with redis://, rediss://, unix://, "
                      "redis+sentinel:// or redis+cluster://")
    if cfg.redis_password and cfg.redis_password_file:
        errors.append("redisPassword and redisPasswordFile are both set: give the password one way")
    if (cfg.redis_password or cfg.redis_password_file) and url_password(cfg.redis_url):
        errors.append(f"redisUrl {redact_url(cfg.redis_url)!r} carries a password and redisPassword or "
                      "redisPasswordFile gives one too: give it one way")
    tls_keys = [key_of(k) for k in ("redis_ca_file", "redis_ca", "redis_cert_file", "redis_key_file")
                if getattr(cfg, k)]
    if tls_keys and not cfg.redis_url.startswith("rediss://"):
        errors.append(f"{', '.join(tls_keys)}: need a rediss:// redisUrl (TLS is available for single-endpoint "
                      "Redis only)")
    if cfg.redis_ca_file and cfg.redis_ca:
        errors.append("redisCAFile and redisCA are both set: give the CA one way")
    if bool(cfg.redis_cert_file) != bool(cfg.redis_key_file):
        errors.append("redisCertFile and redisKeyFile must be given together")
    for key in ("listen", "metrics_listen"):
        value = getattr(cfg, key)
        if not _ADDR_RE.match(value) and not (key == "listen" and value == ""):
            errors.append(f"{camel(key)}: {value!r} is not host:port")
    if bool(cfg.tls_cert_file) != bool(cfg.tls_key_file):
        errors.append("tlsCertFile and tlsKeyFile must be given together")
    for role in ("extender", "webhook"):
        ca, names = getattr(cfg, f"{role}_client_ca_file"), getattr(cfg, f"{role}_client_names")
        if ca and not cfg.tls_cert_file:
            errors.append(f"{role}ClientCAFile needs tlsCertFile and tlsKeyFile: client certificates are "
                          "checked in the TLS handshake")
        if names and not ca:
            errors.append(f"{role}ClientNames needs {role}ClientCAFile: names are checked on certificates that CA "
                          "signed")
    if not re.match(r"^[A-Za-z0-9_.-]{1,32}$", cfg.key_prefix):
        errors.append(f"keyPrefix: {cfg.key_prefix!r} must be 1-32 characters of [A-Za-z0-9_.-]")
    if cfg.leader_yield_seconds and not LEADER_YIELD_MIN <= cfg.leader_yield_seconds <= 3600:
        errors.append(f"leaderYieldSeconds: {cfg.leader_yield_seconds} is outside {LEADER_YIELD_MIN}..3600 (0: never; "
                      "a fault every replica shares reaches an idle replica's readiness within about 50 s)")
    if cfg.leader_lease and not re.match(rf"^{_NAME}/{_NAME}$", cfg.leader_lease):
        errors.append(f"leaderLease: {cfg.leader_lease!r} is not <namespace>/<name>")
    if cfg.pod_name and not re.match(rf"^{_NAME}$", cfg.pod_name):
        errors.append(f"podName: {cfg.pod_name!r} is not a valid pod name")
    if cfg.leader_yield_seconds and cfg.leader_lease and not cfg.leader_peers:
        errors.append("leaderPeers: empty; with leaderYieldSeconds and leaderLease it must select the scheduler "
                      "replicas' pods (a label selector), or every pod of the namespace would count as a replica")
    if cfg.log_level.lower() not in ("debug", "info", "warning", "error"):
        errors.append(f"logLevel: {cfg.log_level!r} is not one of debug, info, warning, error")


def _url_parts(url: str) -> tuple[str, str, str, str]:
    """(scheme://, userinfo, hosts and path, ?query) of a Redis URL of any form; userinfo "" without one.

    The userinfo ends at the last "@" before the query, so an unencoded "/" or "@" in a password
    still counts as part of it: redacting too much is harmless, too little is not.
    """
    scheme, sep, rest = url.partition("://")
    before, q, query = rest.partition("?")
    userinfo, at, hosts = before.rpartition("@")
    return scheme + sep, userinfo if at else "", hosts, q + query


_QUERY_SECRET = re.compile(r"([?&](?:sentinel_)?password=)[^&#]+")


def url_password(url: str) -> str | None:
    """The password a Redis URL carries (redis://user:pw@host, or ?password= as redis-py reads it)."""
    _scheme, userinfo, _hosts, query = _url_parts(url)
    _user, colon, password = userinfo.partition(":")
    if colon and password:
        return unquote(password)
    from_query = parse_qs(query[1:]).get("password")
    return from_query[-1] if from_query and from_query[-1] else None


def redact_url(url: str) -> str:
    """The URL for log lines and error messages: its passwords replaced by ***."""
    scheme, userinfo, hosts, query = _url_parts(url)
    user, colon, password = userinfo.partition(":")
    auth = f"{user}:***@" if colon and password else (f"{userinfo}@" if userinfo else "")
    return scheme + auth + hosts + _QUERY_SECRET.sub(r"\1***", query)


def without_password(url: str) -> str:
    """The URL with the password taken out of its userinfo (the user, if any, stays)."""
    scheme, userinfo, hosts, query = _url_parts(url)
    user = userinfo.partition(":")[0]
    return scheme + (f"{user}@" if user else "") + hosts + query


def redis_password(cfg: Config) -> str | None:
    """The password from redisPasswordFile (read now: a rotated Secret takes effect at the next start)
    or redisPassword; None when neither is set (the URL may still carry one)."""
    if cfg.redis_password_file:
        try:
            text = Path(cfg.redis_password_file).read_text()
        except OSError as e:
            raise ConfigError(f"redisPasswordFile: cannot read {cfg.redis_password_file}: {e.strerror}") from e
        password = text.rstrip("\r\n")  # a file written by echo ends with a newline that is no part of it
        if not password:
            raise ConfigError(f"redisPasswordFile: {cfg.redis_password_file} is empty")
        return password
    return cfg.redis_password or None


def _from_mapping(values: Mapping[str, object], source: str, errors: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, raw in values.items():
        name = _KEYS.get(key)
        if name is None:
            errors.append(f"{source}: unknown setting {key!r} (known: {', '.join(sorted(_KEYS))})")
            continue
        value = _coerce(name, raw, errors)
        if value is not None:
            out[name] = value
    return out


def _same(key: str, a: object, b: object) -> bool:
    """Two spellings of one setting that read as the same value (160 and [160]; "96,160" and [160, 96])."""
    if a == b:  # alike, right or wrong: a wrong one is said once, as wrong
        return True
    ours, theirs = _coerce(_KEYS[key], a, []), _coerce(_KEYS[key], b, [])
    return ours is not None and ours == theirs


def _flatten_file(doc: Mapping[str, object], source: str, errors: list[str]) -> Mapping[str, object]:
    """Accept the flat form and the Helm-values form (devices.mthreads.memoryPerCard). A setting given both ways
    with different values is refused: which one wins would be a guess (a HAMi values block pasted into a file that
    already had the flat key)."""
    flat = dict(doc)
    devices = flat.pop("devices", None)
    if isinstance(devices, Mapping):
        mt = devices.get("mthreads")
        if isinstance(mt, Mapping):
            for k, v in mt.items():
                if k in ("enabled", "customresources"):
                    continue
                if k not in _KEYS:
                    errors.append(f"{source}: unknown setting 'devices.mthreads.{k}' (known: "
                                  f"{', '.join(sorted(_KEYS))})")
                elif k in flat and not _same(k, flat[k], v):
                    errors.append(f"{source}: {k} is {_shown(_KEYS[k], flat[k])} and devices.mthreads.{k} is "
                                  f"{_shown(_KEYS[k], v)}: give it one way")
                else:
                    flat[k] = v
    return flat


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> Config:
    """Build the Config: defaults < file < environment (MTSCHED_*) < flags (camelCase or snake_case keys)."""
    errors: list[str] = []
    merged: dict[str, object] = {}
    if path:
        try:
            doc = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"config file {path}: {e}") from e
        if not isinstance(doc, Mapping):
            raise ConfigError(f"config file {path}: top level must be a mapping")
        source = f"config file {path}"
        merged.update(_from_mapping(_flatten_file(doc, source, errors), source, errors))
    env = os.environ if env is None else env
    env_values = {
        camel(k[len("MTSCHED_"):].lower()): v
        for k, v in env.items()
        if k.startswith("MTSCHED_") and k not in ("MTSCHED_CONFIG",)
    }
    env_values = {SPELLED.get(k, k): v for k, v in env_values.items()}
    # The environment is shared (Service links inject MTSCHED_*_PORT into pods, the CLI reads
    # MTSCHED_LOG_FORMAT): only variables naming a setting are read; the file and flags stay strict.
    env_values = {k: v for k, v in env_values.items() if k in _KEYS}
    merged.update(_from_mapping(env_values, "environment", errors))
    if flags:
        camel_flags = {(camel(k) if "_" in k else k): v for k, v in flags.items() if v is not None}
        camel_flags = {SPELLED.get(k, k): v for k, v in camel_flags.items()}
        merged.update(_from_mapping(camel_flags, "flags", errors))
    cfg = replace(Config(), **merged)  # type: ignore[arg-type]
    _validate(cfg, errors)
    if errors:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errors))
    return cfg
