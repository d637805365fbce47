"""End-to-end: Debian's ``influx`` 1.x CLI imports line protocol into the gateway (issue 3, test 2).

``influx -import`` reads a file with a ``# DDL`` section (``CREATE DATABASE`` / ``CREATE
RETENTION POLICY``, sent to ``POST /query``) and a ``# DML`` section (points, batched 5,000 to a
``POST /write?db=..&rp=..&precision=s&consistency=all``), after a ``GET /ping``. The vault must
then hold exactly the points of the file: metric ``<measurement>_<field>`` (names made
Prometheus-safe), tags as labels (escapes undone), int/uint/bool/float values, second precision.

The file is imported twice, plain and gzip-compressed (``-compressed``): the duplicate delivery
must not duplicate anything.
"""

from __future__ import annotations

import gzip
import random
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from metricvault.store.vault import Vault

from .conftest import GatewayProcess

pytestmark = pytest.mark.e2e

STEPS = 700  # timestamps per series: 16 GPU lines + 3 others per step, ~13,300 lines
HOSTS = ("node01", "node02", "rack 1,a=b", "zürich")  # escaped in the file
IMPORT_TIMEOUT_S = 60

Key = tuple[str, tuple[tuple[str, str], ...], int]  # metric, sorted labels, ts ms


def _escape_tag(text: str) -> str:
    # a backslash before any other character is literal in 1.x and 2.x alike, so it is kept
    return text.replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def _tags(tags: dict[str, str]) -> str:
    return "".join(f",{_escape_tag(k)}={_escape_tag(v)}" for k, v in tags.items())


def build_import_file(path: Path, t0_s: int) -> dict[Key, float]:
    """Write the import file; return the samples the vault must hold afterwards."""
    rng = random.Random(20260303)
    lines = [
        "# DDL",
        "CREATE DATABASE mv_e2e",
        "CREATE RETENTION POLICY two_days ON mv_e2e DURATION 2d REPLICATION 1",
        "",
        "# DML",
        "# CONTEXT-DATABASE: mv_e2e",
        "# CONTEXT-RETENTION-POLICY: two_days",
    ]
    expected: dict[Key, float] = {}

    def point(
        measurement: str,
        metric_prefix: str,
        tags: dict[str, str],
        labels: dict[str, str],
        fields: list[tuple[str, str, str, float]],
        ts: int,
    ) -> None:
        # fields: (key in the file, metric suffix, literal, stored value)
        text = ",".join(f"{key}={literal}" for key, _, literal, _ in fields)
        lines.append(f"{measurement}{_tags(tags)} {text} {ts}")
        for _, suffix, _, value in fields:
            expected[(f"{metric_prefix}_{suffix}", tuple(sorted(labels.items())), ts * 1000)] = (
                value
            )

    for step in range(STEPS):
        ts = t0_s + step
        if step == STEPS // 2:  # the importer passes comments and blank lines through
            lines += ["", "# a comment inside the DML section", "# CONTEXT-DATABASE: other_db"]
        for host in HOSTS:
            for gpu in range(4):
                util = rng.uniform(0, 100)
                mem = rng.randint(-(2**40), 2**40)
                ecc = rng.randint(0, 2**50)
                throttled = rng.random() < 0.3
                tags = {"host": host, "gpu-id": str(gpu)}
                point(
                    "gpu",
                    "gpu",
                    tags,
                    {"host": host, "gpu_id": str(gpu)},
                    [
                        ("util", "util", repr(util), util),
                        ("mem_used", "mem_used", f"{mem}i", float(mem)),
                        ("ecc", "ecc", f"{ecc}u", float(ecc)),
                        ("throttled", "throttled", "true" if throttled else "F", float(throttled)),
                    ],
                    ts,
                )
        device_tags = {"host": "node01", "dev": "sda 1", "path": "/mnt/a,b=c\\d"}
        read = rng.randint(0, 10**9)
        point(
            "disk.io",
            "disk_io",
            device_tags,
            device_tags,
            [("read-bytes", "read_bytes", f"{read}i", float(read))],
            ts,
        )
        latency = rng.randint(0, 100_000) / 1000
        point(
            "my\\ app",
            "my_app",
            {"env": "prod"},
            {"env": "prod"},
            [("latency", "latency", repr(latency), latency), ("up", "up", "T", 1.0)],
            ts,
        )
        celsius = (step % 160) / 4 - 20
        point("temp", "temp", {}, {}, [("celsius", "celsius", repr(celsius), celsius)], ts)
    path.write_text("\n".join(lines) + "\n")
    return expected


def run_import(influx: str, gw: GatewayProcess, path: Path, compressed: bool) -> str:
    command = [influx, "-host", "127.0.0.1", "-port", str(gw.port), "-import", "-path", str(path)]
    command += ["-precision", "s"] + (["-compressed"] if compressed else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{output}\n{gw.log_tail()}"
    assert "Failed 0 inserts" in output, f"the import lost points:\n{output}\n{gw.log_tail()}"
    return output


def vault_samples(vault: Vault) -> tuple[dict[Key, float], int]:
    table = vault.query("{__name__=~'.+'}", "2000-01-01", "2100-01-01", output="arrow")
    names = [c for c in table.column_names if c not in ("timestamp", "metric", "value")]
    ts = table["timestamp"].cast(pa.int64()).to_pylist()
    rows = zip(table["metric"].to_pylist(), ts, table["value"].to_pylist(), strict=True)
    columns = {n: table[n].to_pylist() for n in names}
    out: dict[Key, float] = {}
    for i, (metric, t, value) in enumerate(rows):
        labels = tuple((n, columns[n][i]) for n in names if columns[n][i] is not None)
        out[(metric, labels, t)] = value
    return out, table.num_rows


def test_influx_cli_import_into_gateway(gateway: Any, tmp_path: Path) -> None:
    influx = shutil.which("influx")
    if influx is None:
        pytest.skip("the influx CLI is missing: apt-get install -y influxdb-client")
    gw: GatewayProcess = gateway()
    t0_s = int(time.time()) - 3 * 3600
    plain = tmp_path / "import.txt"
    expected = build_import_file(plain, t0_s)
    packed = tmp_path / "import.txt.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))

    output = run_import(influx, gw, plain, compressed=False)
    assert "Processed 2 commands" in output, output
    run_import(influx, gw, packed, compressed=True)  # the same points again
    gw.stop_gracefully()

    with Vault.open_local(str(gw.data_dir), create=False) as vault:
        actual, rows = vault_samples(vault)
    assert rows == len(actual), f"{rows - len(actual)} samples stored twice"
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    assert not missing, f"{len(missing)} of {len(expected)} points missing, e.g. {missing[:5]}"
    assert not extra, f"{len(extra)} samples never imported, e.g. {extra[:5]}"
    wrong = [(k, expected[k], actual[k]) for k in expected if expected[k] != actual[k]]
    assert not wrong, f"{len(wrong)} values differ (key, file, vault), e.g. {wrong[:5]}"
    series = {(metric, labels) for metric, labels, _ in actual}
    print(f"{len(expected)} samples in {len(series)} series imported twice, stored once")
