"""One typed settings schema for every entry point.

Settings come, in increasing priority, from the defaults below, a TOML file (``--config``),
environment variables ``METRICVAULT_<NAME>`` and command-line flags. Every field carries help
text; ``metricvault config`` prints them all and ``docs/configuration.md`` lists them (a test
fails when a setting is missing there).
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from metricvault.durations import parse_duration_ms, parse_retention_ms
from metricvault.errors import ConfigError
from metricvault.selector import parse_selectors

ENV_PREFIX = "METRICVAULT_"


def _setting(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class RetentionOverride:
    """Keep the series matching ``selector`` for ``retention`` in ``tier`` (e.g. raw forever)."""

    selector: str
    tier: str
    retention: str


@dataclass(frozen=True)
class BearerToken:
    """A gateway credential: the SHA-256 (hex) of the token, never the token itself."""

    sha256: str
    tenant: str = ""


@dataclass(frozen=True)
class BasicUser:
    """HTTP basic auth user: name and the SHA-256 (hex) of the password."""

    user: str
    sha256: str
    tenant: str = ""


@dataclass(frozen=True)
class Settings:
    data: str = _setting(
        "./metricvault-data",
        "Where the vault lives: a local directory or s3://bucket/prefix.",
    )
    state_dir: str = _setting(
        "",
        "Local directory for the durable ingest buffer of a vault on object storage "
        "(default: .metricvault-state/<bucket>-<hash of endpoint and prefix>). "
        "Local vaults keep it inside the vault.",
    )
    s3_endpoint: str = _setting(
        "", "S3 endpoint URL for s3:// vaults (MinIO, moto, ...); empty means AWS."
    )
    s3_region: str = _setting("us-east-1", "S3 region for s3:// vaults.")
    s3_access_key: str = _setting(
        "", "S3 access key; empty means AWS_ACCESS_KEY_ID from the environment."
    )
    s3_secret_key: str = _setting(
        "", "S3 secret key; empty means AWS_SECRET_ACCESS_KEY from the environment."
    )
    retention_raw: str = _setting("30d", "How long raw samples are kept ('forever' to never drop).")
    retention_1m: str = _setting("1095d", "How long 1-minute rollups are kept.")
    retention_1h: str = _setting("forever", "How long 1-hour rollups are kept.")
    retention_overrides: tuple[RetentionOverride, ...] = _setting(
        (),
        "Per-selector retention, e.g. [[retention_overrides]] selector='{experiment=\"x\"}' "
        "tier='raw' retention='forever'.",
    )
    flush_interval: str = _setting(
        "10s", "How often buffered samples become Parquet files (gateway and maintain loop)."
    )
    flush_max_samples: int = _setting(2_000_000, "Flush early once this many samples are buffered.")
    buffer_max_bytes: int = _setting(
        2 * 1024**3,
        "Refuse writes (backpressure, HTTP 503) while the ingest buffer is over this size.",
    )
    counter_lookback: str = _setting(
        "1h",
        "How far back the previous sample of a counter is looked for when computing increase; "
        "a longer gap counts as a fresh start.",
    )
    compact_min_files: int = _setting(
        2, "Compact a day partition once it holds this many data files."
    )
    compact_small_file_bytes: int = _setting(
        64 * 1024**2,
        "While a day is still receiving data, only files smaller than this are merged (so a "
        "busy day is not rewritten whole every round); closed days are merged into one file.",
    )
    keep_snapshots: int = _setting(
        10, "Catalog snapshots kept by maintain; older ones are expired (readers see new ones)."
    )
    orphan_grace: str = _setting(
        "15m",
        "A file compaction, rollup or retention replaced is deleted this long after it was "
        "replaced (readers of older snapshots keep their files); a crashed write's file this "
        "long after it was written.",
    )
    maintain_claim_ttl: str = _setting(
        "5m",
        "How long a maintainer's claim on a day of work (compaction, rollups, retention) lasts: "
        "other maintainers of the vault skip that day meanwhile, and take it over once a "
        "dead maintainer's claim has expired.",
    )
    maintain_interval: str = _setting(
        "60s", "Pause between rounds of 'metricvault maintain --loop'."
    )
    cache_bytes: int = _setting(
        512 * 1024**2, "Memory for decoded data files kept by a Vault for repeated queries."
    )
    listen: str = _setting("127.0.0.1:9201", "Gateway address, HOST:PORT (metricvault serve).")
    max_body_bytes: int = _setting(
        32 * 1024**2,
        "Largest request body the gateway accepts, compressed and decompressed (HTTP 413 above).",
    )
    max_series_per_request: int = _setting(
        20_000,
        "Most series one write request may carry (HTTP 413 above). Default 20000: ten times "
        "Prometheus' max_samples_per_send (2000), so senders that raised it still fit, while one "
        "request cannot keep a gateway worker busy for seconds (100000 new series took 17 s).",
    )
    max_new_series_per_minute: int = _setting(
        100_000,
        "Most series a tenant may create per minute in one gateway worker (HTTP 429 with "
        "Retry-After above). Default 100000: a 250000-series cluster is onboarded in 3 minutes "
        "of retries, while a cardinality bomb cannot grow the series index without bound.",
    )
    max_label_names_per_request: int = _setting(
        1_000,
        "Most distinct label names (tag keys) one write request may use (HTTP 413 above). "
        "Default 1000: real requests use tens; a request's table has a cell per sample and "
        "label name, so 1000 series with 33 names each of their own asked for 33 M cells.",
    )
    decode_time_budget: str = _setting(
        "5s",
        "CPU time one write request may spend being decoded (HTTP 413 above). Default 5s: a "
        "normal 2000-sample request decodes in milliseconds and the largest body max_body_bytes "
        "admits (32 MB of line protocol) in about 3 s on 2 cores; what needs more is an attack.",
    )
    auth_bearer_tokens: tuple[BearerToken, ...] = _setting(
        (),
        "Accepted bearer tokens as [[auth_bearer_tokens]] sha256='<hex of token>' tenant='x'. "
        "Empty (and no basic users): no authentication.",
    )
    auth_basic_users: tuple[BasicUser, ...] = _setting(
        (),
        "Accepted basic-auth users as [[auth_basic_users]] user='u' sha256='<hex of password>' "
        "tenant='x'.",
    )
    tenant_label: str = _setting(
        "tenant",
        "Label a credential's tenant is written to on every series (payloads cannot override it).",
    )
    ha_cluster_label: str = _setting(
        "cluster",
        "HA Prometheus pairs (docs/gateway.md): the label naming the cluster a remote_write "
        "request comes from (an external label both replicas share; kept on stored series).",
    )
    ha_replica_label: str = _setting(
        "__replica__",
        "HA Prometheus pairs: the label naming the replica (an external label of each "
        "replica). Requests carrying it and ha_cluster_label are deduplicated: only the "
        "elected replica's samples are stored, without this label. Empty: no deduplication.",
    )
    ha_failover_timeout: str = _setting(
        "30s",
        "HA Prometheus pairs: another replica is elected once the vault has seen no sample "
        "of the elected one for this long (Mimir's -distributor.ha-tracker.failover-timeout).",
    )
    ha_update_timeout: str = _setting(
        "15s",
        "HA Prometheus pairs: how often the elected replica's last-seen time is written to "
        "the vault (Mimir's -distributor.ha-tracker.update-timeout); shorter than "
        "ha_failover_timeout.",
    )
    ha_cache_ttl: str = _setting(
        "2s",
        "HA Prometheus pairs: how long a gateway trusts its copy of an election before it "
        "reads the vault again (a failover decided elsewhere is followed within this).",
    )
    ha_max_clusters: int = _setting(
        100,
        "HA Prometheus pairs: most clusters a tenant may have (HTTP 413 for a new one above; "
        "Mimir's -distributor.ha-tracker.max-clusters).",
    )
    tls_cert: str = _setting("", "PEM certificate file: serve HTTPS (with tls_key).")
    tls_key: str = _setting("", "PEM private key file for tls_cert.")
    gateway_workers: int = _setting(
        2,
        "Gateway worker processes (Python runs one core per process). Each has its own ingest "
        "buffer; /metrics adds up all of them. 1 runs the gateway in the serve process itself.",
    )
    gateway_maintain: bool = _setting(
        True, "Run maintenance (compaction, rollups, retention) inside metricvault serve."
    )
    gateway_keep_alive: str = _setting(
        "120s",
        "How long the gateway keeps an idle keep-alive connection open. Keep it longer than any "
        "sender's send interval (Prometheus: batch_send_deadline), or a send races the close "
        "and is retried.",
    )
    gateway_header_timeout: str = _setting(
        "10s",
        "A connection that has not sent a complete request head (line and headers) this long "
        "after its first byte (or after connecting) is closed: stalled clients (slowloris) "
        "cannot hold connections.",
    )
    gateway_max_connections: int = _setting(
        1000,
        "Open connections per gateway worker above which requests are answered 503 at once "
        "(uvicorn's limit_concurrency).",
    )
    query_timeout: str = _setting(
        "2m",
        "A PromQL query (the gateway's /api/v1/query and query_range, vault.promql, metricvault "
        "promql) that runs longer is stopped where it is and refused 'query timed out' (503 on "
        "the API; Prometheus's --query.timeout default).",
    )
    query_max_samples: int = _setting(
        50_000_000,
        "Points one PromQL query may hold at once (samples and rollup rows read, range "
        "windows, subquery results, series x steps matrices); more is refused with 422 before "
        "it is built (Prometheus's --query.max-samples default): about 1.2 GB of memory at "
        "this default.",
    )
    query_max_series: int = _setting(
        1_000_000,
        "Series one PromQL query may select, and series /api/v1/series, /api/v1/labels and "
        "/api/v1/label/<name>/values may expand their match[] to; more is refused with 422 "
        "(Mimir's -querier.max-fetched-series-per-query).",
    )
    lookback_delta: str = _setting(
        "5m",
        "How far back a PromQL instant selector looks for a series' latest sample "
        "(Prometheus's --query.lookback-delta).",
    )
    promql_round_windows: bool = _setting(
        False,
        "Answer rate/increase/delta/*_over_time over windows that are not whole minutes "
        "(Grafana's $__rate_interval) from the 1m rollups within raw retention too, each "
        "window moved to whole minutes (end rounded down by under a minute, length to the "
        "nearest minute; said in warnings). Off: answers within raw retention are exactly "
        "Prometheus's; past it windows are always moved.",
    )

    rules_files: tuple[str, ...] = _setting(
        (),
        "Prometheus rule files (paths or globs, comma-separated in the environment) that "
        "metricvault serve evaluates (`serve --rules`); reloaded on SIGHUP and POST /-/reload.",
    )
    rules_evaluation_interval: str = _setting(
        "1m",
        "How often a rule group without its own `interval` is evaluated (Prometheus's global "
        "evaluation_interval).",
    )
    rules_for_outage_tolerance: str = _setting(
        "1h",
        "How long the evaluator may have been down for an alert's `for` state to be restored "
        "from ALERTS_FOR_STATE (Prometheus's --rules.alert.for-outage-tolerance).",
    )
    rules_for_grace_period: str = _setting(
        "10m",
        "After a restart, a restored alert fires no sooner than this; rules with a shorter "
        "`for` are not restored (Prometheus's --rules.alert.for-grace-period).",
    )
    rules_resend_delay: str = _setting(
        "1m",
        "How often a firing alert is sent again to the Alertmanager "
        "(Prometheus's --rules.alert.resend-delay).",
    )
    rules_max_concurrent_groups: int = _setting(
        4,
        "How many rule groups are evaluated at once, each on its own schedule (Prometheus runs "
        "every group in its own goroutine); 1 evaluates them one after another.",
    )
    rules_external_url: str = _setting(
        "",
        "The URL alerts link back to (generatorURL, the templates' externalURL; Prometheus's "
        "--web.external-url).",
    )
    rules_tenant: str = _setting(
        "",
        "Evaluate the rules over this tenant's series only (its tenant_label on everything "
        "they write); empty: over the whole vault.",
    )
    alertmanagers: tuple[str, ...] = _setting(
        (),
        "Alertmanager URLs the rules' alerts are sent to (`serve --alertmanager`; v2 API, "
        "user:password@ in a URL for basic auth), queued and retried while one is down.",
    )

    baselines: tuple[str, ...] = _setting(
        (),
        "What maintain keeps baselined (docs/anomaly.md, Baselines): entries `SELECTOR` or "
        "`SELECTOR by LABEL,LABEL` (optionally `over 28d`), semicolon-separated in the "
        "environment; empty: none.",
    )
    baseline_interval: str = _setting(
        "1h",
        "A maintain round recomputes the baselines trained longer ago than this and copies "
        "the others' values forward.",
    )
    anomaly_score_selectors: tuple[str, ...] = _setting(
        (),
        "Series that maintain scores online as they arrive (docs/anomaly.md, Online scoring): "
        "PromQL selectors, semicolon-separated in the environment; their scores are the "
        "metricvault_anomaly_score series. Empty: none.",
    )
    anomaly_detector: str = _setting(
        "range",
        "The detector that scores anomaly_score_selectors' series (docs/anomaly.md, Detectors).",
    )
    anomaly_score_interval: str = _setting(
        "1m",
        "`maintain --loop` scores the new samples at most this often (each one-off maintain "
        "scores them once).",
    )

    archive_dir: str = _setting(
        "artifacts/metrics",
        "Where `metricvault archive export` writes snapshots (keep it inside your git repository).",
    )
    archive_tag_prefix: str = _setting(
        "metrics/",
        "Git tag of an archived snapshot: this prefix plus the experiment id.",
    )
    archive_dvc_remote: str = _setting(
        "", "DVC remote that archive export --dvc pushes to (empty: the repository's default)."
    )
    iceberg_catalog: str = _setting(
        "",
        "Iceberg SQL catalog that maintain publishes the tiers to, a SQLAlchemy URI: "
        "sqlite:////path/iceberg.db or postgresql+psycopg://user:pw@host/db (empty: none).",
    )
    iceberg_warehouse: str = _setting(
        "",
        "Where the Iceberg tables' files go: a directory or s3://bucket/prefix (empty with a "
        "SQLite catalog: a warehouse directory beside the database file).",
    )
    iceberg_namespace: str = _setting(
        "metricvault", "Iceberg namespace holding the tables raw, rollup_1m and rollup_1h."
    )

    def __post_init__(self) -> None:
        for name in ("retention_raw", "retention_1m", "retention_1h"):
            _check(name, parse_retention_ms, getattr(self, name))
        for name in (
            "flush_interval",
            "counter_lookback",
            "orphan_grace",
            "maintain_claim_ttl",
            "maintain_interval",
            "gateway_keep_alive",
            "gateway_header_timeout",
            "decode_time_budget",
            "query_timeout",
            "lookback_delta",
            "rules_evaluation_interval",
            "rules_for_outage_tolerance",
            "rules_for_grace_period",
            "rules_resend_delay",
            "baseline_interval",
            "anomaly_score_interval",
            "ha_failover_timeout",
            "ha_update_timeout",
            "ha_cache_ttl",
        ):
            _check(name, parse_duration_ms, getattr(self, name))
        _check_ha(self)
        if parse_duration_ms(self.rules_evaluation_interval) < 1:
            raise ConfigError(
                f"setting rules_evaluation_interval={self.rules_evaluation_interval!r} must be "
                "longer than 0 (how often rule groups are evaluated)"
            )
        for name in (
            "max_body_bytes",
            "gateway_workers",
            "max_series_per_request",
            "max_new_series_per_minute",
            "max_label_names_per_request",
            "flush_max_samples",
            "buffer_max_bytes",
            "compact_min_files",
            "compact_small_file_bytes",
            "cache_bytes",
            "gateway_max_connections",
            "query_max_samples",
            "query_max_series",
            "ha_max_clusters",
            "rules_max_concurrent_groups",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"setting {name} must be at least 1, got {getattr(self, name)}")
        for override in self.retention_overrides:
            if override.tier not in ("raw", "1m", "1h"):
                raise ConfigError(
                    f"retention override for {override.selector!r} names tier {override.tier!r}; "
                    "tiers are raw, 1m, 1h"
                )
            _check("retention_overrides.retention", parse_retention_ms, override.retention)
            _check("retention_overrides.selector", parse_selectors, override.selector)
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(
                f"setting listen={self.listen!r} must be HOST:PORT, e.g. 127.0.0.1:9201"
            )
        creds: list[BearerToken | BasicUser] = [*self.auth_bearer_tokens, *self.auth_basic_users]
        for cred in creds:
            if len(cred.sha256) != 64 or any(c not in "0123456789abcdef" for c in cred.sha256):
                raise ConfigError(
                    "auth credentials are stored as the SHA-256 hex digest of the secret "
                    "(64 lower-case hex characters); compute it with "
                    "'metricvault hash-secret' and never put the secret itself in the file"
                )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("set both tls_cert and tls_key to serve HTTPS, or neither")
        _check_iceberg(self)

    def retention_ms(self, tier: str) -> int | None:
        return parse_retention_ms(getattr(self, f"retention_{tier}"))

    def with_overrides(self, **values: Any) -> Settings:
        return replace(self, **{k: _coerce(k, v) for k, v in values.items() if v is not None})

    @classmethod
    def load(
        cls,
        config_file: str | Path | None = None,
        env: dict[str, str] | None = None,
        **flags: Any,
    ) -> Settings:
        """Defaults < TOML file < ``METRICVAULT_*`` environment < explicit flags."""
        values: dict[str, Any] = {}
        if config_file:
            values.update(_read_toml(Path(config_file)))
        values.update(_read_env(os.environ if env is None else env))
        values.update({k: v for k, v in flags.items() if v is not None})
        unknown = set(values) - set(setting_names())
        if unknown:
            raise ConfigError(
                f"unknown setting(s) {', '.join(sorted(unknown))}; known settings are listed by "
                "'metricvault config'"
            )
        return cls(**{k: _coerce(k, v) for k, v in values.items()})


def _check_iceberg(settings: Settings) -> None:
    """Refuse Iceberg settings that cannot work, before anything is read or written."""
    uri = settings.iceberg_catalog
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", settings.iceberg_namespace):
        raise ConfigError(
            f"setting iceberg_namespace={settings.iceberg_namespace!r} must be one identifier "
            "(letters, digits, _; not starting with a digit), e.g. metricvault"
        )
    if not uri:
        return
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if not (scheme == "sqlite" or scheme.startswith("postgresql")):
        raise ConfigError(
            f"setting iceberg_catalog={uri.split('@')[-1]!r} is not a SQLAlchemy URI of SQLite or "
            "PostgreSQL: write it as sqlite:////var/lib/metricvault/iceberg.db (one machine) or "
            "postgresql+psycopg://user:password@host:5432/dbname (many)"
        )
    if scheme == "sqlite" and not uri.startswith("sqlite:///"):
        raise ConfigError(
            f"setting iceberg_catalog={uri!r} names no database file: write it as "
            "sqlite:////absolute/path/iceberg.db or sqlite:///relative/path/iceberg.db"
        )
    if not settings.iceberg_warehouse and scheme != "sqlite":
        raise ConfigError(
            "setting iceberg_warehouse is empty: with a PostgreSQL catalog, say where the "
            "tables' files go (a directory every reader can see, or s3://bucket/prefix)"
        )


def setting_names() -> list[str]:
    return [f.name for f in fields(Settings)]


def describe() -> list[tuple[str, str, str]]:
    """(name, default, help) for every setting, in schema order."""
    rows = []
    for f in fields(Settings):
        default = f.default if f.default is not MISSING else ""
        rows.append((f.name, repr(default), str(f.metadata["help"])))
    return rows


def _check_ha(settings: Settings) -> None:
    update = parse_duration_ms(settings.ha_update_timeout)
    failover = parse_duration_ms(settings.ha_failover_timeout)
    if update >= failover:  # else a live replica's last-seen time looks expired: flapping
        raise ConfigError(
            f"setting ha_update_timeout={settings.ha_update_timeout!r} must be shorter than "
            f"ha_failover_timeout={settings.ha_failover_timeout!r}: the elected replica's "
            "last-seen time is written that often, so a failover timeout no longer than it "
            "would elect another replica while the elected one still sends"
        )
    if settings.ha_replica_label and settings.ha_replica_label == settings.ha_cluster_label:
        raise ConfigError(
            f"settings ha_cluster_label and ha_replica_label are both "
            f"{settings.ha_cluster_label!r}: they must name two different labels"
        )


def _check(name: str, parse: Any, value: Any) -> None:
    try:
        parse(value)
    except Exception as exc:
        raise ConfigError(f"setting {name}={value!r} is invalid: {exc}") from exc


_TABLES = {
    "retention_overrides": RetentionOverride,
    "auth_bearer_tokens": BearerToken,
    "auth_basic_users": BasicUser,
}


def _coerce(name: str, value: Any) -> Any:
    if name in _TABLES:
        if isinstance(value, str):
            raise ConfigError(f"{name} is set in the TOML file as [[{name}]] tables")
        kind = _TABLES[name]
        try:
            return tuple(v if isinstance(v, kind) else kind(**v) for v in value)
        except TypeError as exc:
            raise ConfigError(f"{name}: {exc}") from exc
    kind = type(getattr(Settings(), name)) if name in setting_names() else str
    if kind is tuple:  # a list of strings (rules_files): TOML list, or comma-separated text
        if isinstance(value, str):
            # their entries hold commas (`by a,b`, `{a="1",b="2"}`)
            sep = ";" if name in ("baselines", "anomaly_score_selectors") else ","
            return tuple(part.strip() for part in value.split(sep) if part.strip())
        return tuple(str(v) for v in value)
    if kind is bool and isinstance(value, str):
        if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise ConfigError(f"setting {name} must be true or false, got {value!r}")
        return value.lower() in ("1", "true", "yes", "on")
    if kind is int and isinstance(value, str):
        try:
            return int(value.replace("_", ""))
        except ValueError as exc:
            raise ConfigError(f"setting {name} must be an integer, got {value!r}") from exc
    return value


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    section = raw.get("metricvault", raw)
    return dict(section)


def _read_env(env: Any) -> dict[str, Any]:
    found = {}
    for name in setting_names():
        key = ENV_PREFIX + name.upper()
        if key in env and name not in _TABLES:
            found[name] = env[key]
    _warn_unknown_env(env)
    return found


# METRICVAULT_* variables that are not settings but are read elsewhere (keep in step)
OTHER_ENV = frozenset(
    {
        "METRICVAULT_GATEWAY_TOKEN",  # store/backends/gateway.py: track() and push bearer token
        "METRICVAULT_EXPERIMENT",  # collect/sources/nvml.py: the experiment label
        "METRICVAULT_GATEWAY_SETTINGS_JSON",  # server/app.py: settings handed to workers
        "METRICVAULT_INFLUX_USER",  # cli/influx.py
        "METRICVAULT_INFLUX_PASSWORD",  # cli/influx.py
    }
)


def _warn_unknown_env(env: Any) -> None:
    """A mistyped variable (METRICVAULT_RETENTON_RAW) would otherwise be ignored in silence
    and the default used; name it and the setting it was probably meant for."""
    import difflib
    import logging

    known = {ENV_PREFIX + n.upper() for n in setting_names()} | OTHER_ENV
    for key in sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known):
        if key.startswith(ENV_PREFIX + "AGENT_"):  # the agent's own command line reads these
            continue
        near = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f"did you mean {near[0]}? " if near else ""
        logging.getLogger("metricvault.config").warning(
            "ignoring unknown environment variable %s: %s'metricvault config' lists every "
            "setting (METRICVAULT_<SETTING>)",
            key,
            hint,
        )


__all__ = [
    "BasicUser",
    "BearerToken",
    "RetentionOverride",
    "Settings",
    "describe",
    "setting_names",
]
