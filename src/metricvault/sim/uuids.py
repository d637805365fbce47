"""Deterministic GPU UUIDs in NVIDIA's ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` form."""

from __future__ import annotations

import hashlib
import uuid


def gpu_uuid(seed: int, node: int, gpu: int) -> str:
    digest = hashlib.blake2b(repr(("gpu-uuid", seed, node, gpu)).encode(), digest_size=16)
    return f"GPU-{uuid.UUID(bytes=digest.digest())}"
