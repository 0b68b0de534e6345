"""One style across a whole report (estimate + profile + simulate): all nine figures, each with a
caption and labelled axes carrying units, every colour from the colour-vision-safe palette (or grey),
and each phase in its own colour everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.colors import to_hex

from llmperf.report import EstimateSpec, build_sections
from llmperf.report.style import OKABE_ITO, PHASE_COLORS

from report_testing import write_profile, write_simulate

NINE = {"roofline", "breakdown", "batch", "context", "memory", "attention", "errors", "devices", "serving"}


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> list:
    tmp: Path = tmp_path_factory.mktemp("style")
    spec = EstimateSpec(models=["llama-3.1-8b"], hardware=["a100-80gb-sxm"], batch=[1, 4, 64], prompt_len=[128, 1024],
                        gen_len=[16], compare=["h100-sxm"])
    sections = build_sections(estimate=spec, runs=[write_profile(tmp / "p"), write_simulate(tmp / "s")])
    return [f for s in sections for f in s.figures]


def _is_grey(hex_color: str) -> bool:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return r == g == b


def _drawn_colors(fig) -> set[str]:  # noqa: ANN001
    """Colours a reader sees: line strokes (not of marker-only lines), marker edges and faces, patches."""
    out: set[str] = set()
    for ax in fig.figure.axes:
        for ln in ax.lines:
            if ln.get_linestyle() not in ("None", "none", ""):
                out.add(to_hex(ln.get_color()))
            if ln.get_marker() not in (None, "None", "none", ""):
                out |= {to_hex(ln.get_markeredgecolor()), to_hex(ln.get_markerfacecolor())}
        out |= {to_hex(p.get_facecolor()) for p in ax.patches if p.get_fill()}
        for coll in ax.collections:
            out |= {to_hex(c) for c in coll.get_facecolors()}
    return out


def test_all_nine_figures_with_captions(figures) -> None:  # noqa: ANN001
    assert NINE <= {f.name for f in figures}
    for f in figures:
        assert len(f.caption.split()) >= 10, f"{f.name}: a caption says what to look at"


def test_every_axis_labelled_with_a_unit(figures) -> None:  # noqa: ANN001
    for f in figures:
        for ax in f.figure.axes:
            if not ax.axison:
                continue
            x, y = ax.get_xlabel(), ax.get_ylabel()
            assert x and y, f"{f.name}: an axis without a label ({x!r}, {y!r})"
            assert "(" in x + y and ")" in x + y, f"{f.name}: no unit on either axis ({x!r}, {y!r})"


def test_colours_are_colour_vision_safe(figures) -> None:  # noqa: ANN001
    palette = {c.lower() for c in OKABE_ITO} | {"#ffffff"}
    for f in figures:
        off = {c for c in _drawn_colors(f) if c not in palette and not _is_grey(c)}
        assert not off, f"{f.name}: colours outside the Okabe-Ito palette: {sorted(off)}"


def test_phase_colours_are_the_same_everywhere(figures) -> None:  # noqa: ANN001
    prefill, decode = PHASE_COLORS["prefill"].lower(), PHASE_COLORS["decode"].lower()
    for name in ("roofline", "breakdown", "serving"):
        seen = set().union(*(_drawn_colors(f) for f in figures if f.name == name))
        assert {prefill, decode} <= seen, f"{name}: prefill / decode not in their phase colours"
