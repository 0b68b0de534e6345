"""The report as a person sees it: headless Chromium (Debian's `chromium` package) opens the page;
every image must be decoded and non-empty, and no request may leave the page.

The page itself carries no script (its Content-Security-Policy forbids them). The probe is a copy of
the page with one inline script added (and allowed) that, at the load event, writes what it found into
the DOM, which `--dump-dom` prints: each image's `complete`, `naturalWidth`, `naturalHeight` and
how many of its decoded pixels (drawn onto a canvas) are not white, the Resource Timing entries (every fetch the page
made; `data:` images make none),
and the number of scripts (only the probe). A second run opens the page itself with Chromium's
network log (`--log-net-log`): no URL request initiated by the page (the browser's own background
requests carry the initiator 'not an origin' and are not the page's) may go anywhere but the file. A
page that does load a remote image proves that this check can fail.
"""

from __future__ import annotations

import html as htmllib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llmperf.report import build_report

from report_testing import write_profile, write_simulate

HOSTILE = "<script>alert(1)</script>"

_PROBE = """<script>
window.addEventListener('load', () => {
  // Synchronous, so the result is in the DOM before --dump-dom prints it: drawing an image onto a
  // canvas decodes it; reading the pixels back counts the ones that are not plain white.
  const images = [...document.images].map(img => {
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    let inked = 0;
    if (c.width && c.height) {
      const g = c.getContext('2d');
      g.drawImage(img, 0, 0);
      const px = g.getImageData(0, 0, c.width, c.height).data;
      for (let i = 0; i < px.length; i += 4) if (px[i] < 250 || px[i + 1] < 250 || px[i + 2] < 250) inked++;
    }
    return {complete: img.complete, w: img.naturalWidth, h: img.naturalHeight, inked: inked};
  });
  document.body.setAttribute('data-probe', JSON.stringify({
    images: images,
    resources: performance.getEntriesByType('resource').map(e => e.name),
    scripts: document.scripts.length,
  }));
});
</script>
"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium is not installed: `bash .ci/run` installs Debian's `chromium` package when it "
                    "runs as root (apt-get install -y chromium); install it to run this test")
    report = build_report(runs=[write_profile(tmp_path / "p", model=HOSTILE), write_simulate(tmp_path / "s")],
                          title=HOSTILE)
    page = report.write(tmp_path / "report.html")
    probe = tmp_path / "probe.html"
    text = page.read_text()
    assert "default-src 'none';" in text
    probe.write_text(text.replace("default-src 'none';", "default-src 'none'; script-src 'unsafe-inline';")
                     .replace("</body>", _PROBE + "</body>"))
    cmd = [exe, *_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=15000",
           "--dump-dom", probe.as_uri()]
    done = _run(cmd)
    match = re.search(r'data-probe="([^"]*)"', done.stdout)
    assert match, f"the probe did not run (rc {done.returncode}): {done.stderr[-2000:]}"
    found = json.loads(htmllib.unescape(match.group(1)))
    assert len(found["images"]) == len(report.figures) == 5
    for img in found["images"]:
        assert img["complete"] and img["w"] > 100 and img["h"] > 100, img
        assert img["inked"] > 0.01 * img["w"] * img["h"], img  # a chart, not a blank canvas
    assert found["resources"] == []  # nothing fetched: every image is inline
    assert found["scripts"] == 1  # the probe; the hostile name stayed text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in done.stdout
    assert _page_requests(exe, page, tmp_path / "real") == []


def test_network_check_catches_a_leaking_page(tmp_path: Path) -> None:
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium is not installed (see test_report_renders_in_headless_chromium)")
    leak = tmp_path / "leak.html"
    leak.write_text('<html><body><img src="http://127.0.0.1:9/x.png"></body></html>')
    assert _page_requests(exe, leak, tmp_path / "leak") == ["http://127.0.0.1:9/x.png"]


_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
          "--disable-sync")


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("headless chromium did not finish within 120 s")


def _page_requests(exe: str, page: Path, work: Path) -> list[str]:
    """URLs the page asked for (not the browser's own traffic), from Chromium's network log."""
    netlog = work / "netlog.json"
    work.mkdir()
    _run([exe, *_FLAGS, f"--user-data-dir={work / 'profile'}", f"--log-net-log={netlog}", "--dump-dom",
          page.as_uri()])
    assert netlog.is_file(), "chromium wrote no network log"
    lines = netlog.read_text(errors="replace").splitlines()
    # One JSON object per line (constants first, then events); a log cut at exit may end mid-line.
    constants = json.loads(lines[0].rstrip().rstrip(",") + "}")["constants"]
    events = []
    for line in lines[1:]:
        try:
            events.append(json.loads(line.rstrip().rstrip(",")))
        except json.JSONDecodeError:
            continue
    start_job = constants["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = []
    for event in events:
        params = event.get("params") or {} if isinstance(event, dict) else {}
        if event.get("type") == start_job and "url" in params and params.get("initiator") != "not an origin":
            url = str(params.get("url", ""))
            if not url.startswith(("file:", "data:")):
                urls.append(url)
    return urls
