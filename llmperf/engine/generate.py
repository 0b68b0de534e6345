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

import time
from collections.abc import Sequence as Seq
from typing import Any

import torch

from llmperf.engine.cache import CACHE_KINDS, KVCache, PagedKVCache, make_cache
from llmperf.engine.instrument import NULL_RECORDER
from llmperf.engine.model import Transformer
from llmperf.engine.runner import ModelRunner
from llmperf.engine.sampling import SamplingParams, make_generator
from llmperf.engine.scheduler import POLICIES, Scheduler, ServeResult, StepStats
from llmperf.engine.sequence import RequestOutput, SequenceGroup
from llmperf.engine.workload import Request

Prompts = Seq[Seq[int]] | Seq[int] | torch.Tensor


def _as_prompts(prompts: Prompts) -> list[list[int]]:
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() == 1:
            prompts = prompts[None]
        if prompts.dim() != 2:
            raise ValueError(f"prompts: a tensor must be (B, T) token ids, got shape {tuple(prompts.shape)}")
        return prompts.tolist()
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]  # one prompt
    out = [list(p) for p in prompts]
    for i, p in enumerate(out):
        if not p or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p):
            raise ValueError(f"prompts[{i}]: must be a non-empty list of non-negative token ids, got {p!r}")
    return out


class Engine:
    """A model and how its KV cache is laid out.

    `cache`: "paged" (blocks of `block_size` tokens; `num_blocks` fixes the pool) or "contiguous"
    (`max_batch` rows of `max_seq_len` slots). `max_batch` also caps the running sequences under
    either cache. `attention`: switch the model's backend ("sdpa", "naive", "triton").
    """

    def __init__(self, model: Transformer, *, cache: str = "paged", block_size: int = 16,
                 num_blocks: int | None = None, max_batch: int | None = None, max_seq_len: int | None = None,
                 attention: str | None = None) -> None:
        if cache not in CACHE_KINDS:
            raise ValueError(f"cache: must be one of {', '.join(CACHE_KINDS)}, got {cache!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size: must be a positive integer, got {block_size!r}")
        if max_seq_len is not None and max_seq_len > model.spec.max_positions:
            raise ValueError(f"max_seq_len: {max_seq_len} exceeds the model's max_positions={model.spec.max_positions}")
        self.model = model
        self.cache_kind, self.block_size = cache, block_size
        self.num_blocks, self.max_batch, self.max_seq_len = num_blocks, max_batch, max_seq_len
        self.kv_dtype = model.dtype  # K/V are stored as the model computes them
        if attention is not None:
            model.set_attention(attention)
        self._cache: KVCache | None = None
        self.last_steps: list[StepStats] = []  # the last generate() call's steps (cache usage per step)
        fixed = num_blocks is not None if cache == "paged" else (max_batch is not None and max_seq_len is not None)
        if fixed:
            self._cache = self._make_cache(max_batch or 1, max_seq_len or model.spec.max_positions)

    @property
    def cache(self) -> KVCache | None:
        """The cache of the last call (or the fixed one)."""
        return self._cache

    def _make_cache(self, rows: int, seq_len: int) -> KVCache:
        return make_cache(self.cache_kind, self.model.spec, dtype=self.kv_dtype, device=self.model.device,
                          max_batch=rows, max_seq_len=seq_len, block_size=self.block_size, num_blocks=self.num_blocks)

    def _cache_for(self, groups: Seq[SequenceGroup]) -> KVCache:
        fixed = self.num_blocks is not None if self.cache_kind == "paged" else (
            self.max_batch is not None and self.max_seq_len is not None)
        if fixed and self._cache is not None:
            return self._cache
        rows = self.max_batch or sum(g.width for g in groups)
        seq_len = self.max_seq_len or max(g.max_len for g in groups)
        c = self._cache
        if c is not None and c.num_seqs == 0 and c.max_seq_len >= seq_len and (
                (isinstance(c, PagedKVCache) and c.manager.num_blocks * c.block_size >= rows * seq_len)
                or (not isinstance(c, PagedKVCache) and c.max_batch >= rows)):
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

    def _check_vocab(self, prompts: list[list[int]]) -> None:
        V = self.model.spec.vocab_size
        for i, p in enumerate(prompts):
            bad = [t for t in p if t >= V]
            if bad:
                raise ValueError(f"prompts[{i}]: token ids {bad[:5]} are outside the vocabulary of {V}")

    @torch.inference_mode()
    def generate(self, prompts: Prompts, params: SamplingParams | Seq[SamplingParams] | None = None, *,
                 seed: int | None = 0, recorder: Any = NULL_RECORDER) -> list[RequestOutput]:
        """Decode every prompt to the end (continuous batching over all of them). `params`: one
        `SamplingParams` for all prompts or one per prompt. Returns one `RequestOutput` per prompt,
        in order."""
        prompts = _as_prompts(prompts)
        if not prompts:
            return []
        self._check_vocab(prompts)
        if params is None:
            params = SamplingParams()
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise ValueError(f"params: {len(plist)} SamplingParams for {len(prompts)} prompts")
        groups = self._groups(prompts, plist, seed)
        cache = self._cache_for(groups)
        scheduler = Scheduler(ModelRunner(self.model, cache, recorder=recorder), max_batch=self.max_batch)
        scheduler.run(groups)
        self.last_steps = scheduler.stats
        return [g.output() for g in groups]

    @torch.inference_mode()
    def serve(self, requests: Seq[Request], params: SamplingParams | None = None, *, policy: str = "continuous",
              realtime: bool = True, seed: int | None = 0, recorder: Any = NULL_RECORDER) -> ServeResult:
        """Serve a workload (`llmperf.engine.workload`): requests arrive at their `arrival_time_s`
        (wall clock; `realtime=False` releases them all at once) and are batched by `policy`
        ("continuous" or "static"). Returns per-request TTFT / TPOT and per-step cache usage."""
        if policy not in POLICIES:
            raise ValueError(f"policy: must be one of {', '.join(POLICIES)}, got {policy!r}")
        default = params or SamplingParams()
        if not requests:
            return ServeResult(outputs=[], steps=[], elapsed_s=0.0, policy=policy, cache_kind=self.cache_kind)
        prompts = [list(r.prompt) for r in requests]
        self._check_vocab(prompts)
        plist = [r.params(default) for r in requests]
        groups = self._groups(prompts, plist, seed)
        for g, r in zip(groups, requests):
            g.request_id = r.request_id
        cache = self._cache_for(groups)
        scheduler = Scheduler(ModelRunner(self.model, cache, recorder=recorder), policy=policy,
                              max_batch=self.max_batch)
        arrivals = [r.arrival_time_s for r in requests] if realtime else None
        t0 = time.perf_counter()
        scheduler.run(groups, arrivals)
        elapsed = time.perf_counter() - t0
        outputs = sorted((g.output() for g in groups), key=lambda o: o.request_id)
        return ServeResult(outputs=outputs, steps=scheduler.stats, elapsed_s=elapsed, policy=policy,
                           cache_kind=cache.kind)


def generate(model: Transformer, prompts: Prompts, params: SamplingParams | Seq[SamplingParams] | None = None, *,
             cache: str = "paged", seed: int | None = 0, recorder: Any = NULL_RECORDER,
             **engine_options: Any) -> list[RequestOutput]:
    """One-shot `Engine(model, cache=cache, **engine_options).generate(prompts, params, seed=...)`."""
    return Engine(model, cache=cache, **engine_options).generate(prompts, params, seed=seed, recorder=recorder)
