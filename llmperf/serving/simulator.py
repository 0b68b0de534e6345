"""The serving simulator: the engine's own scheduler (`llmperf.serving.scheduler`) driven by the
cost-model runner (`llmperf.serving.costmodel`) on a simulated clock.

Nothing here decides what runs when: the `Scheduler` does, exactly as it does in the real engine
(static / continuous batching, chunked prefill with a token budget and mixed steps, paged KV with
recompute preemption, prefix sharing). This module sizes the KV pool the way vLLM does (device
memory x `mem_util`, minus the weights and one forward pass's activations at the step's token
budget, in blocks of `block_size` tokens; with data-parallel attention the replica's pool is its
GPUs' pools together; sliding / chunked layers hold only their window's blocks, as vLLM's hybrid
KV-cache manager, unless `kv_window="full"`), feeds the workload's requests at their arrival times,
prices each step with `StepCostModel` (or replays given step durations: `step_times`), and turns the
finished requests and the step log into latency statistics:

- TTFT = first token - arrival; TPOT = (finish - first token) / (output tokens - 1) (undefined for
  one-token outputs); e2e = finish - arrival; queueing delay = first admission - arrival;
- p50 / p90 / p99 (linear interpolation, `numpy.percentile`), throughput over the makespan (first
  arrival to last finish), goodput = requests meeting every given SLO per second of makespan
  (DistServe, Zhong et al., OSDI 2024);
- per step: phase, batch, prefill and decode tokens, KV bytes used and reserved (per GPU) during
  the step, running / waiting requests and preemptions.

`find_max_rate` bisects the arrival rate for the highest one whose chosen percentile of TTFT and TPOT
meets the SLOs (Vidur's "capacity", Agrawal et al., MLSys 2024); each simulation reuses the same
lengths and random stream, only the arrival times scale.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from llmperf.analysis.memory import kv_bytes_per_token_per_gpu, weight_bytes_per_gpu
from llmperf.analysis.rollup import DEFAULT_MAX_BATCHED_TOKENS, Conventions, activation_reserve_bytes
from llmperf.analysis.routing import check_eplb, measured_routing
from llmperf.errors import SpecError
from llmperf.numeric import is_count, is_real
from llmperf.serving.blocks import (
    BlockManager,
    CappedBlockManager,
    HybridLayout,
    WindowedBlockManager,
    WindowGroup,
    capped_blocks_for,
    uniform_window,
    window_blocks_for,
)
from llmperf.serving.costmodel import StepCostModel, _scalar_features, scalar_state_features
from llmperf.serving.scheduler import RequestState, ScheduledItem, Scheduler, SchedulerConfig, StepOutcome, StepPlan
from llmperf.serving.speculative import SpeculativeConfig, SpeculativeCosts, draft_memory
from llmperf.serving.v4cache import V4BlockManager, V4Pages
from llmperf.serving.workload import Gamma, Poisson, Workload, WorkloadSpec, generate
from llmperf.specs import HardwareSpec, ModelSpec, Precision, load_hardware, load_model
from llmperf.specs.expert_load import ExpertLoad, as_expert_load

GiB = 2**30
EFFICIENCIES = ("auto", "roofline", "typical", "calibrated")


@dataclass(frozen=True, kw_only=True)
class SLO:
    """Service-level objectives: `percentile` of TTFT and of TPOT at most `ttft_s` / `tpot_s` seconds
    (None: no bound). Goodput counts requests whose own TTFT and TPOT meet them."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    percentile: float = 90.0

    def __post_init__(self) -> None:
        for name, v in (("slo_ttft", self.ttft_s), ("slo_tpot", self.tpot_s)):
            if v is not None and (not is_real(v) or v <= 0):
                raise SpecError(f"--{name.replace('_', '-')}: must be a number of seconds > 0, got {v!r}")
        if not is_real(self.percentile) or not 0 < self.percentile <= 100:
            raise SpecError(f"--slo-percentile: must be in (0, 100], got {self.percentile!r}")

    @property
    def any(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None


@dataclass(frozen=True, kw_only=True)
class ServingConfig:
    """One replica (a `tp`-way group of GPUs) serving one model, and its scheduler settings.

    The group's layout: plain tensor parallelism; `ep`: the experts expert-parallel over `ep` of
    the GPUs (dividing tp); `dp_attention`: attention data-parallel over the group (each GPU runs its
    own sequences' attention and holds their KV; a MoE model then needs ep == tp), how MLA models are
    served (SGLang's DP attention). `expert_load`: a measured router's load per expert (an `ExpertLoad`
    or its file; None: uniform routing); `eplb`: DeepSeek's EPLB with that many redundant experts per
    MoE layer (needs ep > 1; None: experts placed contiguously), their weights on every GPU
    (`llmperf.analysis.routing`). `mla_mode` picks MLA's computation (auto: prefill unabsorbed,
    decode absorbed). `kv_window`: sliding/chunked layers' KV, "capped" (each holds the blocks its
    window or chunk needs, vLLM's hybrid KV-cache manager: `WindowedBlockManager`) or "full" pages
    (every layer the whole context); `MemoryPlan` says which the pool does.

    Defaults follow vLLM's online serving: continuous batching, chunked prefill with a budget of
    `DEFAULT_MAX_BATCHED_TOKENS` (8192, as `estimate`) tokens per step, at most 256 sequences, 16-token blocks, 90% of
    device memory, prefix caching.
    `efficiency`: the time model ("auto": the expected time, `typical` on a GPU, the calibration a
    `--hardware local` spec carries on a CPU; `llmperf.analysis.timemodel.default_efficiency`), or pass
    `time_model` directly; `engine`: the GPU serving stack's profile pricing its host terms (None: the
    default, compiled; `models_spec/engines/`). `num_blocks` overrides the memory-derived pool size."""

    model: ModelSpec
    hardware: HardwareSpec
    precision: Precision
    tp: int = 1
    pp: int = 1
    attention: str = "fused"
    efficiency: str = "auto"
    time_model: object | None = None
    policy: str = "continuous"
    max_batch: int | None = 256
    max_batched_tokens: int | None = DEFAULT_MAX_BATCHED_TOKENS
    chunked_prefill: bool = True
    prefix_sharing: bool = True
    block_size: int = 16
    mem_util: float = 0.9
    num_blocks: int | None = None
    watermark: float = 0.01
    ep: int = 1
    dp_attention: bool = False
    expert_load: ExpertLoad | None = None
    eplb: int | None = None
    mla_mode: str = "auto"
    kv_window: str = "capped"
    engine: str | None = None
    speculative: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        from llmperf.analysis.operators import MLA_MODES, ShardDims
        from llmperf.analysis.rollup import KV_WINDOW_MODES
        if self.mla_mode not in MLA_MODES:
            raise SpecError(f"--mla-mode: must be one of {', '.join(MLA_MODES)}, got {self.mla_mode!r}")
        if self.kv_window not in KV_WINDOW_MODES:
            raise SpecError(f"--kv-window: must be one of {', '.join(KV_WINDOW_MODES)}, got {self.kv_window!r}")
        if not is_count(self.ep) or self.ep < 1:
            raise SpecError(f"--ep: must be a positive integer, got {self.ep!r}")
        if not isinstance(self.dp_attention, bool):
            raise SpecError(f"--dp-attention: must be true or false, got {self.dp_attention!r}")
        if self.model.is_v4_attention and self.pp != 1:
            raise SpecError(f"pp: DeepSeek-V4 is simulated on one pipeline stage (its pages are a whole model's), "
                            f"got {self.pp}")
        ShardDims.of(self.model, self.tp, self.ep, self.dp_attention)  # names tp, ep or dp_attention
        object.__setattr__(self, "expert_load", as_expert_load(self.expert_load))  # a path is read once
        check_eplb(self.model, self.ep, self.eplb)  # names eplb
        measured_routing(self.model, self.ep, self.expert_load, self.eplb)  # names expert_load
        if self.efficiency not in EFFICIENCIES:
            raise SpecError(f"--efficiency: must be one of {', '.join(EFFICIENCIES)}, got {self.efficiency!r}")
        if self.engine is not None:
            from llmperf.analysis.timemodel import load_engine
            load_engine(self.engine)
        for name in ("block_size",):
            v = getattr(self, name)
            if not is_count(v) or v < 1:
                raise SpecError(f"--block-size: must be a positive integer, got {v!r}")
        if self.num_blocks is not None and (not is_count(self.num_blocks)
                                            or self.num_blocks < 1):
            raise SpecError(f"--num-blocks: must be a positive integer, got {self.num_blocks!r}")
        if not is_real(self.mem_util) or not 0 < self.mem_util <= 1:
            raise SpecError(f"--mem-util: must be in (0, 1], got {self.mem_util!r}")
        try:
            self.scheduler_config()
        except ValueError as exc:
            raise SpecError(f"--{str(exc).replace('_', '-')}") from None
        if self.speculative is not None:
            self._check_speculative()

    def _check_speculative(self) -> None:
        """The draft resolved against the model (SpecError naming `draft`), and the layouts speculation is
        modelled on: one pipeline stage, a pool without capped sliding-window groups."""
        if not isinstance(self.speculative, SpeculativeConfig):
            raise SpecError(f"speculative: must be a SpeculativeConfig or None, got {type(self.speculative).__name__}")
        if self.model.is_v4_attention:
            raise SpecError(f"speculative: speculative decoding is not simulated for DeepSeek-V4 ({self.model.name}: "
                            "its pages are not shared with a draft's)")
        draft, _ = self.speculative.resolve(self.model)
        from llmperf.analysis.operators import ShardDims
        dtp = self.speculative.tp_of_draft(self.model, self.tp, self.dp_attention)  # SpecError naming draft_tp
        try:
            if dtp == self.tp:
                ShardDims.of(draft, self.tp, self.ep if draft.is_moe else 1, self.dp_attention)
            else:
                ShardDims.of(draft, dtp, 1, False)
        except SpecError as exc:
            raise SpecError(f"draft: {draft.name} runs at tp={dtp}: {exc}") from None
        if self.pp != 1:
            raise SpecError(f"pp: speculative decoding is simulated on one pipeline stage (pp 1), got {self.pp}")
        k = self.speculative.num_draft_tokens
        v = self.speculative.verify_tokens(k)
        if self.max_batched_tokens is not None and self.max_batched_tokens < v:
            raise SpecError(f"--max-batched-tokens: a speculative cycle puts {v} tokens through the target "
                            f"(k = {k} draft steps' tokens and the last token), more than the budget, got "
                            f"{self.max_batched_tokens}")
        if window_groups(self.model, self.kv_window, self.pp):
            raise SpecError(f"--kv-window: speculative decoding is not simulated with a capped sliding-window pool "
                            f"({self.model.name} has sliding/chunked layers); pass --kv-window full, got "
                            f"{self.kv_window!r}")

    @classmethod
    def build(cls, model: str | ModelSpec, hardware: str | HardwareSpec, *, precision: Precision | str | None = None,
              weights: str | None = None, activations: str | None = None, kv: str | None = None,
              **kw: object) -> ServingConfig:
        """From names or specs, with a precision preset (default: the model's dtype) and overrides."""
        from llmperf.analysis.generation import resolve_precision
        m, hw = load_model(model), load_hardware(hardware)
        prec = resolve_precision(m, precision, weights=weights, activations=activations, kv=kv)
        return cls(model=m, hardware=hw, precision=prec, **kw)

    def scheduler_config(self) -> SchedulerConfig:
        """The scheduler's settings (policy, limits, chunked prefill, prefix sharing, watermark) from this
        config."""
        return SchedulerConfig(policy=self.policy, max_batch=self.max_batch,
                               max_batched_tokens=self.max_batched_tokens, chunked_prefill=self.chunked_prefill,
                               prefix_sharing=self.prefix_sharing, watermark=self.watermark,
                               speculative=self.speculative)

    def conventions(self, workload: Workload | None = None) -> Conventions:
        """The analytical model's conventions (as `estimate`'s defaults: fused QKV and gate/up GEMMs,
        logits for the last position), with this replica's token budget for the activation reserve
        (without a budget: the longest prompt of the workload, as one forward holds it whole)."""
        tokens = self.max_batched_tokens or (int(workload.prompt_tokens.max()) if workload is not None and len(workload)
                                             else 8192)
        return Conventions(attention=self.attention, block_size=self.block_size, mem_util=self.mem_util,
                           max_batched_tokens=tokens, kv_window=self.kv_window, mla_mode=self.mla_mode, ep=self.ep,
                           dp_attention=self.dp_attention, expert_load=self.expert_load, eplb=self.eplb)

    @property
    def layout(self) -> str:
        """The group's layout in words: tp, tp+ep or dp+ep (`planner.LAYOUTS`)."""
        if self.dp_attention:
            return "dp+ep" if self.ep > 1 else "dp"
        return "tp+ep" if self.ep > 1 else "tp"

    @property
    def kv_shards(self) -> int:
        """GPUs whose KV pools the replica's sequences spread over: with data-parallel attention each
        GPU holds its own sequences' KV (MLA's latent is not replicated), so the replica's pool is tp
        times one GPU's (balanced sequences assumed); else every GPU holds every sequence's share."""
        return self.tp if self.dp_attention else 1

    def resolve_time_model(self, model: ModelSpec | None = None) -> object | None:
        """The time model object (None: the pure roofline) for this config's model, or for `model` (a
        draft) on the same device, engine and efficiency."""
        from llmperf.analysis.roofline import model_time_model
        model = self.model if model is None else model
        if self.time_model is not None:
            return model_time_model(self.time_model, model)
        from llmperf.analysis.timemodel import default_efficiency, time_model_for
        eff = default_efficiency(self.hardware) if self.efficiency == "auto" else self.efficiency
        if eff == "roofline":
            return None
        dtype = self.hardware.compute_dtype(self.precision.activations)
        return model_time_model(time_model_for(self.hardware, eff, dtype, engine=self.engine), model)

    def settings(self) -> dict[str, object]:
        """The config as plain values (model, device, precision, parallelism, server settings, time model),
        for run.json."""
        from llmperf.analysis.roofline import engine_label
        from llmperf.specs.precision import gemm_mode, precision_note
        tm = self.resolve_time_model()
        return dict(model=self.model.name, hardware=self.hardware.name, precision=self.precision.label(),
                    gemm=gemm_mode(self.precision, self.hardware),
                    precision_note=precision_note(self.precision, self.hardware),
                    weights=self.precision.weights,
                    activations=self.precision.activations, kv=self.precision.kv, tp=self.tp, pp=self.pp,
                    layout=self.layout, ep=self.ep, dp_attention=self.dp_attention,
                    expert_load=None if self.expert_load is None else self.expert_load.source, eplb=self.eplb,
                    mla_mode=self.mla_mode,
                    kv_window=self.kv_window,
                    kv_sliding_full_pages=hybrid_kv(self.model) and not (
                        window_groups(self.model, self.kv_window, self.pp)
                        or capped_window(self.model, self.kv_window, self.pp, self.speculative is not None)),
                    attention=self.attention, time_model=getattr(tm, "name", "roofline"),
                    engine=engine_label(tm), policy=self.policy,
                    max_batch=self.max_batch, max_batched_tokens=self.max_batched_tokens,
                    chunked_prefill=self.chunked_prefill, prefix_sharing=self.prefix_sharing,
                    block_size=self.block_size, mem_util=self.mem_util, num_blocks=self.num_blocks,
                    watermark=self.watermark) | self._speculative_settings()

    def _speculative_settings(self) -> dict[str, object]:
        """The speculation settings (none without speculation: the settings stay as they were)."""
        return {} if self.speculative is None else self.speculative.settings(self.model, self.tp)


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """Per-GPU memory of a replica: weights, the activation reserve, and the KV pool it leaves.

    `num_blocks`: the replica's blocks, `kv_shards` GPUs' pools together (tp with data-parallel
    attention, else 1); a block lives on one GPU. `kv_bytes_per_token`: what a block holds per token:
    every layer, or with `window_groups` (kv_window "capped" on a model with sliding / chunked layers)
    the full-attention layers only, each window group holding its own blocks besides, a block of
    its own taking `ceil(its layers / full layers)` pool blocks (`WindowedBlockManager`, the rule the
    engine's paged cache pages by); with `capped_window` (kv_window "capped" on a model whose every
    layer is windowed alike: Mistral 7B v0.1, StreamingLLM) a block holds every layer and a sequence
    only the blocks its window needs (`CappedBlockManager`). `kv_sliding_full_pages`: the model has
    such layers and they get full pages (kv_window "full", or a layout the capped pools do not cover:
    pipeline stages beside full layers, windows of several kinds without a full layer, a draft).
    `state_bytes`: one sequence's Gated DeltaNet state on a GPU (linear layers: no KV, a constant state
    per sequence), held as `state_blocks` = ceil(state_bytes / block_bytes) pool blocks from admission
    to its end or preemption (vLLM's hybrid manager pages the state in the attention pages' size)."""

    usable_bytes: float
    weights_bytes: float
    activation_bytes: float
    kv_bytes_per_token: float
    block_size: int
    num_blocks: int
    kv_shards: int = 1
    kv_sliding_full_pages: bool = False
    window_groups: tuple[WindowGroup, ...] = ()
    capped_window: tuple[str, int] | None = None  # every layer's (attention, window), paged capped
    max_step_tokens: int | None = None  # the step budget (bounds a window group's blocks)
    draft_weights_bytes: float = 0.0  # speculative decoding: the draft's share of weights_bytes
    draft_kv_bytes_per_token: float = 0.0  # and of kv_bytes_per_token (a block holds both models' KV)
    state_bytes: float = 0.0  # linear layers: one sequence's state on a GPU
    state_blocks: int = 0  # the pool blocks it takes
    v4_pages: V4Pages | None = None  # DeepSeek-V4: a block is a page of `V4Pages.page_bytes` (`V4BlockManager`)

    def blocks_for(self, num_tokens: int) -> int:
        """Pool blocks a sequence of up to `num_tokens` tokens holds at most (its state's included)."""
        if self.v4_pages is not None:
            return self.v4_pages.pages(num_tokens)
        if self.window_groups:
            return window_blocks_for(self.window_groups, self.block_size, num_tokens,
                                     self.max_step_tokens) + self.state_blocks
        if self.capped_window is not None:
            return capped_blocks_for(self.capped_window[1], self.block_size, num_tokens, self.max_step_tokens)
        return -(-num_tokens // self.block_size) + self.state_blocks

    def manager(self, max_seq_len: int | None = None) -> BlockManager:
        """The replica's block manager (`WindowedBlockManager` with window groups, `CappedBlockManager`
        with a capped window, `V4BlockManager` for DeepSeek-V4)."""
        if self.v4_pages is not None:
            return V4BlockManager(self.num_blocks, self.v4_pages, max_seq_len=max_seq_len)  # type: ignore[return-value]
        if self.window_groups:
            return WindowedBlockManager(self.num_blocks, self.block_size, groups=self.window_groups,
                                        max_seq_len=max_seq_len, max_step_tokens=self.max_step_tokens,
                                        state_blocks=self.state_blocks)
        if self.capped_window is not None:
            attention, window = self.capped_window
            return CappedBlockManager(self.num_blocks, self.block_size, attention=attention, window=window,
                                      max_seq_len=max_seq_len, max_step_tokens=self.max_step_tokens)
        return BlockManager(self.num_blocks, self.block_size, max_seq_len=max_seq_len, state_blocks=self.state_blocks)

    @property
    def block_bytes(self) -> float:
        return self.kv_bytes_per_token * self.block_size

    @property
    def blocks_per_gpu(self) -> int:
        return self.num_blocks // self.kv_shards

    @property
    def kv_pool_bytes(self) -> float:
        """One GPU's KV pool."""
        return self.blocks_per_gpu * self.block_bytes


def hybrid_kv(model: ModelSpec) -> bool:
    """Whether `model` has sliding or chunked layers (linear ones hold no KV: they do not count; DeepSeek-V4's
    window is paged by `V4BlockManager`, not as a hybrid model's)."""
    if model.is_v4_attention:
        return False
    return any(kind.attention not in ("full", "linear", "none") for kind, _ in model.layer_groups())


def window_groups(model: ModelSpec, kv_window: str = "capped", pp: int = 1, tp: int = 1) -> tuple[WindowGroup, ...]:
    """The window groups of a capped pool (`WindowedBlockManager`): none for a model without sliding
    or chunked layers, with kv_window "full", over pipeline stages, or without a full-attention layer
    (then every layer gets full pages, as `MemoryPlan.kv_sliding_full_pages` says). Gemma 4's layers store
    different widths a token (its full layers their own head dim and KV heads, on `tp` GPUs each kind's heads
    split apart) and its KV-shared layers none: its groups count the layers holding a cache, and a block of
    theirs takes the pool blocks its elements need (`WindowGroup.width`)."""
    m = model
    if not hybrid_kv(m) or kv_window != "capped" or pp != 1:
        return ()
    if m.has_global_attention or m.kv_shared_layers:
        kv = m.kv_cache(1.0).sharded(tp=tp)
        full = [g for g in kv.groups if g.attention == "full"]
        return () if not full else tuple(
            WindowGroup(attention=g.attention, window=g.window, layers=g.num_layers, full_layers=full[0].num_layers,
                        width=kv.layer_elements(g.attention), full_width=kv.layer_elements("full"))
            for g in kv.groups if g.attention != "full")
    layout = HybridLayout.of([(kind.attention, kind.window) for kind in m.layer_kinds()])
    return () if layout is None else layout.groups


def capped_window(model: ModelSpec, kv_window: str = "capped", pp: int = 1,
                  speculative: bool = False) -> tuple[str, int] | None:
    """The (attention, window) of a capped pool of one table (`CappedBlockManager`, the engine's paged
    cache's rule): a model whose every layer is sliding, or every one chunked, with one window, under
    kv_window "capped". None otherwise, and with a draft (`speculative`: its KV shares the blocks and
    may need the whole context). Pipeline stages page alike: every stage's layers are of that kind."""
    if kv_window != "capped" or speculative or model.is_v4_attention:  # DeepSeek-V4: `V4BlockManager`
        return None
    del pp  # every stage holds layers of the one kind
    return uniform_window([(kind.attention, kind.window) for kind in model.layer_kinds()])


def plan_memory(config: ServingConfig, workload: Workload | None = None) -> MemoryPlan:
    """vLLM's sizing, per GPU: usable = memory x mem_util; minus weights; minus one forward pass's
    activations at the token budget (or the longest prompt without one); the rest in KV blocks
    (`num_blocks` overrides one GPU's count); the replica's pool is `kv_shards` GPUs' pools. Raises
    SpecError with the figures when nothing is left for the cache."""
    m, prec, hw = config.model, config.precision, config.hardware
    par = dict(ep=config.ep, dp_attention=config.dp_attention)
    weights = weight_bytes_per_gpu(m, prec, config.tp, config.pp, **par,
                                   redundant_experts=check_eplb(m, config.ep, config.eplb))
    # with data-parallel attention a GPU holds its own sequences' whole KV (kv_bytes_per_token_per_gpu)
    kv_tok = kv_bytes_per_token_per_gpu(m, prec, config.tp, config.pp, ep=config.ep, dp_attention=config.dp_attention)
    groups = window_groups(m, config.kv_window, config.pp, 1 if config.dp_attention else config.tp)
    capped = capped_window(m, config.kv_window, config.pp, config.speculative is not None)
    if groups and (m.has_global_attention or m.kv_shared_layers):  # Gemma 4: the full layers' own width
        kv_tok = groups[0].full_layers * groups[0].full_width * prec.kv_bytes
    elif groups:  # a block holds the full-attention layers' tokens; window groups take blocks besides
        kv_tok = kv_tok * groups[0].full_layers / sum(k.attention not in ("linear", "none") for k in m.layer_kinds())
    state = linear_state_bytes_per_gpu(config)
    v4 = None
    if m.is_v4_attention:  # DeepSeek-V4: pages of its groups, its partial windows and overlaps as state
        from llmperf.specs.kvcache import KVCacheSpec
        v4 = V4Pages.of(KVCacheSpec.from_model(m, prec), config.block_size)  # whole on a GPU (one K = V head)
        kv_tok, state = v4.page_bytes / config.block_size, v4.state_bytes
    act = activation_reserve_bytes(m, prec, config.conventions(workload), config.tp, **par)
    draft = {}
    if config.speculative is not None:  # the draft's weights and KV join the target's; one activation reserve
        dm = draft_memory(config, workload)
        weights, kv_tok, act = weights + dm.weights_bytes, kv_tok + dm.kv_bytes_per_token, max(act, dm.activation_bytes)
        draft = dict(draft_weights_bytes=dm.weights_bytes, draft_kv_bytes_per_token=dm.kv_bytes_per_token)
    usable = hw.memory_bytes * config.mem_util
    shards = config.kv_shards
    if state and not kv_tok:
        raise SpecError(f"model: {m.name} has no KV-holding layer (every layer linear); the simulator pages "
                        "the state in KV blocks")
    state_blocks = math.ceil(state / (kv_tok * config.block_size)) if state else 0
    if v4 is not None:
        state_blocks = v4.state_pages
    common = dict(usable_bytes=usable, weights_bytes=weights, activation_bytes=act, kv_bytes_per_token=kv_tok,
                  state_bytes=state, state_blocks=state_blocks, v4_pages=v4,
                  block_size=config.block_size, kv_shards=shards,
                  kv_sliding_full_pages=hybrid_kv(m) and not groups and capped is None, window_groups=groups,
                  capped_window=capped, max_step_tokens=config.max_batched_tokens, **draft)
    if config.num_blocks is not None:
        return MemoryPlan(num_blocks=config.num_blocks * shards, **common)
    free = usable - weights - act
    blocks = int(free // (kv_tok * config.block_size)) if free > 0 else 0
    if blocks < 1 and free > 0:  # memory is left, but less than one block of block_size tokens
        raise SpecError(f"--block-size: one block of {config.block_size} tokens needs "
                        f"{kv_tok * config.block_size / GiB:.3g} GiB of KV cache per GPU, more than the "
                        f"{free / GiB:.2f} GiB left after weights and activations on {hw.name}")
    if blocks < 1:
        with_draft = f" (the draft's {draft['draft_weights_bytes'] / GiB:.2f} GiB with them)" if draft else ""
        raise SpecError(f"memory: {m.name} at {prec} ({_layout_words(config)}) needs {weights / GiB:.2f} GiB of "
                        f"weights{with_draft} + {act / GiB:.2f} GiB of activations per GPU, more than the "
                        f"{usable / GiB:.2f} GiB "
                        f"usable on {hw.name} ({hw.memory_gib:g} GiB x mem_util {config.mem_util:g}); no room for a "
                        "KV cache")
    return MemoryPlan(num_blocks=blocks * shards, **common)


def linear_state_bytes_per_gpu(config: ServingConfig) -> float:
    """One sequence's Gated DeltaNet state on one GPU (0 without linear layers): every linear layer's
    (`KVCacheSpec.state_bytes`), its heads split by tp (not with data-parallel attention: a GPU holds
    its own sequences' whole state), the pipeline stage holding the most."""
    m = config.model
    if not m.has_linear_layers:
        return 0.0
    from llmperf.analysis.rollup import stage_layer_ranges
    from llmperf.specs.kvcache import KVCacheSpec
    kv = KVCacheSpec.from_model(m, config.precision).sharded(tp=1 if config.dp_attention else config.tp)
    return max(kv.layers(r.start, r.stop).state_bytes for r in stage_layer_ranges(m, config.pp))


def _layout_words(config: ServingConfig) -> str:
    words = f"tp={config.tp}"
    if config.ep > 1:
        words += f", ep={config.ep}"
    if config.dp_attention:
        words += ", data-parallel attention"
    if config.eplb is not None:
        words += f", EPLB with {config.eplb} redundant experts"
    return words


class SyntheticPrompt(Sequence):
    """Token ids of a simulated prompt, made up on demand (prefix sharing compares block contents):
    the first `shared` positions are the system prompt (`0, 1, 2, ...`, the same for every request),
    the rest are private to request `rid` (negative ids, equal within a request, never across)."""

    __slots__ = ("rid", "shared", "length")

    def __init__(self, rid: int, shared: int, length: int) -> None:
        self.rid, self.shared, self.length = rid, shared, length

    def __len__(self) -> int:
        return self.length

    def _tok(self, i: int) -> int:
        return i if i < self.shared else -1 - self.rid

    def __getitem__(self, index):  # noqa: ANN001, ANN204
        if isinstance(index, slice):
            start, stop, step = index.indices(self.length)
            if step != 1:
                return tuple(self._tok(i) for i in range(start, stop, step))
            # a block's tokens, asked for every block of every prefix lookup: the shared ids, then
            # the request's own id repeated, without a call a token
            cut = min(max(start, self.shared), max(stop, start))
            return (*range(start, cut), *((-1 - self.rid,) * max(0, stop - cut)))
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError(index)
        return self._tok(index)


class CostModelRunner:
    """The scheduler's `Runner` for the simulator: prices each step with a `StepCostModel` (or takes
    its duration from `step_times[step]`), ends each request after its `output_tokens`, and records
    the step's token counts and KV occupancy (per GPU) while it runs."""

    def __init__(self, cost: StepCostModel | None, kv: BlockManager, output_tokens: Sequence[int],
                 kv_bytes_per_token: float, step_times: Sequence[float] | None = None, *,
                 speculative: SpeculativeConfig | None = None, speculative_costs: SpeculativeCosts | None = None
                 ) -> None:
        if cost is None and step_times is None:
            raise ValueError("runner: needs a cost model or step_times")
        if speculative is not None and speculative_costs is None and step_times is None:
            raise ValueError("runner: speculative decoding needs speculative_costs (or step_times)")
        self.cost, self.kv, self.out = cost, kv, output_tokens
        self.kv_tok, self.step_times = kv_bytes_per_token, step_times
        self.records: list[tuple[int, int, int, float, float]] = []  # batch, prefill, decode, used, reserved
        self.speculative, self.spec_costs = speculative, speculative_costs
        self.draws = speculative.draws() if speculative is not None else None
        # speculative cycles run and the tokens they emitted; of them, the cycles with all k drafts
        self.cycles = self.cycle_tokens = self.full_cycles = self.full_cycle_tokens = 0

    def execute(self, plan: StepPlan) -> StepOutcome:
        """Price one scheduled step with the analytical model: its duration, and the sequences that
        finished."""
        if self.draws is not None:
            return self._execute_speculative(plan)
        if self.cost is not None and self.cost.v4:
            return self._execute_v4(plan)
        if self.cost is not None and not self.cost.simple:
            return self._execute_groups(plan)
        decodes = prefill = batch = logits = 0
        f_kv = f_qkv = f_tri = 0.0
        finished: list[int] = []
        out = self.out
        # The common case, one decode token of one sequence, adds its keys to both f_kv and f_qkv: summed
        # apart as an int (cheaper than a float add an item) and added once. The same sums: every
        # term is an integer, and every sum far below 2**53, so no float addition here rounds.
        dec_kv = 0
        for item in plan.items:
            n, q = len(item.seq_ids), item.num_tokens
            kv = item.start + q
            if item.decode and n == 1:
                decodes += 1
                dec_kv += kv
            else:
                if item.decode:
                    decodes += q * n
                else:
                    prefill += q * n
                f_kv += kv * n
                f_qkv += q * kv * n
                f_tri += q * (q - 1) / 2 * n
            batch += n
            if item.samples:
                logits += n
                if item.num_generated + 1 >= out[item.request_id]:
                    finished.extend(item.seq_ids)
        f_kv += dec_kv
        f_qkv += dec_kv
        tokens = decodes + prefill
        # full attention: keys read = kv, attended pairs = q kv - q (q - 1) / 2
        return self._outcome(plan, tokens, ((tokens, f_kv, f_qkv - f_tri, f_qkv),), logits, batch, prefill, decodes,
                             finished)

    def _execute_v4(self, plan: StepPlan) -> StepOutcome:
        """`execute` for DeepSeek-V4: the step's sequences by (new tokens, context after the step), how many of each
        (`StepCostModel.v4_features`)."""
        F: dict[tuple[float, float], float] = {}
        decodes = prefill = batch = logits = 0
        finished: list[int] = []
        out = self.out
        for item in plan.items:
            n, q = len(item.seq_ids), item.num_tokens
            key = (float(q), float(item.start + q))
            F[key] = F.get(key, 0.0) + n
            if item.decode:
                decodes += q * n
            else:
                prefill += q * n
            batch += n
            if item.samples:
                logits += n
                if item.num_generated + 1 >= out[item.request_id]:
                    finished.extend(item.seq_ids)
        return self._outcome(plan, decodes + prefill, F, logits, batch, prefill, decodes, finished)

    def _execute_groups(self, plan: StepPlan) -> StepOutcome:
        """`execute` for models whose sequences' features differ per layer span (sliding, chunked)
        or per MLA form (decode absorbed, prefill unabsorbed): one feature row per group."""
        cost = self.cost
        spans = cost.spans
        F = [[0.0, 0.0, 0.0, 0.0] for _ in cost.groups]
        # Gated DeltaNet layers: their two rows of summed `state_features` after the groups'
        state = F0 = F1 = None
        if cost.state_parts:
            F0, F1 = [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]
            F += [F0, F1]
            state = True
        decodes = prefill = batch = logits = 0
        finished: list[int] = []
        out = self.out
        # one decode token: the rows of its form (the absorbed one for MLA under auto: group 0 on)
        decode_rows = [(F[si], window, chunk) for si, (window, chunk) in enumerate(spans)]
        for item in plan.items:
            n, q = len(item.seq_ids), item.num_tokens
            kv = item.start + q
            if q == 1 and n == 1:  # the common case: keys read = attended pairs = the keys it sees
                decodes += item.decode
                prefill += not item.decode
                for row, window, chunk in decode_rows:
                    k = (kv if window is None or kv < window else window) if chunk is None else (kv - 1) % chunk + 1
                    row[0] += 1
                    row[1] += k
                    row[2] += k
                    row[3] += k
                if state:  # one sequence, one token (recurrent), continuing unless it is a one-token prompt
                    F0[0] += 1
                    F0[1] += 1
                    F0[2] += 1
                    F0[3] += kv > 1
            else:
                if item.decode:
                    decodes += q * n
                else:
                    prefill += q * n
                for si, (window, chunk) in enumerate(spans):
                    k, pairs = _scalar_features(q, kv, window, chunk)
                    row = F[cost.group_of(q, si)]
                    row[0] += q * n
                    row[1] += k * n
                    row[2] += pairs * n
                    row[3] += q * k * n
                if state:
                    dec, cont, qc, blocks = scalar_state_features(q, kv, cost.state_chunk)
                    F0[0] += n
                    F0[1] += q * n
                    F0[2] += dec * n
                    F0[3] += cont * n
                    F1[0] += qc * n
                    F1[1] += blocks * n
            batch += n
            if item.samples:
                logits += n
                if item.num_generated + 1 >= out[item.request_id]:
                    finished.extend(item.seq_ids)
        return self._outcome(plan, decodes + prefill, F, logits, batch, prefill, decodes, finished)

    def _execute_speculative(self, plan: StepPlan) -> StepOutcome:
        """`execute` with speculative decoding: each decode item is a cycle (the last token and its
        draft tokens through the target); the tokens it emits are drawn here (`AcceptanceDraws`), and
        the step is priced by `SpeculativeCosts` (the draft's steps, the target's verify, the fixed
        cost once)."""
        q_all: list[int] = []
        kv_all: list[int] = []
        chunk_q: list[int] = []
        chunk_kv: list[int] = []
        cycles: list[ScheduledItem] = []
        decodes = prefill = batch = logits = chunk_rows = 0
        finished: list[int] = []
        out = self.out
        for item in plan.items:
            n, q = len(item.seq_ids), item.num_tokens
            kv = item.start + q
            q_all += [q] * n
            kv_all += [kv] * n
            batch += n
            if item.decode:
                decodes += q * n
                cycles.append(item)
                continue
            prefill += q * n
            chunk_q += [q] * n
            chunk_kv += [kv] * n
            if item.samples:
                logits += n
                chunk_rows += n
                if item.num_generated + 1 >= out[item.request_id]:
                    finished.extend(item.seq_ids)
        spec = self.speculative
        k = spec.num_draft_tokens
        # each cycle's draft steps, as the scheduler cut them (`Scheduler._schedule_cycle`), and the most it accepts
        drafts = [min(k, out[item.request_id] - item.num_generated - 1) for item in cycles]
        emitted: dict[int, int] = {}
        for item, d, e in zip(cycles, drafts, self.draws.draw([spec.accept_depth(d) for d in drafts])):
            emitted[item.request_id] = e
            logits += len(item.seq_ids) * item.num_tokens  # a verify's logits at every position it checks
            if item.num_generated + e >= out[item.request_id]:
                finished.extend(item.seq_ids)
            self.cycles += 1
            self.cycle_tokens += e
            if d == k:
                self.full_cycles += 1
                self.full_cycle_tokens += e
        if self.step_times is not None:
            return self._outcome(plan, 0, None, 0, batch, prefill, decodes, finished, emitted)
        sc, cost = self.spec_costs, self.cost
        tokens = decodes + prefill
        feats = cost.features(q_all, kv_all)
        if cycles:  # the target's forward over the verifies and chunks, its fixed cost once
            duration = sc.verify_s(tokens, feats, logits) + (sc.prefill_fixed_s() if prefill else sc.decode_fixed_s())
        else:
            duration = cost.step_time_from_features(tokens, feats, logits)
        draft = sc.draft
        queries = [spec.draft_queries(d) for d in drafts]
        for i in range(max(max(drafts, default=0), 1 if chunk_q else 0)):
            # draft step i: one token (a tree's later steps: topk candidates) for each cycle with more than
            # i draft steps, at context start + 1 + i; the first also over the step's prefill chunks (the
            # draft's prefill of the prompt)
            dq = [q[i] for q, d in zip(queries, drafts) if d > i]
            dkv = [item.start + i + q[i] for item, q, d in zip(cycles, queries, drafts) if d > i]
            rows = sum(dq)
            if i == 0 and chunk_q:
                dq, dkv, rows = chunk_q + dq, chunk_kv + dkv, rows + chunk_rows
            duration += sc.draft_s(sum(dq), draft.features(dq, dkv), rows, prefill=i == 0 and bool(chunk_q),
                                   first=i == 0)
        return self._outcome(plan, tokens, None, logits, batch, prefill, decodes, finished, emitted, duration)

    def _outcome(self, plan: StepPlan, tokens: int, features, logits: int, batch: int, prefill: int,  # noqa: ANN001
                 decodes: int, finished: list[int], emitted: dict[int, int] | None = None,
                 duration: float | None = None) -> StepOutcome:
        if self.step_times is not None:
            if plan.step >= len(self.step_times):
                raise ValueError(f"step_times: the schedule ran past the {len(self.step_times)} given step times")
            duration = float(self.step_times[plan.step])
        elif duration is None:
            duration = self.cost.step_time_from_features(tokens, features, logits)
        used, reserved = self.kv.slot_counts()
        self.records.append((batch, prefill, decodes, used * self.kv_tok, reserved * self.kv_tok))
        return StepOutcome(duration_s=duration, finished=frozenset(finished), emitted=emitted)

    def speculation(self) -> dict[str, float] | None:
        """The cycles run, the mean tokens per cycle (all, and of the cycles with all k drafts: a cycle
        near a request's end drafts fewer) and E(a, k); None without speculation."""
        if self.speculative is None:
            return None
        mean = self.cycle_tokens / self.cycles if self.cycles else float("nan")
        full = self.full_cycle_tokens / self.full_cycles if self.full_cycles else float("nan")
        return dict(speculative_cycles=self.cycles, tokens_per_cycle=mean, tokens_per_full_cycle=full,
                    expected_tokens_per_cycle=self.speculative.expected_tokens_per_cycle)


def _stats(x: np.ndarray) -> dict[str, float]:
    x = x[~np.isnan(x)]
    if not x.size:
        return dict(p50=float("nan"), p90=float("nan"), p99=float("nan"), mean=float("nan"))
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return dict(p50=float(p50), p90=float(p90), p99=float(p99), mean=float(x.mean()))


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """A simulated run: per-request and per-step tables, the summary, the scheduler's step log."""

    settings: dict[str, object]
    requests: pd.DataFrame
    steps: pd.DataFrame
    memory: MemoryPlan
    slo: SLO
    log: list = field(default_factory=list, repr=False)  # the scheduler's StepLog records
    speculation: dict[str, float] | None = None  # speculative decoding: cycles and tokens per cycle

    @property
    def makespan_s(self) -> float:
        r = self.requests
        return float(r["finish_s"].max() - r["arrival_s"].min()) if len(r) else 0.0

    def meets(self) -> np.ndarray:
        """Per request: TTFT and TPOT within the SLOs (a one-token output has no TPOT to miss)."""
        r = self.requests
        ok = np.ones(len(r), dtype=bool)
        if self.slo.ttft_s is not None:
            ok &= r["ttft_s"].to_numpy() <= self.slo.ttft_s
        if self.slo.tpot_s is not None:
            tpot = r["tpot_s"].to_numpy()
            ok &= np.isnan(tpot) | (tpot <= self.slo.tpot_s)
        return ok

    def percentile(self, column: str, q: float | None = None) -> float:
        """The `q`-th percentile (default: the SLO's) of a request column, missing values ignored (NaN when
        none)."""
        x = self.requests[column].to_numpy(dtype=float)
        x = x[~np.isnan(x)]
        return float(np.percentile(x, self.slo.percentile if q is None else q)) if x.size else float("nan")

    @property
    def meets_slo(self) -> bool:
        """The SLO percentile of TTFT and of TPOT within their bounds."""
        ok = True
        if self.slo.ttft_s is not None:
            ok &= self.percentile("ttft_s") <= self.slo.ttft_s
        if self.slo.tpot_s is not None:
            t = self.percentile("tpot_s")
            ok &= math.isnan(t) or t <= self.slo.tpot_s
        return bool(ok)

    def summary(self) -> dict[str, object]:
        """Latency statistics (p50, p90, p99, mean of TTFT, TPOT, end-to-end and queueing), throughput,
        goodput and counts."""
        r, span = self.requests, self.makespan_s
        n = len(r)
        return dict(
            ttft_s=_stats(r["ttft_s"].to_numpy(dtype=float)), tpot_s=_stats(r["tpot_s"].to_numpy(dtype=float)),
            e2e_s=_stats(r["e2e_s"].to_numpy(dtype=float)), queue_s=_stats(r["queue_s"].to_numpy(dtype=float)),
            throughput_rps=n / span if span > 0 else 0.0,
            tokens_per_s=float(r["output_tokens"].sum()) / span if span > 0 else 0.0,
            goodput_rps=float(self.meets().sum()) / span if span > 0 else 0.0,
            preemptions=int(r["preemptions"].sum()), requests=n, makespan_s=span,
            meets_slo=self.meets_slo if self.slo.any else None,
            mean_batch=float(np.average(self.steps["batch"], weights=self.steps["duration_s"]))
            if len(self.steps) and self.steps["duration_s"].sum() > 0 else 0.0,
            mean_kv_util=float(self.steps["kv_util"].mean()) if len(self.steps) else 0.0,
            peak_kv_used_bytes=float(self.steps["kv_used_bytes"].max()) if len(self.steps) else 0.0,
            kv_pool_bytes=self.memory.kv_pool_bytes, num_blocks=self.memory.num_blocks,
        ) | (self.speculation or {})


def _states(workload: Workload, prefix_sharing: bool) -> list[RequestState]:
    share = _share_prefix(workload, prefix_sharing)
    arr, pr, out, sh = (workload.arrival_s.tolist(), workload.prompt_tokens.tolist(),
                        workload.output_tokens.tolist(), workload.shared_prefix_tokens.tolist())
    return [RequestState(request_id=i, prompt_len=pr[i], max_new_tokens=out[i], arrival_s=arr[i],
                         prompt=SyntheticPrompt(i, sh[i], pr[i]) if share else None)
            for i in range(len(workload))]


def check_fits(config: ServingConfig, memory: MemoryPlan, workload: Workload) -> None:
    """Refuse (SpecError, with the figures) a workload one of whose requests cannot fit alone."""
    if not len(workload):
        raise SpecError("workload: no requests")
    total = workload.prompt_tokens + workload.output_tokens
    i = int(np.argmax(total))
    if total[i] > config.model.max_positions:
        raise SpecError(f"workload: request {i} needs {int(workload.prompt_tokens[i])} prompt + "
                        f"{int(workload.output_tokens[i])} output tokens, more than {config.model.name}'s "
                        f"{config.model.max_positions} positions")
    blocks = memory.blocks_for(int(total[i]))
    if blocks > memory.blocks_per_gpu:  # a sequence's KV lives on one GPU
        raise SpecError(
            f"workload: request {i} ({int(workload.prompt_tokens[i])} prompt + {int(workload.output_tokens[i])} output "
            f"tokens) needs {blocks * memory.block_bytes / GiB:.3f} GiB of KV cache per GPU, more than the "
            f"{memory.kv_pool_bytes / GiB:.3f} GiB pool ({memory.blocks_per_gpu} blocks of {memory.block_size} tokens) "
            + ("that --num-blocks gives" if config.num_blocks is not None else
               f"left on {config.hardware.name} after {memory.weights_bytes / GiB:.2f} GiB of weights and "
               f"{memory.activation_bytes / GiB:.2f} GiB of activations"))
    budget = config.max_batched_tokens
    if budget is not None and not config.chunked_prefill and int(workload.prompt_tokens.max()) > budget:
        j = int(np.argmax(workload.prompt_tokens))
        raise SpecError(f"--max-batched-tokens: request {j}'s {int(workload.prompt_tokens[j])}-token prompt exceeds "
                        f"the per-step budget of {budget} without chunked prefill")


def simulate(workload: Workload, config: ServingConfig, *, slo: SLO | None = None,
             step_times: Sequence[float] | None = None, cost: StepCostModel | None = None) -> SimResult:
    """Serve `workload` on one replica with the shared scheduler on a simulated clock. `step_times`
    replays given step durations instead of pricing them; `cost` reuses a step cost model (its
    caches) across runs of the same configuration."""
    return _simulate(workload, config, slo=slo, step_times=step_times, cost=cost)[0]


@dataclass(kw_only=True, eq=False)
class Checkpoint:
    """A run of a workload's requests, paused where a longer workload whose first requests they are
    would first differ (at the next request's arrival, or at the end): copies of the scheduler, its
    runner and the requests, which `simulate_extending` resumes once (then `state` is None)."""

    config: ServingConfig
    cost: StepCostModel
    workload: Workload  # the paused run's requests
    memory: MemoryPlan
    share: bool  # the requests carried prompts for prefix sharing
    pause_at: float  # the later arrival the run was paused at
    state: tuple | None  # (scheduler, runner, states, pending)


def simulate_extending(workload: Workload, config: ServingConfig, *, slo: SLO | None, cost: StepCostModel,
                       previous: Checkpoint | None = None, pause_at: float | None = None
                       ) -> tuple[SimResult, Checkpoint | None]:
    """`simulate(workload, config, slo=slo, cost=cost)`, the same result to the bit, but resumed from
    `previous` (a run of `workload`'s first requests paused at the arrival of the next one) when
    it applies (else run from the start): the steps before that arrival are not simulated twice.
    `pause_at`: the arrival of the request after `workload`'s in a longer workload of the same
    first requests; the run's `Checkpoint` there is returned (None without it). The planner's
    stopping rule doubles a load's requests: each run goes on from the one before."""
    return _simulate(workload, config, slo=slo, step_times=None, cost=cost, previous=previous, pause_at=pause_at)


def _share_prefix(workload: Workload, prefix_sharing: bool) -> bool:
    """Whether the requests carry prompts for prefix sharing (a shared system prompt)."""
    return prefix_sharing and bool(len(workload)) and int(workload.shared_prefix_tokens.max()) > 0


def _checkpoint(config: ServingConfig, cost: StepCostModel, workload: Workload, memory: MemoryPlan,
                sched: Scheduler, runner: CostModelRunner, states: list[RequestState], pending: object,
                pause_at: float) -> Checkpoint:
    """Copies of a paused run's state, by a pickle round trip (exact, and far quicker than
    `copy.deepcopy` over the block pool's lists). The cost model is shared (its caches only memoise);
    the step log and the step records are never changed again, so the copies share them; the
    sequence-id counter is copied by its next value (counters stop pickling in Python 3.14)."""
    import pickle
    nxt = next(sched._ids)
    log, records = sched.log, runner.records
    sched.log = runner.records = runner.cost = sched._ids = None  # type: ignore[assignment]
    try:
        state = pickle.loads(pickle.dumps((sched, runner, states, pending), protocol=pickle.HIGHEST_PROTOCOL))
    finally:
        sched.log, runner.records, runner.cost = log, records, cost
        sched._ids = itertools.count(nxt)  # the value taken above, then on as before
    state[0].log, state[1].records, state[1].cost = list(log), list(records), cost
    state[0]._ids = itertools.count(nxt)
    return Checkpoint(config=config, cost=cost, workload=workload, memory=memory,
                      share=_share_prefix(workload, config.prefix_sharing), pause_at=pause_at, state=state)


def _resumable(previous: Checkpoint, workload: Workload, config: ServingConfig, cost: StepCostModel | None,
               memory: MemoryPlan, step_times: object) -> bool:
    """Whether `workload`'s run is `previous`'s continued: the same configuration and cost model, no
    speculation (its draws) or replayed steps, `previous`'s requests first and then later ones, in
    arrival order, paused at the first new arrival, and the same KV pool."""
    old, n = previous.workload, len(previous.workload)
    if (previous.state is None or previous.config is not config or previous.cost is not cost
            or step_times is not None or config.speculative is not None or len(workload) <= n):
        return False
    a = workload.arrival_s
    return (float(a[n]) == previous.pause_at and bool(np.all(a[1:] >= a[:-1]))
            and all(np.array_equal(getattr(workload, f)[:n], getattr(old, f))
                    for f in ("arrival_s", "prompt_tokens", "output_tokens", "shared_prefix_tokens"))
            and previous.memory == memory and previous.share == _share_prefix(workload, config.prefix_sharing))


def _simulate(workload: Workload, config: ServingConfig, *, slo: SLO | None, step_times: Sequence[float] | None,
              cost: StepCostModel | None, previous: Checkpoint | None = None, pause_at: float | None = None
              ) -> tuple[SimResult, Checkpoint | None]:
    """`simulate`, resumed from `previous` where `_resumable` says so, paused at `pause_at` for a
    `Checkpoint`."""
    slo = slo or SLO()
    memory = plan_memory(config, workload)
    check_fits(config, memory, workload)
    if cost is None and step_times is None:
        cost = step_cost_model(config)
    resume = previous is not None and _resumable(previous, workload, config, cost, memory, step_times)
    if resume:
        sched, runner, old, pending = previous.state
        previous.state = None  # its copies are this run's now
        runner.out = workload.output_tokens.tolist()
        new = _states(workload, config.prefix_sharing)[len(old):]
        states = old + new
    else:
        kv = memory.manager(max_seq_len=config.model.max_positions)
        # KV occupancy per GPU: with data-parallel attention the replica's sequences spread over its GPUs
        runner = CostModelRunner(cost, kv, workload.output_tokens.tolist(),
                                 memory.kv_bytes_per_token / memory.kv_shards, step_times,
                                 speculative=config.speculative,
                                 speculative_costs=speculative_costs(config, cost) if cost is not None else None)
        sched = Scheduler(kv, runner, config.scheduler_config())
        states = new = _states(workload, config.prefix_sharing)
        pending = None
    checkpoint = None
    # only what `_resumable` can resume is paused (a speculative runner's draft costs are not copied)
    pause_at = pause_at if config.speculative is None and step_times is None else None
    # The run allocates millions of small objects (step items, kept in the log) and no reference
    # cycles: the cyclic garbage collector's scans over them only cost time. It is off during the run;
    # after it, what the run allocated joins the oldest generation unscanned (freeze + unfreeze move
    # lists), where the next young collection would have scanned all of it (1.6-1.9 s over the 8
    # simulations of the README's plan example). Not when the caller has frozen objects: unfreeze
    # would thaw them too.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in new:  # as `Scheduler.run`: every request checked before any is queued
            sched.check(r)
        if pending is None:
            pending = deque(sorted(states, key=lambda r: r.arrival_s))
        else:  # the paused run's requests not yet queued, then the new ones (all later, in arrival order)
            pending.extend(new)
        if pause_at is not None and not sched.serve(pending, until=pause_at):
            checkpoint = _checkpoint(config, cost, workload, memory, sched, runner, states, pending, pause_at)
        sched.serve(pending)
        if pause_at is not None and checkpoint is None and not sched.has_unfinished:
            checkpoint = _checkpoint(config, cost, workload, memory, sched, runner, states, pending, pause_at)
    except (ValueError, RuntimeError) as exc:
        raise SpecError(f"workload: {exc}") from None
    finally:
        if gc_was_enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
    stuck = next((s for s in states if s.finish_s is None), None)
    assert stuck is None, f"the scheduler stopped with request {stuck.request_id} unfinished"
    result = _result(config, slo, memory, workload, states, sched.log, runner.records, runner.speculation())
    return result, checkpoint


def speculative_costs(config: ServingConfig, cost: StepCostModel) -> SpeculativeCosts | None:
    """`config`'s `SpeculativeCosts` over the target's `cost` (None without speculation), kept on `cost` so
    that the runs of one configuration (a rate search) share the draft's cost model."""
    if config.speculative is None:
        return None
    key = (config.speculative.draft, config.efficiency, config.engine, id(config.time_model))
    hit = getattr(cost, "_speculative_costs", None)
    if hit is None or hit[0] != key:
        hit = (key, SpeculativeCosts(cost, config))
        cost._speculative_costs = hit
    return hit[1]


def kv_note(model: ModelSpec, kv_window: str = "capped", pp: int = 1, speculative: bool = False) -> str:
    """The line every output prints for a model with sliding / chunked layers: how its pool holds
    their KV ("" for a model without them); a model with Gated DeltaNet layers says how their state is
    held."""
    state = ""
    if model.is_v4_attention:
        return ("KV: DeepSeek-V4's window and compressed entries (one every rate tokens) paged apart in pages of "
                "one size; its partial windows and overlaps a constant state per sequence (no prefix sharing)")
    if model.has_linear_layers:
        n = sum(k.attention == "linear" for k in model.layer_kinds())
        state = (f"KV: {n} {model.linear_mixer_name} layers hold no KV but a constant state per sequence, in pool "
                 "blocks from admission to its end (no prefix sharing)")
    if not hybrid_kv(model):
        return state
    return "\n".join(x for x in (_window_note(model, kv_window, pp, speculative), state) if x)


def _window_note(model: ModelSpec, kv_window: str, pp: int, speculative: bool) -> str:
    """`kv_note`'s line on sliding / chunked layers."""
    if window_groups(model, kv_window, pp):
        return "KV: sliding/chunked layers hold their window's blocks (vLLM's hybrid KV-cache manager)"
    capped = capped_window(model, kv_window, pp, speculative)
    if capped is not None:
        return f"KV: every layer {capped[0]} ({capped[1]} tokens); a sequence holds its window's blocks"
    if kv_window == "full":
        why = ""
    elif speculative and capped_window(model, kv_window, pp):
        why = " (the draft's KV shares the blocks)"
    else:
        why = " (the capped pool needs one stage and a full-attention layer, or one window for every layer)"
    return "KV: sliding layers given full pages" + why


def step_cost_model(config: ServingConfig) -> StepCostModel:
    """The `StepCostModel` that prices `config`'s steps."""
    return StepCostModel(model=config.model, hardware=config.hardware, precision=config.precision, tp=config.tp,
                         pp=config.pp, attention=config.attention, time_model=config.resolve_time_model(),
                         conventions=config.conventions())


def _result(config: ServingConfig, slo: SLO, memory: MemoryPlan, workload: Workload, states: list[RequestState],
            log: list, records: list, speculation: dict[str, float] | None = None) -> SimResult:
    arrival = workload.arrival_s
    first = np.array([s.first_token_s for s in states], dtype=float)
    finish = np.array([s.finish_s for s in states], dtype=float)
    sched = np.array([s.scheduled_s for s in states], dtype=float)
    out = workload.output_tokens
    gen = np.array([s.num_generated for s in states])
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(gen > 1, (finish - first) / np.maximum(gen - 1, 1), np.nan)
    requests = pd.DataFrame(dict(
        request_id=np.arange(len(states)), arrival_s=arrival, prompt_tokens=workload.prompt_tokens,
        output_tokens=out, first_token_s=first, finish_s=finish, ttft_s=first - arrival, tpot_s=tpot,
        e2e_s=finish - arrival, queue_s=sched - arrival, preemptions=[s.preemptions for s in states]))
    rec = np.array(records, dtype=float).reshape(-1, 5)
    used, reserved = rec[:, 3], rec[:, 4]
    with np.errstate(invalid="ignore", divide="ignore"):
        util = np.where(reserved > 0, used / np.where(reserved > 0, reserved, 1), 1.0)
    steps = pd.DataFrame(dict(
        step=[g.step for g in log], start_s=[g.start_s for g in log], duration_s=[g.duration_s for g in log],
        phase=[str(g.phase) for g in log], batch=rec[:, 0].astype(int), prefill_tokens=rec[:, 1].astype(int),
        decode_tokens=rec[:, 2].astype(int), kv_used_bytes=used, kv_reserved_bytes=reserved, kv_util=util,
        running=[g.num_running for g in log], waiting=[g.num_waiting for g in log],
        preemptions=[len(g.preempted) for g in log]))
    settings = config.settings() | dict(num_blocks=memory.num_blocks, kv_pool_bytes=memory.kv_pool_bytes,
                                        kv_shards=memory.kv_shards,
                                        kv_note=kv_note(config.model, config.kv_window, config.pp,
                                                        config.speculative is not None),
                                        weights_bytes=memory.weights_bytes, slo_ttft_s=slo.ttft_s,
                                        slo_tpot_s=slo.tpot_s, slo_percentile=slo.percentile)
    settings |= {f"workload_{k}": v for k, v in workload.description.items()}
    if memory.state_blocks:  # Gated DeltaNet layers: one sequence's state per GPU, and its pool blocks
        settings |= dict(state_bytes=memory.state_bytes, state_blocks=memory.state_blocks)
    if memory.draft_weights_bytes or memory.draft_kv_bytes_per_token:
        settings |= dict(draft_weights_bytes=memory.draft_weights_bytes,
                         draft_kv_bytes_per_token=memory.draft_kv_bytes_per_token)
    return SimResult(settings=settings, requests=requests, steps=steps, memory=memory, slo=slo, log=log,
                     speculation=speculation)


# ---------------------------------------------------------------------------------------------------
# Rate search


@dataclass(frozen=True, kw_only=True)
class RatePoint:
    """One simulated arrival rate of a rate search, and its result."""

    rate: float
    result: SimResult

    def row(self) -> dict[str, object]:
        """The point as a `rates.csv` row: rate, TTFT and TPOT percentiles, goodput, throughput, whether the
        SLOs are met."""
        s = self.result.summary()
        return dict(rate=self.rate, ttft_p50=s["ttft_s"]["p50"], ttft_p90=s["ttft_s"]["p90"],
                    ttft_p99=s["ttft_s"]["p99"], tpot_p50=s["tpot_s"]["p50"], tpot_p90=s["tpot_s"]["p90"],
                    tpot_p99=s["tpot_s"]["p99"], goodput_rps=s["goodput_rps"], throughput_rps=s["throughput_rps"],
                    meets_slo=self.result.meets_slo)


@dataclass(frozen=True, kw_only=True)
class RateSearch:
    """The points a bisection visited, and the highest rate that met the SLOs (None: none did).

    `service_rate_rps`: the replica's service rate (`saturated_rate`), above which no rate is
    sustainable; `capped`: the SLOs held all the way up to it, so `max_rate` is that rate, not an SLO
    crossing. `note`: why the search stopped where it did, in words."""

    points: list[RatePoint]
    max_rate: float | None
    best: SimResult | None
    service_rate_rps: float = math.inf
    capped: bool = False
    note: str = ""

    def to_frame(self) -> pd.DataFrame:
        """Every simulated rate as a `rates.csv` row, by rate."""
        return pd.DataFrame([p.row() for p in sorted(self.points, key=lambda p: p.rate)])


def _held_tokens(config: ServingConfig, context: float) -> float:
    """Token slots a decoding sequence of `context` tokens holds at least: its context, or in a capped
    pool of one window (`capped_window`) at most the window (an optimistic count, as its callers want)."""
    capped = capped_window(config.model, config.kv_window, config.pp, config.speculative is not None)
    return context if capped is None else min(context, capped[1])


def _fit_at(config: ServingConfig, num_blocks: int, context: float, state_blocks: int) -> int:
    """Sequences at `context` tokens that `num_blocks` hold (`_fit`; DeepSeek-V4: its pages at that context)."""
    if config.model.is_v4_attention:
        return num_blocks // plan_memory(config).blocks_for(max(1, math.ceil(context)))
    return _fit(num_blocks, config.block_size, max(_held_tokens(config, context), 1), state_blocks)


def _fit(num_blocks: int, block_size: int, held: float, state_blocks: int) -> int:
    """Sequences of `held` token slots (and `state_blocks` blocks of state each) that `num_blocks` hold."""
    if not state_blocks:
        return int(num_blocks * block_size / held)
    return int(num_blocks / (held / block_size + state_blocks))


def service_rate_bound(config: ServingConfig, spec: WorkloadSpec, num_blocks: int,
                       cost: StepCostModel | None = None) -> float:
    """An optimistic requests/s of one replica (an upper bound on its service rate): every request's
    decode tokens at the largest batch that fits at the mean context, plus its prompt's prefill at
    the token budget's efficiency. Offered more than this, the queue grows without bound, whatever a
    finite run's percentiles say."""
    cost = cost or step_cost_model(config)
    p_mean, o_mean = spec.prompt_len.mean + spec.system_prompt_len, spec.output_len.mean
    ctx = p_mean + o_mean / 2
    state = plan_memory(config).state_blocks if config.model.has_linear_layers else 0
    fit = max(1, _fit_at(config, num_blocks, ctx, state))
    b = max(1, min(config.max_batch or fit, fit))
    if config.speculative is None:
        step = cost.step_time_s(np.ones(b), np.full(b, ctx), b)
    else:  # a cycle, every draft accepted: the fewest seconds a token (a bound, whatever the acceptance)
        k = config.speculative.num_draft_tokens
        step = speculative_costs(config, cost).cycle_s(b, ctx, k) / (config.speculative.accept_depth(k) + 1)
    chunk = int(min(config.max_batched_tokens or p_mean, max(p_mean, 1)))
    prefill_per_token = cost.step_time_s([chunk], [chunk], 1) / chunk
    per_request = o_mean * step / b + p_mean * prefill_per_token
    return 1.0 / per_request if per_request > 0 else math.inf


def saturated_rate(spec: WorkloadSpec, config: ServingConfig, cost: StepCostModel | None = None) -> float:
    """The replica's service rate for this workload's lengths, simulated: an offline backlog of at
    least three full batches (`max_batch`, else what the pool holds at the mean length) served until
    its queue empties; departures per second between the first and the last request that finished
    while some still waited. Offered more than this, the queue grows without bound."""
    n = max(spec.num_requests or 0, 64)
    p_mean, o_mean = spec.prompt_len.mean + spec.system_prompt_len, spec.output_len.mean
    memory = plan_memory(config)
    fit = max(1, _fit_at(config, memory.num_blocks, p_mean + o_mean, memory.state_blocks))
    n = min(max(n, 3 * min(config.max_batch or fit, fit)), 4096)
    work = generate(dataclasses.replace(spec, arrival="offline", num_requests=n, duration_s=None))
    res = simulate(work, config, cost=cost)
    st = res.steps
    backlog = st[st["waiting"] > 0]
    if len(backlog):
        end = float(backlog["start_s"].iloc[-1] + backlog["duration_s"].iloc[-1])
        done = np.sort(res.requests["finish_s"].to_numpy())
        done = done[done <= end]
        # Departures per second between the first and the last finish while the queue was full
        # (from t=0 the first batch has not finished yet: counting that ramp would understate).
        if len(done) >= 8 and done[-1] > done[0]:
            return (len(done) - 1) / float(done[-1] - done[0])
    return res.summary()["throughput_rps"]


def with_rate(spec: WorkloadSpec, rate: float) -> WorkloadSpec:
    """The same workload at another arrival rate (Poisson stays Poisson, gamma keeps its CV)."""
    arrival = spec.arrival
    new = Gamma(rate, arrival.cv) if isinstance(arrival, Gamma) else Poisson(rate)
    return dataclasses.replace(spec, arrival=new)


def _overlapped(res: SimResult) -> bool:
    """Whether two requests were ever in the system together (else a lower rate changes nothing)."""
    st = res.steps
    if not len(st):
        return False
    return int((st["running"] + st["waiting"]).max()) > 1 or int(st["batch"].max()) > 1


def _missed(res: SimResult) -> str:
    slo, parts = res.slo, []
    if slo.ttft_s is not None and res.percentile("ttft_s") > slo.ttft_s:
        parts.append(f"TTFT p{slo.percentile:g} {res.percentile('ttft_s'):.4g} s > {slo.ttft_s:g} s")
    if slo.tpot_s is not None and res.percentile("tpot_s") > slo.tpot_s:
        parts.append(f"TPOT p{slo.percentile:g} {res.percentile('tpot_s'):.4g} s > {slo.tpot_s:g} s")
    return " and ".join(parts)


def find_max_rate(spec: WorkloadSpec, config: ServingConfig, slo: SLO, *, rel_tol: float = 0.02,
                  max_iter: int = 30, on_point: Callable[[RatePoint], None] | None = None) -> RateSearch:
    """Bisection on the arrival rate: the highest rate whose SLO percentile of TTFT and TPOT meets the
    SLOs, within `rel_tol`. The workload keeps its lengths and seed; only arrivals change.

    The search never goes above the replica's service rate (`saturated_rate`, at most
    `service_rate_bound`): a finite run offered more than the replica can serve still drains its
    queue and may meet loose SLOs, but the load is not sustainable. It stops
    going down once no two requests overlap: then the SLOs are missed by a request alone."""
    if not slo.any:
        raise SpecError("--find-max-rate: needs --slo-ttft and/or --slo-tpot")
    cost = step_cost_model(config)
    points: list[RatePoint] = []

    def run(rate: float) -> RatePoint:
        res = simulate(generate(with_rate(spec, rate)), config, slo=slo, cost=cost)
        p = RatePoint(rate=rate, result=res)
        points.append(p)
        if on_point is not None:
            on_point(p)
        return p

    # Start from the rate one request at a time would allow, then bracket by doubling / halving.
    probe = generate(dataclasses.replace(with_rate(spec, 1.0), num_requests=1, duration_s=None))
    one = simulate(probe, config, slo=slo, cost=cost)
    mu = min(service_rate_bound(config, spec, one.memory.num_blocks, cost), saturated_rate(spec, config, cost))
    rate = min(1.0 / max(float(one.requests["e2e_s"].iloc[0]), 1e-9), mu)
    first = run(rate)
    lo = hi = None
    if first.result.meets_slo:
        lo = first
        for _ in range(max_iter):
            if lo.rate >= mu:
                return RateSearch(points=points, max_rate=lo.rate, best=lo.result, service_rate_rps=mu, capped=True,
                                  note=f"the SLOs hold up to the replica's service rate, {mu:.4g} req/s; "
                                       "no higher rate is sustainable")
            p = run(min(lo.rate * 2, mu))
            if not p.result.meets_slo:
                hi = p
                break
            lo = p
    else:
        hi = first
        for _ in range(max_iter):
            if not _overlapped(hi.result):
                return RateSearch(points=points, max_rate=None, best=None, service_rate_rps=mu,
                                  note=f"missed with no two requests overlapping ({_missed(hi.result)}): "
                                       "no rate meets the SLOs")
            p = run(hi.rate / 4)
            if p.result.meets_slo:
                lo = p
                break
            hi = p
    if lo is None:
        return RateSearch(points=points, max_rate=None, best=None, service_rate_rps=mu,
                          note=f"even {hi.rate:.4g} req/s misses ({_missed(hi.result)})")
    if hi is None:
        return RateSearch(points=points, max_rate=lo.rate, best=lo.result, service_rate_rps=mu,
                          note=f"the SLOs still hold after {max_iter} doublings")
    for _ in range(max_iter):
        if hi.rate - lo.rate <= rel_tol * lo.rate:
            break
        p = run(math.sqrt(lo.rate * hi.rate) if hi.rate > 4 * lo.rate else (lo.rate + hi.rate) / 2)
        if p.result.meets_slo:
            lo = p
        else:
            hi = p
    return RateSearch(points=points, max_rate=lo.rate, best=lo.result, service_rate_rps=mu,
                      note=f"{hi.rate:.4g} req/s misses ({_missed(hi.result)})")


__all__ = ["Checkpoint", "CostModelRunner", "EFFICIENCIES", "MemoryPlan", "RatePoint", "RateSearch", "SLO",
           "ServingConfig", "SimResult", "SyntheticPrompt", "capped_window", "check_fits", "find_max_rate", "hybrid_kv",
           "kv_note", "linear_state_bytes_per_gpu", "plan_memory", "saturated_rate", "service_rate_bound", "simulate",
           "simulate_extending", "step_cost_model", "window_groups", "with_rate"]
