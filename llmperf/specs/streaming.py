"""StreamingLLM's KV eviction for pricing (Xiao et al. 2023, "Efficient Streaming Language Models with
Attention Sinks", arXiv:2309.17453): every layer keeps the first `sink_tokens` tokens' K/V (the
attention sinks) and the last `window` tokens', and evicts the rest.

A query at position p sees keys {0 .. S-1} and {p-W+1 .. p} (within [0, p]): min(p + 1, S + W) of
them, the count a sliding window of S + W gives; a step of q new tokens from position p0 reads
q + W - 1 + S keys of the cache, as the window reads q + (S + W) - 1; and a sequence holds S + W
tokens of K/V. So every FLOP, byte and KV slot llmperf prices is a sliding window's of S + W tokens
(a paged cache may hold one block more: the sinks' last block beside the window's first). `streaming`
returns the model with every layer so windowed, named for what it is; the sinks change which keys
are seen, not their cost. `llmperf.engine.streaming` runs the rule itself (absolute positions).
Models whose layers already bound their attention (sliding or chunked layers) are refused.
"""

from __future__ import annotations

from llmperf.errors import SpecError
from llmperf.specs.model import ModelSpec

__all__ = ["parse_streaming", "streaming"]


def streaming(spec: ModelSpec, sink_tokens: int, window: int) -> ModelSpec:
    """`spec` under StreamingLLM with `sink_tokens` sinks and a window of `window` recent tokens: its
    layers windowed to sink_tokens + window keys (see the module)."""
    for name, value, low in (("sink_tokens", sink_tokens, 0), ("window", window, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise SpecError(f"streaming: {name} must be an integer >= {low}, got {value!r}")
    if spec.sliding_window is not None or spec.layer_types is not None or spec.attention_chunk_size is not None:
        raise SpecError(f"streaming: {spec.name} already bounds its attention (sliding or chunked layers); "
                        "StreamingLLM applies to a model of full-attention layers")
    return spec.scaled(name=f"{spec.name} streaming {sink_tokens}+{window}", sliding_window=sink_tokens + window)


def parse_streaming(option: str, text: str) -> tuple[int, int]:
    """'4:2044' -> (4, 2044): sink tokens and window; anything else is an error naming the option."""
    parts = str(text).split(":")
    try:
        sinks, window = (int(p) for p in parts)
    except ValueError:
        raise SpecError(f"{option}: {text!r} is not SINKS:WINDOW (two integers, e.g. 4:2044)") from None
    if sinks < 0 or window < 1:
        raise SpecError(f"{option}: {text!r} needs SINKS >= 0 and WINDOW >= 1")
    return sinks, window
