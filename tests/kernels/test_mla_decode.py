"""mla_decode against float64 latent attention gathered token by token through the block table.

As in the paged tests: block tables are random permutations of the pool, some blocks are shared between
sequences, unused table entries hold -1, free pool blocks and the output hold NaN, and the split partials
are NaN-filled with one slot more than asked, so any read through a wrong entry, any unwritten element
and any partial read past `num_splits` fails the test. Shapes stay small for the interpreter; one test
runs DeepSeek-V3's real widths (R=512, Dr=64).
"""

from __future__ import annotations

import pytest
import torch
from attention_fp64 import DTYPES, HAS_CUDA, TOLERANCE, mla_fp64, nan_like, rel_error

pytest.importorskip("triton")
import kernels.decode as fd  # noqa: E402
import kernels.mla as mla  # noqa: E402
from kernels import mla_decode, mla_decode_reference  # noqa: E402


@pytest.fixture(autouse=True)
def poisoned_partials(monkeypatch):
    def alloc(B, H, S, D, device):
        o = torch.full((B, H, S + 1, D), float("nan"), device=device)[:, :, :S]
        lse = torch.full((B, H, S + 1), float("nan"), device=device)[:, :, :S]
        return o, lse

    monkeypatch.setattr(fd, "_alloc_partials", alloc)


def _mla_inputs(device, lens, H, R, Dr, P, *, share_prefix=0, extra_cols=1, dtype=torch.float32, seed=0):
    """A pool with 3 spare (NaN) blocks; sequence 1 shares the first `share_prefix` blocks of sequence 0."""
    g = torch.Generator().manual_seed(seed)
    B = len(lens)
    need = [-(-n // P) for n in lens]  # blocks per sequence
    own = [n - (share_prefix if b == 1 else 0) for b, n in enumerate(need)]
    N_blk = sum(own) + 3
    perm = torch.randperm(N_blk, generator=g).tolist()
    table = torch.full((B, max(need) + extra_cols), -1, dtype=torch.int32)  # (B, M_blk)
    nxt = 0
    for b in range(B):
        start = 0
        if b == 1 and share_prefix:
            table[1, :share_prefix] = table[0, :share_prefix]
            start = share_prefix
        for j in range(start, need[b]):
            table[b, j] = perm[nxt]
            nxt += 1
    blocks = torch.full((N_blk, P, R + Dr), float("nan"))  # (N_blk, P, R + Dr); free blocks stay NaN
    used = table[table >= 0].unique().long()
    blocks[used] = torch.randn(len(used), P, R + Dr, generator=g)
    q_latent = torch.randn(B, H, R, generator=g)  # (B, H, R)
    q_rope = torch.randn(B, H, Dr, generator=g)  # (B, H, Dr)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return (q_latent.to(device, dtype), q_rope.to(device, dtype), blocks.to(device, dtype), table.to(device),
            seq_lens.to(device))


def _check(q_latent, q_rope, blocks, table, seq_lens, num_splits, sm_scale=0.1):
    out = nan_like(q_latent)
    got = mla_decode(q_latent, q_rope, blocks, table, seq_lens, num_splits, sm_scale=sm_scale, out=out)
    assert got is out and got.dtype == q_latent.dtype and got.shape == q_latent.shape
    err = rel_error(got, mla_fp64(q_latent, q_rope, blocks, table.cpu(), seq_lens.cpu(), sm_scale))
    assert err < TOLERANCE[q_latent.dtype], err


@pytest.mark.parametrize("P", [16, 4, 12, 32], ids=lambda p: f"P{p}")
@pytest.mark.parametrize("num_splits", [1, 3])
def test_block_sizes_and_splits(device, P, num_splits):
    """Ragged lengths, crossing blocks; P equal to, below, above BLOCK_N, and not a power of two."""
    _check(*_mla_inputs(device, [1, 7, 33, 70], 4, 32, 16, P), num_splits)


@pytest.mark.parametrize("H", [1, 4, 16, 72], ids=lambda h: f"H{h}")
def test_head_counts(device, H):
    """One padded head tile (1, 4), one full tile (16), three tiles of 32 with a partial last one (72)."""
    _check(*_mla_inputs(device, [9, 40], H, 32, 16, 8), 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("R, Dr", [(64, 16), (48, 8), (32, 64)], ids=["R64", "R48-Dr8", "Dr64"])
def test_widths_and_dtypes(device, dtype, R, Dr):
    """Power-of-two widths, padded (masked) ones, and a rotary part as wide as the latent."""
    _check(*_mla_inputs(device, [5, 33], 8, R, Dr, 16, dtype=dtype), 2)


@pytest.mark.parametrize("num_splits", [1, 4, 16], ids=lambda s: f"splits{s}")
def test_shared_prefix_and_empty_splits(device, num_splits):
    """Sequences 0 and 1 share three blocks; 16 splits leave the short sequences empty splits."""
    _check(*_mla_inputs(device, [70, 55, 3], 8, 32, 16, 16, share_prefix=3, extra_cols=4), num_splits)


def test_contiguous_cache(device):
    """A contiguous (B, S_max, R + Dr) cache: one block of P = S_max per sequence, block table = row index.

    Positions past each length hold NaN, so a read beyond seq_lens poisons the output."""
    B, S_max, H, R, Dr = 3, 50, 4, 32, 16
    g = torch.Generator().manual_seed(1)
    lens = [50, 17, 1]
    cache = torch.randn(B, S_max, R + Dr, generator=g)  # (B, S_max, R + Dr)
    for b, n in enumerate(lens):
        cache[b, n:] = float("nan")
    table = torch.arange(B, dtype=torch.int32)[:, None]  # (B, 1)
    q_latent = torch.randn(B, H, R, generator=g)
    q_rope = torch.randn(B, H, Dr, generator=g)
    args = (q_latent, q_rope, cache, table, torch.tensor(lens, dtype=torch.int32))
    for num_splits in (1, 3):
        _check(*(t.to(device) for t in args), num_splits)


def test_strided_views(device):
    """q_latent and q_rope as the two parts of one (B, H, R + Dr) query, and the cache as a
    (N_blk, P, 1, R + Dr) tensor (FlashMLA's layout, one KV head) viewed without its head dim."""
    q_latent, q_rope, blocks, table, seq_lens = _mla_inputs(device, [20, 9], 8, 32, 16, 8)
    R = q_latent.shape[2]
    q = torch.cat([q_latent, q_rope], dim=-1)  # (B, H, R + Dr)
    flash_mla_cache = blocks[:, :, None, :].clone()  # (N_blk, P, 1, R + Dr)
    _check(q[..., :R], q[..., R:], flash_mla_cache[:, :, 0], table, seq_lens, 2, sm_scale=0.3)


def test_heuristic_splits(device, monkeypatch):
    """Without num_splits, one sequence on a small device is split (here 3 ways) and still exact."""
    seen = []
    alloc = fd._alloc_partials
    monkeypatch.setattr(mla, "device_num_sms", lambda device: 4)
    monkeypatch.setattr(fd, "_alloc_partials", lambda B, H, S, D, dev: seen.append(S) or alloc(B, H, S, D, dev))
    _check(*_mla_inputs(device, [600], 4, 32, 16, 16), None)
    assert seen == [3]


def test_unvalidated_launch_and_reference_agree(device):
    """validate=False skips the host reads and gives the same result; the torch reference agrees."""
    args = _mla_inputs(device, [3, 40], 4, 32, 16, 8)
    a = mla_decode(*args, 2, sm_scale=0.2)
    b = mla_decode(*args, 2, sm_scale=0.2, validate=False)
    assert rel_error(a, b) < 1e-6
    assert rel_error(a, mla_decode_reference(*args, sm_scale=0.2)) < TOLERANCE[torch.float32]


def test_deepseek_v3_widths(device):
    """DeepSeek-V3's latent (R=512) and rotary (Dr=64) widths, FlashMLA's block size 64, two splits."""
    _check(*_mla_inputs(device, [70, 9], 16, 512, 64, 64), 2, sm_scale=192**-0.5)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("H", [128, 16])
@pytest.mark.parametrize("num_splits", [1, 6, None])
def test_gpu_deepseek_v3(device, dtype, H, num_splits):
    """Autotuned configs on DeepSeek-V3 (all 128 heads, or 16 per GPU at TP 8), block size 64."""
    _check(*_mla_inputs(device, [3000, 1000, 1, 77], H, 512, 64, 64, share_prefix=10, dtype=dtype), num_splits,
           sm_scale=192**-0.5)
