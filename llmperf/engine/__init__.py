"""A small, readable inference engine that llmperf measures (torch; Llama and GPT-2 families).

    model = build_model(spec, seed=0)  or  from_pretrained("path/to/hf-checkpoint")
    engine = Engine(model, cache="paged" | "contiguous", attention="sdpa" | "naive" | "triton")
    outputs = engine.generate(prompts, SamplingParams(...), seed=0, recorder=Recorder(model.device))
    result = engine.serve(generate_workload(...), policy="continuous" | "static")

Modules: `model` (the decoder), `weights` (random / Hugging Face checkpoints), `step` (one step's
metadata, which the runner prepares and every backend reads), `attention` (backends), `cache`
(contiguous and paged KV caches), `runner` (executes the shared scheduler's steps: forward + token
choice), `scheduler` (drives `llmperf.serving`'s scheduler over the runner), `generate` (`Engine`),
`instrument` (per-step / per-operator timings), `ops` (what runs the model's operators: plain torch, or
`cpu`, llmperf's own CPU kernels and oneDNN), `speculative` (greedy speculative decoding), `streaming`
(StreamingLLM's KV eviction: attention sinks plus a window), `tensor_parallel` (Megatron-style shards
over processes: gloo on CPU, NCCL on GPUs);
`sampling`, `beam`, `workload` (engine-pure). The speed benchmark is `llmperf.measure.engine_bench`;
block bookkeeping is `llmperf.serving.blocks`.
"""

from llmperf.engine.attention import BACKENDS
from llmperf.engine.beam import BeamSearch
from llmperf.engine.cache import CacheUsage, ContiguousKVCache, KVCache, PagedKVCache, make_cache
from llmperf.engine.generate import Engine, generate
from llmperf.engine.instrument import (
    NULL_RECORDER,
    OP_NAMES,
    CountRecord,
    OpRecord,
    Recorder,
    RoutingRecord,
    StepRecord,
    Trace,
)
from llmperf.engine.model import Transformer
from llmperf.engine.sampling import SamplingParams
from llmperf.engine.scheduler import ServeResult, StepStats, run_groups
from llmperf.engine.sequence import Completion, RequestMetrics, RequestOutput
from llmperf.engine.speculative import SpeculativeResult, SpeculativeStep, early_exit_draft, speculative_generate
from llmperf.engine.step import KVStore, StepMeta
from llmperf.engine.streaming import StreamingKVCache, StreamingResult, StreamingStep, streaming_generate
from llmperf.engine.tensor_parallel import TPResult, run_ranks, shard_model, shard_spec, tp_generate
from llmperf.engine.weights import build_model, from_pretrained, hf_config, load_hf_state_dict, to_hf_state_dict
from llmperf.engine.workload import Request, generate_workload
from llmperf.serving.scheduler import POLICIES

__all__ = [
    "BACKENDS", "BeamSearch", "CacheUsage", "Completion", "ContiguousKVCache", "CountRecord", "Engine", "KVCache",
    "KVStore",
    "NULL_RECORDER", "OP_NAMES", "OpRecord", "POLICIES", "PagedKVCache", "Recorder", "Request", "RequestMetrics",
    "RequestOutput", "RoutingRecord",
    "SamplingParams", "ServeResult", "SpeculativeResult", "SpeculativeStep", "StepMeta", "StepRecord", "StepStats",
    "StreamingKVCache", "StreamingResult", "StreamingStep", "TPResult", "Trace", "Transformer",
    "build_model", "early_exit_draft", "from_pretrained", "generate", "generate_workload", "hf_config",
    "load_hf_state_dict", "make_cache", "run_groups", "run_ranks", "shard_model", "shard_spec",
    "speculative_generate", "streaming_generate", "to_hf_state_dict", "tp_generate",
]
