"""paged_attention against float64 attention gathered token by token through the block table.

Block tables are random permutations of the pool (non-contiguous), some blocks are shared between
sequences (a common prefix), unused table entries hold -1, and free pool blocks hold NaN, so a read
through a wrong or unused entry poisons the output. With a sliding window or chunk, the entries of the
blocks wholly before the query's first visible key hold -1 too (as after a sliding-window cache frees
them), so a read of a key the query cannot see fails.
"""

from __future__ import annotations

import pytest
import torch
from attention_fp64 import (
    DTYPES,
    HAS_CUDA,
    TOLERANCE,
    first_key,
    nan_like,
    paged_fp64,
    rel_error,
)

pytest.importorskip("triton")
import kernels.decode as fd  # noqa: E402
from kernels import paged_attention  # noqa: E402


@pytest.fixture(autouse=True)
def poisoned_partials(monkeypatch):
    def alloc(B, H, S, D, device):
        return (torch.full((B, H, S, D), float("nan"), device=device),
                torch.full((B, H, S), float("nan"), device=device))

    monkeypatch.setattr(fd, "_alloc_partials", alloc)


def _paged_inputs(device, lens, H, H_kv, D, P, *, share_prefix=0, extra_cols=1, dtype=torch.float32, seed=0,
                  window=None, chunk=None):
    """A pool with 3 spare blocks beyond what the sequences need; sequence 1 shares the first
    `share_prefix` blocks of sequence 0 (both must be long enough)."""
    g = torch.Generator().manual_seed(seed)
    B = len(lens)
    need = [-(-n // P) for n in lens]  # blocks per sequence
    own = [n - (share_prefix if b == 1 else 0) for b, n in enumerate(need)]
    N_blk = sum(own) + 3
    perm = torch.randperm(N_blk, generator=g).tolist()
    M_blk = max(need) + extra_cols
    table = torch.full((B, M_blk), -1, dtype=torch.int32)  # (B, M_blk)
    nxt = 0
    for b in range(B):
        start = 0
        if b == 1 and share_prefix:
            table[1, :share_prefix] = table[0, :share_prefix]
            start = share_prefix
        for j in range(start, need[b]):
            table[b, j] = perm[nxt]
            nxt += 1
    for b, n in enumerate(lens):
        table[b, : first_key(n - 1, window, chunk) // P] = -1  # blocks the query cannot see: freed
    kb = torch.full((N_blk, P, H_kv, D), float("nan"))  # (N_blk, P, H_kv, D); free blocks stay NaN
    vb = torch.full((N_blk, P, H_kv, D), float("nan"))
    used = table[table >= 0].unique().long()
    kb[used] = torch.randn(len(used), P, H_kv, D, generator=g)
    vb[used] = torch.randn(len(used), P, H_kv, D, generator=g)
    q = torch.randn(B, H, D, generator=g)  # (B, H, D)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return (q.to(device, dtype), kb.to(device, dtype), vb.to(device, dtype), table.to(device), seq_lens.to(device))


def _check(q, kb, vb, table, seq_lens, num_splits, sm_scale=None, **features):
    out = nan_like(q)
    got = paged_attention(q, kb, vb, table, seq_lens, num_splits, sm_scale=sm_scale, out=out, **features)
    assert got is out and got.dtype == q.dtype and got.shape == q.shape
    err = rel_error(got, paged_fp64(q, kb, vb, table.cpu(), seq_lens.cpu(), sm_scale, **features))
    assert err < TOLERANCE[q.dtype], err


def _sinks(device, H, dtype=torch.float32, seed=5):
    return torch.randn(H, generator=torch.Generator().manual_seed(seed)).to(device, dtype)


@pytest.mark.parametrize("P", [16, 8, 32, 12], ids=lambda p: f"P{p}")
@pytest.mark.parametrize("num_splits", [1, 3])
def test_block_sizes_and_splits(device, P, num_splits):
    """P equal to, below (a tile spans blocks), above (a block spans tiles) and not a power of two."""
    _check(*_paged_inputs(device, [1, 7, 63, 129], 8, 2, 64, P), num_splits)


@pytest.mark.parametrize("num_splits", [1, 4, None], ids=lambda s: f"splits{s}")
def test_shared_prefix_blocks(device, num_splits):
    """Sequences 0 and 1 share their first three blocks, as after a forked prompt or in beam search."""
    _check(*_paged_inputs(device, [70, 55, 20], 8, 1, 64, 16, share_prefix=3), num_splits)


@pytest.mark.parametrize("H, H_kv", [(4, 4), (8, 2), (8, 1), (16, 2)], ids=["mha", "gqa4", "mqa8", "gqa8"])
def test_gqa(device, H, H_kv):
    _check(*_paged_inputs(device, [9, 40], H, H_kv, 64, 16), 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D", [64, 128, 48], ids=lambda d: f"D{d}")
def test_head_dims_and_dtypes(device, dtype, D):
    _check(*_paged_inputs(device, [5, 33], 4, 2, D, 16, dtype=dtype), 2)


def test_custom_scale_and_wide_table(device):
    """Many unused (-1) columns past each sequence's blocks; a custom softmax scale."""
    _check(*_paged_inputs(device, [17, 3], 4, 2, 64, 8, extra_cols=6), 2, sm_scale=0.5)


FEATURES = [dict(window=20), dict(window=1, sinks=True), dict(chunk=16), dict(chunk=24, sinks=True), dict(sinks=True)]


@pytest.mark.parametrize("features", FEATURES, ids=lambda f: "".join(f"{k}{v}" for k, v in f.items()))
@pytest.mark.parametrize("P, num_splits", [(16, 1), (12, 3)], ids=["P16-splits1", "P12-splits3"])
def test_window_chunk_sinks(device, features, P, num_splits):
    """Windows and chunks through the block table (blocks before them freed), with and without sinks."""
    features = dict(features)
    sinks = _sinks(device, 8) if features.pop("sinks", False) else None
    _check(*_paged_inputs(device, [1, 7, 63, 129], 8, 2, 32, P, **features), num_splits, sinks=sinks, **features)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_window_sinks_shared_prefix_dtypes(device, dtype):
    """A shared prefix that only the shorter sequence's window still sees; sinks in another dtype."""
    _check(*_paged_inputs(device, [100, 40, 9], 8, 1, 64, 16, share_prefix=2, window=36, dtype=dtype), 2,
           window=36, sinks=_sinks(device, 8, torch.bfloat16))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("features", [dict(window=128), dict(chunk=1024)], ids=["window", "chunk"])
@pytest.mark.parametrize("num_splits", [1, 6, None])
def test_gpu_local_and_sinks(device, dtype, features, num_splits):
    """gpt-oss-like attention (64 / 8 heads, D=64) with sinks through a block table of 16-token blocks."""
    _check(*_paged_inputs(device, [3000, 1000, 1, 77], 64, 8, 64, 16, share_prefix=10, dtype=dtype, **features),
           num_splits, sinks=_sinks(device, 64), **features)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("num_splits", [1, 6, None])
def test_gpu_realistic_shape(device, dtype, num_splits):
    """Autotuned configs on a Llama-3-8B-like shape (32 query / 8 KV heads, D=128), block size 16."""
    _check(*_paged_inputs(device, [3000, 1000, 1, 77], 32, 8, 128, 16, share_prefix=10, dtype=dtype), num_splits)
