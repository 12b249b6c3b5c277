"""The Prometheus endpoint: real HTTP server (prometheus_client), real scrape, numbers equal
to the ETTR report of the same journal; a port that cannot be bound is a one-line error."""

from __future__ import annotations

import socket
import urllib.request

import pytest

pytest.importorskip("prometheus_client")

from unbroken.core.ettr import ettr_report  # noqa: E402
from unbroken.metrics import MetricsError, MetricsExporter  # noqa: E402

pytestmark = pytest.mark.server


def journal() -> list[dict]:
    """100 steps at 0.1 s; a kill at step 40 masked with 1.0 s extra."""
    ev, t = [], 1000.0
    for k in range(100):
        t += 0.1 + (1.0 if k == 40 else 0.0)
        if k == 40:
            ev.append({"event": "fault", "kind": "kill", "group": 1, "step": 40, "t": t - 1.05})
            ev.append({"event": "replan", "step": 40, "members": [0, 2, 3], "phase": "free",
                       "depth": 2, "reform_at": t - 0.9, "t": t - 0.8})
        ev.append({"event": "commit", "step": k, "loss": 5.0 - k / 50, "t": t})
    return ev


def scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_scraped_metrics_equal_the_ettr_report():
    ev = journal()
    rep = ettr_report(ev)
    m = MetricsExporter(0)
    try:
        m.update(ev)
        got = scrape(m.port)
    finally:
        m.close()
    assert got["unbroken_ettr"] == pytest.approx(rep.ettr)
    assert rep.ettr == pytest.approx(10 / 11, rel=0.02)
    assert got["unbroken_steps_committed"] == 100
    assert got['unbroken_faults{kind="kill"}'] == 1 and got["unbroken_faults_masked"] == 1
    # detection: from the fault (1.05 s before the commit) to the reform start (0.9 s before)
    detect = got['unbroken_time_lost_seconds{kind="kill",part="detect"}']
    assert detect == pytest.approx(rep.faults[0].detect_s) and detect == pytest.approx(0.15)
    assert got["unbroken_loss"] == pytest.approx(5.0 - 99 / 50)
    assert got["unbroken_metrics_errors"] == 0


def test_a_broken_update_is_counted_not_raised():
    class Broken(list):  # a journal that blows up when read
        def __iter__(self):
            raise OSError("journal unreadable")

    ev = journal()
    m = MetricsExporter(0)
    try:
        m.update(ev)
        before = scrape(m.port)["unbroken_ettr"]
        m.update(Broken())  # must not raise into the training loop
        after = scrape(m.port)
    finally:
        m.close()
    assert after["unbroken_metrics_errors"] == 1
    assert after["unbroken_ettr"] == before  # the last good numbers stay served


@pytest.mark.mp
def test_busy_port_is_one_line_error_before_anything_starts(cli, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(MetricsError, match=f"--metrics-port {port}: cannot serve"):
            MetricsExporter(port)
        p = cli("demo", "--metrics-port", str(port), "--out", str(tmp_path / "d"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"--metrics-port {port}" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "d").exists()  # nothing started, nothing written
