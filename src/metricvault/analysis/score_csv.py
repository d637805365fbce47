"""Score a ``timestamp,value`` CSV row by row: the offline form of the online detectors.

Rows are read, scored and written one at a time (the detector's state carries over), so a
file of any length streams in constant memory and no row's score depends on a later row.
The output goes to a temporary file beside ``output`` and replaces it only once every row
parsed: bad input gets an error naming its line and leaves ``output`` as it was.
"""

from __future__ import annotations

import csv
import math
import os
import tempfile
from datetime import datetime
from pathlib import Path

import numpy as np

from metricvault.analysis.detectors import DEFAULT_DETECTOR, make_detector
from metricvault.errors import InputError

# epoch seconds up to the year 5138, milliseconds beyond (1e11 s ~ 1e11 ms = 1973)
_MS_ABOVE = 1e11


def parse_timestamp(text: str, where: str) -> float:
    """Epoch seconds of an ISO 8601 timestamp or of an epoch in seconds or milliseconds."""
    text = text.strip()
    try:
        number = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise InputError(
                f"{where}: timestamp {text[:40]!r} is neither ISO 8601 "
                "(2024-01-31T12:00:00Z) nor epoch seconds or milliseconds"
            ) from None
        if parsed.tzinfo is None:  # naive: UTC, as NAB and most exports mean
            from datetime import UTC

            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    if not math.isfinite(number):
        raise InputError(f"{where}: timestamp {text!r} is not a finite number")
    return number / 1000.0 if abs(number) >= _MS_ABOVE else number


def score_csv(source: Path, output: Path, detector: str = DEFAULT_DETECTOR) -> int:
    """Write ``source``'s rows plus ``anomaly_score`` and ``is_anomaly`` to ``output``; returns
    the number of rows scored."""
    det = make_detector(detector)
    threshold = det.threshold()
    output = Path(output)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent or Path("."))
    rows = 0
    try:
        with open(source, newline="") as fin, os.fdopen(fd, "w", newline="") as fout:
            reader = csv.reader(fin)
            writer = csv.writer(fout, lineterminator="\n")
            header = next(reader, None)
            if header is None or [h.strip().lower() for h in header[:2]] != ["timestamp", "value"]:
                raise InputError(
                    f"{source}: line 1 must be the header 'timestamp,value' "
                    f"(got {','.join(header or [])[:60]!r})"
                )
            writer.writerow([*header, "anomaly_score", "is_anomaly"])
            previous = -math.inf
            for row in reader:
                line = reader.line_num
                if not row or not "".join(row).strip():
                    continue
                if len(row) < 2:
                    raise InputError(
                        f"{source}: line {line}: expected 'timestamp,value', got {row!r}"
                    )
                ts = parse_timestamp(row[0], f"{source}: line {line}")
                if ts < previous:
                    raise InputError(
                        f"{source}: line {line}: timestamp {row[0]!r} is earlier than the row "
                        "before: sort the file by time (the detectors stream in time order)"
                    )
                previous = ts
                try:
                    value = float(row[1])
                except ValueError:
                    raise InputError(
                        f"{source}: line {line}: value {row[1][:40]!r} is not a number"
                    ) from None
                if not math.isfinite(value):
                    raise InputError(f"{source}: line {line}: value {row[1]!r} is not finite")
                score = float(det.update(np.array([value]))[0])
                writer.writerow([*row, f"{score:.6f}", "1" if score >= threshold else "0"])
                rows += 1
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return rows
