"""The one S3 call pyarrow's filesystem cannot make: a PUT that creates an object only if absent.

A catalog commit must be a compare-and-swap, or two writers that each saw version N both write
N+1 and the later PUT silently replaces the earlier one (with every sample that commit
acknowledged). S3 has conditional writes (``If-None-Match: *``) since 2024; pyarrow has no way
to send the header, so this module reaches the same bucket with boto3, built from the same
settings (endpoint, region, keys; else boto3's usual credential chain, as pyarrow's is).
boto3 is imported on first use. The catalog also reads through it: a GET that answers "absent"
in one request (probing for the next version) and a pointer replaced with ``If-Match``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from metricvault.errors import StorageError

# The codes S3 answers a conditional PUT with when the key exists (412), or while another
# conditional write of the same key is in flight (409, which AWS says to retry).
_LOST = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_UNSUPPORTED = {"NotImplemented", "501"}


@dataclass
class S3Access:
    """How to reach an S3 vault's bucket with boto3 (for conditional writes)."""

    endpoint: str  # "" for AWS itself
    region: str
    access_key: str | None
    secret_key: str | None
    _client: Any = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = _make_client(self)
            return self._client

    def create_if_absent(self, path: str, data: bytes) -> bool:
        """PUT ``bucket/key`` unless it exists; False when another writer created it first."""
        import botocore.exceptions

        bucket, _, key = path.partition("/")
        try:
            self.client().put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except botocore.exceptions.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in _LOST or status in _LOST:
                if status == "409" or code == "ConditionalRequestConflict":
                    return False  # another write of this key is in flight: re-read, retry
                # A retried PUT whose first attempt did land is answered 412 too: it is ours
                # exactly when the stored bytes are the ones we sent.
                return self._stored(bucket, key) == data
            if code in _UNSUPPORTED or status in _UNSUPPORTED:
                raise StorageError(
                    f"the S3 endpoint {self.endpoint or 'AWS'} does not support conditional "
                    f"writes (If-None-Match: *), which catalog commits to s3://{path} need so "
                    "that no writer overwrites another's: use an S3 service that has them "
                    "(AWS S3, MinIO, Ceph RGW, R2 and GCS do)"
                ) from exc
            raise StorageError(f"cannot write s3://{path}: {exc}") from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise StorageError(f"cannot write s3://{path}: {exc}") from exc
        return True

    def get(self, path: str) -> tuple[bytes, str] | None:
        """The bytes and ETag of ``bucket/key``, or None when it does not exist: one GET, where
        pyarrow's filesystem would add a HEAD and, for a missing key, a LIST."""
        import botocore.exceptions

        bucket, _, key = path.partition("/")
        try:
            found = self.client().get_object(Bucket=bucket, Key=key)
        except botocore.exceptions.ClientError as exc:
            if _missing(exc):
                return None
            raise StorageError(f"cannot read s3://{path}: {exc}") from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise StorageError(f"cannot read s3://{path}: {exc}") from exc
        return bytes(found["Body"].read()), str(found.get("ETag", ""))

    def exists(self, path: str) -> bool:
        """Whether ``bucket/key`` exists: one HEAD."""
        import botocore.exceptions

        bucket, _, key = path.partition("/")
        try:
            self.client().head_object(Bucket=bucket, Key=key)
        except botocore.exceptions.ClientError as exc:
            if _missing(exc):
                return False
            raise StorageError(f"cannot reach s3://{path}: {exc}") from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise StorageError(f"cannot reach s3://{path}: {exc}") from exc
        return True

    def replace_if_match(self, path: str, data: bytes, etag: str | None) -> bool:
        """PUT ``bucket/key`` only if it still has ``etag`` (None: only if it is absent);
        False when another writer replaced or created it first."""
        if etag is None:
            return self.create_if_absent(path, data)
        import botocore.exceptions

        bucket, _, key = path.partition("/")
        try:
            self.client().put_object(Bucket=bucket, Key=key, Body=data, IfMatch=etag)
        except botocore.exceptions.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in _LOST or status in _LOST or _missing(exc):
                return False
            raise StorageError(f"cannot write s3://{path}: {exc}") from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise StorageError(f"cannot write s3://{path}: {exc}") from exc
        return True

    def _stored(self, bucket: str, key: str) -> bytes | None:
        import botocore.exceptions

        try:
            return bytes(self.client().get_object(Bucket=bucket, Key=key)["Body"].read())
        except botocore.exceptions.ClientError:
            return None


def _missing(exc: Any) -> bool:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code in {"NoSuchKey", "404", "NotFound"} or status == "404"


def _make_client(access: S3Access) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - boto3 is a dependency
        raise StorageError(
            "committing to an s3:// vault needs boto3 (for conditional writes): "
            "pip install 'boto3>=1.36'"
        ) from exc
    config = Config(
        # Checksums only where S3 requires them: S3-compatible stores refuse the newer ones.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        retries={"mode": "standard", "max_attempts": 3},
        s3={"addressing_style": "path"} if access.endpoint else {},
    )
    keys: dict[str, str] = {}
    if access.access_key and access.secret_key:
        keys = {"aws_access_key_id": access.access_key, "aws_secret_access_key": access.secret_key}
    return boto3.session.Session().client(
        "s3",
        region_name=access.region,
        endpoint_url=access.endpoint or None,
        config=config,
        **keys,
    )
