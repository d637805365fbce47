"""End-to-end: SIGTERM empties a gateway's buffer into its s3:// vault before it exits.

deploy/kubernetes/scale-out keeps each gateway's ingest buffer (state_dir) on an emptyDir,
which Kubernetes deletes with the pod right after the container exits. That is safe only if
every acknowledged sample is in S3 by then: here a real ``metricvault serve`` (two worker
processes, a flush interval far longer than the test) acknowledges writes into its buffer,
gets SIGTERM, exits 0, and a reader with a fresh state directory (the emptyDir gone) finds
every acknowledged sample in the vault.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from metricvault import Vault

from .conftest import S3Server, free_port
from .test_multi_writer import S3Gateway

pytestmark = pytest.mark.e2e

T0_MS = 1_767_225_600_000  # 2026-01-01, a fixed day: the samples never age out
BATCHES, PER_BATCH = 8, 25


def stored(uri: str, endpoint: str, state_dir: Path) -> int:
    with Vault.open_local(uri, s3_endpoint=endpoint, state_dir=str(state_dir)) as vault:
        table = vault.sql("select count(*) as n from raw")
    return int(table["n"].iloc[0])


def test_sigterm_flushes_every_acknowledged_sample_to_s3_before_the_gateway_exits(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    uri = f"s3://{s3_bucket}/fleet"
    gateway = S3Gateway(
        data_dir=tmp_path / "unused",
        port=free_port(),
        log_path=tmp_path / "serve.log",
        settings=(
            f"s3_endpoint={s3_server.endpoint}",
            "flush_interval=1h",  # nothing reaches S3 before the SIGTERM but that flush
            "gateway_maintain=false",
            "gateway_workers=2",  # each worker flushes its own buffer on the way out
        ),
        uri=uri,
        state=tmp_path / "state",  # the pod's emptyDir
    )
    gateway.start()
    try:
        gateway.wait_ready()
        acked = batch = 0
        # A worker that starts after the other has taken writes flushes the other's buffer
        # (every worker's start does): on a loaded machine that can empty what was acked
        # so far. Write until samples are acked that no flush has stored yet, so that the
        # SIGTERM flush is what must store them.
        for _round in range(4):
            for _ in range(BATCHES):
                lines = [
                    f"sig,series=s{s} v={batch * PER_BATCH + s} {T0_MS + batch * 1_000}"
                    for s in range(PER_BATCH)
                ]
                request = urllib.request.Request(
                    f"{gateway.url}/api/v2/write?precision=ms",
                    data="\n".join(lines).encode(),
                    method="POST",
                )
                with urllib.request.urlopen(request, timeout=30) as response:
                    assert response.status == 204
                acked += PER_BATCH
                batch += 1
            before = stored(uri, s3_server.endpoint, tmp_path / f"reader-before-{_round}")
            if before < acked:
                break
        assert before < acked, "everything flushed before SIGTERM: the test would prove nothing"
    finally:
        status = gateway.stop(timeout=60)
    assert status == 0, f"serve exited {status} on SIGTERM:\n{gateway.log_tail()}"
    # the emptyDir is gone: a reader without the gateway's state directory
    assert stored(uri, s3_server.endpoint, tmp_path / "reader-after") == acked
