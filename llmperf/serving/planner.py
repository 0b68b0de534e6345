"""Capacity planning: which devices, at which precision, tensor-parallel degree and layout, and how
many replicas (data parallel) serve a load within the SLOs, at what cost per million generated tokens
(`plan`, one `Candidate` per device x precision x TP x layout).

Layouts of a replica's `tp` GPUs (`LAYOUTS`): `tp` (plain tensor parallelism, Megatron-LM, Shoeybi et
al. 2019, arXiv:1909.08053), `tp+ep` (attention tensor-parallel, the experts expert-parallel over the
group), `dp+ep` (attention data-parallel, experts expert-parallel: SGLang's DP attention, how MLA
models are served). Every step is priced by the time model `efficiency` names (default `typical`).

For every candidate: the weights and one step's activations must leave room for a KV pool that holds
the longest request (else it loses on memory); a request alone must meet the SLOs (its prefill for
TTFT, a batch-1 decode step for TPOT) before anything is simulated; then the offered rate is split
evenly over `r` replicas, `r` starting at the service-rate bound (`simulator.service_rate_bound`) and
growing until the simulated SLO percentiles meet the SLOs, each load simulated under the stopping rule
of `llmperf.serving.stability`, never offering a replica its simulated service rate or more.

Cost per million generated tokens = replicas x TP x price per GPU-hour / (3600 x generated tokens/s)
x 1e6, at the offered load: the ranking. It is also split into USD per million input and output
tokens by the share of step time prefill and decode take (`llmperf.serving.costsplit`). `--users N`
is N users each sending a request every `user_interval_s` seconds: a Poisson rate N / user_interval_s.
The search step by step: docs/serving.md, "plan".
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from llmperf.analysis.operators import ShardDims
from llmperf.analysis.routing import check_eplb, check_eplb_count, measured_routing
from llmperf.errors import SpecError
from llmperf.numeric import is_real
from llmperf.serving.costsplit import input_time_share, token_prices
from llmperf.serving.prices import price_for
from llmperf.serving.simulator import (
    SLO,
    ServingConfig,
    check_fits,
    kv_note,
    plan_memory,
    saturated_rate,
    service_rate_bound,
    simulate,
    simulate_extending,
    speculative_costs,
    step_cost_model,
)
from llmperf.serving.stability import Stability, Stopping, assess
from llmperf.serving.workload import Poisson, Workload, WorkloadSpec, generate
from llmperf.specs import ModelSpec, Precision, load_hardware, load_model
from llmperf.specs.expert_load import ExpertLoad, as_expert_load
from llmperf.specs.precision import gemm_mode, precision_note

GiB = 2**30
#: the planner checks a replica's load against its simulated service rate above this share of the
#: optimistic service-rate bound (see `_evaluate`)
SATURATION_CHECK = 0.5
DEFAULT_PRECISIONS = ("bf16", "fp8", "int8", "int4")
DEFAULT_TPS = (1, 2, 4, 8)
#: a replica's layouts: label -> (experts expert-parallel over the group, data-parallel attention)
LAYOUTS = {"tp": (False, False), "tp+ep": (True, False), "dp+ep": (True, True)}
DEFAULT_EFFICIENCY = "typical"


def layouts_for(model: ModelSpec) -> tuple[str, ...]:
    """The layouts that apply to `model`: all of them for a mixture of experts, else `tp`."""
    return tuple(LAYOUTS) if model.is_moe else ("tp",)


def check_layouts(layouts: Sequence[str]) -> tuple[str, ...]:
    """`layouts` checked by name (SpecError naming --layouts and the bad value), duplicates dropped."""
    out: list[str] = []
    for name in layouts:
        if name not in LAYOUTS:
            raise SpecError(f"--layouts: unknown layout {name!r} (layouts: {', '.join(LAYOUTS)})")
        if name not in out:
            out.append(name)
    if not out:
        raise SpecError("--layouts: give at least one layout")
    return tuple(out)


def plan_precision(model: ModelSpec, name: str, kv: str | None = None) -> Precision:
    """A serving precision by its weight format: fp8 as deployed (`Precision.preset`: fp8 GEMMs,
    W8A8, with 16-bit activations between operators and all-reduces, and an fp8 KV cache; on a
    device without fp8 units W8A16), int8 / int4 weight-only (activations and KV at the model's
    16-bit dtype), bf16/fp16 all 16-bit. `kv` overrides the KV cache's format."""
    native = model.dtype if model.dtype in ("fp16", "bf16") else "bf16"
    if name == "fp8":
        p = Precision.preset("fp8", native)
        return Precision(weights=p.weights, activations=p.activations, kv=kv or p.kv)
    acts = name if name in ("fp16", "bf16", "fp32") else native
    return Precision(weights=name, activations=acts, kv=kv or acts)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One configuration `plan` evaluates: a device, a precision, a TP degree and a layout."""

    device: str
    precision: str
    tp: int
    layout: str = "tp"

    @property
    def ep(self) -> int:
        return self.tp if LAYOUTS[self.layout][0] else 1

    @property
    def dp_attention(self) -> bool:
        return LAYOUTS[self.layout][1]


@dataclass(frozen=True, kw_only=True)
class PlanRow:
    """One candidate's outcome. `feasible`: it meets the SLOs with `replicas` replicas; else
    `binding` names what it loses on (memory, TTFT, TPOT, tp, replicas) and `detail` gives figures."""

    device: str
    precision: str
    tp: int
    replicas: int | None
    gpus: int | None
    feasible: bool
    binding: str
    detail: str
    layout: str = "tp"
    ep: int = 1
    dp_attention: bool = False
    expert_load: str | None = None  # the measured router's load file (None: uniform routing)
    eplb: int | None = None  # EPLB's redundant experts per MoE layer (None: experts placed contiguously)
    time_model: str = ""  # the time model that priced its steps
    gemm: str = ""  # the linear layers' GEMMs on this device: W8A8, W8A16 (fp8 weight-only), W4A16, W16A16
    ttft_s: float | None = None  # at the SLO percentile, per replica load
    tpot_s: float | None = None
    usd_per_gpu_hour: float | None = None
    price_source: str = ""
    cost_per_hour: float | None = None
    cost_per_million_tokens: float | None = None  # all the GPU cost over the generated tokens (the ranking)
    cost_per_million_input_tokens: float | None = None  # the prefill share of the cost over the prompt tokens
    cost_per_million_output_tokens: float | None = None  # the decode share over the generated tokens
    prefill_time_share: float | None = None  # of the replica's step time (`llmperf.serving.costsplit`)
    replica_rate_rps: float | None = None
    simulations: int = 0
    requests_simulated: int | None = None  # the answer's own run (the stopping rule's last sample)
    ci_converged: bool | None = None  # its intervals are within the tolerance
    unstable: bool = False  # its queue kept growing (load above capacity)
    ttft_ci_low_s: float | None = None  # the confidence interval of the SLO percentile (batch sectioning)
    ttft_ci_high_s: float | None = None
    tpot_ci_low_s: float | None = None
    tpot_ci_high_s: float | None = None
    # the same replica load under the roofline (the optimistic bound), beside the expected answer
    ttft_bound_s: float | None = None
    tpot_bound_s: float | None = None

    def as_dict(self) -> dict[str, object]:
        """The row as plain values, in the columns of `plan -f csv`."""
        return dict(device=self.device, precision=self.precision, tp=self.tp, layout=self.layout, ep=self.ep,
                    dp_attention=self.dp_attention, expert_load=self.expert_load, eplb=self.eplb, gemm=self.gemm,
                    replicas=self.replicas, gpus=self.gpus,
                    feasible=self.feasible, binding=self.binding, detail=self.detail, ttft_s=self.ttft_s,
                    tpot_s=self.tpot_s, usd_per_gpu_hour=self.usd_per_gpu_hour, price_source=self.price_source,
                    cost_per_hour=self.cost_per_hour, cost_per_million_tokens=self.cost_per_million_tokens,
                    cost_per_million_input_tokens=self.cost_per_million_input_tokens,
                    cost_per_million_output_tokens=self.cost_per_million_output_tokens,
                    prefill_time_share=self.prefill_time_share,
                    replica_rate_rps=self.replica_rate_rps, simulations=self.simulations, time_model=self.time_model,
                    requests_simulated=self.requests_simulated, ci_converged=self.ci_converged,
                    unstable=self.unstable, ttft_ci_low_s=self.ttft_ci_low_s, ttft_ci_high_s=self.ttft_ci_high_s,
                    tpot_ci_low_s=self.tpot_ci_low_s, tpot_ci_high_s=self.tpot_ci_high_s,
                    ttft_bound_s=self.ttft_bound_s, tpot_bound_s=self.tpot_bound_s)


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    """Every candidate `plan` evaluated for a model, a rate and SLOs: those that meet them and those that
    lose, with why."""

    model: str
    rate_rps: float
    slo: SLO
    rows: list[PlanRow]
    settings: dict[str, object]

    @property
    def feasible(self) -> list[PlanRow]:
        """Configurations meeting the SLOs, cheapest per million tokens first (unknown prices last),
        then fewest GPUs."""
        ok = [r for r in self.rows if r.feasible]
        return sorted(ok, key=lambda r: (r.cost_per_million_tokens is None,
                                         r.cost_per_million_tokens if r.cost_per_million_tokens is not None else 0.0,
                                         r.gpus))

    @property
    def losers(self) -> list[PlanRow]:
        return [r for r in self.rows if not r.feasible]

    def to_frame(self) -> pd.DataFrame:
        """Feasible rows first (ranked), then the losers (rank empty)."""
        rows = self.feasible + self.losers
        frame = pd.DataFrame([r.as_dict() for r in rows])
        if "eplb" in frame:  # integers beside the None of the candidates without a balancer, not floats
            frame["eplb"] = pd.array(frame["eplb"].tolist(), dtype="Int64")
        frame.insert(0, "rank", pd.array([i + 1 if r.feasible else None for i, r in enumerate(rows)], dtype="Int64"))
        return frame

    def best_loser(self) -> PlanRow | None:
        """The losing candidate that came closest: an SLO miss before memory before tp; among SLO
        misses the smallest overshoot (worst of TTFT / SLO and TPOT / SLO), then the fewest GPUs."""
        if not self.losers:
            return None
        return min(self.losers, key=lambda r: _closeness(r, self.slo))


_BINDING_ORDER = {"replicas": 0, "TTFT": 1, "TPOT": 1, "memory": 2, "tp": 3, "layout": 3, "outranked": 4}


def _closeness(r: PlanRow, slo: SLO) -> tuple:
    over = 0.0
    for got, bound in ((r.ttft_s, slo.ttft_s), (r.tpot_s, slo.tpot_s)):
        if got is not None and bound is not None and math.isfinite(got):
            over = max(over, got / bound)
    return (_BINDING_ORDER.get(r.binding, 4), over, r.gpus or 0)


#: requests drawn for the workload's mean lengths (`mean_lengths`): within 0.6% of the mean of the
#: default lengths, where the 500 of a first simulation were 7% off
LENGTH_SAMPLE = 100_000


def mean_lengths(spec: WorkloadSpec) -> tuple[float, float]:
    """The workload's mean (prompt, output) tokens per request, from a fixed sample of its lengths
    (the same seed): what the offered load asks of every candidate, whatever sample its own
    simulations drew, so that costs per million tokens rank as costs per hour do."""
    w = generate(WorkloadSpec(arrival="offline", prompt_len=spec.prompt_len, output_len=spec.output_len,
                              num_requests=LENGTH_SAMPLE, system_prompt_len=spec.system_prompt_len, seed=spec.seed))
    return float(w.prompt_tokens.mean()), float(w.output_tokens.mean())


def _floors(config: ServingConfig, spec: WorkloadSpec, slo: SLO) -> tuple[float, float]:
    """(TTFT, TPOT) a request at the SLO percentile of the lengths gets alone on an idle replica."""
    cost = step_cost_model(config)
    probe = generate(WorkloadSpec(arrival="offline", prompt_len=spec.prompt_len, output_len=spec.output_len,
                                  num_requests=2000, system_prompt_len=spec.system_prompt_len, seed=spec.seed))
    P = int(np.percentile(probe.prompt_tokens, slo.percentile))
    budget = config.max_batched_tokens if config.chunked_prefill and config.max_batched_tokens else P
    ttft, done = 0.0, 0
    while done < P:
        n = min(budget, P - done)
        done += n
        ttft += cost.step_time_s([n], [done], 1 if done == P else 0)
    if config.speculative is None:
        tpot = cost.step_time_s([1], [P + 1], 1)
    else:  # a cycle with every draft accepted: no request alone decodes faster
        k = config.speculative.num_draft_tokens
        tpot = speculative_costs(config, cost).cycle_s(1, P + 1, k) / (config.speculative.accept_depth(k) + 1)
    return ttft, tpot


@dataclass(frozen=True, kw_only=True)
class _Prepared:
    """A candidate that passed every check before simulation: its replica's config and cost model,
    and the fewest replicas its optimistic service rate allows (`replicas`, a lower bound on its answer)."""

    config: ServingConfig
    eff: str
    common: dict
    cost: object  # the replica's StepCostModel (its caches serve every simulation)
    mu: float  # the optimistic service-rate bound of one replica, req/s
    replicas: int

    @property
    def gpus(self) -> int:
        return self.replicas * self.config.tp

    @property
    def cost_per_hour(self) -> float | None:
        price = self.common["usd_per_gpu_hour"]
        return None if price is None else price * self.gpus


def _prepare(cand: Candidate, model: ModelSpec, rate: float, spec: WorkloadSpec, slo: SLO, base: dict,
             gpu_cost: dict[str, float] | float | None, kv: str | None) -> PlanRow | _Prepared:
    """The checks before any simulation: the candidate's losing row (tp, layout, memory, a request
    alone missing the SLOs), or what its simulations need."""
    price, source = price_for(cand.device, gpu_cost)
    load, eplb = base.get("expert_load"), base.get("eplb") if cand.ep > 1 else None  # ep 1: no balancer
    common = dict(device=cand.device, precision=cand.precision, tp=cand.tp, layout=cand.layout, ep=cand.ep,
                  dp_attention=cand.dp_attention, expert_load=None if load is None else load.source, eplb=eplb,
                  usd_per_gpu_hour=price, price_source=source)
    try:
        hw = load_hardware(cand.device)
        ShardDims.of(model, cand.tp)  # a TP degree the heads and the FFN cannot be split over loses on tp
    except SpecError as exc:
        return PlanRow(replicas=None, gpus=None, feasible=False, binding="tp", detail=str(exc), **common)
    try:
        ShardDims.of(model, cand.tp, cand.ep, cand.dp_attention)  # the layout at this degree
        if model.is_v4_attention and cand.tp > 1 and not cand.dp_attention:  # as ForwardModel refuses it
            raise SpecError(f"tp: DeepSeek-V4's attention is not split by heads: tp={cand.tp} needs dp_attention")
        check_eplb(model, cand.ep, eplb)  # EPLB's experts and redundant ones over this layout's ep GPUs
    except SpecError as exc:
        return PlanRow(replicas=None, gpus=None, feasible=False, binding="layout",
                       detail=f"{cand.layout}: {exc}", **common)
    base = dict(base, eplb=eplb)
    eff = base.pop("efficiency", DEFAULT_EFFICIENCY)
    if eff == "typical" and (hw.vendor.lower() == "cpu" or "cpu" in (hw.variant or "").lower().split()):
        eff = "auto"  # typical's figures are GPU measurements: a CPU takes its calibration
    try:
        config = ServingConfig(model=model, hardware=hw, precision=plan_precision(model, cand.precision, kv),
                               tp=cand.tp, ep=cand.ep, dp_attention=cand.dp_attention, efficiency=eff, **base)
    except SpecError as exc:
        return PlanRow(replicas=None, gpus=None, feasible=False, binding="tp", detail=str(exc), **common)
    common["time_model"] = str(config.settings()["time_model"])
    common["gemm"] = gemm_mode(config.precision, hw)
    probe = generate(WorkloadSpec(arrival="offline", prompt_len=spec.prompt_len, output_len=spec.output_len,
                                  num_requests=200, system_prompt_len=spec.system_prompt_len, seed=spec.seed))
    try:
        memory = plan_memory(config, probe)
        check_fits(config, memory, probe)
    except SpecError as exc:
        return PlanRow(replicas=None, gpus=None, feasible=False, binding="memory",
                       detail=str(exc).removeprefix("memory: ").removeprefix("workload: "), **common)
    ttft_floor, tpot_floor = _floors(config, spec, slo)
    if slo.ttft_s is not None and ttft_floor > slo.ttft_s:
        return PlanRow(replicas=None, gpus=None, feasible=False, binding="TTFT", ttft_s=ttft_floor, tpot_s=tpot_floor,
                       detail=f"a p{slo.percentile:g}-length prompt alone takes {ttft_floor:.3g} s to its first token "
                              f"> SLO {slo.ttft_s:g} s", **common)
    if slo.tpot_s is not None and tpot_floor > slo.tpot_s:
        return PlanRow(replicas=None, gpus=None, feasible=False, binding="TPOT", ttft_s=ttft_floor, tpot_s=tpot_floor,
                       detail=f"one decode step alone takes {tpot_floor:.3g} s > SLO {slo.tpot_s:g} s", **common)
    cost = step_cost_model(config)
    mu = service_rate_bound(config, spec, memory.num_blocks, cost)
    # Fewer replicas than rate / (an upper bound on one replica's service rate) cannot keep up with
    # the load, even when a finite run drains its queue within loose SLOs: never go below it.
    replicas = max(1, math.ceil(rate / mu)) if math.isfinite(mu) else 1
    return _Prepared(config=config, eff=eff, common=common, cost=cost, mu=mu, replicas=replicas)


def _evaluate(cand: Candidate, model: ModelSpec, rate: float, spec: WorkloadSpec, slo: SLO, base: dict,
              max_replicas: int, gpu_cost: dict[str, float] | float | None, kv: str | None,
              stopping: Stopping, lengths: tuple[float, float]) -> PlanRow:
    """The candidate's row: a loser before simulation, or the fewest replicas that meet the SLOs
    (simulated under `stopping`). `lengths`: the workload's mean (prompt, output) tokens per request,
    which the cost per million tokens divides by (one figure for every candidate)."""
    prep = _prepare(cand, model, rate, spec, slo, base, gpu_cost, kv)
    if isinstance(prep, PlanRow):
        return prep
    return _search(prep, cand, rate, spec, slo, max_replicas, stopping, lengths)


def _search(prep: _Prepared, cand: Candidate, rate: float, spec: WorkloadSpec, slo: SLO, max_replicas: int,
            stopping: Stopping, lengths: tuple[float, float]) -> PlanRow:
    """The fewest replicas of a prepared candidate that meet the SLOs, from `prep.replicas` up."""
    config, eff, common, cost, mu = prep.config, prep.eff, prep.common, prep.cost, prep.mu
    price = common["usd_per_gpu_hour"]
    sims = 0
    cache: dict[int, _Measured] = {}
    paused: dict[int, tuple] = {}  # replica count -> (its last run's Checkpoint, the next run's workload)
    metrics = tuple(name for name, bound in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s)) if bound is not None)

    def workload(r: int, n: int) -> Workload:
        """`n` requests of `r` replicas' load (one replica's share of the rate)."""
        return generate(WorkloadSpec(arrival=Poisson(rate / r), prompt_len=spec.prompt_len,
                                     output_len=spec.output_len, num_requests=n,
                                     system_prompt_len=spec.system_prompt_len, seed=spec.seed))

    def run(r: int, final: bool = False) -> _Measured:
        """`r` replicas' load simulated: until the SLO percentiles' intervals are within the
        tolerance (`final`), or, while searching, until they also say on which side of the SLOs
        the load falls."""
        nonlocal sims
        hit = cache.get(r)
        if hit is not None and (hit.done or not final):
            return hit
        fixed = stopping.tolerance is None
        n = spec.num_requests if fixed else (min(2 * hit.stability.requests, stopping.max_requests) if hit is not None
                                            else max(stopping.min_requests, 1))
        while True:
            # A longer run of this load may follow (the stopping rule doubles it): this one pauses at
            # that run's first new arrival, and that run goes on from there (`simulate_extending`:
            # the same result as simulating it from the start).
            prev, w = paused.pop(r, (None, None))
            if w is None or len(w) != n:
                prev, w = None, workload(r, n)
            nxt = workload(r, min(2 * n, stopping.max_requests)) if not fixed and n < stopping.max_requests else None
            res, ckpt = simulate_extending(w, config, slo=slo, cost=cost, previous=prev,
                                           pause_at=None if nxt is None else float(nxt.arrival_s[n]))
            if nxt is not None and ckpt is not None:
                paused[r] = (ckpt, nxt)
            sims += 1
            st = assess(res.requests, slo.percentile, stopping, metrics, res.steps)
            done = fixed or st.converged or n >= stopping.max_requests
            got = cache[r] = _Measured(result=res, stability=st, slo=slo, done=done, judge_growth=not fixed)
            if done:  # no longer run of this load follows
                paused.pop(r, None)
            if done or (not final and not st.unstable and got.decided):
                return got
            n = min(2 * n, stopping.max_requests)

    r_min = r = prep.replicas
    if r > max_replicas:
        res = run(max_replicas)
        return _loser(common, max_replicas, cand.tp, res, slo, sims,
                      f"needs at least {r} replicas by its optimistic service rate {mu:.3g} req/s per replica")
    res = run(r)
    if res.meets_slo:
        while r > r_min and run(r - 1).meets_slo:
            r -= 1
    else:
        lo, hi = r, None
        step = 1
        while hi is None:
            nxt = min(lo + step, max_replicas)
            if run(nxt).meets_slo:
                hi = nxt
            elif nxt == max_replicas:
                return _loser(common, max_replicas, cand.tp, run(max_replicas), slo, sims,
                              f"misses the SLOs even with {max_replicas} replicas (--max-replicas)")
            else:
                lo, step = nxt, step * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if run(mid).meets_slo:
                hi = mid
            else:
                lo = mid
        r = hi
    # The answer's own run goes on to the tolerance; where its steadier percentiles miss after all,
    # the next replica count is tried.
    while not run(r, final=True).meets_slo:
        if r >= max_replicas:
            return _loser(common, r, cand.tp, run(r), slo, sims,
                          f"misses the SLOs even with {max_replicas} replicas (--max-replicas)")
        r += 1
    # A finite run can meet the SLOs at a load its replica cannot sustain (the queue is still
    # building when the arrivals stop): never offer a replica its simulated service rate or more.
    # Simulating that rate costs a backlog run, so it is done only when the load is above
    # SATURATION_CHECK of the optimistic bound `mu` (the simulated rate was 0.79-0.99 of it on
    # Llama-3.1-8B x A100 / H100 / L4 x bf16 / fp8 / int4).
    mu_sim = saturated_rate(spec, config, cost) if rate / r > SATURATION_CHECK * mu else math.inf
    while rate / r >= mu_sim and r < max_replicas:
        r += 1
    if rate / r >= mu_sim:
        return _loser(common, r, cand.tp, run(r), slo, sims,
                      f"{rate / r:.3g} req/s per replica reaches its simulated service rate {mu_sim:.3g} req/s "
                      f"even with {max_replicas} replicas (--max-replicas)")
    got = run(r, final=True)
    res = got.result
    bound = _bound(config, eff, rate / r, spec, slo, got, metrics)
    tokens_per_s = rate * lengths[1]
    cost_h = price * r * cand.tp if price is not None else None
    split = token_prices(cost_h, input_time_share(res.steps), rate * lengths[0], tokens_per_s)
    return PlanRow(replicas=r, gpus=r * cand.tp, feasible=True, binding="", detail="meets the SLOs",
                   ttft_s=got.ttft_s, tpot_s=got.tpot_s, cost_per_hour=cost_h,
                   cost_per_million_tokens=cost_h / 3600 / tokens_per_s * 1e6 if cost_h is not None else None,
                   replica_rate_rps=rate / r, simulations=sims, **split.as_dict(), **_ci_fields(got), **bound,
                   **common)


def _bound(config: ServingConfig, eff: str, replica_rate: float, spec: WorkloadSpec, slo: SLO, got: _Measured,
           metrics: tuple[str, ...]) -> dict[str, float | None]:
    """The answer's replica load (the same requests, as many as its own run) priced by the roofline:
    the optimistic bound shown beside the expected percentiles. Nothing when the answer is the roofline."""
    if eff == "roofline":
        return dict(ttft_bound_s=got.ttft_s, tpot_bound_s=got.tpot_s)
    roof = dataclasses.replace(config, efficiency="roofline", time_model=None, engine=None)
    w = generate(WorkloadSpec(arrival=Poisson(replica_rate), prompt_len=spec.prompt_len, output_len=spec.output_len,
                              num_requests=got.stability.requests, system_prompt_len=spec.system_prompt_len,
                              seed=spec.seed))
    res = simulate(w, roof, slo=slo, cost=step_cost_model(roof))
    st = assess(res.requests, slo.percentile, Stopping(tolerance=None), metrics, res.steps)
    b = _Measured(result=res, stability=st, slo=slo, done=True, judge_growth=False)
    return dict(ttft_bound_s=b.ttft_s, tpot_bound_s=b.tpot_s)


@dataclass(frozen=True, kw_only=True)
class _Measured:
    """One replica count's simulation and what the stopping rule says of it (`stability`)."""

    result: object  # SimResult
    stability: Stability
    slo: SLO
    done: bool  # the tolerance is met, or the sample is at its cap (or fixed)
    # a rising number in the replica counts as unstable under the stopping rule only: a fixed short
    # sample is all warm-up, and rises whatever the load (it is still reported, not converged)
    judge_growth: bool = True

    @property
    def ttft_s(self) -> float:
        return self.stability.ttft.estimate

    @property
    def tpot_s(self) -> float:
        return self.stability.tpot.estimate

    def _sides(self) -> list[tuple[float, float, float]]:
        st, slo = self.stability, self.slo
        return [(c.low, c.high, b) for c, b in ((st.ttft, slo.ttft_s), (st.tpot, slo.tpot_s))
                if b is not None and c.n]

    @property
    def meets_slo(self) -> bool:
        """The steady-state SLO percentiles within their bounds; never for a growing queue."""
        if self.stability.unstable and self.judge_growth:
            return False
        st, slo = self.stability, self.slo
        return all(not (c.estimate > b) for c, b in ((st.ttft, slo.ttft_s), (st.tpot, slo.tpot_s))
                   if b is not None and c.n)

    @property
    def decided(self) -> bool:
        """The intervals put the load on one side of the SLOs: one interval wholly above its bound,
        or every one wholly below."""
        sides = self._sides()
        return any(lo > b for lo, _, b in sides) or bool(sides) and all(hi <= b for _, hi, b in sides)


def _ci_fields(got: _Measured) -> dict[str, object]:
    st = got.stability
    return dict(requests_simulated=st.requests, ci_converged=st.converged, unstable=st.unstable,
                ttft_ci_low_s=st.ttft.low, ttft_ci_high_s=st.ttft.high, tpot_ci_low_s=st.tpot.low,
                tpot_ci_high_s=st.tpot.high)


def _loser(common: dict, replicas: int, tp: int, got: _Measured, slo: SLO, sims: int,  # noqa: ANN001
           why: str) -> PlanRow:
    ttft, tpot = got.ttft_s, got.tpot_s
    over = []
    if got.stability.unstable and got.judge_growth:
        over.append(("replicas", math.inf, f"the queue grows without bound over {got.stability.requests} "
                                           "requests (load above the replica's capacity)"))
    if slo.ttft_s is not None and ttft > slo.ttft_s:
        over.append(("TTFT", ttft / slo.ttft_s, f"p{slo.percentile:g} TTFT {ttft:.4g} s > {slo.ttft_s:g} s"))
    if slo.tpot_s is not None and tpot > slo.tpot_s:
        over.append(("TPOT", tpot / slo.tpot_s, f"p{slo.percentile:g} TPOT {tpot:.4g} s > {slo.tpot_s:g} s"))
    binding = max(over, key=lambda o: o[1])[0] if over else "replicas"
    detail = "; ".join(o[2] for o in over) + (f" at {replicas} replicas: " if over else "") + why
    return PlanRow(replicas=replicas, gpus=replicas * tp, feasible=False, binding=binding, detail=detail,
                   ttft_s=ttft, tpot_s=tpot, simulations=sims, **_ci_fields(got), **common)


def plan(model: str | ModelSpec, *, rate: float, slo: SLO, workload: WorkloadSpec, devices: Sequence[str],
         precisions: Sequence[str] = DEFAULT_PRECISIONS, tps: Sequence[int] = DEFAULT_TPS, max_replicas: int = 64,
         gpu_cost: dict[str, float] | float | None = None, kv: str | None = None, base: dict | None = None,
         on_candidate: Callable[[PlanRow], None] | None = None, jobs: int | None = None,
         layouts: Sequence[str] | None = None, efficiency: str = DEFAULT_EFFICIENCY,
         stopping: Stopping | None = None, top: int | None = None, expert_load: ExpertLoad | str | None = None,
         eplb: int | None = None) -> PlanResult:
    """Evaluate every device x precision x TP x layout candidate for `rate` requests/s under `slo`
    (in `jobs` processes; default one per CPU). `top`: simulate only until the `top` cheapest
    configurations that meet the SLOs are certain (`_run_candidates`; the others are rows that
    lose on "outranked", with the bound that ruled them out); None or 0: simulate every
    candidate. `stopping`: how many requests each simulation
    serves (`llmperf.serving.stability.Stopping`: doubling until the SLO percentiles' intervals are
    within its tolerance, as `llmperf plan` does); None: `workload.num_requests`, once (the
    intervals are still reported). `layouts`: None, every layout the model takes
    (`layouts_for`); `efficiency`: the time model pricing every step (`ServingConfig.efficiency`;
    `base` may set it too). `expert_load` (an `ExpertLoad` or its file) prices every candidate's
    experts at a measured router's load; `eplb` places them by EPLB with that many redundant experts
    on the expert-parallel candidates (ep > 1; one whose ep GPUs cannot hold the experts and the
    redundant ones evenly loses on layout), ep 1 candidates without a balancer (`base` may set both)."""
    if not (is_real(rate) and rate > 0):
        raise SpecError(f"--rate: must be a number of requests/s > 0, got {rate!r}")
    if not slo.any:
        raise SpecError("plan: give at least one SLO (--slo-ttft, --slo-tpot)")
    if workload.num_requests is None or workload.num_requests < 1:
        raise SpecError("plan: the workload needs a number of requests per simulation")
    check_top(top)
    m = load_model(model)
    for d in devices:
        load_hardware(d)  # unknown names fail before any work
    from llmperf.serving.simulator import EFFICIENCIES
    if efficiency not in EFFICIENCIES:
        raise SpecError(f"--efficiency: must be one of {', '.join(EFFICIENCIES)}, got {efficiency!r}")
    layouts = layouts_for(m) if layouts is None else check_layouts(layouts)
    base = dict(base or {})
    base.setdefault("efficiency", efficiency)
    load = as_expert_load(base.pop("expert_load", expert_load))
    eplb = base.pop("eplb", eplb)
    if load is not None:
        measured_routing(m, 1, load, None)  # the model's experts: SpecError naming expert_load
    speculative = base.get("speculative")
    spec_settings = {} if speculative is None else speculative.settings(m)  # a bad draft fails before any work
    for t in tps if speculative is not None else ():
        speculative.tp_of_draft(m, t)  # a draft_tp that does not divide a candidate's tp fails before any work
    cands = [Candidate(device=d, precision=p, tp=t, layout=lay) for d in devices for p in precisions for t in tps
             for lay in layouts if not _duplicate(lay, t, layouts)]
    _check_eplb(m, eplb, cands)
    base |= dict(expert_load=load, eplb=eplb)
    stopping = stopping or Stopping(tolerance=None)
    lengths = mean_lengths(workload)
    jobs = max(1, min(jobs if jobs is not None else (os.cpu_count() or 1), len(cands)))
    rows = _run_candidates(cands, (m, rate, workload, slo, base, max_replicas, gpu_cost, kv), stopping, lengths,
                           top, jobs, on_candidate)
    notes = _precision_notes(m, devices, precisions, kv)
    settings = dict(model=m.name, rate_rps=rate, precision_notes=notes, devices=list(devices),
                    precisions=list(precisions), tps=list(tps),
                    layouts=list(layouts), kv_note=kv_note(m, base.get("kv_window", "capped"), base.get("pp", 1),
                                                      speculative is not None),
                    max_replicas=max_replicas, slo_ttft_s=slo.ttft_s, slo_tpot_s=slo.tpot_s,
                    slo_percentile=slo.percentile, workload=workload.describe(),
                    stopping=_stopping_settings(stopping, workload), top=top or None,
                    mean_prompt_tokens=lengths[0], mean_output_tokens=lengths[1],
                    **{k: v for k, v in base.items() if k not in ("speculative", "expert_load")},
                    expert_load=None if load is None else load.source, **spec_settings)
    return PlanResult(model=m.name, rate_rps=rate, slo=slo, rows=list(rows), settings=settings)


def _check_eplb(model: ModelSpec, eplb: object, cands: Sequence[Candidate]) -> None:
    """Refuse an `eplb` that no candidate could take: not a count, a model without experts, or no
    expert-parallel candidate (each candidate's own layout is checked in `_prepare`)."""
    if eplb is None:
        return
    check_eplb_count(model, eplb)
    if not any(c.ep > 1 for c in cands):
        raise SpecError(f"eplb: {eplb} needs an expert-parallel candidate (layout tp+ep or dp+ep at tp > 1); "
                        "every candidate here holds every expert on each GPU")


def check_top(top: object) -> None:
    """Refuse a `--top` that is not 0 (every candidate) or a positive integer."""
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
        raise SpecError(f"--top: must be 0 (simulate every candidate) or a positive integer, got {top!r}")


def _rank_key(cost_per_hour: float | None, gpus: int) -> tuple:
    """The ranking's order (cheapest first, unknown prices last, then fewest GPUs): with one figure
    of tokens per second for every candidate, cost per million tokens ranks as cost per hour."""
    return (cost_per_hour is None, cost_per_hour or 0.0, gpus)


def _row_key(row: PlanRow) -> tuple:
    return _rank_key(row.cost_per_hour, row.gpus)


def _bound_key(prep: _Prepared) -> tuple:
    """A lower bound on the candidate's `_row_key`: its answer has at least `prep.replicas` replicas."""
    return _rank_key(prep.cost_per_hour, prep.gpus)


def _ruled_out(prep: _Prepared, rows: Iterable[PlanRow], top: int | None) -> tuple | None:
    """The key that rules `prep` out: the `top`-th best of `rows`' feasible keys, when `prep`'s
    bound ranks after it (None: fewer than `top` feasible rows, no `top`, or a bound that could
    still rank among them)."""
    keys = sorted(_row_key(r) for r in rows if r.feasible)
    cut = keys[top - 1] if top and len(keys) >= top else None
    return cut if cut is not None and _bound_key(prep) > cut else None


def _outranked(prep: _Prepared, cut: tuple, top: int) -> PlanRow:
    """The row of a candidate not simulated: even its lower bound ranks after the `top` cheapest."""
    c = prep.common
    bound = (f"at least {prep.replicas} replica{'s' if prep.replicas != 1 else ''} ({prep.gpus} GPUs) by its "
             f"optimistic service rate of {prep.mu:.3g} req/s per replica")
    if prep.cost_per_hour is not None:
        why = (f"{bound}, ${prep.cost_per_hour:.2f}/h, ranks after the {top} cheapest that meet the SLOs (up to "
               f"${cut[1]:.2f}/h)")
    elif not cut[0]:
        why = (f"no price for {c['device']} ranks it after every priced configuration, and {top} priced ones meet "
               f"the SLOs (--gpu-cost {c['device']}=USD ranks it)")
    else:
        why = f"{bound}, ranks after the {top} with the fewest GPUs that meet the SLOs (up to {cut[2]})"
    return PlanRow(replicas=None, gpus=None, feasible=False, binding="outranked",
                   detail=f"not simulated: {why}; --top 0 simulates it", **c)


def _run_candidates(cands: list[Candidate], common: tuple, stopping: Stopping, lengths: tuple[float, float],
                    top: int | None, jobs: int, on_candidate: Callable[[PlanRow], None] | None) -> list[PlanRow]:
    """Every candidate's row, in the candidates' order.

    All are prepared first (the checks before simulation, and each one's lower bound on its cost:
    `_Prepared.replicas`). The rest are simulated cheapest bound first until the `top` cheapest
    feasible rows are known: a candidate whose bound ranks after the `top`-th best row found before
    it is not simulated (and no later one, their bounds being no better). With `jobs` processes the
    candidates are simulated in the same order, a few ahead; what the order one at a time would not
    have simulated is then set aside, so the rows are the same for any `jobs`."""
    model, rate, spec, slo, base, max_replicas, gpu_cost, kv = common
    rows: list[PlanRow | None] = [None] * len(cands)
    preps: dict[int, _Prepared] = {}
    for i, c in enumerate(cands):
        got = _prepare(c, model, rate, spec, slo, base, gpu_cost, kv)
        if isinstance(got, PlanRow):
            rows[i] = got
            if on_candidate is not None:
                on_candidate(got)
        else:
            preps[i] = got
    order = sorted(preps, key=lambda i: (_bound_key(preps[i]), i))
    done: dict[int, PlanRow] = {}

    if jobs == 1:
        for i in order:
            if _ruled_out(preps[i], done.values(), top) is not None:
                break
            done[i] = _search(preps[i], cands[i], rate, spec, slo, max_replicas, stopping, lengths)
            if on_candidate is not None:
                on_candidate(done[i])
    else:
        # Candidates are independent simulations: one process per core (fork keeps the loaded specs).
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
        ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
        queue = list(order)
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            running: dict = {}
            while True:
                while queue and len(running) < jobs and _ruled_out(preps[queue[0]], done.values(), top) is None:
                    i = queue.pop(0)
                    running[pool.submit(_evaluate, cands[i], *common, stopping, lengths)] = i
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    i = running.pop(fut)
                    done[i] = fut.result()
                    if on_candidate is not None:
                        on_candidate(done[i])
    # What one at a time would have simulated: the same rows whatever ran ahead in parallel.
    kept: list[int] = []
    for i in order:
        cut = _ruled_out(preps[i], (done[k] for k in kept), top)
        if cut is not None:
            rows[i] = _outranked(preps[i], cut, top)
            if i not in done and on_candidate is not None:
                on_candidate(rows[i])
        else:
            rows[i] = done[i]
            kept.append(i)
    return rows


def _precision_notes(model: ModelSpec, devices: Sequence[str], precisions: Sequence[str], kv: str | None) -> list[str]:
    """The fp8 lines (`precision_note`), one per kind, naming the devices it holds on (twelve devices
    are two lines, not twelve)."""
    mark = "\x00"
    kinds: dict[str, list[str]] = {}
    for d in devices:
        for p in precisions:
            note = precision_note(plan_precision(model, p, kv), load_hardware(d)) if p == "fp8" else ""
            if note:
                kinds.setdefault(note.replace(f" on {d} ", f" on {mark} ", 1), []).append(d)
    return sorted(k.replace(mark, ", ".join(dict.fromkeys(ds))) for k, ds in kinds.items())


def _stopping_settings(stopping: Stopping | None, workload: WorkloadSpec) -> dict[str, object]:
    """The stopping rule in the settings (JSON, run directory, the table's title)."""
    if stopping is None or stopping.tolerance is None:
        st = stopping or Stopping(tolerance=None)
        return dict(method="fixed sample", requests=workload.num_requests, ci_level=st.level, batches=st.batches,
                    warmup=st.warmup, min_warmup=st.min_warmup)
    return dict(method="batch sectioning", ci_tolerance=stopping.tolerance, ci_level=stopping.level,
                min_requests=stopping.min_requests, max_requests=stopping.max_requests, batches=stopping.batches,
                warmup=stopping.warmup, min_warmup=stopping.min_warmup)


def _duplicate(layout: str, tp: int, layouts: Sequence[str]) -> bool:
    """Whether `layout` at `tp` is the same replica as another candidate of the list: at tp = 1
    every layout is plain `tp` (one GPU: no experts to split, no attention to share), kept once."""
    first = "tp" if "tp" in layouts else layouts[0]
    return tp == 1 and layout != first


def all_devices() -> list[str]:
    """Every built-in device name, sorted."""
    from llmperf.specs.loader import list_hardware
    return sorted(list_hardware())


__all__ = ["Candidate", "DEFAULT_EFFICIENCY", "DEFAULT_PRECISIONS", "DEFAULT_TPS", "LAYOUTS", "check_layouts",
           "check_top", "mean_lengths",
           "layouts_for", "PlanResult", "PlanRow", "all_devices", "plan",
           "plan_precision"]
