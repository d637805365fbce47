"""Counter-based noise: the random value of (series, step) is a hash of both.

Because noise depends only on the key and the global step index, a chunk can be computed without
the chunks before it and the values do not depend on the chunk size. Only integer operations and
float additions and multiplications are used, so values are the same on every CPU (numpy's
transcendental functions may differ in the last bit between SIMD code paths).
"""

from __future__ import annotations

import hashlib

import numpy as np
from numpy.typing import NDArray

U64 = NDArray[np.uint64]
F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_LOW16 = np.uint64(0xFFFF)
# Irwin-Hall: four 16-bit uniforms; mean and standard deviation of their sum.
_SUM_MEAN = 2 * 65535.0
_SUM_SD = float(np.sqrt(4 * (65536.0**2 - 1) / 12))


def key(seed: int, *parts: object) -> int:
    """A stable 64-bit key for a purpose (never Python's salted ``hash()``)."""
    text = repr((seed, *parts)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def keys(seed: int, *parts: object, count: int) -> U64:
    """``count`` keys, one per index (e.g. one per GPU of a node)."""
    return np.array([key(seed, *parts, i) for i in range(count)], dtype=np.uint64)


def _mix(x: U64) -> U64:
    # splitmix64 finaliser; uint64 array arithmetic wraps modulo 2**64, which is what we want.
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


def hashes(row_keys: U64, steps: I64) -> U64:
    """A (len(row_keys), len(steps)) array of 64-bit hashes."""
    counters = steps.astype(np.uint64) * _GOLDEN
    return _mix(row_keys[:, None] + counters[None, :])


def uniform(row_keys: U64, steps: I64) -> F64:
    """Uniform in [0, 1)."""
    return (hashes(row_keys, steps) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def normal(row_keys: U64, steps: I64) -> F64:
    """Mean 0, standard deviation 1, bell-shaped and bounded to about +-3.46 (no wild outliers)."""
    h = hashes(row_keys, steps)
    total = (
        (h & _LOW16)
        + ((h >> np.uint64(16)) & _LOW16)
        + ((h >> np.uint64(32)) & _LOW16)
        + (h >> np.uint64(48))
    )
    z: F64 = (total.astype(np.float64) - _SUM_MEAN) * (1.0 / _SUM_SD)
    return z


def smooth(row_keys: U64, steps: I64, period_steps: int) -> F64:
    """Slowly wandering noise: normal values at knots every ``period_steps``, eased between."""
    period = max(1, period_steps)
    knot = steps // period
    first = int(knot[0]) if len(knot) else 0
    last = int(knot[-1]) + 1 if len(knot) else 1
    values = normal(row_keys, np.arange(first, last + 1, dtype=np.int64))
    left = values[:, knot - first]
    right = values[:, knot - first + 1]
    frac = (steps - knot * period).astype(np.float64) / period
    ease = frac * frac * (3.0 - 2.0 * frac)
    return left + (right - left) * ease[None, :]
