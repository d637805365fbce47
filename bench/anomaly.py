"""Anomaly detectors measured on labelled real data.

    python bench/anomaly.py                 # NAB (19 files) + ASD/SMD (13 machines) + root cause
    python bench/anomaly.py --only nab      # one part: nab, smd or rootcause
    python bench/anomaly.py --only neighbours  # NAB of the default range detector's neighbours
    python bench/anomaly.py --only libraries  # statsmodels/stumpy/river on NAB ([anomaly] extra)

NAB (``../shared/data/nab_machine_metrics``): each detector streams every file (no look-ahead,
one parameter set), and NAB's scoring function (metricvault.analysis.nab_score, re-implemented
from numenta/NAB) gives the standard / reward-low-FP / reward-low-FN scores with one threshold
for the whole set. Our implementations of NAB's random and windowed-Gaussian detectors are
scored first, beside their published scores, to validate the scorer.

ASD/SMD (``../shared/data/interfusion_asd_smd``): the detector runs over train then test (the
train rows are history, not scored); per-metric scores are combined by their maximum. The
multivariate detectors (``MULTIVARIATE``: ``pca``, metricvault.analysis.multivariate) are
fitted on the same train rows, then stream the test rows. Per machine, and per machine group
(ASD omi-*, SMD machine-1-*, -2-*, -3-*: the mean over the group's machines in the run).
Precision / recall / F1 at the best threshold, without and with point adjustment, VUS-PR
(Paparrizos et al., VLDB 2022) from the ``tsb-ad`` package where it is importable (its
dependencies pin numpy < 2 and pull in torch, so install it apart:
``pip install --target tsb-ad-pkgs --no-deps TSB-AD==1.5 scikit-learn scipy joblib
threadpoolctl narwhals``, then run with ``PYTHONPATH=tsb-ad-pkgs``; the
metric needs only scikit-learn), else an approximation that reads lower; the output names
which (``vus_source``); run time.

Root cause: for each labelled segment, metrics ranked by metricvault.analysis.rootcause_rank;
HitRate@100 % / @150 % against ``interpretation_label/``, beside a seeded random ranking.
Deterministic: every random part is seeded.
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from metricvault.analysis.detectors import DEFAULT_DETECTOR, RangeDetector, make_detector
from metricvault.analysis.multivariate import PcaDetector
from metricvault.analysis.nab_score import PROFILES, LabelledFile, nab_score, window_rows
from metricvault.analysis.rootcause_rank import rank_metrics

ROOT = Path(__file__).resolve().parents[1]
NAB = ROOT.parent / "shared" / "data" / "nab_machine_metrics"
ASD = ROOT.parent / "shared" / "data" / "interfusion_asd_smd"
PUBLISHED = {
    "Numenta HTM": 72.8,
    "contextOSE": 71.7,
    "KNN CAD": 60.6,
    "Random Cut Forest": 60.4,
    "Twitter ADVec": 42.8,
    "windowed Gaussian (NAB)": 34.8,
    "random (NAB)": 9.0,
}
NAB_DETECTORS = {
    "range": None,
    "random": "random (NAB)",
    "gaussian": "windowed Gaussian (NAB)",
    "gaussian-rolling": None,
    "quantile": None,
    "mad": None,
    "novelty": None,
    "history": None,
}


# fitted on the train split, then streamed over the test rows (bench_smd only)
MULTIVARIATE = {"pca": lambda width: PcaDetector(width)}


def _epoch_s(text: str) -> int:
    return int(np.datetime64(text.strip()[:19]).astype("datetime64[s]").astype(np.int64))


def load_nab() -> list[tuple[str, npt.NDArray[np.int64], npt.NDArray[np.float64], list[Any]]]:
    windows = json.loads((NAB / "labels" / "combined_windows.json").read_text())
    out = []
    for key in sorted(windows):
        path = NAB / "data" / key
        if not path.exists():
            continue
        lines = path.read_text().splitlines()[1:]
        ts = np.array([_epoch_s(line.split(",")[0]) for line in lines], dtype=np.int64)
        vals = np.array([float(line.split(",")[1]) for line in lines])
        wins = [(_epoch_s(a), _epoch_s(b)) for a, b in windows[key]]
        out.append((key, ts, vals, wins))
    return out


def stream(name: str, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    rows = values.reshape(len(values), -1)
    det = make_detector(name, rows.shape[1])
    out = np.empty_like(rows)
    for i, row in enumerate(rows):
        out[i] = det.update(row)
    return out


def bench_nab(detectors: list[str]) -> list[dict[str, Any]]:
    data = load_nab()
    results = []
    for name in detectors:
        t0 = time.perf_counter()
        files = [
            LabelledFile(stream(name, vals)[:, 0], window_rows(ts, wins))
            for _, ts, vals, wins in data
        ]
        elapsed = time.perf_counter() - t0
        row: dict[str, Any] = {"detector": name, "seconds": round(elapsed, 2)}
        for profile in PROFILES:
            row[profile] = round(nab_score(files, profile).score, 1)
        row["published"] = PUBLISHED.get(NAB_DETECTORS.get(name) or "")
        results.append(row)
        print(json.dumps(row), file=sys.stderr)
    return results


def nab_random_seeds(seeds: int = 20) -> dict[str, Any]:
    """A random detector's NAB score depends on its draw: the mean and spread over seeds is
    what compares with NAB's published 9.0 (a single seed ranges from ~2 to ~25 here)."""
    data = load_nab()
    by_profile: dict[str, list[float]] = {p: [] for p in PROFILES}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        files = [LabelledFile(rng.random(len(v)), window_rows(ts, w)) for _, ts, v, w in data]
        for profile in PROFILES:
            by_profile[profile].append(nab_score(files, profile).score)
    row: dict[str, Any] = {"detector": f"random, mean of {seeds} seeds (± sd)"}
    for profile, scores in by_profile.items():
        row[profile] = f"{np.mean(scores):.1f} ± {np.std(scores):.1f}"
    row["published"] = PUBLISHED["random (NAB)"]
    print(json.dumps(row), file=sys.stderr)
    return row


# the default's parameters changed one at a time: a score that holds on its neighbours is not one
# lucky point (all of them are in-sample: chosen on these same files)
RANGE_NEIGHBOURS: list[dict[str, Any]] = [
    {},
    {"low_weight": 0.0},  # the range detector before the lower quantile
    {"low_quantile": 0.15},
    {"low_quantile": 0.25},
    {"low_quantile": 0.3},
    {"low_weight": 0.5},
    {"low_weight": 2.25},
    {"medians": (12,)},
    {"medians": (12, 36)},
    {"margin": 0.12},
    {"margin": 0.18},
    {"median_weight": 1.8},
    {"median_weight": 2.7},
    {"quiet": 48},
    {"quiet": 96},
]


def nab_neighbours() -> list[dict[str, Any]]:
    """NAB scores of the default ``range`` detector and of its neighbouring parameter sets."""
    data = load_nab()
    rows = []
    for params in RANGE_NEIGHBOURS:
        files = []
        for _, ts, vals, wins in data:
            det = RangeDetector(1, **params)
            scores = np.array([det.update(np.array([v]))[0] for v in vals.tolist()])
            files.append(LabelledFile(scores, window_rows(ts, wins)))
        row: dict[str, Any] = {
            "range": ", ".join(f"{k}={v}" for k, v in params.items()) or "default"
        }
        for profile in PROFILES:
            row[profile] = round(nab_score(files, profile).score, 1)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


def _hst(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """river's HalfSpaceTrees (online isolation) behind its online MinMaxScaler, score then
    learn each sample."""
    from river import anomaly, compose, preprocessing

    model = compose.Pipeline(
        preprocessing.MinMaxScaler(),
        anomaly.HalfSpaceTrees(n_trees=25, height=8, window_size=250, seed=42),
    )
    out = np.zeros(len(values))
    for i, v in enumerate(values.tolist()):
        out[i] = model.score_one({"v": v})
        model.learn_one({"v": v})
    return out


def _stl(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """statsmodels STL (daily period of 288) refitted every 288 samples on the last 2016 before
    it; a sample's score is its distance from the fit's trend + seasonal forecast in MADs of
    the fit's residuals."""
    from statsmodels.tsa.seasonal import STL

    out = np.zeros(len(values))
    fit: tuple[npt.NDArray[np.float64], float, float] | None = None
    base = 0
    for i in range(len(values)):
        if i >= 576 and (fit is None or i - base >= 288):
            past = values[max(0, i - 2016) : i]
            res = STL(past, period=288, robust=False).fit()
            resid = np.asarray(res.resid)
            mad = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
            scale = mad + 1e-9 + 1e-3 * abs(float(np.median(past)))
            fit, base = (
                (np.asarray(res.seasonal)[-288:], float(np.asarray(res.trend)[-1]), scale),
                i,
            )
        if fit is not None:
            season, trend, scale = fit
            z = abs(values[i] - trend - season[(i - base) % 288]) / scale
            out[i] = z / (z + 3.0)
    return out


def _left_matrix_profile(values: npt.NDArray[np.float64], m: int = 12) -> npt.NDArray[np.float64]:
    """stumpy's left matrix profile: the z-normalised distance of the subsequence ending at each
    sample to its nearest neighbour among the EARLIER subsequences only (what stumpy.stumpi
    streams, computed in one stumpy.stump call), over its maximum 2*sqrt(m)."""
    import stumpy

    jitter = np.random.default_rng(0).normal(0, 1e-9, len(values)) * (np.std(values) + 1e-9)
    series = values.astype(np.float64) + jitter  # flat stretches have no z-normalisation
    left = stumpy.stump(series, m)[:, 2].astype(np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(series, m)
    z = (windows - windows.mean(axis=1, keepdims=True)) / (
        windows.std(axis=1, keepdims=True) + 1e-12
    )
    out = np.zeros(len(values))
    has = left >= 0
    idx = np.flatnonzero(has)
    out[idx + m - 1] = np.sqrt(((z[idx] - z[left[idx]]) ** 2).sum(axis=1)) / (2 * math.sqrt(m))
    return out


LIBRARY_DETECTORS = {
    "river HalfSpaceTrees": _hst,
    "statsmodels STL residual": _stl,
    "stumpy left matrix profile (m=12)": _left_matrix_profile,
}


def bench_libraries() -> list[dict[str, Any]]:
    """The methods of the [anomaly] extra on NAB, alone: measured to decide whether the default
    should use them (it does not: docs/anomaly.md)."""
    data = load_nab()
    rows = []
    for name, fn in LIBRARY_DETECTORS.items():
        t0 = time.perf_counter()
        files = [LabelledFile(fn(vals), window_rows(ts, wins)) for _, ts, vals, wins in data]
        row: dict[str, Any] = {"detector": name, "seconds": round(time.perf_counter() - t0, 2)}
        for profile in PROFILES:
            row[profile] = round(nab_score(files, profile).score, 1)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


class _Numpy(pickle.Unpickler):
    ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing {module}.{name}")
        return super().find_class(module, name)


def load_pkl(path: Path) -> npt.NDArray[np.float64]:
    with path.open("rb") as fh:
        return np.asarray(_Numpy(fh).load(), dtype=np.float64)


def machines(full: bool) -> list[str]:
    names = sorted(
        p.name.removesuffix("_test_label.pkl") for p in (ASD / "processed").glob("*_test_label.pkl")
    )
    return names if full else [*[n for n in names if n != "machine-2-1"][:6], "machine-2-1"]


def best_f1(scores: npt.NDArray[np.float64], labels: npt.NDArray[np.bool_]) -> dict[str, float]:
    """Best F1 over every threshold (as every SMD paper reports), plain and point-adjusted."""
    out: dict[str, float] = {}
    qs = np.unique(np.quantile(scores, np.linspace(0.5, 1.0, 201)))
    segs = _segments(labels)
    for adjusted in (False, True):
        best = (0.0, 0.0, 0.0)
        for q in qs:
            pred = scores >= q
            if adjusted:
                pred = pred.copy()
                for a, b in segs:
                    if pred[a : b + 1].any():
                        pred[a : b + 1] = True
            tp = float((pred & labels).sum())
            fp = float((pred & ~labels).sum())
            fn = float((~pred & labels).sum())
            p = tp / (tp + fp) if tp + fp else 0.0
            r = tp / (tp + fn) if tp + fn else 0.0
            f = 2 * p * r / (p + r) if p + r else 0.0
            if f > best[2]:
                best = (p, r, f)
        key = "pa_" if adjusted else ""
        out[key + "precision"], out[key + "recall"], out[key + "f1"] = best
    return out


def _segments(labels: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    edges = np.flatnonzero(
        np.diff(np.concatenate([np.zeros(1), labels.astype(np.int8), np.zeros(1)]))
    )
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def vus_pr(
    scores: npt.NDArray[np.float64], labels: npt.NDArray[np.bool_], max_window: int = 100
) -> float:
    """VUS-PR (Paparrizos et al., VLDB 2022) as the TSB-AD benchmark computes it: the
    ``tsb-ad`` package's own ``generate_curve`` (sliding window 100, 250 thresholds) where it
    is importable, else the approximation below (see ``VUS_SOURCE``)."""
    curve = _tsb_ad_curve()
    if curve is not None:
        return float(curve(labels.astype(int), scores, max_window, "opt", 250)[-1])
    return vus_pr_approx(scores, labels, max_window)


def _tsb_ad_curve() -> Any:
    try:
        from TSB_AD.evaluation.basic_metrics import generate_curve
    except ImportError:
        return None
    return generate_curve


def vus_source() -> str:
    if _tsb_ad_curve() is None:
        return "approximation (bench/anomaly.py vus_pr_approx; tsb-ad not importable)"
    from importlib.metadata import version

    return f"tsb-ad {version('TSB-AD')} (TSB_AD.evaluation.basic_metrics.generate_curve)"


def vus_pr_approx(
    scores: npt.NDArray[np.float64], labels: npt.NDArray[np.bool_], max_window: int = 100
) -> float:
    """An approximation of VUS-PR without the package: the mean over buffer lengths
    l = 0..max_window (step max_window/10) of the PR AUC where each label segment is widened
    by l/2 on both sides with a sqrt ramp (no existence reward: it reads lower than tsb-ad's)."""
    n = len(labels)
    segs = _segments(labels)
    order = np.argsort(-scores, kind="stable")
    aucs = []
    for length in np.linspace(0, max_window, 11).astype(int):
        soft = labels.astype(np.float64).copy()
        half = length // 2
        for a, b in segs:
            for j in range(1, half + 1):
                w = math.sqrt(1 - j / (half + 1))
                if a - j >= 0:
                    soft[a - j] = max(soft[a - j], w)
                if b + j < n:
                    soft[b + j] = max(soft[b + j], w)
        s = soft[order]
        tp = np.cumsum(s)
        k = np.arange(1, n + 1)
        precision = tp / k
        # the soft recall (tsb-ad adds an existence reward per segment reached)
        recall = tp / max(soft.sum(), 1e-12)
        recall = np.concatenate([[0.0], recall])
        precision = np.concatenate([[1.0], precision])
        aucs.append(float(np.sum(np.diff(recall) * precision[1:])))
    return float(np.mean(aucs))


def bench_smd(detectors: list[str], full: bool) -> list[dict[str, Any]]:
    rows = []
    for machine in machines(full):
        train = load_pkl(ASD / "processed" / f"{machine}_train.pkl")
        test = load_pkl(ASD / "processed" / f"{machine}_test.pkl")
        labels = load_pkl(ASD / "processed" / f"{machine}_test_label.pkl") > 0.5
        if not full:
            train = train[-4032:]
        for name in detectors:
            t0 = time.perf_counter()
            if name in MULTIVARIATE:
                scores = MULTIVARIATE[name](train.shape[1]).fit(train).score(test)
            else:
                scores = stream(name, np.vstack([train, test]))[len(train) :]
            combined = scores.max(axis=1)
            elapsed = time.perf_counter() - t0
            row: dict[str, Any] = {"machine": machine, "detector": name}
            row.update({k: round(v, 3) for k, v in best_f1(combined, labels).items()})
            row["vus_pr"] = round(vus_pr(combined, labels), 3)
            row["seconds"] = round(elapsed, 1)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return rows


def machine_group(machine: str) -> str:
    """ASD's omi-* machines are one group; SMD's machine-G-i are grouped by G."""
    return "ASD" if machine.startswith("omi-") else "SMD " + machine.rsplit("-", 1)[0]


def smd_groups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per machine group and detector: the mean over the group's machines of each measure."""
    keys = ["precision", "recall", "f1", "pa_f1", "vus_pr", "seconds"]
    out = []
    for group in sorted({machine_group(r["machine"]) for r in rows}):
        members = [r for r in rows if machine_group(r["machine"]) == group]
        for name in dict.fromkeys(r["detector"] for r in members):
            mine = [r for r in members if r["detector"] == name]
            row: dict[str, Any] = {"group": group, "detector": name}
            row["machines"] = ",".join(r["machine"] for r in mine)
            row.update({k: round(float(np.mean([r[k] for r in mine])), 3) for k in keys})
            out.append(row)
            print(json.dumps(row), file=sys.stderr)
    return out


def interpretation(machine: str) -> list[tuple[int, int, list[int]]]:
    out = []
    for line in (ASD / "interpretation_label" / f"{machine}.txt").read_text().splitlines():
        if not line.strip():
            continue
        span, dims = line.split(":")
        a, b = span.split("-")
        out.append((int(a), int(b), [int(d) - 1 for d in dims.split(",") if d.strip()]))
    return out


def bench_rootcause(full: bool) -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    rows = []
    for machine in machines(True):
        train = load_pkl(ASD / "processed" / f"{machine}_train.pkl")
        test = load_pkl(ASD / "processed" / f"{machine}_test.pkl")
        hits: dict[str, list[float]] = {
            "rank@100": [],
            "rank@150": [],
            "rnd@100": [],
            "rnd@150": [],
        }
        for a, b, truth in interpretation(machine):
            ranked = rank_metrics(train, test[a : b + 1], recent=test[max(0, a - 288) : a])
            rnd = list(rng.permutation(train.shape[1]))
            for label, order in (("rank", ranked), ("rnd", rnd)):
                for pct in (100, 150):
                    top = set(order[: math.ceil(len(truth) * pct / 100)])
                    hits[f"{label}@{pct}"].append(len(top & set(truth)) / len(truth))
        row: dict[str, Any] = {"machine": machine, "segments": len(hits["rank@100"])}
        row.update({k: round(float(np.mean(v)), 3) for k, v in hits.items()})
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", choices=["nab", "neighbours", "smd", "rootcause", "libraries"], action="append"
    )
    parser.add_argument("--full", action="store_true", help="every machine, the whole train split")
    parser.add_argument("--detectors", default=",".join(NAB_DETECTORS))
    args = parser.parse_args()
    parts = args.only or ["nab", "smd", "rootcause"]
    detectors = args.detectors.split(",")
    result: dict[str, Any] = {"default_detector": DEFAULT_DETECTOR, "vus_source": vus_source()}
    if "nab" in parts:
        result["nab"] = [
            *bench_nab([d for d in detectors if d not in MULTIVARIATE]),
            nab_random_seeds(),
        ]
    if "neighbours" in parts:  # opt-in: the default's NAB score on neighbouring parameters
        result["nab_neighbours"] = nab_neighbours()
    if "smd" in parts:
        smd = [d for d in detectors if d != "quantile"]
        if args.detectors == parser.get_default("detectors"):
            smd += list(MULTIVARIATE)
        result["smd"] = bench_smd(smd, args.full)
        result["smd_groups"] = smd_groups(result["smd"])
    if "rootcause" in parts:
        result["rootcause"] = bench_rootcause(args.full)
    if "libraries" in parts:  # opt-in: needs the [anomaly] extra, and takes long
        result["libraries"] = bench_libraries()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
