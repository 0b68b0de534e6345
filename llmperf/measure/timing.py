"""Time one forward pass at a chosen `(batch, q_len, kv_len)`, the analytical model's coordinates.

`time_forward(model, batch=8, q_len=1, kv_len=1024)` builds a cache in which each of `batch`
sequences already holds `kv_len - q_len` tokens (zeros: attention costs the same whatever the
values), feeds `q_len` new tokens per sequence, and records every operator with a `Recorder`,
`warmup` untimed passes first. The result is a `Trace` whose records carry exactly the
`(batch, q_len, kv_len)` that `llmperf.analysis` cost functions take, so the two join by operator
name: `trace.to_frame().groupby("op").seconds.median()` per step is the measured side of a
prediction. `q_len == kv_len` is a prefill, `q_len == 1` a decode step (both phases are recorded as
"prefill" unless `q_len == 1`).
"""

from __future__ import annotations

import torch

from llmperf.engine.cache import make_cache
from llmperf.engine.instrument import Recorder, Trace
from llmperf.engine.model import Transformer


@torch.inference_mode()
def time_forward(model: Transformer, *, batch: int, q_len: int, kv_len: int, cache: str = "contiguous",
                 block_size: int = 16, reps: int = 5, warmup: int = 2, mode: str = "events",
                 seed: int = 0) -> Trace:
    """`reps` timed forward passes of `q_len` new tokens for `batch` sequences with `kv_len` context
    (new tokens included), each one `StepRecord` plus its `OpRecord`s. Raises ValueError for
    impossible shapes."""
    for name, value in (("batch", batch), ("q_len", q_len), ("kv_len", kv_len), ("reps", reps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    if q_len > kv_len:
        raise ValueError(f"q_len: {q_len} new tokens cannot exceed the context kv_len={kv_len}")
    if kv_len > model.spec.max_positions:
        raise ValueError(f"kv_len: {kv_len} exceeds the model's max_positions={model.spec.max_positions}")
    kv = make_cache(cache, model.spec, dtype=model.dtype, device=model.device, max_batch=batch,
                    max_seq_len=kv_len, block_size=block_size)
    seq_ids = list(range(batch))
    for s in seq_ids:
        assert kv.allocate(s, kv_len), "the cache was sized for every sequence"
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.spec.vocab_size, (batch, q_len), generator=gen).to(model.device)
    meta_args = (seq_ids, q_len)
    phase = "decode" if q_len == 1 else "prefill"
    shape = dict(batch=batch, q_len=q_len, kv_len=kv_len, tokens_in_cache=batch * kv_len)
    for _ in range(warmup):
        model(tokens, kv.prepare(*meta_args))
    rec = Recorder(model.device, mode=mode)
    for _ in range(reps):
        meta = kv.prepare(*meta_args)  # every pass rewrites the same last q_len slots
        with rec.step(phase, **shape):
            with rec.forward():
                model(tokens, meta, rec=rec)
    return rec.trace
