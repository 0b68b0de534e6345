"""Reports: pictures of estimates, profiles and simulations (matplotlib), gathered into one
self-contained HTML page (jinja2) with the PNGs beside it. Reads result frames and run directories;
computes nothing new; never imports torch, so a report renders on any machine.

    from llmperf.report import EstimateSpec, build_report
    report = build_report(estimate=EstimateSpec(models=["llama-3.1-8b"], hardware=["h100-sxm"],
                                                batch=[1, 8, 64], prompt_len=[512, 4096]),
                          runs=["runs/profile-cpu", "runs/simulate-a100"])
    report.write("report.html")          # report.html + report_files/*.png, *.csv

Figures one by one (tidy frames in, captioned matplotlib figures out) are in
`llmperf.report.figures`; the run-directory readers in `llmperf.report.runs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llmperf.report import figures
from llmperf.report.figures import Ceiling, ReportFigure
from llmperf.report.html import RenderedReport, files_folder, render, write
from llmperf.report.runs import ProfileRun, SimulateRun, load_profile, load_run, load_simulate
from llmperf.report.sources import (
    DEFAULT_COMPARE,
    EstimateSpec,
    Section,
    estimate_section,
    profile_section,
    simulate_section,
    typical_section,
)


@dataclass(frozen=True, kw_only=True)
class Report:
    """The sections of a report and their rendering (HTML text and the files beside it)."""

    sections: tuple[Section, ...]
    rendered: RenderedReport

    @property
    def figures(self) -> list[ReportFigure]:
        return [f for s in self.sections for f in s.figures]

    @property
    def html(self) -> str:
        return self.rendered.html

    def write(self, path: str | Path) -> Path:
        """`path` (an .html file) and `<stem>_files/` beside it, written atomically."""
        return write(self.rendered, path)


def build_sections(*, estimate: EstimateSpec | None = None, runs: Sequence[str | Path] = (),
                   typical: bool = True) -> list[Section]:
    """An estimate's section (and, with `typical`, typical's operator times against Vidur's
    measurements), then one per run directory."""
    sections = [estimate_section(estimate)] if estimate is not None else []
    if estimate is not None and typical:  # how good `typical` is, beside every estimate
        sections.append(typical_section())
    for path in runs:
        run = load_run(path)
        sections.append(profile_section(run) if isinstance(run, ProfileRun) else simulate_section(run))
    return sections


def build_report(*, estimate: EstimateSpec | None = None, runs: Sequence[str | Path] = (),
                 title: str = "llmperf report", typical: bool = True) -> Report:
    """Sections for an estimate and/or run directories, rendered in memory (nothing written yet)."""
    from llmperf.errors import SpecError
    if estimate is None and not runs:
        raise SpecError("report: give an estimate spec, a run directory, or both")
    sections = build_sections(estimate=estimate, runs=runs, typical=typical)
    try:
        rendered = render(sections, title=title)
    finally:
        for section in sections:  # free matplotlib's memory: figures are not registered with pyplot
            for fig in section.figures:
                fig.figure.clear()
    return Report(sections=tuple(sections), rendered=rendered)


__all__ = [
    "Ceiling", "DEFAULT_COMPARE", "EstimateSpec", "ProfileRun", "RenderedReport", "Report", "ReportFigure",
    "Section", "SimulateRun", "build_report", "build_sections", "figures", "files_folder", "load_profile",
    "load_run", "load_simulate", "render", "write",
]
