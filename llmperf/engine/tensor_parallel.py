"""Tensor parallelism for the engine, Megatron-style (Shoeybi et al. 2019, arXiv:1909.08053, §3): a layer's
heads and FFN columns split over `world` ranks, two all-reduces per layer, the vocabulary split too (one
all-reduce after the embedding, one gather of the logits), on CPUs (gloo) or GPUs (NCCL).

Letters: C hidden size, H / H_kv query / key-value heads, D head dim, F FFN width, V vocabulary, w world, r rank.

- `shard_spec(spec, w)`: the spec one rank runs (H / w, H_kv / w, F / w), or a `SpecError` naming what
  cannot be split exactly (an indivisible width, experts, latent attention).
- `shard_model(model, r, w, all_reduce, all_gather)`: rank r's `Transformer`: column-parallel [q | k | v]
  and [gate | up], row-parallel o and down (biases on rank 0 only), norms replicated. Each layer sums its
  o projection's and its FFN's partial outputs in place with `all_reduce` (`Block.reduce`, timed as
  `attn_allreduce` / `mlp_allreduce`) before the post norms and residual adds. Vocabulary-parallel
  (default; vLLM's `VocabParallelEmbedding` / `ParallelLMHead`): the embedding and the LM head (tied: the
  same shard) keep vocabulary rows [r V_r, (r + 1) V_r), V_r = ceil(V / w) (zero rows pad the last); a
  token outside them embeds as zeros, `all_reduce` sums the rows (`embed_allreduce`), and every rank's
  logit slice is all-gathered (`logits_gather`): each rank samples the same token from the whole logits
  (vLLM gathers to rank 0 and broadcasts its tokens: the same bytes, into one rank). The padding is cut.
- `run_ranks(w, fn, *args)`: `fn(rank, w, *args)` in w spawned processes with `torch.distributed` set up.
- `tp_generate(spec, prompts, w, max_new_tokens=...)`: greedy generation on w ranks, timed per step (`TPResult`).

Exact: per rank the attention of its heads is the unsharded one's and the sums only reorder fp additions
(a vocabulary shard's rows add zeros), so fp32 logits equal the whole model's to rounding
(tests/engine/test_tensor_parallel.py). Not done: sequence parallelism, experts, MLA, replicating KV heads
when w > H_kv, overlapping communication with compute. Design notes: docs/engine.md, "Tensor parallelism".
"""

from __future__ import annotations

import gc
import os
import pickle
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from llmperf.analysis.vocabulary import Op
from llmperf.engine.attention import get_backend
from llmperf.engine.instrument import NullRecorder
from llmperf.engine.model import Transformer
from llmperf.engine.parts import check_buildable, torch_dtype
from llmperf.errors import SpecError
from llmperf.specs import ModelSpec

if TYPE_CHECKING:
    import pandas as pd

#: the operators a shard's layers time their sums under (the analytical model's names)
REDUCE_OPS = (Op.attn_allreduce.value, Op.mlp_allreduce.value)
#: every collective a shard runs in a forward pass: the layers' sums and the vocabulary's two
COLLECTIVE_OPS = (Op.embed_allreduce.value, *REDUCE_OPS, Op.logits_gather.value)
#: seconds `run_ranks` waits for its processes (and every collective waits for the others) by default
DEFAULT_TIMEOUT_S = 600.0


# ---------------------------------------------------------------------------------------------------
# Sharding


def shard_spec(spec: ModelSpec, world: int) -> ModelSpec:
    """The spec one of `world` ranks runs: `num_heads`, `num_kv_heads` and `ffn_size` divided by
    `world`, everything else (head_dim, rotary_dim, name, ...) unchanged; or a `SpecError` naming the
    field that cannot be split exactly."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise SpecError(f"world: must be a positive integer, got {world!r}")
    if spec.qk_norm == "rmsnorm_across_heads":
        raise SpecError(f"qk_norm: {spec.name} norms q and k across all heads (MiniMax-M2); tensor parallelism "
                        "shards heads and does not sum that norm's variance over ranks")
    if spec.is_moe or any(kind.moe for kind in spec.layer_kinds()):
        raise SpecError(f"num_experts: {spec.name} is a mixture of experts (num_experts={spec.num_experts}); "
                        "tensor parallelism shards dense FFNs only (no expert parallelism)")
    if spec.has_linear_layers:
        raise SpecError(f"layer_types: {spec.name} has linear ({spec.linear_mixer_name}) layers; tensor parallelism "
                        "shards attention heads and FFNs only (not the linear layers' heads and state)")
    if spec.sublayer_layers:
        raise SpecError(f"mixer_only_layers: {spec.name} has layers of one sublayer (Nemotron-H); tensor parallelism "
                        "shards layers of attention and an FFN only")
    if spec.is_mla:
        raise SpecError(f"kv_lora_rank: {spec.name} uses multi-head latent attention "
                        f"(kv_lora_rank={spec.kv_lora_rank}); tensor parallelism shards per-head K and V only")
    if spec.shared_input_norm:
        raise SpecError(f"shared_input_norm: {spec.name} runs attention and the FFN side by side from one norm; "
                        "tensor parallelism shards layers of one after the other")
    if spec.parallel_residual:
        raise SpecError(f"parallel_residual: {spec.name} reads one input in attention and the MLP; "
                        "the engine does not build it")
    for field in ("num_heads", "num_kv_heads", "ffn_size"):
        value = getattr(spec, field)
        if value % world:
            raise SpecError(f"--tp {world}: {field}={value} is not divisible by {world} ({spec.name})")
    if world == 1:
        return spec
    # head_dim and rotary_dim given: `scaled` would re-derive them from the new head count
    return spec.scaled(num_heads=spec.num_heads // world, num_kv_heads=spec.num_kv_heads // world,
                       ffn_size=spec.ffn_size // world, head_dim=spec.head_dim, rotary_dim=spec.rotary_dim)


def _columns(value: torch.Tensor, dim: int, blocks: tuple[int, ...], rank: int, world: int) -> torch.Tensor:
    """Rank `rank`'s share of each of the consecutive `blocks` along `dim`, concatenated: the output
    features of a column-parallel fused matrix (blocks [q, k, v] or [gate, up])."""
    parts, lo = [], 0
    for size in blocks:
        part = size // world
        parts.append(value.narrow(dim, lo + rank * part, part))
        lo += size
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def _rank_value(name: str, value: torch.Tensor, spec: ModelSpec, in_out: bool, rank: int,
                world: int) -> torch.Tensor | None:
    """The rank's value of parameter `name` of the whole model (None: the parameter is dropped)."""
    leaf = name.rsplit(".", 1)[-1]
    out_dim, in_dim = (-1, 0) if in_out else (0, -1)  # matrices: (in, out) or (out, in); vectors: (out,)
    if leaf in ("qkv_weight", "qkv_bias"):
        blocks = (spec.q_size, spec.kv_size, spec.kv_size)
        return _columns(value, out_dim if leaf == "qkv_weight" else 0, blocks, rank, world)
    if leaf in ("up_weight", "up_bias"):
        blocks = (spec.ffn_size, spec.ffn_size) if spec.ffn_kind == "swiglu" else (spec.ffn_size,)
        return _columns(value, out_dim if leaf == "up_weight" else 0, blocks, rank, world)
    if leaf == "sinks":  # one logit per query head
        return _columns(value, 0, (spec.num_heads,), rank, world)
    if leaf in ("o_weight", "down_weight"):  # row-parallel: the inputs the rank's heads / columns produce
        return _columns(value, in_dim, (value.shape[in_dim],), rank, world)
    if leaf in ("o_bias", "down_bias"):  # added once to the sum: on rank 0 only
        return value if rank == 0 else None
    return value  # replicated: norms, q/k norms (per head dim), positions (embeddings: `_split_vocabulary`)


def vocab_rows(vocab_size: int, rank: int, world: int) -> tuple[int, int]:
    """(first row, rows) of the padded vocabulary rank `rank` of `world` holds: rows = ceil(V / w), the
    last ranks' tails past V being padding (Megatron-LM's and vLLM's even split of a padded vocabulary)."""
    rows = -(-vocab_size // world)
    return rank * rows, rows


def _vocab_slice(value: torch.Tensor, dim: int, rank: int, world: int, vocab_size: int) -> torch.Tensor:
    """Rank `rank`'s rows of the vocabulary dimension `dim` of `value`, zero rows past the vocabulary."""
    lo, rows = vocab_rows(vocab_size, rank, world)
    real = max(0, min(rows, vocab_size - lo))
    part = value.narrow(dim, min(lo, vocab_size), real)
    if real == rows:
        return part.clone()
    shape = list(value.shape)
    shape[dim] = rows - real
    return torch.cat([part, value.new_zeros(shape)], dim)


def _gather_by_sum(all_reduce: Callable[[torch.Tensor], None], rank: int,
                   world: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """An all-gather of the last dimension made of an in-place sum (each rank's slice in place, zeros
    elsewhere: exact): for callers that give `shard_model` a sum only (twice an all-gather's bytes)."""
    def gather(t: torch.Tensor) -> torch.Tensor:
        n = t.shape[-1]
        out = t.new_zeros(*t.shape[:-1], world * n)  # (..., w V_r)
        out[..., rank * n:(rank + 1) * n] = t
        all_reduce(out)
        return out
    return gather


def _split_vocabulary(shard: Transformer, model: Transformer, rank: int, world: int,
                      all_reduce: Callable[[torch.Tensor], None],
                      all_gather: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
    """The shard's embedding and LM head cut to its vocabulary rows (a tied head: the same tensor)."""
    V = model.spec.vocab_size
    shard.embed_weight = torch.nn.Parameter(_vocab_slice(model.embed_weight, 0, rank, world, V),
                                            requires_grad=False)  # (V_r, C)
    if model.spec.tied_embeddings:
        shard.lm_head_weight = shard.embed_weight
    else:  # (C, V_r) in_out, (V_r, C) out_in
        shard.lm_head_weight = torch.nn.Parameter(
            _vocab_slice(model.lm_head_weight, -1 if model.in_out else 0, rank, world, V), requires_grad=False)
    shard.vocab_start = vocab_rows(V, rank, world)[0]
    shard.embed_reduce = all_reduce
    shard.gather_logits = all_gather if all_gather is not None else _gather_by_sum(all_reduce, rank, world)


@torch.no_grad()
def shard_model(model: Transformer, rank: int, world: int, all_reduce: Callable[[torch.Tensor], None],
                all_gather: Callable[[torch.Tensor], torch.Tensor] | None = None, *,
                vocab_parallel: bool = True) -> Transformer:
    """Rank `rank`'s shard of `model` out of `world`: a new `Transformer` of `shard_spec(model.spec,
    world)` (same dtype, device, attention backend and weight layout) holding copies of the rank's
    slices of `model`'s parameters. `all_reduce(t)` must sum `t` over the ranks in place; every layer
    calls it on its o projection's and its FFN's outputs. With `vocab_parallel` (and world > 1) the
    embedding and the LM head hold the rank's vocabulary rows (`vocab_rows`), `all_reduce` sums the
    embedded tokens, and `all_gather(t)` must return the ranks' `(..., V_r)` logits concatenated in rank
    order along the last dimension (default: one made of `all_reduce`); `vocab_parallel=False` keeps
    both whole on every rank. The shard runs no one-call CPU decode step."""
    spec = model.spec
    sharded = shard_spec(spec, world)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"rank: must be an integer in [0, {world}), got {rank!r}")
    if not isinstance(vocab_parallel, bool):
        raise ValueError(f"vocab_parallel: must be true or false, got {vocab_parallel!r}")
    split_vocab = vocab_parallel and world > 1
    shard = Transformer(sharded, dtype=model.dtype, device=model.device, attention=model.attention_backend,
                        weight_layout=model.weight_layout)
    whole = dict(model.named_parameters(remove_duplicate=False))
    for name, p in shard.named_parameters():  # a tied LM head is the embedding: listed once
        if split_vocab and name in ("embed_weight", "lm_head_weight"):
            continue
        value = _rank_value(name, whole[name], spec, model.in_out, rank, world)
        if value is None:
            module_name, leaf = name.rsplit(".", 1)
            setattr(shard.get_submodule(module_name), leaf, None)
            continue
        assert value.shape == p.shape, f"{name}: the rank's slice is {tuple(value.shape)}, the shard holds {p.shape}"
        p.copy_(value)
    if split_vocab:
        _split_vocabulary(shard, model, rank, world, all_reduce, all_gather)
    for block in shard.layers:
        block.reduce = all_reduce
    shard.decode_in_one_call = False  # the one call would skip the sums
    shard.eos_token_id = model.eos_token_id
    return shard


# ---------------------------------------------------------------------------------------------------
# Processes


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _rank_main(rank: int, world: int, backend: str, threads: int, timeout_s: float, init_file: str,
               out_dir: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:  # pragma: no cover - spawned
    """One rank: set up, run `fn`, leave its return value (or its traceback) in `out_dir`. A failure is
    written before the group is destroyed, so the rank that failed first is the one whose file is oldest."""
    import torch.distributed as dist

    out = Path(out_dir)
    joined = False
    try:
        torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        joined = True
        tmp = out / f"rank{rank}.pkl.tmp"
        tmp.write_bytes(pickle.dumps(fn(rank, world, *args)))
        tmp.rename(out / f"rank{rank}.pkl")  # whole or absent
    except BaseException:
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        raise SystemExit(1) from None
    finally:
        if joined:
            dist.destroy_process_group()


def run_ranks(world: int, fn: Callable[..., Any], *args: Any, backend: str | None = None,
              threads_per_rank: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Any]:
    """`fn(rank, world, *args)` in each of `world` spawned processes; their return values in rank order.

    Each process joins a `torch.distributed` group (`backend`: "gloo" or "nccl"; default nccl when
    there are `world` CUDA devices, else gloo; a file:// rendezvous in a temporary folder), runs
    `torch.set_num_threads(threads_per_rank)` (default: the cores over `world`) and on nccl uses CUDA
    device `rank`. `fn`, `args` and the results must pickle (`fn` a module-level function). A rank that
    fails raises a RuntimeError here with its traceback, after every process has been ended; so does a
    run longer than `timeout_s` (also every collective's timeout)."""
    import torch.multiprocessing as mp

    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world: must be a positive integer, got {world!r}")
    if backend is None:
        backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world:
        raise ValueError(f"backend: nccl needs {world} CUDA devices, found {torch.cuda.device_count()}")
    threads = max(1, _cores() // world) if threads_per_rank is None else threads_per_rank
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads_per_rank: must be None or a positive integer, got {threads_per_rank!r}")
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="llmperf-tp-") as tmp:
        out = Path(tmp)
        procs = [ctx.Process(target=_rank_main, daemon=True,
                             args=(r, world, backend, threads, timeout_s, str(out / "init"), tmp, fn, args))
                 for r in range(world)]
        try:
            for p in procs:
                p.start()
            _wait(procs, time.monotonic() + timeout_s, timeout_s)
        finally:
            _end(procs)
        failed = [r for r, p in enumerate(procs) if p.exitcode]
        if failed:
            raise RuntimeError(_failure(out, failed, [p.exitcode for p in procs]))
        return [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(world)]


def _wait(procs: list[Any], deadline: float, timeout_s: float) -> None:
    """Until every process has exited, or one has failed; a RuntimeError past `deadline`."""
    import multiprocessing.connection

    while True:
        alive = [p for p in procs if p.exitcode is None]
        if not alive or any(p.exitcode for p in procs):
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"run_ranks: the {len(procs)} ranks did not finish within {timeout_s:g} s")
        ready = multiprocessing.connection.wait([p.sentinel for p in alive], timeout=min(left, 1.0))
        for p in alive:  # a closed sentinel comes before the exit status: wait for it, not in a busy loop
            if p.sentinel in ready:
                p.join(min(max(left, 0.0), 0.1))


def _end(procs: list[Any]) -> None:
    """Every process that still runs ended: terminated, then killed if it ignores that."""
    for p in procs:
        if p.exitcode is None and p.pid is not None:
            p.terminate()
    for p in procs:
        if p.pid is None:
            continue
        p.join(10)
        if p.exitcode is None:
            p.kill()
            p.join(10)


def _failure(out: Path, failed: list[int], codes: list[int | None]) -> str:
    """The message of a failed run: the rank that failed first (its traceback; a rank that failed
    because a partner left fails later), else the first that exited with an error code."""
    errors = sorted((err.stat().st_mtime_ns, r, err) for r in failed if (err := out / f"rank{r}.err").exists())
    if errors:
        _, r, err = errors[0]
        text = err.read_text().rstrip()
        return f"rank {r} of {len(codes)} failed: {text.splitlines()[-1]}\n{text}"
    return f"rank {failed[0]} of {len(codes)} exited with code {codes[failed[0]]} (no traceback)"


# ---------------------------------------------------------------------------------------------------
# Generation


@dataclass(frozen=True, kw_only=True)
class TPResult:
    """A tensor-parallel run as rank 0 saw it. `steps`: (phase, batch, q_len, kv_len, seconds) of each
    engine step of the timed run (`kv_len`: the longest context, the new tokens included);
    `allreduce_s` (with `record=True`): each step's seconds inside all its collectives (`COLLECTIVE_OPS`:
    the layers' all-reduces and, with `vocab_parallel`, the embedding's all-reduce and the logits'
    gather), waiting for the other ranks included."""

    tokens: list[list[int]]
    steps: list[tuple[str, int, int, int, float]]
    world: int
    backend: str
    threads_per_rank: int
    allreduce_s: list[float] | None = None
    vocab_parallel: bool = True

    def to_frame(self) -> pd.DataFrame:
        """One row per step: phase, batch, q_len, kv_len, seconds, allreduce_s (NaN when not recorded)."""
        import pandas as pd
        df = pd.DataFrame(self.steps, columns=["phase", "batch", "q_len", "kv_len", "seconds"])
        df["allreduce_s"] = self.allreduce_s if self.allreduce_s is not None else float("nan")
        return df


class _ReduceClock(NullRecorder):
    """A recorder that times only the collectives (`COLLECTIVE_OPS`), summed per engine step; every other
    operator runs untimed, as without a recorder. On CUDA the clock is read after a synchronisation."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.per_step: list[float] = []
        self._seconds = 0.0

    def op(self, name: str, layer: int | None = None) -> Any:
        return self._timed() if name in COLLECTIVE_OPS else super().op(name, layer)

    @contextmanager
    def _timed(self) -> Iterator[None]:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        yield
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self._seconds += time.perf_counter() - t0

    @contextmanager
    def step(self, phase: str, *, batch: int, q_len: int, kv_len: int, tokens_in_cache: int) -> Iterator[None]:
        self._seconds = 0.0
        yield
        self.per_step.append(self._seconds)


def _sum_over_ranks(t: torch.Tensor) -> None:
    """`t` summed over the process group, in place."""
    import torch.distributed as dist

    if t.is_contiguous():
        dist.all_reduce(t)
    else:
        flat = t.contiguous()
        dist.all_reduce(flat)
        t.copy_(flat)


def _gather_over_ranks(t: torch.Tensor) -> torch.Tensor:
    """The ranks' `t` concatenated in rank order along the last dimension (an all-gather)."""
    import torch.distributed as dist

    t = t.contiguous()
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return torch.cat(parts, dim=-1)


def _tp_generate_rank(rank: int, world: int, spec: ModelSpec, prompts: list[list[int]], max_new_tokens: int,
                      seed: int, dtype: str, device: str, attention: str, record: bool, backend: str,
                      vocab_parallel: bool = True) -> TPResult:  # pragma: no cover - runs in spawned processes
    from llmperf.engine.generate import Engine
    from llmperf.engine.sampling import SamplingParams
    from llmperf.engine.weights import build_model

    dev = torch.device("cuda", rank) if device == "cuda" else torch.device(device)
    whole = build_model(spec, seed=seed, dtype=dtype, device=dev, attention=attention)  # same on every rank
    model = shard_model(whole, rank, world, _sum_over_ranks, _gather_over_ranks, vocab_parallel=vocab_parallel)
    del whole
    T = max(len(p) for p in prompts)
    engine = Engine(model, cache="contiguous", max_batch=len(prompts), max_seq_len=T + max_new_tokens)
    engine.generate(prompts, SamplingParams(max_new_tokens=min(2, max_new_tokens)))  # warm-up: a prefill, a decode
    clock = _ReduceClock(dev) if record else None
    gc.collect()
    gc.disable()  # no collector pause inside a timed step
    try:
        if clock is None:
            out = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens))
        else:
            out = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens), recorder=clock)
    finally:
        gc.enable()
    steps = []
    for s in engine.last_steps:
        items = s.log.items
        steps.append((s.phase.value, s.batch, max(i.num_tokens for i in items),
                      max(i.start + i.num_tokens for i in items), s.seconds))
    return TPResult(tokens=[o.tokens for o in out], steps=steps, world=world, backend=backend,
                    threads_per_rank=torch.get_num_threads(), allreduce_s=None if clock is None else clock.per_step,
                    vocab_parallel=vocab_parallel)


def tp_generate(spec: ModelSpec, prompts: list[list[int]] | torch.Tensor, world: int, *, max_new_tokens: int,
                seed: int = 0, dtype: str = "fp32", device: str = "cpu", attention: str = "sdpa",
                threads_per_rank: int | None = None, record: bool = False, vocab_parallel: bool = True,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> TPResult:
    """Greedy generation of `prompts` (B token lists, or a `(B, T)` tensor) on `world` ranks, rank 0's view.

    Every rank builds the whole model with `build_model(spec, seed=seed, ...)` (one seed: the same
    weights on every rank; a whole model per rank is wasteful for big models, simple here), keeps its
    shard (`shard_model`), runs one short warm-up generation and then the timed one on the engine's
    contiguous cache (`Engine.generate`, greedy, no EOS). `device` "cpu" runs gloo, "cuda" NCCL with
    rank r on CUDA device r. `record`: each step's seconds in the collectives (`TPResult.allreduce_s`).
    `vocab_parallel`: the embedding and the LM head split by vocabulary rows (`shard_model`), else whole
    on every rank. The ranks must produce the same tokens (they hold the same logits); a divergence raises."""
    shard_spec(spec, world)  # refused by name before anything is spawned
    if not isinstance(vocab_parallel, bool):
        raise ValueError(f"vocab_parallel: must be true or false, got {vocab_parallel!r}")
    check_buildable(spec)
    torch_dtype(dtype)
    get_backend(attention)
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() != 2:
            raise ValueError(f"prompts: expected a (B, T) tensor of token ids, got shape {tuple(prompts.shape)}")
        prompts = prompts.tolist()
    prompts = [[int(t) for t in p] for p in prompts]
    if not prompts or not all(prompts):
        raise ValueError("prompts: expected at least one non-empty prompt")
    bad = [t for p in prompts for t in p if not 0 <= t < spec.vocab_size]
    if bad:
        raise ValueError(f"prompts: token ids {bad[:5]} are outside the vocabulary of {spec.vocab_size}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: must be a positive integer, got {max_new_tokens!r}")
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > spec.max_positions:
        raise ValueError(f"max_new_tokens: {longest} prompt + {max_new_tokens} new tokens exceed the model's "
                         f"max_positions={spec.max_positions}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: must be 'cpu' or 'cuda', got {device!r}")
    backend = "nccl" if device == "cuda" else "gloo"
    results = run_ranks(world, _tp_generate_rank, spec, prompts, max_new_tokens, seed, dtype, device, attention,
                        record, backend, vocab_parallel, backend=backend, threads_per_rank=threads_per_rank,
                        timeout_s=timeout_s)
    for r, res in enumerate(results[1:], start=1):
        if res.tokens != results[0].tokens:
            raise RuntimeError(f"tp_generate: rank {r}'s tokens differ from rank 0's (the ranks left lockstep)")
    return results[0]


__all__ = ["COLLECTIVE_OPS", "DEFAULT_TIMEOUT_S", "REDUCE_OPS", "TPResult", "run_ranks", "shard_model", "shard_spec",
           "tp_generate", "vocab_rows"]
