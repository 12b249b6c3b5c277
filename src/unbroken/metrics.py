"""ETTR and fault accounting on a Prometheus endpoint (prometheus_client).

Why from the journal: every number a dashboard shows must be the same number the report and
the figure show, so the exporter holds no counters of its own; it recomputes
:func:`unbroken.core.ettr.ettr_report` from the journal events it is fed and sets gauges.

Contract: the exporter can never hurt training. A port that cannot be bound is a one-line
:class:`MetricsError` *before* the run starts (nothing lost); once running, an update that
fails is counted in ``unbroken_metrics_errors`` and otherwise ignored.

Metrics (all gauges, label ``kind`` = fault kind, ``part`` = detect/decide/recompute/restart):
``unbroken_ettr``, ``unbroken_ettr_window``, ``unbroken_steps_committed``, ``unbroken_step_seconds``
(failure-free), ``unbroken_loss``, ``unbroken_faults{kind}``, ``unbroken_faults_masked``,
``unbroken_restarts``, ``unbroken_time_lost_seconds{kind,part}``,
``unbroken_time_lost_other_seconds``, ``unbroken_metrics_errors``.
"""

from __future__ import annotations

from collections import defaultdict

from unbroken.core.ettr import ettr_report

__all__ = ["MetricsError", "MetricsExporter"]

_PARTS = ("detect", "decide", "recompute", "restart")


class MetricsError(RuntimeError):
    """The metrics endpoint could not be started (one line naming the address)."""


class MetricsExporter:
    """Serves ``/metrics`` on ``addr:port`` (port 0: any free port, see ``.port``)."""

    def __init__(self, port: int, addr: str = "127.0.0.1") -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        if not 0 <= int(port) <= 65535:
            raise MetricsError(f"--metrics-port {port}: not a TCP port (0..65535)")
        self.registry = reg = CollectorRegistry()
        g = lambda name, doc, labels=(): Gauge(name, doc, labels, registry=reg)  # noqa: E731
        self.ettr = g("unbroken_ettr", "effective training time ratio, cumulative")
        self.ettr_window = g("unbroken_ettr_window", "ETTR over the last window of steps")
        self.steps = g("unbroken_steps_committed", "distinct committed steps")
        self.step_s = g("unbroken_step_seconds", "failure-free step time (median)")
        self.loss = g("unbroken_loss", "loss of the last committed step")
        self.faults = g("unbroken_faults", "faults seen, by kind", ("kind",))
        self.masked = g("unbroken_faults_masked", "faults masked without a restart")
        self.restarts = g("unbroken_restarts", "restarts (from the committed state in memory or a checkpoint)")
        self.lost = g("unbroken_time_lost_seconds", "time lost to faults", ("kind", "part"))
        self.other = g("unbroken_time_lost_other_seconds", "time lost outside fault windows")
        self.errors = g("unbroken_metrics_errors", "updates that failed (ignored)")
        try:
            self.server, self.thread = start_http_server(int(port), addr=addr, registry=reg)
        except OSError as exc:
            raise MetricsError(f"--metrics-port {port}: cannot serve on {addr}:{port} "
                               f"({exc.strerror or exc})") from None
        self.port = self.server.server_port

    def update(self, events: list[dict]) -> None:
        """Recompute every gauge from the journal so far; never raises."""
        try:
            rep = ettr_report(events)
            self.ettr.set(rep.ettr)
            self.ettr_window.set(rep.series[-1][2] if rep.series else 0.0)
            self.steps.set(rep.steps)
            self.step_s.set(rep.step_s)
            if rep.losses:
                self.loss.set(rep.losses[max(rep.losses)])
            kinds: dict[str, int] = defaultdict(int)
            lost: dict[tuple[str, str], float] = defaultdict(float)
            for f in rep.faults:
                kinds[f.kind] += 1
                for part in _PARTS:
                    lost[(f.kind, part)] += getattr(f, f"{part}_s") or 0.0
            for k, n in kinds.items():
                self.faults.labels(kind=k).set(n)
            for (k, part), v in lost.items():
                self.lost.labels(kind=k, part=part).set(v)
            self.masked.set(sum(1 for f in rep.faults if f.masked))
            self.restarts.set(rep.restarts)
            self.other.set(rep.other_lost_s)
        except Exception:  # a dashboard must never stop training
            self.errors.inc()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
