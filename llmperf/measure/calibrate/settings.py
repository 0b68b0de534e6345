"""What `calibrate` measures: the sizes, dtypes, budgets and switches of one calibration run.

`Settings.for_device` gives the full run for a CPU or a CUDA device, `Settings.tiny` a seconds-long
one for tests (its figures are meaningless, its code paths are not). Settings that cannot be measured
are refused before anything runs, naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
VECTOR_KINDS = ("elementwise", "norm", "embedding")
MiB = 1 << 20

Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What to measure. `for_device` gives the full run; `tiny()` a seconds-long one for tests."""

    device: str = "cpu"
    dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16")
    stream_sizes: tuple[int, ...] = tuple(s * 1024 for s in (64, 256, 1024, 4096, 16384, 65536, 262144))
    gemm_k: int = 4096
    gemm_n: int = 8192
    gemm_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    gemm_call_budget_s: float = 0.8  # stop growing rows before a call predicted to take longer (slow dtypes)
    # a dtype's GEMM sweep stops before a point predicted to take it past this many seconds (`sweep_fits`)
    gemm_sweep_budget_s: float = 30.0
    # the vector-operator prefills of a dtype stop before one predicted to take them past this (`sweep_fits`)
    vector_budget_s: float = 20.0
    # CPU: either sweep of a dtype without a native kernel here (`engine.paths.native_kernel`: bf16 on an
    # AVX2-only CPU, fp16 on most) stops at this instead. Such a GEMM converts every element, ~10x fp32's
    # time: on an AVX2 EPYC the bf16 sweep took 66 s and its vector prefills 75 s, of a 330 s calibration
    emulated_budget_s: float = 8.0
    gemm_rounds: int = 3  # CPU: interleaved rounds of the memory-bound GEMM points (`measure_gemm`)
    attn_heads: int = 16
    attn_head_dim: int = 128
    # query heads per KV head (`attn_heads` query heads, attn_heads / attn_group KV heads): attention is
    # timed as the engine's SDPA backend runs grouped-query attention (decode: the group folded into the
    # query axis, read once per KV head; prefill: `enable_gqa`). 4: Llama 3 8B, Mistral 7B
    attn_group: int = 4
    # CPU: the decode points are timed again at these groups over the same KV heads and cache (the same
    # bytes, FLOPs x group): with `attn_group` they give the additive decode model `decode_attention`
    # (`fit_decode_groups`; on the 2-core EPYC a byte cost 1.5x more at 8 query heads per KV head than
    # at 1). () skips it (CUDA: `attention_eff` prices GPU attention by shape)
    attn_decode_groups: tuple[int, ...] = (1,)
    attn_decode: tuple[tuple[int, int], ...] = ((1, 4096), (4, 4096))  # (batch, context)
    attn_prefill: tuple[int, ...] = (256, 1024)  # causal square, batch 1
    reps: int = 5
    allreduce: bool = True
    allreduce_sizes: tuple[int, ...] = (4096, 65536, MiB, 16 * MiB)
    step_overhead: bool = True
    op_overhead: bool = True  # per engine operator and attention backend, from a tiny model's generation
    op_overhead_tokens: int = 32  # tokens the tiny model generates for it
    # CPU: the width of `dispatch_spec`'s model, whose recorded decode gives the dispatch of the operators
    # that read no weights (0: they keep the tiny model's cold figure, as the GEMMs do)
    dispatch_hidden: int = 2048
    threads: int | None = None  # CPU threads (torch.set_num_threads) while measuring; None: torch's default
    # CPU: the bytes a GEMM's weights / a decode's KV cache cycle through (copies used in turn), so every
    # call streams from DRAM as in a real model's step. None: `working_set_for` decides (0: one copy).
    working_set_bytes: int | None = None
    # (batch, prompt) prefills of VECTOR_SPEC whose recorded operators give `op_e_memory`; () skips it
    vector_prefills: tuple[tuple[int, int], ...] = ((1, 128), (4, 512), (16, 1024), (32, 1024))
    vector_reps: int = 3
    # CPU: (N, K) weights whose engine GEMM is timed at the decode rows (`cpu_gemm_sizes`; with the sweep's
    # gemm_n x gemm_k they give `gemm_e_memory`): 4, 16 and 64 MiB fp32 projections and a 256 MiB
    # wide-and-short lm_head; () skips it
    gemm_sizes: tuple[tuple[int, int], ...] = ((1024, 1024), (4096, 1024), (4096, 4096), (65536, 1024))
    gemm_size_rows: tuple[int, ...] = (1, 2, 4, 8, 16)  # with both sides of each GEMM path edge up to 16
    gemm_size_budget_s: float = 6.0  # a dtype's size sweep stops before a point predicted past this (both
    # fp32 and bf16, every point, took 4.4 s on a 2-core AVX-512 EPYC)
    # CPU: the prefill rows the same weights are timed at after the decode rows (a prefill's projections,
    # a routed expert's share of a prompt's tokens); past the largest, a GEMM keeps the FLOP rate its
    # weight reached there. A point predicted past `gemm_size_prefill_budget_s` is skipped, noted
    gemm_size_prefill_rows: tuple[int, ...] = (64, 256, 1024)
    gemm_size_prefill_budget_s: float = 8.0

    def __post_init__(self) -> None:
        """Settings that cannot be measured are refused before anything runs, naming the field."""
        if self.attn_group < 1 or self.attn_heads % self.attn_group:
            raise ValueError(f"attn_group: must divide attn_heads={self.attn_heads}, got {self.attn_group!r}")
        if any(not isinstance(g, int) or isinstance(g, bool) or g < 1 for g in self.attn_decode_groups):
            raise ValueError(f"attn_decode_groups: must be integers >= 1, got {self.attn_decode_groups!r}")
        if self.dispatch_hidden < 0 or self.dispatch_hidden % 64:
            raise ValueError("dispatch_hidden: must be 0 or a multiple of 64 (heads of 64), "
                             f"got {self.dispatch_hidden!r}")
        if self.gemm_rounds < 1:
            raise ValueError(f"gemm_rounds: must be >= 1, got {self.gemm_rounds!r}")
        if any(len(nk) != 2 or min(nk) < 1 for nk in self.gemm_sizes):
            raise ValueError(f"gemm_sizes: must be (N, K) pairs of positive sizes, got {self.gemm_sizes!r}")
        if any(r < 1 for r in self.gemm_size_rows):
            raise ValueError(f"gemm_size_rows: must be rows >= 1, got {self.gemm_size_rows!r}")
        if any(r < 1 for r in self.gemm_size_prefill_rows):
            raise ValueError(f"gemm_size_prefill_rows: must be rows >= 1, got {self.gemm_size_prefill_rows!r}")

    @property
    def decode_groups(self) -> tuple[int, ...]:
        """The groups decode attention is timed at: `attn_group` first, then `attn_decode_groups`."""
        return (self.attn_group, *dict.fromkeys(g for g in self.attn_decode_groups if g != self.attn_group))

    @classmethod
    def for_device(cls, device: str, **changes: Any) -> Settings:
        if device == "cuda":
            base = cls(device="cuda", stream_sizes=tuple(s * MiB for s in (1, 8, 32, 128, 512, 2048)),
                       gemm_k=8192, gemm_n=8192, gemm_rows=(1, 4, 16, 64, 256, 1024, 4096, 8192),
                       gemm_call_budget_s=1.0, gemm_sweep_budget_s=60.0, vector_budget_s=60.0,
                       emulated_budget_s=60.0, attn_heads=32, attn_decode=((1, 8192), (32, 8192)),
                       attn_prefill=(1024, 4096), allreduce_sizes=(4096, 65536, MiB, 16 * MiB, 256 * MiB),
                       attn_decode_groups=(),  # CUDA: the fused-attention shape model prices by shape
                       gemm_sizes=())  # CUDA: the GEMM shape model (`gemm_shapes`) prices by shape
        else:
            base = cls(device=device)
        from dataclasses import replace
        return replace(base, **changes)

    @classmethod
    def tiny(cls, **changes: Any) -> Settings:
        """Sizes small enough for a test (the figures are meaningless, the code paths are not)."""
        from dataclasses import replace
        base = cls(dtypes=("fp32", "bf16"), stream_sizes=(64 * 1024, 4 * MiB), gemm_k=256, gemm_n=512,
                   gemm_rows=(1, 8, 64), attn_heads=2, attn_head_dim=32, attn_group=2, attn_decode=((1, 256),),
                   attn_prefill=(64,), reps=3, allreduce=False, step_overhead=False, op_overhead_tokens=6,
                   working_set_bytes=0, vector_prefills=((1, 8), (2, 32)), vector_reps=2, dispatch_hidden=128,
                   gemm_sizes=((128, 128), (1024, 256)), gemm_size_rows=(1, 4), gemm_size_prefill_rows=(32,))
        return replace(base, **changes)
