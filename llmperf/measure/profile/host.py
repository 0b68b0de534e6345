"""The host's DRAM bandwidth while a CPU profile runs, beside the figure its calibration measured.

A calibrated CPU model is priced at the bandwidth `calibrate` measured minutes before, but a shared
machine's memory bandwidth is not one figure: on the development VM a 256 MiB read ran at 46 GB/s in
one calibration and 71 in the next, and a model's decode streamed 1.4x faster than one calibration
priced in every configuration of the profile that followed (the speed follows where a buffer lands,
not the clock). So before each configuration's generation (each round, `--runs`) `profile` times the
read `calibrate` times for its largest stream over the model's own largest weights
(`read_probe`, `weights_to_probe`: a sum over 256 MiB of them, the fastest of a few), and `run.json`
keeps the probes (`host_bandwidth`). The accuracy report sets them against the bandwidth the
calibration priced DRAM at (`calibration_bandwidth`; `drift_lines`, `config_lines`): memory-bound
steps that miss by the same factor miss through the host, not the time model. Nothing is fitted on them.
On a GPU the engine's steps follow the host's dispatch instead: `profile` times a tiny kernel's issue
(`timers.dispatch_seconds`) before each configuration (`host_dispatch`), beside the calibration's
(`dispatch_lines`; config lines in us).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

PROBE_BYTES = 256 * 1024 * 1024  # calibrate's largest stream (`Settings.stream_sizes`)
DRIFT = 0.10  # a probe median this far from the calibration's read is reported as the host moving


def read_probe(device: Any, nbytes: int = PROBE_BYTES, tensors: Sequence[Any] = ()) -> float:
    """GB/s (decimal) of the fastest of a few sums, as `calibrate`'s stream read times it
    (`llmperf.measure.calibrate.ceilings.measure_streams`): over `tensors` (the model's own weights,
    `weights_to_probe`) when given, else over a fresh `nbytes` fp32 buffer on `device`."""
    import torch

    from llmperf.measure.timers import read_bytes_per_s

    if not tensors:
        tensors = [torch.ones(max(nbytes // 4, 1), device=device)]
    return read_bytes_per_s(tensors, device, reps=5, min_time_s=0.05) / 1e9


def weights_to_probe(model: Any, nbytes: int = PROBE_BYTES) -> list[Any]:
    """The model's largest weight tensors, largest first, until they hold `nbytes` (all of them if
    fewer): a shared machine's DRAM bandwidth can depend on where a buffer lands (on the development VM
    a fresh buffer read at 42-82 GB/s from one allocation to the next, while the engine's weights
    streamed at one speed all run), so the probe reads what the engine's steps read."""
    out, held = [], 0
    for p in sorted(model.parameters(), key=lambda t: t.numel() * t.element_size(), reverse=True):
        if held >= nbytes:
            break
        out.append(p.detach())
        held += p.numel() * p.element_size()
    return out


def calibration_bandwidth(hardware: Any) -> float | None:
    """The DRAM bandwidth (GB/s) a calibrated device's decode is priced at: its calibration's memory
    bandwidth, the best DRAM-sized stream it measured (a read, a copy or the GEMV's weight stream,
    `Calibration.memory_bytes_per_s`); None for a device without a calibration."""
    if not getattr(hardware, "calibration", None):
        return None
    return float(hardware.mem_bandwidth_bytes_per_s) / 1e9 or None


def drift_lines(probes: Sequence[float], calibrated: float | None) -> list[str]:
    """The report's lines on the host's bandwidth: the probes' median and range beside the calibration's
    read, and whether the host moved past `DRIFT`."""
    if not probes:
        return []
    median = statistics.median(probes)
    return _moved(f"host DRAM read during the run: median {median:.1f} GB/s ({min(probes):.1f}-{max(probes):.1f}, "
                  f"{len(probes)} probes of {PROBE_BYTES // 2**20} MiB)", median, calibrated,
                  "no calibration read to compare", "the calibration priced DRAM at {c:.1f} GB/s",
                  "its DRAM bandwidth", "memory-bound")


def _moved(line: str, median: float, calibrated: float | None, missing: str, against: str, what: str, steps: str
           ) -> list[str]:
    """`line` with the calibration's figure (`against`, formatted with c=) and the ratio, and a second
    line when the host moved past `DRIFT`; `missing` instead without a calibration figure."""
    if calibrated is None:
        return [line + "; " + missing]
    ratio = median / calibrated
    line += "; " + against.format(c=calibrated) + f" ({ratio:.2f}x)"
    if abs(ratio - 1) <= DRIFT:
        return [line]
    return [line, f"note the host moved since the calibration ({ratio:.2f}x {what}): {steps} steps run about that "
                  "much off their calibrated prediction; calibrate again on a steadier machine"]


def config_lines(probes: Sequence[tuple[str, float]], decode_errors: Mapping[str, float], calibrated: float | None,
                 *, unit: str = "GB/s", what: str = "host bandwidth") -> list[str]:
    """Per configuration, its probes' median (GB/s, `(config, probe)` pairs; `unit` for another probe,
    `what` names it) beside its calibrated decode steps' median |error| (`decode_errors`), and the decode
    median over the steady configurations (those whose probe is within `DRIFT` of the calibration's):
    which misses go with a moved host. The steady set is chosen by the probes alone, never by the errors."""
    if not probes or calibrated is None or not decode_errors:
        return []
    by: dict[str, list[float]] = {}
    for config, value in probes:
        by.setdefault(config, []).append(value)
    out, steady = [], []
    for config, values in by.items():
        if config not in decode_errors:
            continue
        ratio = statistics.median(values) / calibrated
        err = decode_errors[config]
        out.append(f"  {config}: host {statistics.median(values):.1f} {unit} ({ratio:.2f}x), "
                   f"calibrated decode median {err:.1%}")
        if abs(ratio - 1) <= DRIFT:
            steady.append(config)
    if len(out) < 2:
        return []
    if steady:
        med = statistics.median(decode_errors[c] for c in steady)
        tail = f"steady configurations (host within {DRIFT:.0%}): {len(steady)} of {len(out)}, decode median {med:.1%}"
    else:
        tail = f"steady configurations (host within {DRIFT:.0%}): none of {len(out)}"
    return [f"{what} by configuration:"] + out + ["  " + tail]


def host_moved_notes(run: Any) -> list[str]:
    """run.json `settings.notes` when the host's probes over the run (a `RunManifest`'s `host_bandwidth` or
    `host_dispatch`) moved past `DRIFT` from its calibration's figure: a calibration written on a busier
    (or quieter) machine prices every calibrated step off by about that, and `profile` says so at the end,
    not only the report."""
    s = run.settings
    lines = (drift_lines([p.read_gb_per_s for p in run.host_bandwidth or []], s.calibration_bandwidth_gb_per_s)
             + dispatch_lines([p.dispatch_us for p in run.host_dispatch or []], s.calibration_dispatch_us))
    return [line.removeprefix("note ") for line in lines if line.startswith("note the host moved")]


def calibration_dispatch(hardware: Any) -> float | None:
    """The host's time (us) to issue a tiny kernel when a GPU's calibration timed its operators
    (`dispatch_probe_us`, `llmperf.measure.timers.dispatch_seconds`); None without one."""
    cal = getattr(hardware, "calibration", None) or {}
    value = cal.get("dispatch_probe_us")
    return float(value) if value else None


def dispatch_lines(probes: Sequence[float], calibrated: float | None) -> list[str]:
    """The report's lines on a GPU host's dispatch: the probes' median and range (us to issue a tiny
    kernel) beside the calibration's, and whether the host moved past `DRIFT` (a host-bound engine's
    steps run about that much off their calibrated prediction)."""
    if not probes:
        return []
    median = statistics.median(probes)
    return _moved(f"host dispatch during the run: median {median:.2f} us a kernel ({min(probes):.2f}-"
                  f"{max(probes):.2f}, {len(probes)} probes)", median, calibrated, "no calibration probe to compare",
                  "the calibration's {c:.2f} us", "its dispatch time", "host-bound")
