"""Every ValueError path of the kernel wrappers and the references: the message names the argument.

The checks run before any launch, so these tests are cheap; kernels and references share them, so each
bad input is tried on both.
"""

from __future__ import annotations

import re

import pytest
import torch

import kernels
from kernels import (
    mla_decode_reference,
    naive_attention,
    naive_decode,
    num_kv_splits,
    paged_decode_reference,
    sdpa_attention,
    sdpa_decode,
)

triton = pytest.importorskip("triton")
from kernels import flash_attention, flash_decoding, mla_decode, paged_attention  # noqa: E402

B, H, H_kv, T, D = 2, 4, 2, 8, 16
TRITON_FNS = (flash_attention, flash_decoding, paged_attention, mla_decode)
#: where the Triton kernels run: on a GPU (no interpreter) their inputs must be there, or the device
#: check answers before the check a test is about (the 2026-11-27 H100 session: 36 such failures)
KERNEL_DEVICE = torch.device("cuda") if torch.cuda.is_available() else None


def _here(fn, args, message=None):
    """`args` (and the expected `message`) for `fn`: on a GPU, a Triton kernel's CPU tensors move to it;
    meta tensors stay, and a message naming q's device names the GPU's."""
    if KERNEL_DEVICE is None or fn not in TRITON_FNS:
        return args if message is None else (args, message)
    moved = {k: v.to(KERNEL_DEVICE) if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v
             for k, v in args.items()}
    if message is None:
        return moved
    first = next(v for v in moved.values() if isinstance(v, torch.Tensor))
    return moved, message.replace("q is on cpu", f"q is on {first.device}")


def _raises(fn, args, message, **extra):
    """`fn(**args, **extra)` on the kernels' device raises ValueError with `message` at the start."""
    args, message = _here(fn, dict(args, **extra), message)
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        fn(**args)
PREFILL_FNS = [flash_attention, naive_attention, sdpa_attention]
DECODE_FNS = [flash_decoding, naive_decode, sdpa_decode]
PAGED_FNS = [paged_attention, paged_decode_reference]


def _prefill(**change):
    args = dict(
        q=torch.randn(B, H, T, D), k=torch.randn(B, H_kv, T, D), v=torch.randn(B, H_kv, T, D), causal=True
    )
    args.update(change)
    return args


def _decode(**change):
    args = dict(
        q=torch.randn(B, H, D),
        k_cache=torch.randn(B, H_kv, T, D),
        v_cache=torch.randn(B, H_kv, T, D),
        seq_lens=torch.tensor([T, 3], dtype=torch.int32),
    )
    args.update(change)
    return args


N_BLK, P, M_BLK = 6, 4, 3


def _paged(**change):
    args = dict(
        q=torch.randn(B, H, D),
        key_blocks=torch.randn(N_BLK, P, H_kv, D),
        value_blocks=torch.randn(N_BLK, P, H_kv, D),
        block_tables=torch.tensor([[0, 1, 2], [3, -1, -1]], dtype=torch.int32),
        seq_lens=torch.tensor([10, 4], dtype=torch.int32),
    )
    args.update(change)
    return args


# Window, chunk and sinks: the same checks for every wrapper and reference.
FEATURE_BAD = {
    "window zero": (dict(window=0), "window: must be a positive integer (keys each query sees"),
    "window bool": (dict(window=True), "window: must be a positive integer"),
    "window float": (dict(window=4.0), "window: must be a positive integer"),
    "chunk negative": (dict(chunk=-8), ("chunk: must be a positive integer (tokens per attention chunk) or None, "
                                        "got -8")),
    "window and chunk": (dict(window=4, chunk=8), ("window, chunk: sliding-window and chunked attention exclude "
                                                   "each other, pass one (got window=4, chunk=8)")),
    "sinks list": (dict(sinks=[0.0] * H), "sinks: expected a torch.Tensor (H,)"),
    "sinks 2-d": (dict(sinks=torch.zeros(1, H)), "sinks: expected 1 dims (H,)"),
    "sinks int": (dict(sinks=torch.zeros(H, dtype=torch.int32)), "sinks: dtype must be"),
    "sinks shape": (dict(sinks=torch.zeros(H + 1)), (f"sinks: expected one logit per query head, shape ({H},), "
                                                     f"got ({H + 1},)")),
    "sinks on meta": (dict(sinks=torch.zeros(H, device="meta")), "sinks: on meta, but q is on cpu"),
}

PREFILL_BAD = {
    "q not a tensor": (_prefill(q=[1.0]), "q: expected a torch.Tensor"),
    "q 3-d": (_prefill(q=torch.randn(B, H, T)), "q: expected 4 dims"),
    "k 3-d": (_prefill(k=torch.randn(B, T, D)), "k: expected 4 dims"),
    "q int": (_prefill(q=torch.ones(B, H, T, D, dtype=torch.int32)), "q: dtype must be"),
    "k other dtype": (_prefill(k=torch.randn(B, H_kv, T, D).half()), "k: dtype torch.float16 differs"),
    "v on meta": (_prefill(v=torch.empty(B, H_kv, T, D, device="meta")), "v: on meta"),
    "k batch": (_prefill(k=torch.randn(3, H_kv, T, D)), "k: batch 3 differs"),
    "v shape": (_prefill(v=torch.randn(B, H_kv, T + 1, D)), "v: shape"),
    "k head dim": (_prefill(k=torch.randn(B, H_kv, T, 8), v=torch.randn(B, H_kv, T, 8)), "k: head dim 8 differs"),
    "head dim too wide": (_prefill(q=torch.randn(1, 1, 1, 300), k=torch.randn(1, 1, 1, 300),
                                   v=torch.randn(1, 1, 1, 300)), "q: head dim must be in [1, 256]"),
    "heads": (_prefill(k=torch.randn(B, 3, T, D), v=torch.randn(B, 3, T, D)), "k: 3 KV heads do not divide"),
    "causal q longer": (_prefill(q=torch.randn(B, H, T + 1, D)), "q: causal attention aligns"),
    "no queries": (_prefill(q=torch.randn(B, H, 0, D)), "q: needs at least one"),
    "no keys": (_prefill(k=torch.randn(B, H_kv, 0, D), v=torch.randn(B, H_kv, 0, D), causal=False),
                "k: needs at least one key"),
    "causal not bool": (_prefill(causal=1), "causal: must be a bool"),
    "sm_scale": (_prefill(sm_scale=-1.0), "sm_scale: must be a positive number"),
    "window not causal": (_prefill(causal=False, window=4), "window: sliding-window attention is causal"),
    "chunk not causal": (_prefill(causal=False, chunk=4), "chunk: chunked attention is causal"),
    **{name: (_prefill(**change), message) for name, (change, message) in FEATURE_BAD.items()},
}


@pytest.mark.parametrize("fn", PREFILL_FNS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("case", list(PREFILL_BAD), ids=str)
def test_prefill_bad_input(fn, case):
    _raises(fn, *PREFILL_BAD[case])


DECODE_BAD = {
    "q 4-d": (_decode(q=torch.randn(B, H, 1, D)), "q: expected 3 dims"),
    "k_cache 3-d": (_decode(k_cache=torch.randn(B, T, D)), "k_cache: expected 4 dims"),
    "v_cache dtype": (_decode(v_cache=torch.randn(B, H_kv, T, D).half()), "v_cache: dtype"),
    "k_cache batch": (_decode(k_cache=torch.randn(1, H_kv, T, D)), "k_cache: batch 1 differs"),
    "v_cache shape": (_decode(v_cache=torch.randn(B, H_kv, T + 1, D)), "v_cache: shape"),
    "heads": (_decode(k_cache=torch.randn(B, 3, T, D), v_cache=torch.randn(B, 3, T, D)), "k_cache: 3 KV heads"),
    "seq_lens int64": (_decode(seq_lens=torch.tensor([T, 3])), "seq_lens: dtype must be torch.int32"),
    "seq_lens 2-d": (_decode(seq_lens=torch.ones(B, 1, dtype=torch.int32)), "seq_lens: expected 1 dims"),
    "seq_lens length": (_decode(seq_lens=torch.tensor([T], dtype=torch.int32)), "seq_lens: length 1 differs"),
    "seq_lens zero": (_decode(seq_lens=torch.tensor([T, 0], dtype=torch.int32)), "seq_lens: length 0 of sequence 1"),
    "seq_lens too long": (_decode(seq_lens=torch.tensor([3, T + 1], dtype=torch.int32)),
                          f"seq_lens: length {T + 1} exceeds the cache's S_max={T} for sequence 1"),
    "seq_lens on meta": (_decode(seq_lens=torch.empty(B, dtype=torch.int32, device="meta")), "seq_lens: on meta"),
    "sm_scale": (_decode(sm_scale=0.0), "sm_scale: must be a positive number"),
    **{name: (_decode(**change), message) for name, (change, message) in FEATURE_BAD.items()},
}


@pytest.mark.parametrize("fn", DECODE_FNS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("case", list(DECODE_BAD), ids=str)
def test_decode_bad_input(fn, case):
    _raises(fn, *DECODE_BAD[case])


PAGED_BAD = {
    "key_blocks 3-d": (_paged(key_blocks=torch.randn(N_BLK, P, D)), "key_blocks: expected 4 dims"),
    "value_blocks shape": (_paged(value_blocks=torch.randn(N_BLK + 1, P, H_kv, D)), "value_blocks: shape"),
    "key_blocks dtype": (_paged(key_blocks=torch.randn(N_BLK, P, H_kv, D).half()), "key_blocks: dtype"),
    "heads": (_paged(key_blocks=torch.randn(N_BLK, P, 3, D), value_blocks=torch.randn(N_BLK, P, 3, D)),
              "key_blocks: 3 KV heads"),
    "head dim": (_paged(key_blocks=torch.randn(N_BLK, P, H_kv, 8), value_blocks=torch.randn(N_BLK, P, H_kv, 8)),
                 "key_blocks: head dim 8 differs"),
    "table int64": (_paged(block_tables=torch.zeros(B, M_BLK, dtype=torch.int64)), "block_tables: dtype"),
    "table rows": (_paged(block_tables=torch.zeros(1, M_BLK, dtype=torch.int32)), "block_tables: 1 rows differ"),
    "table empty": (_paged(block_tables=torch.zeros(B, 0, dtype=torch.int32)), "block_tables: needs at least one"),
    "block out of range": (_paged(block_tables=torch.tensor([[0, 1, 6], [3, -1, -1]], dtype=torch.int32)),
                           "block_tables: entry 2 of sequence 0 is block 6, outside [0, num_blocks=6)"),
    "negative block in use": (_paged(seq_lens=torch.tensor([10, 5], dtype=torch.int32)),
                              "block_tables: entry 1 of sequence 1 is block -1"),
    "seq_lens too long": (_paged(seq_lens=torch.tensor([13, 4], dtype=torch.int32)),
                          "seq_lens: length 13 exceeds the cache's max_blocks*block_size=12 for sequence 0"),
    "seq_lens length": (_paged(seq_lens=torch.tensor([4], dtype=torch.int32)), "seq_lens: length 1 differs"),
    "block in the window": (_paged(block_tables=torch.tensor([[-1, -1, 2], [3, -1, -1]], dtype=torch.int32),
                                   window=3), "block_tables: entry 1 of sequence 0 is block -1"),
    **{name: (_paged(**change), message) for name, (change, message) in FEATURE_BAD.items()},
}


@pytest.mark.parametrize("fn", PAGED_FNS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("case", list(PAGED_BAD), ids=str)
def test_paged_bad_input(fn, case):
    _raises(fn, *PAGED_BAD[case])


@pytest.mark.parametrize("fn, args", [(flash_decoding, _decode()), (paged_attention, _paged())],
                         ids=["flash_decoding", "paged_attention"])
@pytest.mark.parametrize("bad", [0, -2, 2.5, True, 70000])
def test_num_splits_bad(fn, args, bad):
    _raises(fn, args, "num_splits: must be an integer", num_splits=bad)


@pytest.mark.parametrize("fn, args", [(sdpa_attention, _prefill()), (sdpa_decode, _decode()),
                                      (paged_decode_reference, _paged())],
                         ids=["sdpa_attention", "sdpa_decode", "paged_decode_reference"])
def test_sdpa_refuses_sinks(fn, args):
    with pytest.raises(ValueError, match="^sinks: torch SDPA has no attention sinks"):
        fn(**args, sinks=torch.zeros(H))


@pytest.mark.parametrize("fn", PAGED_FNS, ids=lambda f: f.__name__)
def test_paged_blocks_before_the_window_may_be_freed(fn):
    """Table entries before the first block a query sees are never read, so -1 there is accepted."""
    table = torch.tensor([[-1, 1, 2], [3, -1, -1]], dtype=torch.int32)  # sequence 0 sees keys 6..9: blocks 1, 2
    args = _paged(block_tables=table, window=4)
    if fn is paged_decode_reference:
        args["impl"] = "naive"
    assert torch.isfinite(fn(**_here(fn, args))).all()


def test_paged_reference_impl_bad():
    with pytest.raises(ValueError, match="^impl: must be"):
        paged_decode_reference(**_paged(), impl="flash")


@pytest.mark.parametrize("fn, args", [(flash_attention, _prefill()), (flash_decoding, _decode()),
                                      (paged_attention, _paged())], ids=["prefill", "decode", "paged"])
class TestKernelOnly:
    """Inputs the references accept but the Triton kernels do not."""

    def test_float64(self, fn, args):
        args = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in args.items()}
        with pytest.raises(ValueError, match="^q: the Triton kernels take float16, bfloat16 or float32"):
            fn(**args)

    def test_cpu_without_interpreter(self, fn, args, monkeypatch):
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="^q: the Triton kernels need CUDA tensors"):
            fn(**args)

    def test_head_dim_not_contiguous(self, fn, args):
        name = next(iter(args))
        args = dict(args, q=args[name].transpose(-1, -2).contiguous().transpose(-1, -2))
        _raises(fn, args, "q: the last (head) dim must be contiguous")

    def test_out_mismatch(self, fn, args):
        _raises(fn, args, "out: must match q", out=torch.empty(1, dtype=args["q"].dtype))


@pytest.mark.parametrize("arg", ["batch", "num_kv_heads", "seq_len", "num_sms"])
@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_num_kv_splits_bad(arg, bad):
    good = dict(batch=1, num_kv_heads=8, seq_len=4096, num_sms=132)
    with pytest.raises(ValueError, match=f"^{arg}: must be a positive integer"):
        num_kv_splits(**dict(good, **{arg: bad}))


def test_lazy_triton_import_message():
    """Unknown names raise AttributeError (the Triton exports resolve lazily)."""
    with pytest.raises(AttributeError):
        kernels.no_such_kernel  # noqa: B018



R, DR = 16, 8


def _mla(**change):
    args = dict(
        q_latent=torch.randn(B, H, R),
        q_rope=torch.randn(B, H, DR),
        latent_blocks=torch.randn(N_BLK, P, R + DR),
        block_tables=torch.tensor([[0, 1, 2], [3, -1, -1]], dtype=torch.int32),
        seq_lens=torch.tensor([10, 4], dtype=torch.int32),
        sm_scale=0.1,
    )
    args.update(change)
    return args


MLA_FNS = [mla_decode, mla_decode_reference]
MLA_BAD = {
    "q_latent not a tensor": (_mla(q_latent=None), "q_latent: expected a torch.Tensor"),
    "q_latent 4-d": (_mla(q_latent=torch.randn(B, H, 1, R)), "q_latent: expected 3 dims (B, H, R)"),
    "q_latent int": (_mla(q_latent=torch.ones(B, H, R, dtype=torch.int32)), "q_latent: dtype must be"),
    "q_latent no heads": (_mla(q_latent=torch.randn(B, 0, R), q_rope=torch.randn(B, 0, DR)),
                          "q_latent: needs at least one sequence and one head"),
    "latent too wide": (_mla(q_latent=torch.randn(B, H, 2048), latent_blocks=torch.randn(N_BLK, P, 2048 + DR)),
                        "q_latent: latent dim (kv_lora_rank) must be in [1, 1024], got 2048"),
    "q_rope dtype": (_mla(q_rope=torch.randn(B, H, DR).half()),
                     "q_rope: dtype torch.float16 differs from q_latent's torch.float32"),
    "q_rope heads": (_mla(q_rope=torch.randn(B, H + 1, DR)), "q_rope: batch and heads (2, 5) differ from q_latent's"),
    "q_rope 2-d": (_mla(q_rope=torch.randn(B, H)), "q_rope: expected 3 dims (B, H, Dr)"),
    "blocks 4-d": (_mla(latent_blocks=torch.randn(N_BLK, P, 1, R + DR)),
                   "latent_blocks: expected 3 dims (num_blocks, block_size, R + Dr)"),
    "blocks dtype": (_mla(latent_blocks=torch.randn(N_BLK, P, R + DR).double()), "latent_blocks: dtype torch.float64"),
    "blocks width": (_mla(latent_blocks=torch.randn(N_BLK, P, R)),
                     f"latent_blocks: width {R} differs from q_latent's R + q_rope's Dr = {R} + {DR}"),
    "blocks empty": (_mla(latent_blocks=torch.randn(0, P, R + DR)), "latent_blocks: needs at least one block"),
    "blocks on meta": (_mla(latent_blocks=torch.empty(N_BLK, P, R + DR, device="meta")), "latent_blocks: on meta"),
    "table rows": (_mla(block_tables=torch.zeros(1, M_BLK, dtype=torch.int32)),
                   "block_tables: 1 rows differ from q_latent's batch 2"),
    "table int64": (_mla(block_tables=torch.zeros(B, M_BLK, dtype=torch.int64)), "block_tables: dtype"),
    "block out of range": (_mla(block_tables=torch.tensor([[0, 1, 6], [3, -1, -1]], dtype=torch.int32)),
                           "block_tables: entry 2 of sequence 0 is block 6, outside [0, num_blocks=6)"),
    "negative block in use": (_mla(seq_lens=torch.tensor([10, 5], dtype=torch.int32)),
                              "block_tables: entry 1 of sequence 1 is block -1"),
    "seq_lens too long": (_mla(seq_lens=torch.tensor([13, 4], dtype=torch.int32)),
                          "seq_lens: length 13 exceeds the cache's max_blocks*block_size=12 for sequence 0"),
    "seq_lens zero": (_mla(seq_lens=torch.tensor([10, 0], dtype=torch.int32)), "seq_lens: length 0 of sequence 1"),
    "seq_lens length": (_mla(seq_lens=torch.tensor([4], dtype=torch.int32)),
                        "seq_lens: length 1 differs from q_latent's batch 2"),
    "sm_scale None": (_mla(sm_scale=None), "sm_scale: must be a positive number"),
    "sm_scale negative": (_mla(sm_scale=-0.5), "sm_scale: must be a positive number"),
}


@pytest.mark.parametrize("fn", MLA_FNS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("case", list(MLA_BAD), ids=str)
def test_mla_bad_input(fn, case):
    _raises(fn, *MLA_BAD[case])


@pytest.mark.parametrize("fn", MLA_FNS, ids=lambda f: f.__name__)
def test_mla_needs_sm_scale(fn):
    """The softmax scale is the model's (not R + Dr's inverse square root): it has no default."""
    args = _mla()
    del args["sm_scale"]
    with pytest.raises(TypeError, match="sm_scale"):
        fn(**args)


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, 70000])
def test_mla_num_splits_bad(bad):
    _raises(mla_decode, _mla(), "num_splits: must be an integer", num_splits=bad)


class TestMLAKernelOnly:
    """Inputs the MLA reference accepts but the Triton kernel does not."""

    def test_float64(self):
        args = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                for k, v in _mla().items()}
        with pytest.raises(ValueError, match="^q_latent: the Triton kernels take float16, bfloat16 or float32"):
            mla_decode(**args)

    def test_cpu_without_interpreter(self, monkeypatch):
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="^q_latent: the Triton kernels need CUDA tensors"):
            mla_decode(**_mla())

    @pytest.mark.parametrize("name", ["q_latent", "q_rope", "latent_blocks"])
    def test_last_dim_not_contiguous(self, name):
        t = _mla()[name]
        args = _mla(**{name: t.transpose(-1, -2).contiguous().transpose(-1, -2)})
        _raises(mla_decode, args, f"{name}: the last (head) dim must be contiguous")

    def test_out_mismatch(self):
        _raises(mla_decode, _mla(), "out: must match q_latent", out=torch.empty(B, H, R + DR))


def test_autotuning_can_be_cut_to_one_config_that_fits_every_dtype(monkeypatch):
    """LLMPERF_TRITON_AUTOTUNE=0 (the GPU tests) keeps one config per kernel: the one named as fitting
    every dtype and head dim (fp32 at D=256 for prefill, the narrowest tiles for decode and MLA)."""
    from kernels import decode, mla, prefill
    from kernels._common import tuning_configs

    monkeypatch.delenv("LLMPERF_TRITON_AUTOTUNE", raising=False)
    assert tuning_configs(prefill.CUDA_CONFIGS, prefill.FALLBACK) == prefill.CUDA_CONFIGS
    monkeypatch.setenv("LLMPERF_TRITON_AUTOTUNE", "0")
    assert tuning_configs(prefill.CUDA_CONFIGS, prefill.FALLBACK) == [(64, 32, 8, 2)]
    assert tuning_configs(decode.CUDA_CONFIGS, decode.FALLBACK) == [(32, 4, 4)]
    assert tuning_configs(mla.CUDA_CONFIGS, mla.FALLBACK) == [(16, 8, 3)]
