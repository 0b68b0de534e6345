"""Collectives priced with a latency: `time = alpha(n) + comm_bytes / (link * busbw_fraction(n))`.

The terms come from `models_spec/efficiency/collectives.yaml`, fitted on measured NCCL all-reduce
times (`python -m llmperf.measure.fit_collectives`; each figure's source is in the file). `n` is the
number of GPUs in the collective (`OpCost.comm_gpus`: the TP degree for an all-reduce, the EP degree
for an all-to-all, 2 for a pipeline send). A device listed under a measured node takes that node's
terms; any other device takes the `default` node's alpha and busbw fraction, the fraction applied to
its own datasheet `interconnect_gbps` (the held-out A100 -> H100 check measures exactly this transfer);
GPUs on PCIe alone take the `pcie` node (the default's terms plus NCCL's PCIe latency per ring step).
Between measured GPU counts the terms are interpolated in log(n); beyond them held at the nearest.

Only all-reduce is measured; the other collectives take its terms, scaled by their ring step counts
(`LATENCY_SHARE`, NCCL's ring algorithms: an all-reduce is a reduce-scatter then an all-gather, 2(n-1)
steps; an all-gather, a reduce-scatter or an all-to-all (n-1 concurrent peer exchanges, one step of
latency each) n-1; a point-to-point send one step of a 2-GPU all-reduce's two): half the all-reduce's
latency at the same GPU count, and the same bus bandwidth fraction, `comm_bytes` already being each
collective's bus bytes (nccl-tests' PERFORMANCE.md: busbw = algbw x 2(n-1)/n for all-reduce, (n-1)/n
for all-gather, reduce-scatter and all-to-all, 1 for send/recv). A measured all-to-all would replace it.

The `typical` time model uses it for every comm operator; the `roofline` does not (the pure bound:
the link's bandwidth, no latency).

Pure Python + numpy, like the rest of `llmperf.analysis`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from llmperf.errors import SpecError

Number = Any

#: a collective's latency as a share of an all-reduce's over the same GPUs (ring steps; module docstring)
LATENCY_SHARE = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5, "send": 0.5}
#: which collective each comm operator of the vocabulary is
OP_COLLECTIVE = {"embed_allreduce": "all_reduce", "qk_norm_gather": "all_gather", "qk_norm_allreduce": "all_reduce",
                 "attn_allreduce": "all_reduce", "mlp_allreduce": "all_reduce",
                 "moe_dispatch": "all_to_all", "moe_combine": "all_to_all", "logits_gather": "all_gather",
                 "pp_send": "send"}


def latency_share(op_name: str) -> float:
    """The share of an all-reduce's latency that the comm operator `op_name` pays (1 if unknown)."""
    return LATENCY_SHARE[OP_COLLECTIVE.get(op_name, "all_reduce")]


@dataclass(frozen=True)
class NodeTerms:
    """One measured node: the devices it prices, and alpha / busbw fraction by GPU count."""

    name: str
    hardware: tuple[str, ...]
    link_gbps: float
    gpus: tuple[int, ...]
    alpha_s: tuple[float, ...]
    busbw_fraction: tuple[float, ...]

    def __post_init__(self) -> None:  # the measured counts, looked up without interpolating (every comm op asks)
        object.__setattr__(self, "_exact", dict(zip(self.gpus, zip(self.alpha_s, self.busbw_fraction))))

    def at(self, gpus: Number) -> tuple[Number, Number]:
        """(alpha_s, busbw_fraction) at `gpus` GPUs (log-linear between measured counts, flat beyond)."""
        if type(gpus) is int and gpus in self._exact:
            return self._exact[gpus]
        n = np.log(np.maximum(np.asarray(gpus, dtype=float), 2.0))
        xs = np.log(np.asarray(self.gpus, dtype=float))
        alpha = np.interp(n, xs, self.alpha_s)
        frac = np.interp(n, xs, self.busbw_fraction)
        if np.ndim(alpha) == 0:
            return float(alpha), float(frac)
        return alpha, frac


@dataclass(frozen=True)
class Collectives:
    """The collectives terms of every measured node, and the node other devices take."""

    nodes: tuple[NodeTerms, ...]
    default: str
    source: str = ""

    def node_for(self, hardware_name: str) -> NodeTerms:
        """The measured node whose terms price a collective on `hardware_name` (the default node for a device
        no node lists)."""
        for node in self.nodes:
            if hardware_name in node.hardware:
                return node
        return next(node for node in self.nodes if node.name == self.default)

    def terms(self, hardware_name: str, gpus: Number) -> tuple[Number, Number]:
        """(alpha_s, e_comm) of a collective over `gpus` GPUs of a `hardware_name` node: its latency
        and its bus bandwidth as a fraction of the device's `interconnect_gbps`."""
        return self.node_for(hardware_name).at(gpus)

    def time_s(self, hardware_name: str, link_bytes_per_s: float, gpus: Number, comm_bytes: Number,
               collective: str = "all_reduce") -> Number:
        """Seconds of one `collective` moving `comm_bytes` per GPU (its bus bytes) over `gpus` GPUs."""
        alpha, frac = self.terms(hardware_name, gpus)
        return alpha * LATENCY_SHARE[collective] + comm_bytes / (link_bytes_per_s * frac)


def collectives_path() -> Path:
    """The installed `models_spec/efficiency/collectives.yaml`."""
    return Path(str(resources.files("models_spec").joinpath("efficiency", "collectives.yaml")))


def parse_collectives(raw: Any, where: str) -> Collectives:
    """Validate `collectives.yaml`: {schema_version: 1, default, all_reduce: {node: {hardware, link_gbps,
    gpus: {n: {alpha_s, busbw_fraction, ...}}}}}."""
    if not isinstance(raw, Mapping) or raw.get("schema_version") != 1:
        raise SpecError(f"{where}: expected a mapping with schema_version 1")
    nodes_raw = raw.get("all_reduce")
    if not isinstance(nodes_raw, Mapping) or not nodes_raw:
        raise SpecError(f"{where}.all_reduce: expected a mapping of node -> terms, got {nodes_raw!r}")
    nodes = []
    for name, node in nodes_raw.items():
        at = f"{where}.all_reduce.{name}"
        if not isinstance(node, Mapping) or not isinstance(node.get("gpus"), Mapping) or not node["gpus"]:
            raise SpecError(f"{at}: expected hardware, link_gbps and gpus")
        gpus, alphas, fracs = [], [], []
        for n, t in sorted(node["gpus"].items()):
            alpha, frac = (t.get("alpha_s"), t.get("busbw_fraction")) if isinstance(t, Mapping) else (None, None)
            if (not isinstance(n, int) or n < 2 or not isinstance(alpha, (int, float)) or not 0 <= alpha < 1
                    or not isinstance(frac, (int, float)) or not 0 < frac <= 1):
                raise SpecError(f"{at}.gpus.{n}: expected n >= 2: {{alpha_s: seconds, busbw_fraction: (0, 1]}}, "
                                f"got {t!r}")
            gpus.append(n)
            alphas.append(float(alpha))
            fracs.append(float(frac))
        nodes.append(NodeTerms(name=str(name), hardware=tuple(str(h) for h in node.get("hardware") or ()),
                               link_gbps=float(node.get("link_gbps", 0.0)), gpus=tuple(gpus),
                               alpha_s=tuple(alphas), busbw_fraction=tuple(fracs)))
    default = raw.get("default")
    if default not in {n.name for n in nodes}:
        raise SpecError(f"{where}.default: must name a node of all_reduce, got {default!r}")
    return Collectives(nodes=tuple(nodes), default=str(default), source=str(raw.get("source", "")))


@lru_cache(maxsize=4)
def load_collectives(path: str | None = None) -> Collectives:
    """The collectives terms (default: the packaged `models_spec/efficiency/collectives.yaml`)."""
    import yaml

    p = Path(path) if path else collectives_path()
    try:
        raw = yaml.load(p.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml: faster
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"{p}: cannot read the collectives file ({str(exc).splitlines()[0]})") from None
    return parse_collectives(raw, str(p))
