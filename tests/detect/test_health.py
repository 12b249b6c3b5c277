"""The per-group health agent samples its own process and the runner's progress."""

from __future__ import annotations

import threading

import pytest

from unbroken.detect.health import HealthAgent, sample_process


@pytest.mark.timeout(30)
def test_sample_reports_process_signals_and_rates_between_samples():
    step = {"step": 10}
    agent = HealthAgent(3, lambda ev: None, lambda: dict(step))
    first = agent.sample(now=100.0)
    assert first["uid"] == 3 and first["step"] == 10 and first["rss_mb"] > 1
    assert "cpu_util" not in first  # a rate needs two samples
    cpu0 = first["cpu_s"]
    while sample_process()["cpu_s"] <= cpu0:  # burn CPU until the clock tick (10 ms) moves
        sum(i * i for i in range(20_000))
    step["step"] = 30
    second = agent.sample(now=102.0)
    # rates over the 2 s between the samples: 20 steps, and the CPU seconds burnt meanwhile
    assert second["step_rate"] == 10.0 and second["cpu_s"] > first["cpu_s"]
    assert second["cpu_util"] == round((second["cpu_s"] - first["cpu_s"]) / 2.0, 4)
    # a thread more is counted
    release = threading.Event()
    extra = threading.Thread(target=release.wait)
    extra.start()
    try:
        assert agent.sample(now=103.0)["threads"] == second["threads"] + 1
    finally:
        release.set()
        extra.join(10)


def test_a_failing_probe_is_reported_once_and_never_raises():
    def broken():
        raise OSError("no /proc here")

    agent = HealthAgent(0, lambda ev: None, broken)
    a, b = agent.sample(now=1.0), agent.sample(now=2.0)
    assert "no /proc here" in a["error"] and "error" not in b


def test_the_agent_thread_reports_until_stopped():
    got: list[dict] = []
    seen = threading.Event()

    def report(ev):
        got.append(ev)
        if len(got) >= 2:
            seen.set()

    agent = HealthAgent(1, report, lambda: {"step": 0}, period=0.01).start()
    assert seen.wait(10)
    agent.stop()
    agent._thread.join(10)
    assert not agent._thread.is_alive()  # stop() ends the thread
    assert all(e["event"] == "health" and e["uid"] == 1 and e["step"] == 0 for e in got)
    assert got[1]["step_rate"] == 0.0  # a rate from the second sample on; no step was made
