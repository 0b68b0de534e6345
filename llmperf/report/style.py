"""One look for every chart of a report: colour is the phase, marker is predicted vs measured, every
axis carries its unit, and the palette reads in print and for people with colour-vision deficiency.

The palette is Okabe & Ito's ("Color Universal Design", 2008; https://jfly.uni-koeln.de/color/), the
usual choice for categorical data that must survive deuteranopia, protanopia and tritanopia. Where
colour alone would carry a distinction that matters in a grey print, a second channel carries it too:
a marker shape (predicted vs measured), a hatch (compute-bound vs memory-bound) or a line style.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import matplotlib

matplotlib.use("Agg")  # reports render without a display

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from llmperf.analysis.vocabulary import Phase  # noqa: E402

# Okabe-Ito, in their published order (black first)
OKABE_ITO = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
BLACK, ORANGE, SKY_BLUE, GREEN, YELLOW, BLUE, VERMILLION, PURPLE = OKABE_ITO

#: colour of each phase, everywhere
PHASE_COLORS = {Phase.prefill.value: BLUE, Phase.decode.value: VERMILLION, Phase.mixed.value: GREEN,
                Phase.verify.value: PURPLE}
#: categorical colours for anything that is not a phase (devices, contexts, models), phases' excluded
SERIES_COLORS = (BLUE, VERMILLION, GREEN, ORANGE, PURPLE, SKY_BLUE, BLACK, YELLOW)

#: marker of each kind of value: filled for measured, hollow for predicted
MARKERS = {"measured": "o", "roofline": "s", "typical": "^", "calibrated": "D"}
HATCH_COMPUTE = "///"  # compute-bound time is hatched, memory-bound time solid

DPI = 100


def phase_color(phase: str) -> str:
    return PHASE_COLORS.get(str(phase), BLACK)


def series_color(i: int) -> str:
    return SERIES_COLORS[i % len(SERIES_COLORS)]


def marker_style(kind: str, color: str) -> dict[str, object]:
    """Keyword arguments for `ax.plot`/`ax.scatter`-like markers: measured filled, predictions hollow."""
    filled = kind == "measured"
    return dict(marker=MARKERS.get(kind, "o"), markeredgecolor=color,
                markerfacecolor=color if filled else "white", markeredgewidth=1.4)


_RC = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "savefig.bbox": "tight",
    "figure.dpi": DPI,
    # Model names, paths and trace names come from users: a '$' must print as '$', never start
    # mathtext (which would fail to parse, or render something else).
    "text.parse_math": False,
    "text.usetex": False,
}


@contextmanager
def report_style() -> Iterator[None]:
    with plt.rc_context(_RC):
        yield


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 7.0, height: float = 4.0):  # noqa: ANN201
    """A figure and its axes (a flat list), not registered with pyplot's global state."""
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]
