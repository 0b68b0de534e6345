"""The report as one self-contained HTML file (figures embedded as PNG data URIs, CSS inline, no
script, no network) plus the PNGs and CSV tables in a folder beside it.

Every string that reaches the page (model and device names, paths, settings, table cells) goes through
jinja2's autoescaping; a Content-Security-Policy meta tag forbids scripts and any load that is not an
inline `data:` image, so even a page edited by hand cannot reach the network. Output is written
atomically: everything is rendered in memory first, each file goes to a temporary name in its folder
and is renamed, and the HTML (the report itself) is renamed last.
"""

from __future__ import annotations

import base64
import datetime as _dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd

from llmperf.errors import SpecError
from llmperf.outputs import FileTarget, FolderTarget, check_file, check_files_folder, signals_clean_up
from llmperf.report.sources import Section
from llmperf.report.style import DPI

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; max-width: 1200px; margin: 2em auto;
       padding: 0 1em; color: #111; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { font-size: 1.3em; border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
figure { margin: 1.5em 0; page-break-inside: avoid; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .92em; color: #333; max-width: 60em; }
table { border-collapse: collapse; font-size: .82em; margin: .8em 0; }
th, td { border: 1px solid #ccc; padding: .2em .5em; text-align: right; }
th { background: #f4f4f4; } td.t { text-align: left; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: .2em 1.2em; }
dl.facts dt { font-weight: 600; } dl.facts dd { margin: 0; }
.note { color: #555; font-size: .9em; }
nav ol { columns: 2; }
</style>
</head>
<body>
<h1>{{ title }}</h1>
<p class="note">Made by llmperf {{ version }} on {{ created }}. Units: seconds (and ms, µs), FLOP/s, bytes
decimal (GB = 1e9 B), memory capacities in GiB. Colour is the phase (blue prefill, vermillion decode) unless
a caption says otherwise; filled markers are measured, hollow markers predicted (square: roofline,
diamond: calibrated).</p>
<nav><ol>
{% for s in sections %}<li><a href="#s{{ loop.index }}">{{ s.title }}</a></li>
{% endfor %}</ol></nav>
{% for s in sections %}{% set si = loop.index %}
<section id="s{{ si }}">
<h2>{{ s.title }}</h2>
{% if s.facts %}<dl class="facts">{% for k, v in s.facts %}<dt>{{ k }}</dt><dd>{{ v }}</dd>{% endfor %}</dl>{% endif %}
{% for n in s.notes %}<p class="note">{{ n }}</p>{% endfor %}
{% for f in s.figures %}
<figure id="s{{ si }}-{{ f.name }}">
<img src="data:image/png;base64,{{ f.png }}" alt="{{ f.title }}: {{ f.alt }}"
 width="{{ f.width }}" height="{{ f.height }}">
<figcaption><strong>{{ f.number }}. {{ f.title }}.</strong> {{ f.caption }}
<span class="note">({{ f.file }})</span></figcaption>
</figure>
{% endfor %}
{% for name, t in s.tables %}
<h3>{{ name }}</h3>
{% if t.rows %}<table><thead><tr>{% for c in t.columns %}<th>{{ c }}</th>{% endfor %}</tr></thead>
<tbody>{% for row in t.rows %}<tr>{% for cell, text in row -%}
<td{% if text %} class="t"{% endif %}>{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>{% else %}<p class="note">(none)</p>{% endif %}
{% endfor %}
</section>
{% endfor %}
</body>
</html>
"""

_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)


@dataclass(frozen=True, kw_only=True)
class RenderedReport:
    """A report rendered in memory: the HTML text and the files that go beside it."""

    html: str
    files: dict[str, bytes]  # relative name inside the folder beside the HTML -> content
    seconds: float


def _cell(value: object) -> tuple[str, bool]:
    """A table cell's text and whether it is text (left-aligned) rather than a number."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value)), True
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}", False
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return ("" if np.isnan(v) else f"{v:.4g}"), False
    return str(value), True


def _table(frame: pd.DataFrame) -> dict[str, object]:
    return dict(columns=[str(c) for c in frame.columns],
                rows=[[_cell(v) for v in row] for row in frame.itertuples(index=False, name=None)])


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def render(sections: Sequence[Section], *, title: str) -> RenderedReport:
    """HTML text (images inline) and the PNG/CSV files, all in memory. Figures are closed as drawn."""
    import time

    import llmperf
    t0 = time.perf_counter()
    files: dict[str, bytes] = {}
    ctx_sections = []
    number = 0
    for si, section in enumerate(sections, 1):
        figs = []
        for fig in section.figures:
            number += 1
            png = fig.png(DPI)
            w, h = (int(round(v * DPI)) for v in fig.figure.get_size_inches())
            name = f"{si:02d}-{section.kind}-{number:02d}-{fig.name}.png"
            files[name] = png
            figs.append(dict(name=fig.name, title=fig.title, caption=fig.caption, number=number,
                             png=base64.b64encode(png).decode("ascii"), file=name,
                             width=_png_size(png)[0] or w, height=_png_size(png)[1] or h,
                             alt=fig.caption.split(". ")[0]))
        for name, frame in section.attachments.items():
            stem = _slug(name.removesuffix(".csv"))
            files[f"{si:02d}-{section.kind}-{stem}.csv"] = frame.to_csv(index=False).encode()
        ctx_sections.append(dict(title=section.title, facts=section.facts, notes=section.notes, figures=figs,
                                 tables=[(name, _table(t)) for name, t in section.tables]))
    html = _ENV.from_string(_TEMPLATE).render(
        title=title, sections=ctx_sections, version=llmperf.__version__,
        created=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    return RenderedReport(html=html, files=files, seconds=time.perf_counter() - t0)


def _png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        return 0, 0
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def files_folder(html_path: Path) -> Path:
    """The folder beside the HTML that holds its PNGs and CSVs: `report.html` -> `report_files/`."""
    return html_path.with_name(f"{html_path.stem}_files")


def is_report_file(name: str) -> bool:
    """A file name `render` gives (`01-estimate-03-roofline.png`, `02-simulate-requests.csv`): what an
    older report left in `<name>_files/`, and the only files a new report may replace there."""
    return _REPORT_FILE.fullmatch(name) is not None


_REPORT_FILE = re.compile(r"\d{2,}-[a-z]+-[A-Za-z0-9._-]+\.(png|csv)")


def check_destination(html_path: str | Path) -> tuple[FileTarget, FolderTarget]:
    """Check the HTML file and its `<stem>_files/` folder before anything is rendered: an .html name
    in an existing folder, not a FIFO, device or directory, and a files folder that is absent or holds
    only an older report's files (a user's own files there are never deleted)."""
    shown = str(html_path)
    if Path(shown).suffix.lower() not in (".html", ".htm"):
        raise SpecError(f"--output: {shown!r} must end in .html")
    html = check_file(shown, "--output")
    assert html is not None  # not "-": it ends in .html
    folder = check_files_folder(files_folder(Path(shown)), is_report_file, "--output")
    return html, folder


def write(report: RenderedReport, html_path: str | Path) -> Path:
    """Write the files beside the HTML, then the HTML, each atomically (`llmperf.outputs`); a failure
    leaves the old report (HTML and folder) as it was and nothing else behind. Returns the HTML path."""
    html, folder = check_destination(html_path)
    for name in report.files:
        if not is_report_file(name):  # pragma: no cover - render names them
            raise AssertionError(f"report file name {name!r} is not one `is_report_file` recognises")
    with signals_clean_up():
        # built aside: stale PNGs of an older report never survive; a report made private stays private
        staged_folder = folder.stage(report.files, None if html.st is None else html.st.st_mode)
        staged_html = None
        try:
            staged_html = html.stage(report.html.encode("utf-8"))
            staged_folder.commit()
            staged_html.commit()
        except BaseException:
            if staged_html is not None:
                staged_html.discard()
            staged_folder.restore()
            raise
        staged_folder.finish()
    return Path(html_path)
