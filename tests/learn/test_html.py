"""The HTML report: self-contained, and it renders in a real headless Chromium with every
image loaded and no console message."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import pytest

from unbroken.learn.analyze import Inputs, analyze
from unbroken.learn.html import write_html
from unbroken.learn.sacct import parse_sacct
from unbroken.learn.synth import sacct_lines

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or \
    shutil.which("google-chrome")


@pytest.fixture(scope="module")
def report(small, tmp_path_factory):
    jobs, _ = parse_sacct(sacct_lines(small))
    data, ctx = analyze(Inputs(small.frame, [], jobs))
    path = tmp_path_factory.mktemp("html") / "report.html"
    write_html(path, data, ctx)
    return path, data


def test_self_contained_with_one_figure_per_failure(report):
    path, data = report
    text = path.read_text()
    assert "<script" not in text
    assert not re.search(r"""(src|href)=["'](?!data:)""", text)      # nothing external
    imgs = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert len(imgs) == len(data["failures"]) + 2     # + checkpoint phases + exclusions
    for b in imgs:
        assert base64.b64decode(b)[:8] == b"\x89PNG\r\n\x1a\n"
    for f in data["failures"]:
        assert f"{f['node']} against its peers" in text


_CHECK = """<script>window.addEventListener('load', function () {
  var imgs = Array.from(document.images);
  var d = document.createElement('pre'); d.id = 'unbroken-check';
  d.textContent = JSON.stringify({images: imgs.length,
    loaded: imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length,
    h2: document.querySelectorAll('h2').length, height: document.body.scrollHeight});
  document.body.appendChild(d);
});</script>"""


@pytest.mark.mp
@pytest.mark.timeout(120)
@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (apt-get install chromium)")
def test_renders_in_headless_chromium(report, tmp_path):
    path, data = report
    page = tmp_path / "page.html"            # the report plus a probe that reads the DOM
    page.write_text(path.read_text().replace("</body>", _CHECK + "</body>"))
    p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
                        "--dump-dom", page.as_uri()], capture_output=True, text=True,
                       timeout=90)
    m = re.search(r'<pre id="unbroken-check">(.*?)</pre>', p.stdout)
    assert m, p.stderr[-2000:]
    got = json.loads(m.group(1).replace("&quot;", '"'))
    assert got["images"] == len(data["failures"]) + 2
    assert got["loaded"] == got["images"]
    assert got["h2"] == 6 + (1 if data["warnings"] else 0)
    assert got["height"] > 1000
    console = [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln]
    assert not console, console
