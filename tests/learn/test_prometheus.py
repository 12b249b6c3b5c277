"""A real Prometheus server (Debian package ``prometheus``) over a TSDB backfilled by
``promtool tsdb create-blocks-from openmetrics``, queried by ``unbroken learn --prometheus``:
the analysis over HTTP equals the analysis of the same data from the file."""

from __future__ import annotations

import gzip
import json
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

pytestmark = [pytest.mark.mp, pytest.mark.server, pytest.mark.timeout(420),
              pytest.mark.skipif(shutil.which("prometheus") is None or
                                 shutil.which("promtool") is None,
                                 reason="prometheus/promtool not installed (Debian package "
                                        "'prometheus'; make test installs it)")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from unbroken.learn.synth import SynthSpec, generate, write

    d = tmp_path_factory.mktemp("prom")
    paths = write(generate(SynthSpec(seed=9, nodes=8, days=1.0, failures=3, before=1)), d)
    with gzip.open(paths["metrics"], "rb") as src, open(d / "metrics.om", "wb") as dst:
        shutil.copyfileobj(src, dst)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                    str(d / "metrics.om"), str(d / "tsdb")], check=True, capture_output=True,
                   timeout=300)
    (d / "prometheus.yml").write_text("global:\n  scrape_interval: 30s\n")
    port = _free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={d / 'prometheus.yml'}",
                             f"--storage.tsdb.path={d / 'tsdb'}",
                             "--storage.tsdb.retention.time=100y",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=open(d / "prom.log", "wb"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("prometheus did not start: " +
                                   (d / "prom.log").read_text()[-2000:])
            time.sleep(0.5)
        yield url, d, paths
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_learn_over_http_equals_learn_from_the_file(cli, server):
    url, d, paths = server
    common = ["--kernel-log", paths["kernel_log"], "--sacct", paths["sacct"], "--json"]
    p = cli("learn", "--prometheus", url, *common, timeout=300)
    assert p.returncode == 0, p.stderr
    q = cli("learn", "--openmetrics", paths["metrics"], *common, timeout=300)
    assert q.returncode == 0, q.stderr
    http, file = json.loads(p.stdout), json.loads(q.stdout)
    assert http["nodes"] == file["nodes"] == 8
    assert http["scrape_s"] == 30
    assert http["start"] == file["start"] and http["end"] == file["end"]
    assert [f["detected_time"] for f in http["failures"]] == \
        [f["detected_time"] for f in file["failures"]]
    assert http["detected"] == file["detected"] >= 2
    assert http["false_alarms_per_day"] == file["false_alarms_per_day"]
    assert len(http["checkpoint_phases"]) == len(file["checkpoint_phases"])
    assert http["ckpt_save_s"] == pytest.approx(file["ckpt_save_s"], rel=1e-6)


def test_server_errors_are_one_line(cli, server):
    url, _, _ = server
    p = cli("learn", "--prometheus", url, "--from", "2001-01-01", "--to", "2001-01-02",
            timeout=120)
    assert p.returncode == 2 and "empty time range" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = cli("learn", "--prometheus", url + "/nothing-here", timeout=120)
    assert p.returncode == 2 and "HTTP 404" in p.stderr, p.stderr
