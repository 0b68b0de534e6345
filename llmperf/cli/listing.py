"""Rich tables of the built-in models and devices (`llmperf models`, `llmperf hardware`).

Both fit in 80 columns (a terminal's default, and what `rich` assumes when piped without `COLUMNS`)
and never truncate a name: names are one unbreakable column, numbers are shortened with their unit
in the header. JSON and CSV (`-f json|csv`) carry every field at full precision.
"""

from __future__ import annotations

import io
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

LISTING_WIDTH = 80


def _table(title: str, columns: list[tuple[str, str]]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1, 0, 0))  # with the blank column divider: 2 spaces between columns
    for header, justify in columns:
        table.add_column(header, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    return table


def _kib(value: float) -> str:
    return f"{value / 1024:,.0f}" if value >= 1024 else f"{value / 1024:.2f}"


def _opt(value: Any, fmt: str = "{:g}") -> str:
    return "-" if value is None else fmt.format(value)


def _count(n: float) -> str:
    """Parameters in 3 significant digits with a unit: 124M, 8.03B, 671B, 1.03T."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:,.0f}"


def models_table(rows: list[dict[str, Any]]) -> Table:
    """Name, total/active parameters, layers, attention, local layers, experts and KV bytes per token."""
    table = _table("Built-in models (exact counts: --format json)", [
        ("name", "left"), ("params", "right"), ("layers", "right"), ("attention", "left"), ("local", "left"),
        ("experts", "right"), ("KV KiB", "right")])
    for r in rows:
        params = _count(r["params"])
        if r["active_params"] != r["params"]:
            params += "/" + _count(r["active_params"])
        experts = "-"
        if r["experts"] > 1:
            shared = f"+{r['shared_experts']}" if r["shared_experts"] else ""
            experts = f"{r['experts_per_token']}/{r['experts']}{shared}"
        kv = 2 * r["layers"] * r["kv_elements_per_token_per_layer"]  # fp16 bytes, every layer's full cache
        table.add_row(r["name"], params, str(r["layers"]), r["attention"], r["local_attention"], experts, _kib(kv))
    table.caption = ("params: total/active; attention: KV heads x head_dim, MLA latent+rope; local: sliding or "
                     "chunked : full layers; experts: top-k/routed+shared; KV KiB: per token at fp16, no window cap")
    table.caption_justify = "left"
    return table


def hardware_table(rows: list[dict[str, Any]]) -> Table:
    """Dense peaks, memory, ridge point and link of each device."""
    table = _table("Built-in devices (dense peaks; every field: --format json)", [
        ("name", "left"), ("fp16", "right"), ("fp8", "right"), ("int8", "right"), ("GB/s", "right"),
        ("GiB", "right"), ("ridge", "right"), ("link GB/s", "right")])
    for r in rows:
        table.add_row(r["name"], _opt(r["fp16_tflops"]), _opt(r["fp8_tflops"]), _opt(r["int8_tflops"]),
                      f"{r['bandwidth_gbps']:g}", f"{r['memory_gib']:.1f}", f"{r['ridge_fp16']:.0f}",
                      _opt(r["interconnect_gbps"] or None))
    table.caption = "peaks in dense TFLOP/s (TOP/s for int8); ridge = fp16 peak / bandwidth, FLOP/B"
    table.caption_justify = "left"
    return table


def table_text(table: Table, width: int = LISTING_WIDTH) -> str:
    """The table as plain text (no colour codes), as written to a file with `-o`."""
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None, force_terminal=False,
                      markup=False)
    console.print(table)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"
