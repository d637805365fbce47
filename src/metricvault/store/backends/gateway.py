"""A gateway seen as a vault, for training jobs that reach only ``metricvault serve``:
``metricvault.track("r3", data="http://gateway:9201")`` registers the experiment through the
gateway's ``/api/v1/experiments`` and sends its series with remote_write.

Writes are synchronous here (the training run's writer thread calls them, never the loop) and
raise on failure, so the run keeps the batch and retries it; the gateway stores a resent sample
once. A bearer token comes from ``token=`` or ``METRICVAULT_GATEWAY_TOKEN``.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from metricvault.errors import (
    ConflictError,
    InputError,
    MetricVaultError,
    NotFoundError,
    StorageError,
    UnsupportedError,
)
from metricvault.experiment import Experiment, RegistryBase
from metricvault.model import KindUpdate

TIMEOUT_S = 30.0

_ERRORS: dict[int, type[MetricVaultError]] = {
    400: InputError,
    404: NotFoundError,
    409: ConflictError,
}


class GatewayVault:
    """The part of the :class:`~metricvault.Vault` API a training run uses, over HTTP: writing
    and the experiment registry. Reading goes to the vault behind the gateway."""

    capabilities = frozenset({"write", "experiments"})
    backend_name = "gateway"
    unsupported_hint = (
        "A gateway URL takes writes and experiments only: open the vault the gateway stores "
        "into (its --data) to read, export or maintain it: pass that directory or s3:// URI "
        "(or influxdb:// URI) as --data instead of the gateway URL."
    )

    def __init__(self, url: str, token: str | None = None) -> None:
        self.base = url.rstrip("/")
        for suffix in ("/api/v1/write", "/api/v1"):
            self.base = self.base.removesuffix(suffix)
        token = token or os.environ.get("METRICVAULT_GATEWAY_TOKEN") or ""
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.experiments = RemoteExperiments(self)

    @property
    def uri(self) -> str:
        return self.base

    def write(
        self,
        samples: Sequence[tuple[str, Mapping[str, str], int, float]],
        kinds: Any = None,
        *,
        admit_new_series: Any = None,
    ) -> int:
        """Send samples with remote_write 1.0 (metric kinds follow the names at the gateway).
        The gateway applies its own cardinality limit, so ``admit_new_series`` is refused."""
        if admit_new_series is not None:
            raise UnsupportedError(
                "admit_new_series cannot be applied through a gateway: it enforces its own "
                "limit (max_new_series_per_minute); write without it"
            )
        if not samples:
            return 0
        from metricvault.wire.remote_write import encode_write_request

        body = encode_write_request(samples)
        headers = {
            **self.headers,
            "Content-Encoding": "snappy",
            "Content-Type": "application/x-protobuf",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
        }
        self.request("POST", "/api/v1/write", body, headers)
        return len(samples)

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] = {}
    ) -> Any:
        request = urllib.request.Request(
            self.base + path, data=body, method=method, headers={**self.headers, **headers}
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
                payload = reply.read()
        except urllib.error.HTTPError as exc:
            message = exc.read().decode(errors="replace").strip()
            raise _ERRORS.get(exc.code, StorageError)(
                f"gateway {self.base} answered {exc.code} to {method} {path}: {message}"
            ) from exc
        except OSError as exc:
            raise StorageError(f"cannot reach the gateway at {self.base}: {exc}") from exc
        return json.loads(payload) if payload.strip().startswith((b"{", b"[")) else None

    def set_metric_kinds(self, kinds: Mapping[str, str]) -> KindUpdate:
        """Kinds follow the metric names at the gateway (``_total``: counter); there is no
        metadata channel through it, so a kind that differs from the name is refused."""
        from metricvault.model import kind_from_name

        odd = {m: k for m, k in kinds.items() if kind_from_name(m) != k}
        if odd:
            raise UnsupportedError(
                f"a gateway takes metric kinds from the names only; {', '.join(sorted(odd))} "
                "would need metadata: name counters *_total, or write to the vault directly"
            )
        return KindUpdate()

    def flush(self) -> int:
        """Nothing to flush: every write was acknowledged by the gateway when it returned."""
        return 0

    def min_writable_ms(self) -> int:
        """The gateway checks the horizon of the vault behind it and answers 400 with why."""
        return 0

    def close(self) -> None:
        pass

    def __enter__(self) -> GatewayVault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteExperiments(RegistryBase):
    """The experiment registry behind a gateway (same methods as the vault's). The gateway
    validates and stores; its own messages (tenant-aware) are passed on as they are."""

    def __init__(self, gateway: GatewayVault) -> None:
        self.gateway = gateway
        self.where = gateway.base

    def _json(self, method: str, path: str, fields: Mapping[str, Any] | None = None) -> Any:
        body = None if fields is None else json.dumps(fields, default=_jsonable).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        return self.gateway.request(method, "/api/v1/experiments" + path, body, headers)

    def _load(self, experiment_id: str) -> Experiment | None:
        try:
            return self.get(experiment_id)
        except NotFoundError:
            return None

    def _all(self) -> list[Experiment]:
        return [Experiment.from_record(r) for r in self._json("GET", "")]

    def _store(self, exp: Experiment, *, new: bool) -> bool:
        raise NotImplementedError("the gateway stores records: create() and update() ask it")

    def create(self, experiment_id: str, selector: str, **fields: Any) -> Experiment:
        record = self._json("POST", "", {"id": experiment_id, "selector": selector, **fields})
        return Experiment.from_record(record)

    def get(self, experiment_id: str) -> Experiment:
        return Experiment.from_record(self._json("GET", f"/{experiment_id}"))

    def update(self, experiment_id: str, **changes: Any) -> Experiment:
        return Experiment.from_record(self._json("PATCH", f"/{experiment_id}", changes))


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
