"""Default GPU prices for `llmperf plan` (USD per GPU-hour, on-demand, single-GPU list prices).

Prices change monthly and differ by provider, region and commitment: pass your own with
`--gpu-cost` (one number for every device, or `device=price,...`). A device without a figure here
and without `--gpu-cost` is still planned, ranked by GPU count after the priced ones, its cost shown
as unknown. Each figure names where it was listed; all were collected from the "Serverless GPU
Pricing Matrix" cheat sheet (techbytes.app, prices "verified on May 7, 2026 from official vendor
pricing"), which quotes Modal's and Lambda's public pricing pages.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmperf.errors import SpecError

_CHEAT_SHEET = "https://techbytes.app/posts/serverless-gpu-pricing-matrix-modal-replicate-lambda-2026/"


@dataclass(frozen=True, kw_only=True)
class GpuPrice:
    """A GPU's hourly price in US dollars, who listed it, and where."""

    usd_per_hour: float
    provider: str
    source: str


DEFAULT_PRICES: dict[str, GpuPrice] = {
    "h100-sxm": GpuPrice(usd_per_hour=3.78, provider="Lambda, 1x H100 SXM on demand", source=_CHEAT_SHEET),
    "h100-pcie": GpuPrice(usd_per_hour=2.86, provider="Lambda, 1x H100 PCIe on demand", source=_CHEAT_SHEET),
    "a100-80gb-sxm": GpuPrice(usd_per_hour=2.4984, provider="Modal, A100 80GB", source=_CHEAT_SHEET),
    "a100-40gb-sxm": GpuPrice(usd_per_hour=1.48, provider="Lambda, 1x A100 40GB on demand", source=_CHEAT_SHEET),
    "l40s": GpuPrice(usd_per_hour=1.9512, provider="Modal, L40S", source=_CHEAT_SHEET),
    "l4": GpuPrice(usd_per_hour=0.7992, provider="Modal, L4", source=_CHEAT_SHEET),
    "a10": GpuPrice(usd_per_hour=0.86, provider="Lambda, 1x A10 on demand", source=_CHEAT_SHEET),
}


def parse_gpu_cost(text: str | None) -> dict[str, float] | float | None:
    """`--gpu-cost`: None, one price for every device ("2.5"), or "h100-sxm=3.5,a100-80gb-sxm=2"."""
    if text is None:
        return None
    text = text.strip()
    if "=" not in text:
        try:
            value = float(text)
        except ValueError:
            raise SpecError(f"--gpu-cost: {text!r} is not a price (USD per GPU-hour) or a list device=price") from None
        if not value > 0 or value == float("inf"):
            raise SpecError(f"--gpu-cost: must be a price > 0 USD per GPU-hour, got {text!r}")
        return value
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, price = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise SpecError(f"--gpu-cost: {part.strip()!r} is not device=price")
        try:
            value = float(price)
        except ValueError:
            raise SpecError(f"--gpu-cost: {name}={price.strip()!r} is not a price") from None
        if not value > 0 or value == float("inf"):
            raise SpecError(f"--gpu-cost: {name} must cost > 0 USD per GPU-hour, got {price.strip()!r}")
        key = name if name.endswith((".yaml", ".yml", ".json")) or "/" in name else name.lower()  # names: any case
        if key in out:
            raise SpecError(f"--gpu-cost: {name!r} is priced twice ({out[key]:g} and {value:g})")
        out[key] = value
    return out


def price_for(device: str, given: dict[str, float] | float | None) -> tuple[float | None, str]:
    """(USD per GPU-hour or None, where it came from) for `device`."""
    if isinstance(given, float):
        return given, "--gpu-cost"
    if isinstance(given, dict) and device in given:
        return given[device], "--gpu-cost"
    default = DEFAULT_PRICES.get(device)
    if default is not None:
        return default.usd_per_hour, default.provider
    return None, "unknown (pass --gpu-cost)"


__all__ = ["DEFAULT_PRICES", "GpuPrice", "parse_gpu_cost", "price_for"]
