"""The host's DRAM bandwidth while a CPU profile runs, beside the figure its calibration measured.

A calibrated CPU model is priced at the bandwidth `calibrate` measured minutes before; a shared
machine's memory bandwidth moves over minutes (on the development VM a 256 MiB read ran at 46 GB/s in
one calibration and the engine's decode then streamed 1.4x faster than it priced, in every
configuration of the profile that followed). So before each configuration's generation (each round,
`--runs`) `profile` times the same read `calibrate` times for its largest stream (`read_probe`: a sum
over 256 MiB, the fastest of a few), and `run.json` keeps the probes (`host_bandwidth`). The accuracy
report sets their median against the calibration's own read at that size (`drift_lines`): a miss of
memory-bound steps by the same factor is the host, not the time model. Nothing is fitted on them.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

PROBE_BYTES = 256 * 1024 * 1024  # calibrate's largest stream (`Settings.stream_sizes`)
DRIFT = 0.10  # a probe median this far from the calibration's read is reported as the host moving


def read_probe(device: Any, nbytes: int = PROBE_BYTES) -> float:
    """GB/s (decimal) of the fastest of a few sums over a fresh `nbytes` fp32 buffer on `device`, as
    `calibrate`'s stream read times it (`llmperf.measure.calibrate.ceilings.measure_streams`)."""
    import torch

    from llmperf.measure.timers import time_fn

    n = max(nbytes // 4, 1)
    src = torch.ones(n, device=device)
    t = time_fn(lambda: src.sum(), device, reps=5, min_time_s=0.05)
    return 4 * n / t.min_s / 1e9


def calibration_read(calibration: Mapping[str, Any] | None, nbytes: int = PROBE_BYTES) -> float | None:
    """The read bandwidth (GB/s) a calibration's record (`HardwareSpec.calibration`) measured at
    `nbytes`, else at its largest read; None without one."""
    streams = [s for s in (calibration or {}).get("streams") or []
               if isinstance(s, Mapping) and s.get("kind") == "read"]
    if not streams:
        return None
    at = [s for s in streams if s.get("size_bytes") == nbytes] or [max(streams, key=lambda s: s.get("size_bytes", 0))]
    value = at[0].get("gb_per_s")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def drift_lines(probes: Sequence[float], calibrated: float | None) -> list[str]:
    """The report's lines on the host's bandwidth: the probes' median and range beside the calibration's
    read, and whether the host moved past `DRIFT`."""
    if not probes:
        return []
    median = statistics.median(probes)
    line = (f"host DRAM read during the run: median {median:.1f} GB/s ({min(probes):.1f}-{max(probes):.1f}, "
            f"{len(probes)} probes of {PROBE_BYTES // 2**20} MiB)")
    if calibrated is None:
        return [line + "; no calibration read to compare"]
    ratio = median / calibrated
    line += f"; the calibration read {calibrated:.1f} GB/s ({ratio:.2f}x)"
    if abs(ratio - 1) <= DRIFT:
        return [line]
    return [line, f"note the host moved since the calibration ({ratio:.2f}x its read bandwidth): memory-bound steps "
                  "run about that much off their calibrated prediction; calibrate again on a steadier machine"]
