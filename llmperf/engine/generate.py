"""`Engine`: a model plus a KV-cache configuration; `generate()` for prompts, `serve()` for workloads.

    from llmperf.engine import Engine, SamplingParams, build_model
    from llmperf.specs import load_model

    spec = load_model("llama-3.1-8b").scaled(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                                             ffn_size=512, vocab_size=1000, rotary_dim=None)
    engine = Engine(build_model(spec, seed=0), cache="paged", block_size=16)
    out = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=8), seed=0)
    out[0].tokens  # the first prompt's generated tokens

Every request gets its own generator, seeded `params.seed` if set, else `seed + request index`, so a
request draws the same tokens whatever it is batched with and however the scheduler interleaves it.

Cache sizing: give `num_blocks` (paged) or `max_batch` and `max_seq_len` (contiguous) to fix the
cache; otherwise each call sizes one to its requests (contiguous: one row of the longest
prompt + max_new_tokens per sequence; paged: the same number of token slots, in blocks) and keeps it
for the next call if it is big enough.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from typing import Any

import torch

from llmperf.engine.attention import get_backend
from llmperf.engine.cache import CACHE_KINDS, KVCache, hybrid_layout, make_cache
from llmperf.engine.instrument import NULL_RECORDER
from llmperf.engine.model import Transformer
from llmperf.engine.sampling import SamplingParams, make_generator
from llmperf.engine.scheduler import ServeResult, StepStats, run_groups
from llmperf.engine.sequence import RequestOutput, SequenceGroup
from llmperf.engine.workload import Request
from llmperf.serving.scheduler import POLICIES, SchedulerConfig, StepLog

Prompts = Seq[Seq[int]] | Seq[int] | torch.Tensor


def _is_id(t: object) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def _as_prompts(prompts: Prompts) -> list[list[int]]:
    """Token-id lists from a (B, T) / (T,) tensor, one flat list of ids, or a list of them."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() == 1:
            prompts = prompts[None]
        if prompts.dim() != 2 or prompts.dtype.is_floating_point or prompts.dtype == torch.bool:
            raise ValueError(f"prompts: a tensor must be (B, T) integer token ids, got shape "
                             f"{tuple(prompts.shape)} {prompts.dtype}")
        return prompts.tolist()
    if isinstance(prompts, (str, bytes, dict)) or not isinstance(prompts, Seq):
        raise ValueError(f"prompts: must be a list of token ids or a list of such lists, got "
                         f"{type(prompts).__name__} {prompts!r:.80}")
    prompts = list(prompts)
    if prompts and all(_is_id(t) for t in prompts):
        prompts = [prompts]  # one prompt
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, (str, bytes, dict)) or not isinstance(p, Seq):
            raise ValueError(f"prompts[{i}]: must be a list of token ids (Python ints), got "
                             f"{type(p).__name__} {p!r:.80} (a numpy array: pass ids.tolist())")
        p = list(p)
        if not p or not all(_is_id(t) and t >= 0 for t in p):
            bad = next((t for t in p if not (_is_id(t) and t >= 0)), None)
            raise ValueError(f"prompts[{i}]: must be a non-empty list of non-negative Python int token ids, got "
                             f"{'an empty list' if not p else f'{bad!r} ({type(bad).__name__})'}")
        out.append(p)
    return out


def _as_params(params: SamplingParams | Seq[SamplingParams] | None, n: int,
               default: SamplingParams) -> list[SamplingParams]:
    if params is None:
        return [default] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if isinstance(params, (str, bytes, dict)) or not isinstance(params, Seq):
        raise ValueError(f"params: must be a SamplingParams or a list of them (one per prompt), got "
                         f"{type(params).__name__} {params!r:.80}")
    plist = list(params)
    for i, p in enumerate(plist):
        if not isinstance(p, SamplingParams):
            raise ValueError(f"params[{i}]: must be a SamplingParams, got {type(p).__name__} {p!r:.80}")
    if len(plist) != n:
        raise ValueError(f"params: {len(plist)} SamplingParams for {n} prompts")
    return plist


class Engine:
    """A model, how its KV cache is laid out, and how requests are scheduled.

    `cache`: "paged" (blocks of `block_size` tokens; `num_blocks` fixes the pool) or "contiguous"
    (`max_batch` rows of `max_seq_len` slots). `max_batch` also caps the running sequences under
    either cache. `attention`: this engine's backend ("sdpa", "naive", "triton"; default the model's),
    never changing the model or another engine sharing it. Scheduling (`llmperf.serving`):
    `chunked_prefill` with `max_batched_tokens` per step, `prefix_sharing` (paged cache),
    `watermark` (share of the pool kept free at admission). `kv_window`: "capped" (a hybrid model's
    sliding / chunked layers give back the blocks that left their window, paged cache) or "full"
    (every layer keeps the whole context).
    """

    def __init__(self, model: Transformer, *, cache: str = "paged", block_size: int = 16,
                 num_blocks: int | None = None, max_batch: int | None = None, max_seq_len: int | None = None,
                 attention: str | None = None, max_batched_tokens: int | None = None,
                 chunked_prefill: bool = False, prefix_sharing: bool = False, watermark: float = 0.01,
                 kv_window: str = "capped") -> None:
        if cache not in CACHE_KINDS:
            raise ValueError(f"cache: must be one of {', '.join(CACHE_KINDS)}, got {cache!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size: must be a positive integer, got {block_size!r}")
        for name, value in (("num_blocks", num_blocks), ("max_seq_len", max_seq_len)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: must be None or a positive integer, got {value!r}")
        if max_seq_len is not None and max_seq_len > model.spec.max_positions:
            raise ValueError(f"max_seq_len: {max_seq_len} exceeds the model's max_positions={model.spec.max_positions}")
        if prefix_sharing and cache != "paged":
            raise ValueError(f"prefix_sharing: needs the paged cache, got cache={cache!r}")
        if prefix_sharing and model.spec.has_linear_layers:
            raise ValueError(f"prefix_sharing: {model.spec.name} has linear ({model.spec.linear_mixer_name}) layers, "
                             "whose per-sequence state a cached prefix's K/V blocks do not carry")
        hybrid_layout(model.spec, kv_window)  # validate now, by name
        self.kv_window = kv_window
        self.model = model
        self.attention = attention or model.attention_backend
        get_backend(self.attention)  # validate now, by name
        self.sched_config = SchedulerConfig(max_batch=max_batch, max_batched_tokens=max_batched_tokens,
                                            chunked_prefill=chunked_prefill, prefix_sharing=prefix_sharing,
                                            watermark=watermark)
        self.cache_kind, self.block_size = cache, block_size
        self.num_blocks, self.max_batch, self.max_seq_len = num_blocks, max_batch, max_seq_len
        self.kv_dtype = model.dtype  # K/V are stored as the model computes them
        self._cache: KVCache | None = None
        self.last_steps: list[StepStats] = []  # the last call's steps (cache usage per step)
        self.last_schedule: list[StepLog] = []  # the last call's scheduling decisions
        if self._fixed:
            self._cache = self._make_cache(max_batch or 1, max_seq_len or model.spec.max_positions)

    @property
    def _fixed(self) -> bool:
        if self.cache_kind == "paged":
            return self.num_blocks is not None
        return self.max_batch is not None and self.max_seq_len is not None

    @property
    def cache(self) -> KVCache | None:
        """The cache of the last call (or the fixed one)."""
        return self._cache

    @property
    def default_params(self) -> SamplingParams:
        """What `generate` uses when given no params: greedy, stopping at the checkpoint's EOS (its
        `generation_config.json`, else `config.json`), as Hugging Face `generate()` does."""
        return SamplingParams().with_model_eos(self.model.eos_token_id)

    def _resolved(self, plist: Seq[SamplingParams]) -> list[SamplingParams]:
        """Each params' `MODEL_EOS` (the default `eos_token_id`) replaced by the model's EOS: given
        params stop at the checkpoint's EOS too, unless they set `eos_token_id` (None: never)."""
        return [p.with_model_eos(self.model.eos_token_id) for p in plist]

    def _make_cache(self, rows: int, seq_len: int) -> KVCache:
        num_blocks = self.num_blocks
        if num_blocks is None and self.cache_kind == "paged":
            # Every sequence at its longest, plus the admission watermark (a block per sequence
            # and `watermark` of the pool): an auto-sized cache never makes a call wait
            # and `watermark` of the pool), in every group of a hybrid model's layers.
            layout = hybrid_layout(self.model.spec, self.kv_window)
            full = (rows * -(-seq_len // self.block_size) + rows) * (1 if layout is None else layout.tables)
            num_blocks = full + math.ceil(self.sched_config.watermark * full / (1 - self.sched_config.watermark)) + 1
        return make_cache(self.cache_kind, self.model.spec, dtype=self.kv_dtype, device=self.model.device,
                          max_batch=rows, max_seq_len=seq_len, block_size=self.block_size, num_blocks=num_blocks,
                          kv_window=self.kv_window, max_step_tokens=self.sched_config.max_batched_tokens)

    def _cache_for(self, groups: Seq[SequenceGroup]) -> KVCache:
        if self._fixed and self._cache is not None:
            return self._cache
        rows = self.max_batch or sum(g.width for g in groups)
        # The last generated token is never fed back, so a sequence holds at most max_len - 1 slots.
        seq_len = self.max_seq_len or max(g.max_len - 1 for g in groups)
        c = self._cache
        if c is not None and c.num_seqs == 0 and c.max_seq_len >= seq_len and (
                (c.paged and c.num_blocks >= rows * (-(-seq_len // c.block_size) + 1) * c.pages_per_block)
                or (not c.paged and c.num_blocks >= rows)):
            return c
        self._cache = None  # let the old storage go before allocating the new one
        self._cache = self._make_cache(rows, seq_len)
        return self._cache

    def _groups(self, prompts: list[list[int]], params: Seq[SamplingParams], seed: int | None,
                first_id: int = 0) -> list[SequenceGroup]:
        groups = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            s = p.seed if p.seed is not None else (None if seed is None else seed + first_id + i)
            # Beam search samples on the host (its bookkeeping lives there); other draws on the model's device.
            device = "cpu" if p.is_beam_search else self.model.device
            gen = make_generator(s, device) if (p.is_sampling or s is not None) else None
            groups.append(SequenceGroup(first_id + i, prompt, p, arrival=time.perf_counter(), generator=gen))
        return groups

    def _check(self, prompts: list[list[int]], plist: Seq[SamplingParams], seed: int | None) -> None:
        """Every request against the model, before anything is allocated."""
        if seed is not None and (not _is_id(seed) or seed < 0):
            raise ValueError(f"seed: must be None or a non-negative integer, got {seed!r}")
        V, P = self.model.spec.vocab_size, self.model.spec.max_positions
        for i, (prompt, p) in enumerate(zip(prompts, plist)):
            bad = [t for t in prompt if t >= V]
            if bad:
                raise ValueError(f"prompts[{i}]: token ids {bad[:5]} are outside the vocabulary of {V}")
            for name, ids in (("eos_token_id", p.eos_ids), ("bad_words_ids", [t for w in p.bad_words_ids for t in w]),
                              ("stop_sequences", [t for w in p.stop_sequences for t in w])):
                out = [t for t in ids if t >= V]
                if out:
                    whose = (" (the checkpoint's EOS: pass SamplingParams(eos_token_id=None) or your own)"
                             if name == "eos_token_id" and p.eos_token_id == self.model.eos_token_id else "")
                    raise ValueError(f"{name}: token ids {out[:5]} (request {i}) are outside the vocabulary "
                                     f"of {V}{whose}")
            # The last new token is never fed back: prompt + max_new_tokens may reach positions + 1 (as HF).
            if len(prompt) + p.max_new_tokens > P + 1:
                raise ValueError(f"max_new_tokens: request {i} needs {len(prompt)} prompt + {p.max_new_tokens} new "
                                 f"tokens, more than the model's max_positions={P} (+1: the last token is never fed)")

    def _run(self, groups: list[SequenceGroup], config: SchedulerConfig, recorder: Any,
             arrivals: Seq[float] | None = None, realtime: bool = False) -> tuple[list[StepStats], KVCache]:
        cache = self._cache_for(groups)
        try:
            stats, sched = run_groups(self.model, cache, groups, config, attention=self.attention,
                                      recorder=recorder, arrivals=arrivals, realtime=realtime)
        except BaseException:
            self.last_steps, self.last_schedule = [], []
            raise
        self.last_steps, self.last_schedule = stats, sched.log
        return stats, cache

    @torch.inference_mode()
    def generate(self, prompts: Prompts, params: SamplingParams | Seq[SamplingParams] | None = None, *,
                 seed: int | None = 0, recorder: Any = NULL_RECORDER) -> list[RequestOutput]:
        """Decode every prompt to the end (continuous batching over all of them). `params`: one
        `SamplingParams` for all prompts or one per prompt (None: `default_params`). Returns one
        `RequestOutput` per prompt, in order. Bad input raises ValueError before anything runs; if a
        step fails, everything the call allocated is freed before the error propagates."""
        prompts = _as_prompts(prompts)
        plist = self._resolved(_as_params(params, len(prompts), self.default_params))
        if not prompts:
            return []
        self._check(prompts, plist, seed)
        groups = self._groups(prompts, plist, seed)
        self._run(groups, self.sched_config, recorder)
        return [g.output() for g in groups]

    @torch.inference_mode()
    def serve(self, requests: Seq[Request], params: SamplingParams | None = None, *, policy: str = "continuous",
              realtime: bool = True, seed: int | None = 0, recorder: Any = NULL_RECORDER) -> ServeResult:
        """Serve a workload (`llmperf.engine.workload`): requests arrive at their `arrival_time_s`
        (wall clock; `realtime=False` releases them all at once) and are batched by `policy`
        ("continuous" or "static"). Returns per-request TTFT / TPOT and per-step cache usage."""
        if policy not in POLICIES:
            raise ValueError(f"policy: must be one of {', '.join(POLICIES)}, got {policy!r}")
        if params is not None and not isinstance(params, SamplingParams):
            raise ValueError(f"params: must be a SamplingParams or None, got {type(params).__name__} {params!r:.80}")
        default = params or self.default_params
        if isinstance(requests, (str, bytes, dict)) or not isinstance(requests, (Seq, Iterator)):
            raise ValueError(f"requests: must be a list of Request, got {type(requests).__name__} {requests!r:.80}")
        requests = list(requests)  # a generator is read once, here
        for i, r in enumerate(requests):
            if not isinstance(r, Request):
                raise ValueError(f"requests[{i}]: must be a Request (llmperf.engine.workload), got "
                                 f"{type(r).__name__} {r!r:.80}")
        if not requests:
            return ServeResult(outputs=[], steps=[], elapsed_s=0.0, policy=policy, cache_kind=self.cache_kind)
        prompts = [list(r.prompt) for r in requests]
        plist = self._resolved([r.params(default) for r in requests])
        self._check(prompts, plist, seed)
        groups = self._groups(prompts, plist, seed)
        for g, r in zip(groups, requests):
            g.request_id = r.request_id
        config = dataclasses.replace(self.sched_config, policy=policy)
        arrivals = [r.arrival_time_s for r in requests] if realtime else None
        t0 = time.perf_counter()
        stats, cache = self._run(groups, config, recorder, arrivals, realtime)
        elapsed = time.perf_counter() - t0
        outputs = sorted((g.output() for g in groups), key=lambda o: o.request_id)
        return ServeResult(outputs=outputs, steps=stats, elapsed_s=elapsed, policy=policy, cache_kind=cache.kind)


def generate(model: Transformer, prompts: Prompts, params: SamplingParams | Seq[SamplingParams] | None = None, *,
             cache: str = "paged", seed: int | None = 0, recorder: Any = NULL_RECORDER,
             **engine_options: Any) -> list[RequestOutput]:
    """One-shot `Engine(model, cache=cache, **engine_options).generate(prompts, params, seed=...)`."""
    return Engine(model, cache=cache, **engine_options).generate(prompts, params, seed=seed, recorder=recorder)
