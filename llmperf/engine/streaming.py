"""StreamingLLM's KV eviction on the engine: window attention with attention sinks (Xiao et al. 2023,
"Efficient Streaming Language Models with Attention Sinks", arXiv:2309.17453).

The rule: with S sink tokens and a window of W tokens, a query at absolute position p attends to the
keys at positions {0 .. S-1} ∪ {p-W+1 .. p} (intersected with [0, p]): min(p + 1, S + W) keys.

The cache (`StreamingKVCache`) gives each sequence a row of S + W slots per layer. A row that holds
S + W tokens after a step drops its oldest non-sink token before the next step, in O(1): the newest
token (in the last slot) moves into the dropped token's slot, and the next token is written in the
last slot again. A full row's one-token query sees every slot, and attention does not depend on the
slots' order (each key carries its own rotation), so the order of the window's slots is kept only
in `StreamingKVCache` (oldest first). No future query can see a dropped token.

Positions stay absolute (keys rotated at their own positions when written, queries at theirs): the
step's `StepMeta` carries absolute `positions`, its slot counts (`starts`, `seq_lens`) index the
row. The paper's re-indexing of positions within the cache is not done, so a stream is
bounded by the model's `max_positions`.

A run (greedy, prompts in lockstep): the first min(prompt_len, S + W) tokens of each prompt in one
forward (all their queries see every earlier token, which is the rule while p + 1 <= S + W), then one
token per live sequence per forward: a prompt's remaining tokens, then the generated ones. Checked
against the engine's sliding-window model (S = 0) and an uncached forward under the rule's exact mask
(tests/engine/test_streaming.py). Design notes: docs/engine.md, "StreamingLLM". Letters: B live
sequences, V vocabulary.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from llmperf.engine.cache import ContiguousKVCache
from llmperf.engine.deltanet import refuse_linear
from llmperf.engine.generate import Prompts, _as_prompts, _is_id
from llmperf.engine.model import Transformer
from llmperf.engine.sampling import SamplingParams, finish_reason
from llmperf.engine.speculative import _clock, _forward_ragged
from llmperf.engine.step import StepMeta
from llmperf.specs import ModelSpec

__all__ = ["StreamingKVCache", "StreamingResult", "StreamingStep", "streaming_generate"]


@dataclass(frozen=True, kw_only=True)
class StreamingStep:
    """One forward of one token per live sequence: per sequence (in prompt order) the absolute
    `positions` of the token it fed and the `slots` its row held in the step (the keys it attended,
    at most S + W); `evict_s` the seconds of the eviction that made room before the forward,
    `seconds` those of the forward (with its argmax)."""

    positions: tuple[int, ...]
    slots: tuple[int, ...]
    evict_s: float
    seconds: float

    @property
    def batch(self) -> int:
        return len(self.positions)

    @property
    def max_position(self) -> int:
        return max(self.positions)

    @property
    def max_slots(self) -> int:
        return max(self.slots)


@dataclass(frozen=True, kw_only=True)
class StreamingResult:
    """A StreamingLLM run: the `tokens` generated per prompt, the rule's `sink_tokens` and `window`,
    the slots each prompt's first forward filled (`prefill_slots`: min(prompt_len, S + W)), the
    seconds of that forward (`prefill_s`), one `StreamingStep` per later forward (`steps`), and
    `wall_s` from the first forward to the last token (the cache's allocation excluded). Times:
    `time.perf_counter` around each forward and eviction (CUDA synchronised)."""

    tokens: list[list[int]]
    sink_tokens: int
    window: int
    prefill_slots: list[int]
    prefill_s: float
    wall_s: float
    steps: list[StreamingStep] = field(default_factory=list)

    @property
    def decode_s(self) -> float:
        """Seconds of the one-token forwards (a prompt's tokens past S + W included)."""
        return sum(s.seconds for s in self.steps)

    @property
    def evict_s(self) -> float:
        """Seconds of the evictions."""
        return sum(s.evict_s for s in self.steps)

    @property
    def max_slots(self) -> int:
        """The most slots a sequence's row held in any forward (at most S + W)."""
        return max([*self.prefill_slots, *(s.max_slots for s in self.steps)], default=0)

    def to_dict(self) -> dict[str, Any]:
        """Every field and derived figure as plain JSON data."""
        out = asdict(self)
        for step in out["steps"]:
            step["positions"], step["slots"] = list(step["positions"]), list(step["slots"])
        for name in ("decode_s", "evict_s", "max_slots"):
            out[name] = getattr(self, name)
        return out

    def steps_frame(self) -> Any:
        """One row per step: batch, max_position, max_slots, evict_s, seconds (a pandas DataFrame)."""
        import pandas as pd
        columns = ["batch", "max_position", "max_slots", "evict_s", "seconds"]
        return pd.DataFrame([[getattr(s, c) for c in columns] for s in self.steps], columns=columns)


# ---------------------------------------------------------------------------------------------------


class StreamingKVCache(ContiguousKVCache):
    """A `ContiguousKVCache` of rows of S + W slots, `kv` `(L, 2, B_max, H_kv, S + W, D)` (MLA: `(L, 1,
    B_max, 1, S + W, R + Dr)`), that keeps each sequence's absolute length (`length`: tokens fed,
    evicted ones included) apart from its slots (`seq_len`). `evict` drops the oldest window token of full rows (see the
    module); `prepare` gives the step absolute `positions` with slot `starts`, and `write` stores at
    slots. Positions run ahead of slots only in one-token steps of full rows, so a mask built from
    positions (keys s <= p) sees exactly the row's slots, which is what the rule lets the query see."""

    def __init__(self, spec: ModelSpec, *, sink_tokens: int, window: int, max_batch: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        for name, value, low in (("sink_tokens", sink_tokens, 0), ("window", window, 1)):
            if not _is_id(value) or value < low:
                raise ValueError(f"{name}: must be an integer >= {low}, got {value!r}")
        super().__init__(spec, max_batch=max_batch, max_seq_len=sink_tokens + window, dtype=dtype, device=device)
        self.sink_tokens, self.window = sink_tokens, window
        self._abs: dict[int, int] = {}
        self._age: dict[int, deque[int]] = {}  # a full row's window slots, oldest token first

    def length(self, seq_id: int) -> int:
        """Tokens the sequence has been fed (evicted ones included): its next token's position."""
        return self._abs[seq_id]

    def allocate(self, seq_id: int, num_tokens: int, prefix: Sequence[int] | None = None) -> bool:
        if not super().allocate(seq_id, num_tokens, prefix):
            return False
        self._abs[seq_id] = num_tokens
        return True

    def reserve(self, seq_id: int, num_tokens: int = 1) -> bool:
        if not super().reserve(seq_id, num_tokens):
            return False
        self._abs[seq_id] += num_tokens
        return True

    def free(self, seq_id: int) -> None:
        super().free(seq_id)
        del self._abs[seq_id]
        self._age.pop(seq_id, None)

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        raise ValueError("truncate: a StreamingKVCache cannot roll back: it has evicted the tokens")

    def fork(self, parent: int, child: int) -> bool:
        raise ValueError("fork: a StreamingKVCache does not fork sequences")

    def _reorder(self, seq_ids: list[int], sources: list[int]) -> bool:
        raise ValueError("reorder: a StreamingKVCache does not reorder sequences")

    def evict(self, seq_ids: Sequence[int]) -> int:
        """Drop the oldest non-sink token of each of `seq_ids` whose row is full (S + W slots): the
        newest token moves from the last slot into the dropped one's, in every layer (one token's K/V
        a row), so the row holds the sinks and the last W - 1 tokens and its last slot is free for the
        next. Returns how many rows dropped a token."""
        n, S = self._max_seq_len, self.sink_tokens
        full = [s for s in seq_ids if self._len[s] == n]
        if not full:
            return 0
        last = n - 1
        rows, dropped = [], []
        for s in full:
            age = self._age.setdefault(s, deque(range(S, n)))  # first full: the slots are in order
            oldest = age.popleft()
            if oldest != last:  # W = 1: the one window slot is the last: nothing to move
                age[-1] = oldest  # the newest token now lives in the dropped one's slot
                rows.append(self._row[s])
                dropped.append(oldest)
            age.append(last)  # the next token is written in the last slot
            self._len[s] = last
        if rows:
            r = torch.tensor(rows, device=self.device)
            to = torch.tensor(dropped, device=self.device)
            # both sides indexed alike (rows, slots paired): (B_full, L, 2, H_kv, D)
            self.kv[:, :, r, :, to] = self.kv[:, :, r, :, torch.full_like(to, last)]
        return len(full)

    def prepare(self, seq_ids: Sequence[int], q_len: int) -> StepMeta:
        meta = super().prepare(seq_ids, q_len)  # slot starts and rows; positions equal to the slots
        firsts = [self._abs[s] - q_len for s in seq_ids]
        if firsts != list(meta.starts):
            ahead_ok = q_len == 1 and all(f == st or self._len[s] == self._max_seq_len
                                          for s, f, st in zip(seq_ids, firsts, meta.starts))
            assert ahead_ok, ("StreamingKVCache: positions run ahead of slots only in one-token steps of full "
                              "rows (the backends' masks, keys s <= p, then see exactly the row's slots)")
            meta.positions = self._positions(firsts, q_len)  # (B, T) absolute
            meta.last_position = max(firsts) + q_len - 1
        return meta

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor | None, meta: StepMeta) -> None:
        if meta.last_position is None or (meta.row_slice is not None and meta.uniform):
            super().write(layer, k, v, meta)  # positions are slots, or the write is addressed by starts
            return
        if "slots" not in meta._memo:
            meta._memo["slots"] = self._positions(meta.starts, meta.q_len)  # (B, T) slot of each new token
        rows, slots = meta.rows[:, None], meta._memo["slots"]  # (B, 1), (B, T)
        for part, x in self._written(k, v):
            self.kv[layer, part][rows, :, slots] = x


# ---------------------------------------------------------------------------------------------------
# Input checks


def _check(model: Any, prompts: list[list[int]], sink_tokens: Any, window: Any, max_new_tokens: Any,
           eos_token_id: Any) -> SamplingParams:
    """Every argument, before anything is allocated; the stop rules as the engine's `SamplingParams`."""
    if not isinstance(model, Transformer):
        raise ValueError(f"model: must be an llmperf.engine Transformer, got {type(model).__name__}")
    refuse_linear(model.spec, "StreamingLLM", "already summarises every evicted token; K/V eviction does not apply "
                  "to it")
    if not _is_id(sink_tokens) or sink_tokens < 0:
        raise ValueError(f"sink_tokens: must be an integer >= 0, got {sink_tokens!r}")
    if not _is_id(window) or window < 1:
        raise ValueError(f"window: must be an integer >= 1, got {window!r}")
    if sink_tokens + window < 2:
        raise ValueError(f"window: sink_tokens + window must be at least 2 (a query sees more than itself), got "
                         f"sink_tokens={sink_tokens}, window={window}")
    if not _is_id(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: must be a positive integer, got {max_new_tokens!r}")
    spec = model.spec
    kinds = {k.attention for k in spec.layer_kinds()}
    if (spec.layer_types is not None or spec.sliding_window is not None or spec.attention_chunk_size is not None
            or kinds != {"full"}):
        raise ValueError(f"model: {spec.name} already bounds its attention (sliding_window={spec.sliding_window}, "
                         f"layer_types={spec.layer_types}, attention_chunk_size={spec.attention_chunk_size}); "
                         "StreamingLLM applies to a model of full-attention layers")
    params = SamplingParams(max_new_tokens=max_new_tokens, eos_token_id=eos_token_id)
    params = params.with_model_eos(model.eos_token_id)
    V, P = spec.vocab_size, spec.max_positions
    bad_eos = [t for t in params.eos_ids if t >= V]
    if bad_eos:
        raise ValueError(f"eos_token_id: token ids {bad_eos[:5]} are outside the vocabulary of {V}")
    for i, p in enumerate(prompts):
        bad = [t for t in p if t >= V]
        if bad:
            raise ValueError(f"prompts[{i}]: token ids {bad[:5]} are outside the vocabulary of {V}")
        if len(p) + max_new_tokens > P + 1:  # the engine's (HF's) limit: the last new token is never fed
            raise ValueError(f"max_new_tokens: prompt {i} needs {len(p)} prompt + {max_new_tokens} new tokens, more "
                             f"than the model's max_positions={P} + 1 (positions stay absolute: a stream is not "
                             "re-indexed past the model's context)")
    return params


# ---------------------------------------------------------------------------------------------------


@dataclass
class _Stream:
    """One prompt's decoding: its cache id (its index), prompt, generated tokens, tokens fed so far."""

    index: int
    prompt: list[int]
    out: list[int]
    fed: int

    def next_input(self) -> int:
        """The token the next step feeds: the prompt's next, or the last generated."""
        return self.prompt[self.fed] if self.fed < len(self.prompt) else self.out[-1]


def _sized(ok: bool) -> None:
    assert ok, "streaming_generate: a cache row is full before its step, though every step evicts first"


def _step(model: Transformer, cache: StreamingKVCache, live: list[_Stream],
          clock: Callable[[], float]) -> tuple[list[int], StreamingStep]:
    """One token per live sequence: evict from the full rows, feed, and return each greedy next token."""
    ids = [s.index for s in live]
    t0 = clock()
    cache.evict(ids)
    evict_s = clock() - t0
    for i in ids:
        _sized(cache.reserve(i, 1))
    tokens = torch.tensor([[s.next_input()] for s in live], dtype=torch.long).to(model.device)  # (B, 1)
    meta = cache.prepare(ids, 1)
    t0 = clock()
    choice = model(tokens, meta).argmax(-1).tolist()  # (B,)
    seconds = clock() - t0
    step = StreamingStep(positions=tuple(s.fed for s in live), slots=meta.seq_lens, evict_s=evict_s, seconds=seconds)
    return choice, step


@torch.inference_mode()
def streaming_generate(model: Transformer, prompts: Prompts, *, sink_tokens: int, window: int, max_new_tokens: int,
                       eos_token_id: int | Sequence[int] | None = None) -> StreamingResult:
    """Greedy decoding of `prompts` (as `Engine.generate` takes them) under StreamingLLM's rule with
    `sink_tokens` sinks and a `window` of recent tokens (see the module), stopping at an EOS (kept, as
    the engine keeps it) or after `max_new_tokens`. `eos_token_id`: None never stops on a token;
    "model" (`sampling.MODEL_EOS`) the model's checkpoint EOS. The model runs with its own backend
    (sdpa, naive or triton) and, on a CPU, its one-call decode path. Bad input raises ValueError naming the
    field: among others a model whose layers already bound their attention, and a prompt plus
    max_new_tokens past `max_positions` (positions are absolute, not re-indexed)."""
    prompts = _as_prompts(prompts)
    params = _check(model, prompts, sink_tokens, window, max_new_tokens, eos_token_id)
    slots = sink_tokens + window
    if not prompts:
        return StreamingResult(tokens=[], sink_tokens=sink_tokens, window=window, prefill_slots=[], prefill_s=0.0,
                               wall_s=0.0)
    clock = _clock(model.device)
    cache = StreamingKVCache(model.spec, sink_tokens=sink_tokens, window=window, max_batch=len(prompts),
                             dtype=model.dtype, device=model.device)
    heads = [p[:slots] for p in prompts]
    t_start = clock()
    for i, h in enumerate(heads):
        _sized(cache.allocate(i, len(h)))
    first = _forward_ragged(model, cache, list(range(len(prompts))), heads).argmax(-1).tolist()
    prefill_s = clock() - t_start
    seqs = [_Stream(i, p, [], len(h)) for i, (p, h) in enumerate(zip(prompts, heads))]
    live = []
    for s, tok in zip(seqs, first):
        if s.fed == len(s.prompt):  # the whole prompt fit: the forward's last logits are the first token
            s.out.append(tok)
        if s.out and finish_reason(s.out, params) is not None:
            cache.free(s.index)
        else:
            live.append(s)
    steps: list[StreamingStep] = []
    while live:
        choice, step = _step(model, cache, live, clock)
        steps.append(step)
        still = []
        for s, tok in zip(live, choice):
            s.fed += 1
            if s.fed >= len(s.prompt):  # it fed its last prompt token or a generated one
                s.out.append(tok)
                if finish_reason(s.out, params) is not None:
                    cache.free(s.index)
                    continue
            still.append(s)
        live = still
    return StreamingResult(tokens=[s.out for s in seqs], sink_tokens=sink_tokens, window=window,
                           prefill_slots=[len(h) for h in heads], prefill_s=prefill_s, wall_s=clock() - t_start,
                           steps=steps)
