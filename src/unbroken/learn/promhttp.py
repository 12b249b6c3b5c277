"""A running Prometheus server as input, through its HTTP API (``query_range``).

Why raw series and not PromQL rates: the analyses take rates themselves (``learn.signals``),
the same way for files and for a server, so both inputs give the same numbers. Each metric of
``learn.names`` is fetched as ``{__name__="..."}`` over the range, at the scrape interval,
in pieces of at most ``MAX_POINTS`` steps (the server refuses more than 11,000 points per
series).

The range: ``--from``/``--to`` when given; otherwise the span the server holds for
``node_intr_total`` (or the first known metric) within ``LOOKBACK_S`` of now, found with a
``min_over_time(timestamp(...)[..:1h])`` subquery. The step is the scrape interval, the median
spacing of the raw samples of the last 10 minutes, and the range is aligned to a sample's
timestamp so that each step reads one scrape.

Errors are one line naming the URL: a server that does not answer, an HTTP error, an API
error (``status: error``), an empty range.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

from unbroken.learn import names
from unbroken.learn.frame import Frame, build_frame, reduce_labels
from unbroken.learn.openmetrics import merge_series

__all__ = ["read_prometheus", "PrometheusError"]

MAX_POINTS = 10_000
LOOKBACK_S = 90 * 86400
TIMEOUT_S = 60.0


class PrometheusError(ValueError):
    """The server cannot be used (one line naming the URL)."""


def _get(base: str, path: str, params: dict) -> dict:
    url = base.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
            body = r.read()
    except urllib.error.HTTPError as e:
        try:
            msg = json.loads(e.read()).get("error", "")
        except Exception:  # noqa: BLE001 - the body is not the API's JSON
            msg = ""
        raise PrometheusError(f"--prometheus {base}: answered HTTP {e.code}"
                              f"{': ' + msg if msg else ''}") from None
    except (urllib.error.URLError, OSError) as e:
        why = getattr(e, "reason", e)
        raise PrometheusError(f"--prometheus {base}: does not answer ({why})") from None
    try:
        d = json.loads(body)
    except ValueError:
        raise PrometheusError(f"--prometheus {base}: answered something that is not the "
                              f"Prometheus API's JSON") from None
    if d.get("status") != "success":
        raise PrometheusError(f"--prometheus {base}: answered an error: "
                              f"{d.get('errorType', '')} {d.get('error', '')}".rstrip())
    return d["data"]


def _scalar(base: str, query: str, at: float) -> float | None:
    data = _get(base, "/api/v1/query", {"query": query, "time": f"{at:.3f}"})
    res = data.get("result") or []
    if not res:
        return None
    v = res[0]["value"][1] if data.get("resultType") == "vector" else res[1]
    v = float(v)
    return v if math.isfinite(v) else None


def _span(base: str, metric: str, now: float) -> tuple[float, float, float] | None:
    """(first, last, step) of ``metric`` on the server, None when it has none."""
    days = int(LOOKBACK_S // 86400)
    lo = _scalar(base, f"min(min_over_time(timestamp({metric})[{days}d:1h]))", now)
    hi = _scalar(base, f"max(max_over_time(timestamp({metric})[{days}d:1h]))", now)
    if lo is None or hi is None:
        return None
    raw = _get(base, "/api/v1/query", {"query": f"{metric}[10m]", "time": f"{hi:.3f}"})
    diffs = [d for s in raw.get("result", [])[:20]
             for d in np.diff([float(v[0]) for v in s.get("values", [])])]
    step = float(np.median(diffs)) if diffs else 30.0
    first = hi - math.floor((hi - (lo - 3600.0)) / step) * step
    return first, hi, step


def read_prometheus(base: str, start: float | None = None, end: float | None = None,
                    now: float | None = None) -> Frame:
    if not base.startswith(("http://", "https://")):
        raise PrometheusError(f"--prometheus {base!r}: expected an http:// or https:// URL")
    now = time.time() if now is None else now
    _get(base, "/api/v1/status/buildinfo", {})           # answers at all?
    span = None
    for metric in (names.INTR, names.PROCS, names.GPU_UTIL):
        span = _span(base, metric, now)
        if span is not None:
            break
    if span is None:
        raise PrometheusError(f"--prometheus {base}: no samples of node_intr_total, "
                              f"node_procs_running or DCGM_FI_DEV_GPU_UTIL in the last "
                              f"{LOOKBACK_S // 86400} days")
    first, last, step = span
    lo = first if start is None else first + math.ceil((start - first) / step) * step
    hi = last if end is None else min(end, last)
    if start is not None and start > last or end is not None and end < first or hi < lo:
        raise PrometheusError(f"--prometheus {base}: empty time range (the server holds "
                              f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(first))} to "
                              f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(last))})")
    acc: dict[tuple, tuple[list, list]] = {}
    for metric in names.ALL:
        t0 = lo
        while t0 <= hi:
            t1 = min(hi, t0 + (MAX_POINTS - 1) * step)
            data = _get(base, "/api/v1/query_range",
                        {"query": f'{{__name__="{metric}"}}', "start": f"{t0:.3f}",
                         "end": f"{t1:.3f}", "step": f"{step:g}"})
            for series in data.get("result", []):
                red = reduce_labels(metric, series.get("metric", {}))
                if red is None:
                    continue
                vals = series.get("values") or []
                if not vals:
                    continue
                arr = np.array(vals, dtype=float)
                key = (metric, red[0], red[1], json.dumps(series["metric"], sort_keys=True))
                a = acc.setdefault(key, ([], []))
                a[0].append(arr[:, 0])
                a[1].append(arr[:, 1])
            t0 = t1 + step
    if not acc:
        raise PrometheusError(f"--prometheus {base}: no samples in the time range")
    merged = merge_series({k: (np.concatenate(v[0]), np.concatenate(v[1]))
                           for k, v in acc.items()})
    return build_frame(merged, dt=step, start=lo, end=hi)
