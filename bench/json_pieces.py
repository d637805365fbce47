"""Two facts the query API's JSON writer rests on, measured side by side in one process.

    .venv/bin/python bench/json_pieces.py            # ~5 s
    .venv/bin/python bench/json_pieces.py --quick    # tiny sizes (what the unit test runs)

1. Building one big string from a head, a body and a tail: ``a + big + b`` (CPython grows the
   first sum in place for the second ``+``: a ``realloc`` of a block that size) against an
   f-string and ``"".join`` (the total size computed first, one copy).
2. Each distinct value of an answer once (the JSON writer formats each distinct value once
   where values repeat): ``np.unique(return_inverse=True)`` (a sort) against Arrow's
   hash-based ``dictionary_encode``, on averages of a few integers (quarter steps).

Prints a table per fact: the median of ``--repeat`` timings of each way, in ms, and each one's
ratio to the first row (the baseline).
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _median_ms(run: Callable[[], object], number: int, repeat: int) -> float:
    return statistics.median(timeit.repeat(run, number=number, repeat=repeat)) / number * 1e3


def _table(title: str, rows: list[tuple[str, float]]) -> None:
    print(f"\n{title}\n\n| way | median ms | ratio to the first |\n|---|---|---|")
    base = rows[0][1]
    for name, ms in rows:
        print(f"| {name} | {ms:.3f} | {ms / base:.2f} |")


def strings(sizes_mb: list[float], repeat: int) -> None:
    for size in sizes_mb:
        big = "x" * int(size * 1_000_000)
        head, tail = '{"status":"success","data":', "}"
        rows = [
            ("a + big + b", _median_ms(lambda: head + big + tail, 20, repeat)),  # noqa: B023
            ("f-string", _median_ms(lambda: f"{head}{big}{tail}", 20, repeat)),  # noqa: B023
            ('"".join', _median_ms(lambda: "".join((head, big, tail)), 20, repeat)),  # noqa: B023
        ]
        _table(f"### One string of {size:g} MB from a head, a body and a tail", rows)


def distinct_values(points: int, repeat: int) -> None:
    rng = np.random.default_rng(0)
    values = rng.integers(0, 400, points) / 4.0  # averages of four integer utilisations

    def arrow() -> object:
        encoded = pc.dictionary_encode(pa.array(values, pa.float64()))
        return encoded.indices.to_numpy(), encoded.dictionary.to_numpy(zero_copy_only=False)

    rows = [
        ("np.unique(return_inverse=True)",
         _median_ms(lambda: np.unique(values, return_inverse=True), 10, repeat)),
        ("pyarrow dictionary_encode", _median_ms(arrow, 10, repeat)),
    ]  # fmt: skip
    _table(f"### The distinct values of {points:,} answer values (quarter steps)", rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 3 repeats")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    repeat = 3 if args.quick else args.repeat
    strings([0.01] if args.quick else [0.1, 1.0, 4.0], repeat)
    distinct_values(1_000 if args.quick else 46_000, repeat)


if __name__ == "__main__":
    main()
