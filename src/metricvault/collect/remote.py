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

from metricvault.archive.experiments import Experiment
from metricvault.durations import TimeLike
from metricvault.errors import (
    ConflictError,
    InputError,
    MetricVaultError,
    NotFoundError,
    StorageError,
)

TIMEOUT_S = 30.0
_ERRORS: dict[int, type[MetricVaultError]] = {
    400: InputError,
    404: NotFoundError,
    409: ConflictError,
}


class GatewayVault:
    """The part of the :class:`~metricvault.Vault` API a training run uses, over HTTP."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.base = url.rstrip("/")
        for suffix in ("/api/v1/write", "/api/v1"):
            self.base = self.base.removesuffix(suffix)
        token = token or os.environ.get("METRICVAULT_GATEWAY_TOKEN") or ""
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.experiments = RemoteExperiments(self)

    def write(
        self, samples: Sequence[tuple[str, Mapping[str, str], int, float]], kinds: Any = None
    ) -> int:
        """Send samples with remote_write 1.0 (metric kinds follow the names at the gateway)."""
        from metricvault.collect.push import encode_write_request

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

    def close(self) -> None:
        pass

    def __enter__(self) -> GatewayVault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteExperiments:
    """The experiment registry behind a gateway (same methods as the vault's)."""

    def __init__(self, gateway: GatewayVault) -> None:
        self.gateway = gateway

    def _json(self, method: str, path: str, fields: Mapping[str, Any] | None = None) -> Any:
        body = None if fields is None else json.dumps(fields, default=_jsonable).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        return self.gateway.request(method, "/api/v1/experiments" + path, body, headers)

    def create(self, experiment_id: str, selector: str, **fields: Any) -> Experiment:
        record = self._json("POST", "", {"id": experiment_id, "selector": selector, **fields})
        return Experiment.from_record(record)

    def get(self, experiment_id: str) -> Experiment:
        return Experiment.from_record(self._json("GET", f"/{experiment_id}"))

    def ids(self) -> list[str]:
        return sorted(e.id for e in self.list())

    def list(self) -> list[Experiment]:
        return [Experiment.from_record(r) for r in self._json("GET", "")]

    def __contains__(self, experiment_id: str) -> bool:
        try:
            self.get(experiment_id)
        except NotFoundError:
            return False
        return True

    def update(self, experiment_id: str, **changes: Any) -> Experiment:
        return Experiment.from_record(self._json("PATCH", f"/{experiment_id}", changes))

    def end(self, experiment_id: str, at: TimeLike = "now") -> Experiment:
        return self.update(experiment_id, end=at)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
