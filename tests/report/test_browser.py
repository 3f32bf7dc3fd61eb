"""Reports in a real browser: headless Chromium opens them offline, with no console errors, and the
heatmaps are on screen (laid out, visible, coloured in the screenshot).

Chromium is driven through the DevTools protocol over ``--remote-debugging-pipe`` (fd 3 in, fd 4 out,
JSON messages ending in NUL) with the standard library only. Without chromium the test skips, except
under ``CI=true`` where it fails: CI installs Debian's ``chromium`` package.
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from simkit.report import render_report
from tests.report.test_report import EVIL, make_compare, make_study

pytestmark = pytest.mark.browser

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-dev-shm-usage", "--remote-debugging-pipe"]
TIMEOUT = 60.0


def chromium_path() -> str:
    """The chromium executable: $SIMKIT_CHROMIUM or the first of the usual names on PATH."""
    for name in (os.environ.get("SIMKIT_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    message = "headless chromium not found (apt-get install -y chromium, or set SIMKIT_CHROMIUM)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


class Browser:
    """One headless Chromium process and one page, spoken to over the DevTools pipe."""

    def __init__(self, executable: str, profile: Path):
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        # Keep the child's ends above 4 so dup2 onto 3 and 4 cannot clobber one another.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_chrome_r, from_chrome_w)]
        for fd in (to_chrome_r, from_chrome_w):
            os.close(fd)

        def child_fds() -> None:
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=child_fds)
        for fd in high:
            os.close(fd)
        self._out = os.fdopen(to_chrome_w, "wb", buffering=0)
        self._in = os.fdopen(from_chrome_r, "rb", buffering=0)
        self._messages: queue.Queue = queue.Queue()
        self._next_id = 0
        self.events: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                self.call(f"{domain}.enable", session=True)
            self.call("Emulation.setDeviceMetricsOverride", session=True, width=1280, height=900,
                      deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.process.kill()
            self.process.wait()
            raise

    def _read(self) -> None:
        buffer = b""
        while chunk := self._in.read(1 << 16):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for message in messages:
                self._messages.put(json.loads(message))
        self._messages.put(None)

    def _next(self, deadline: float) -> dict:
        try:
            message = self._messages.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError("chromium did not answer in time") from None
        if message is None:
            raise RuntimeError(f"chromium exited (code {self.process.poll()})")
        return message

    def call(self, method: str, session: bool = False, **params) -> dict:
        """Send one command and wait for its answer; events that arrive meanwhile are kept."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self._out.write(json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT
        while True:
            answer = self._next(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]
            self.events.append(answer)

    def wait_for(self, method: str) -> dict:
        deadline = time.monotonic() + TIMEOUT
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            event = self._next(deadline)
            self.events.append(event)
            if event.get("method") == method:
                return event

    def open(self, url: str) -> None:
        """Navigate and wait for the load event plus a short settle for late errors."""
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired")
        self.call("Runtime.evaluate", session=True, expression="new Promise(r => setTimeout(r, 300))",
                  awaitPromise=True)

    def evaluate(self, expression: str):
        answer = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in answer:
            raise RuntimeError(f"page script failed: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors since the last ``open``."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(params["exceptionDetails"].get("exception", {}).get("description")
                             or params["exceptionDetails"].get("text", "exception"))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(params["entry"].get("text", ""))
        return found

    def screenshot(self) -> bytes:
        """A PNG of the whole page (beyond the viewport)."""
        size = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.call("Page.captureScreenshot", session=True, format="png", clip=clip,
                         captureBeyondViewport=True)
        return base64.b64decode(shot["data"])

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._out.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    executable = chromium_path()
    instance = Browser(executable, tmp_path_factory.mktemp("chromium-profile"))
    yield instance
    instance.close()


HEATMAPS_JS = """
(() => Array.from(document.querySelectorAll('svg.heatmap-svg')).map(svg => {
  svg.scrollIntoView();
  const box = svg.getBoundingClientRect();
  const style = getComputedStyle(svg);
  const cells = svg.querySelectorAll('rect.c');
  const first = cells[0].getBoundingClientRect();
  const hit = document.elementFromPoint(first.x + first.width / 2, first.y + first.height / 2);
  return {width: box.width, height: box.height, top: box.top + window.scrollY, left: box.left + window.scrollX,
          visible: style.visibility === 'visible' && style.display !== 'none' && style.opacity !== '0',
          cells: cells.length, firstCellOnTop: hit === cells[0],
          rowLabel: svg.querySelector('.row-labels text title').textContent};
}))()
"""


def colours_in(png: bytes, box: dict) -> int:
    """Distinct colours inside ``box`` (page CSS pixels) of a screenshot."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    region = image.crop((int(box["left"]), int(box["top"]), int(box["left"] + box["width"]),
                         int(box["top"] + box["height"])))
    return len(region.getcolors(maxcolors=1 << 20))


def check_report(browser: Browser, html_path: Path, heatmaps: int, cells: int) -> bytes:
    browser.open(html_path.as_uri())
    assert browser.errors() == []
    assert browser.evaluate("document.querySelectorAll('script').length") == 0
    found = browser.evaluate(HEATMAPS_JS)
    assert len(found) == heatmaps
    png = browser.screenshot()
    for item in found:
        assert item["visible"] and item["firstCellOnTop"]
        assert item["width"] > 200 and item["height"] > 150
        assert item["cells"] == cells
        assert colours_in(png, item) > 30  # a coloured grid, not a blank box
    return png


def test_compare_report_renders_in_chromium(browser, tmp_path):
    names_a = [f"layer{i // 4}.{i % 4}" for i in range(20)]
    names_a[0] = EVIL
    names_b = [f"blocks.{j}.mlp.fc2" for j in range(30)]
    result = make_compare(names_a=names_a, names_b=names_b, null=True, nan_cell=(3, 4))
    path = render_report(result, tmp_path / "report.html")
    png = check_report(browser, path, heatmaps=2, cells=600)
    assert browser.evaluate(HEATMAPS_JS)[0]["rowLabel"] == EVIL  # shown as text, never run
    (tmp_path / "report.png").write_bytes(png)
    if os.environ.get("SIMKIT_SCREENSHOT_DIR"):  # to look at it by eye
        Path(os.environ["SIMKIT_SCREENSHOT_DIR"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / "report.png", Path(os.environ["SIMKIT_SCREENSHOT_DIR"]) / "compare-made-up.png")


def test_study_report_renders_in_chromium(browser, tmp_path):
    path = render_report(make_study(null=True), tmp_path / "report.html")
    png = check_report(browser, path, heatmaps=2, cells=9)
    if os.environ.get("SIMKIT_SCREENSHOT_DIR"):
        Path(os.environ["SIMKIT_SCREENSHOT_DIR"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["SIMKIT_SCREENSHOT_DIR"]) / "study-made-up.png").write_bytes(png)


def test_the_harness_sees_console_errors_and_blocked_loads(browser, tmp_path):
    page = tmp_path / "broken.html"
    page.write_text(
        "<!DOCTYPE html><html><head><meta http-equiv=\"Content-Security-Policy\" "
        "content=\"default-src 'none'; script-src 'unsafe-inline'\"></head><body>"
        "<img src=\"https://example.invalid/x.png\">"
        "<script>console.error('logged-error'); throw new Error('thrown-error');</script></body></html>",
        encoding="utf-8")
    browser.open(page.as_uri())
    errors = " | ".join(browser.errors())
    assert "logged-error" in errors and "thrown-error" in errors
    assert "Content Security Policy" in errors


# --------------------------------------------------------------------------------------------------
# every report kind from a small real run: generic checks, a screenshot, what the report opens with

LAYOUT_JS = """
(() => {
  const kids = Array.from(document.body.children).filter(e => !['STYLE', 'SCRIPT'].includes(e.tagName));
  const clipped = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (el.closest('svg') || !el.textContent.trim()) continue;
    const style = getComputedStyle(el);
    if (style.display === 'inline' || ['auto', 'scroll'].includes(style.overflowX)) continue;
    if (el.scrollWidth > el.clientWidth + 1) clipped.push(el.tagName + ': ' + el.textContent.trim().slice(0, 80));
  }
  for (const svg of document.querySelectorAll('svg')) {
    const box = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll('text')) {
      const r = t.getBoundingClientRect();
      if (r.width && (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1
                      || r.bottom > box.bottom + 1)) clipped.push('svg text: ' + t.textContent.slice(0, 80));
    }
  }
  const content = Array.from(document.querySelectorAll('img.figure, svg.heatmap-svg, table'))
    .filter(e => !e.closest('.meta-table') && !e.closest('#findings') && !e.closest('#cautions'));
  const firstFigure = content.findIndex(e => e.tagName !== 'TABLE');
  const firstTable = content.findIndex(e => e.tagName === 'TABLE');
  return {opening: kids.slice(0, 4).map(e => e.id || e.tagName.toLowerCase()),
          findings: Array.from(document.querySelectorAll('#findings p')).map(p => p.textContent),
          cautions: Array.from(document.querySelectorAll('#cautions li')).map(li => li.textContent),
          pageOverflow: document.documentElement.scrollWidth - window.innerWidth, clipped,
          figuresFirst: firstFigure === -1 || firstTable === -1 || firstFigure < firstTable};
})()
"""


def test_the_real_runs_cover_every_report_kind(real_runs):
    from simkit.report import REPORT_KINDS

    assert set(real_runs) == set(REPORT_KINDS)


@pytest.mark.parametrize("kind", ["compare", "study", "convert", "stitch", "linearize", "graft", "trend"])
def test_every_report_kind_opens_with_findings_and_fits_its_boxes(browser, real_runs, kind):
    page = real_runs[kind] / "report.html"
    browser.open(page.as_uri())
    assert browser.errors() == []
    layout = browser.evaluate(LAYOUT_JS)
    png = browser.screenshot()
    if os.environ.get("SIMKIT_SCREENSHOT_DIR"):  # to look at by eye, with what each report opens with
        folder = Path(os.environ["SIMKIT_SCREENSHOT_DIR"])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{kind}.png").write_bytes(png)
        opening = {key: layout[key] for key in ("opening", "findings", "cautions", "clipped", "figuresFirst")}
        (folder / f"{kind}.json").write_text(json.dumps(opening, indent=1), encoding="utf-8")
    assert layout["opening"][:3] == ["h1", "p", "findings"], layout["opening"]  # heading, byline, findings
    assert 1 <= len(layout["findings"]) <= 4 and all(len(s) > 20 for s in layout["findings"])
    assert layout["pageOverflow"] <= 1, "the page scrolls sideways"
    assert layout["clipped"] == []
    assert layout["figuresFirst"], "a table comes before the first figure"


RUNNER_OF_KIND = {"compare": "compare", "study": "study", "convert": "convert", "stitch": "stitch",
                  "linearize": "linearize", "graft": "graft", "trend": "trend"}


@pytest.mark.parametrize("kind", list(RUNNER_OF_KIND))
def test_every_kind_shows_itself_in_a_fresh_notebook(real_runs, kind):
    """In a fresh interpreter, taking a runner from ``simkit`` is enough for its results to show the
    report's findings inline (no import of simkit.report by hand, no simkit.load)."""
    import sys

    code = (f"import simkit; simkit.{RUNNER_OF_KIND[kind]}\n"
            "from simkit.results import load\n"
            f"html = load({str(real_runs[kind])!r})._repr_html_()\n"
            "assert html and 'class=\"findings\"' in html, repr(html)[:300]\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


# --------------------------------------------------------------------------------------------------
# #26: what the models are, no similar pair from noise, and the study's views of many networks at once

PROSE_JS = """
(() => {
  const parts = [];
  for (const el of document.body.children) {
    if (el.tagName === 'H2' && el.textContent.startsWith('How this run was made')) break;
    parts.push(el.innerText || '');
  }
  return parts.join('\\n');
})()
"""

WEIGHTS = ("random init", "weights file", "pretrained")


@pytest.mark.parametrize("kind", ["compare", "study", "convert", "stitch", "linearize", "graft"])
def test_every_report_kind_names_its_models_weights(browser, real_runs, kind):
    """Every model of these runs is built by simkit with random initial weights: the report says so
    where a reader reads (heading, findings, tables), not only in "How this run was made"."""
    browser.open((real_runs[kind] / "report.html").as_uri())
    prose = browser.evaluate(PROSE_JS)
    assert "random init" in prose, f"the {kind} report never says its models' weights are a random init"
    if kind == "compare":  # both models named with their weights
        assert prose.count("random init") >= 2


VIEWS_JS = """
(() => ['study-map', 'study-tree'].map(id => {
  const svg = document.querySelector('#' + id + ' svg.view-svg');
  if (!svg) return null;
  svg.scrollIntoView();
  const box = svg.getBoundingClientRect();
  const style = getComputedStyle(svg);
  return {width: box.width, height: box.height, top: box.top + window.scrollY, left: box.left + window.scrollX,
          visible: style.visibility === 'visible' && style.display !== 'none',
          texts: Array.from(svg.querySelectorAll('text')).map(t => t.textContent),
          titles: Array.from(svg.querySelectorAll('title')).map(t => t.textContent),
          caption: document.querySelector('#' + id + ' figcaption').textContent};
}))()
"""


def check_views(browser: Browser, models: list[str]) -> list[dict]:
    """The map and the dendrogram are on screen, drawn, with every model named (full name on hover)."""
    found = browser.evaluate(VIEWS_JS)
    assert None not in found, "the study report lacks the map or the dendrogram"
    png = browser.screenshot()
    for item in found:
        assert item["visible"] and item["width"] > 200 and item["height"] > 150
        assert colours_in(png, item) > 10  # drawn, not a blank box
        assert sorted(item["titles"]) == sorted(models)
    assert "MDS" in found[0]["caption"] and "embedding.csv" in found[0]["caption"]
    assert "linkage" in found[1]["caption"] and "linkage.csv" in found[1]["caption"]
    return found


def test_the_study_report_shows_the_map_and_the_dendrogram(browser, real_runs):
    from simkit.results import load

    browser.open((real_runs["study"] / "report.html").as_uri())
    assert browser.errors() == []
    check_views(browser, list(load(real_runs["study"]).summary["models"]))


def test_a_study_of_unrelated_random_models_names_no_similar_pair(browser, tmp_path):
    """Models whose one layer is an independent random table: nothing is similar, and the report says
    so: no "most similar pair", the map and tree called noise."""
    import torch

    from simkit.engine import capture, study
    from simkit.report import save_run
    from tests.engine.test_caches import _Table

    index = torch.arange(256)
    paths = [capture(_Table(seed), index, tmp_path / f"noise{seed}", layers=["layer"], model_name=f"noise{seed}",
                     data_name="index", progress=False) for seed in range(4)]
    result = study(paths, progress=False)
    run = save_run(result, tmp_path / "study")
    browser.open((run / "report.html").as_uri())
    assert browser.errors() == []
    layout = browser.evaluate(LAYOUT_JS)
    text = " ".join(layout["findings"])
    assert "most similar pair" not in text and "no pair of different models beats chance" in text
    assert "as given" in text  # the weights of modules simkit did not load
    assert layout["clipped"] == [] and layout["pageOverflow"] <= 1
    check_views(browser, list(result.summary["models"]))
    assert "layout is noise" in browser.evaluate(PROSE_JS)
