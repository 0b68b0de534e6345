"""What the device is: the facts a measurement needs beside it to mean anything.

- NVIDIA: `torch.cuda.get_device_properties` (name, memory, SMs, compute capability) and, when the
  `pynvml` bindings are installed (NVIDIA's NVML: `nvmlDeviceGetClockInfo`, `nvmlSystemGetDriverVersion`,
  `nvmlDeviceGetPowerManagementLimit`), the clocks, driver and power limit.
- CPU: the model name, cores and threads (`os.cpu_count`, `torch.get_num_threads`), the ISA extensions
  that change GEMM speed (AVX2, AVX-512, AVX-512 BF16, AMX) from `/proc/cpuinfo`, and the cache sizes
  from `/sys/devices/system/cpu/cpu0/cache` (Linux; absent fields are simply missing elsewhere).
- `versions()`: torch, triton, numpy, python: every run records them.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16",
             "amx_int8", "neon", "asimd")


def _cpuinfo() -> dict[str, str]:
    """The first processor block of /proc/cpuinfo as a dict ('' values where absent)."""
    path = Path("/proc/cpuinfo")
    info: dict[str, str] = {}
    if not path.is_file():
        return info
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            if info:
                break
            continue
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    return info


def cpu_caches() -> dict[str, int]:
    """Cache sizes in bytes per level ('L1d', 'L1i', 'L2', 'L3') as seen by CPU 0."""
    out: dict[str, int] = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(root.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size[-1:], 1)
        name = f"L{level}" + ({"Data": "d", "Instruction": "i"}.get(kind, ""))
        out[name] = int(size.rstrip("KMG")) * unit
    return out


def describe_cpu() -> dict[str, Any]:
    import torch

    from llmperf.engine.cpu import kernels as cpu_kernels

    info = _cpuinfo()
    flags = set(info.get("flags", info.get("Features", "")).split())
    level, _ = cpu_kernels.isa_cap()
    if level != "native":  # LLMPERF_MAX_CPU_ISA: the features this run uses, and the cap that hid the rest
        flags &= cpu_kernels.cpu_features()
    out = dict(kind="cpu", name=info.get("model name") or platform.processor() or platform.machine(),
               machine=platform.machine(), cores=os.cpu_count() or 1, threads=torch.get_num_threads(),
               isa=[f for f in ISA_FLAGS if f in flags], caches=cpu_caches(), memory_bytes=_total_memory_bytes())
    if level != "native":
        out["isa_cap"] = f"{cpu_kernels.MAX_ISA}={level}"
    from llmperf.engine.cpu.allocator import describe as allocator
    from llmperf.engine.cpu.allocator import keep_freed_memory

    keep_freed_memory()  # settled as the engine this CPU's measurement runs will settle it
    out["allocator"] = allocator()  # whether freed memory is kept (`llmperf.engine.cpu.allocator`)
    return out


def _total_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def available_memory_bytes(device: Any) -> int:
    """Free memory on `device` now (CUDA: `mem_get_info`; CPU: MemAvailable from /proc/meminfo)."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return _total_memory_bytes()


def describe_cuda(index: int = 0) -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(index)
    out: dict[str, Any] = dict(
        kind="cuda", name=props.name, index=index, memory_bytes=int(props.total_memory),
        sms=int(props.multi_processor_count), compute_capability=f"{props.major}.{props.minor}",
        l2_cache_bytes=int(getattr(props, "L2_cache_size", 0)), device_count=torch.cuda.device_count(),
        cuda=str(torch.version.cuda))
    try:
        import pynvml
    except ImportError:
        out["nvml"] = "pynvml not installed"
        return out
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        out.update(
            driver=_text(pynvml.nvmlSystemGetDriverVersion()),
            sm_clock_max_mhz=pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            mem_clock_max_mhz=pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            sm_clock_mhz=pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            power_limit_w=pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000,
            memory_bus_width_bits=_maybe(lambda: pynvml.nvmlDeviceGetMemoryBusWidth(handle)))
    except Exception as exc:  # noqa: BLE001 - without NVML access (or an older binding) torch's facts remain
        out["nvml"] = f"unavailable ({exc})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down an NVML that never started
            pass
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _maybe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - optional NVML queries differ between driver versions
        return None


def describe(device: Any) -> dict[str, Any]:
    """`describe_cuda` for a CUDA device, else `describe_cpu`."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return describe_cuda(device.index or 0)
    return describe_cpu()


def versions() -> dict[str, str]:
    import numpy
    import torch

    out = dict(python=platform.python_version(), torch=str(torch.__version__), numpy=str(numpy.__version__))
    try:
        import triton
        out["triton"] = str(triton.__version__)
    except ImportError:
        out["triton"] = "not installed"
    from llmperf import __version__
    out["llmperf"] = str(__version__)
    return out


def git_commit(path: str | os.PathLike[str] | None = None) -> str | None:
    """The commit of the checkout llmperf runs from, or None outside a git checkout."""
    where = Path(path) if path else Path(__file__).resolve().parents[2]
    try:
        res = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() or None if res.returncode == 0 else None
