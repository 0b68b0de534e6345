"""The torch references (naive and SDPA; prefill, decode, paged) against independent float64 attention.

These need only torch: they are the engine's non-Triton attention backends.
"""

from __future__ import annotations

import pytest
import torch
from attention_fp64 import TOLERANCE, attention_fp64, decode_fp64, mla_fp64, paged_fp64, rel_error

from kernels import (
    causal_mask,
    gather_paged_kv,
    gather_paged_latent,
    mla_decode_reference,
    naive_attention,
    naive_decode,
    paged_decode_reference,
    sdpa_attention,
    sdpa_decode,
)

PREFILL = [naive_attention, sdpa_attention]
DECODE = [naive_decode, sdpa_decode]
REF_DTYPES = [torch.float64, torch.float32, torch.float16]


def _prefill_inputs(B, H, H_kv, T_q, T_kv, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, h, t, D, generator=g).to(dtype) for h, t in ((H, T_q), (H_kv, T_kv), (H_kv, T_kv)))


def test_causal_mask_is_bottom_right():
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert torch.equal(causal_mask(3, 3), torch.ones(3, 3, dtype=torch.bool).tril())


@pytest.mark.parametrize("fn", PREFILL, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", REF_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("H, H_kv, T_q, T_kv", [(4, 4, 33, 33), (8, 2, 7, 63), (8, 1, 1, 129), (4, 2, 40, 17)])
def test_prefill_references(fn, dtype, causal, H, H_kv, T_q, T_kv):
    if causal and T_q > T_kv:
        pytest.skip("causal needs T_q <= T_kv")
    q, k, v = _prefill_inputs(2, H, H_kv, T_q, T_kv, 64, dtype)
    out = fn(q, k, v, causal, 0.2)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_error(out, attention_fp64(q, k, v, causal, 0.2)) < TOLERANCE[dtype]


def _decode_inputs(lens, H, H_kv, D, dtype, S_max=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    B, S_max = len(lens), S_max or max(lens)
    q = torch.randn(B, H, D, generator=g).to(dtype)
    k = torch.randn(B, H_kv, S_max, D, generator=g).to(dtype)
    v = torch.randn(B, H_kv, S_max, D, generator=g).to(dtype)
    return q, k, v, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("fn", DECODE, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", REF_DTYPES, ids=str)
@pytest.mark.parametrize("H, H_kv", [(4, 4), (8, 2), (8, 1)])
def test_decode_references(fn, dtype, H, H_kv):
    q, k, v, seq_lens = _decode_inputs([1, 7, 63, 129], H, H_kv, 64, dtype, S_max=130)
    out = fn(q, k, v, seq_lens)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_error(out, decode_fp64(q, k, v, seq_lens)) < TOLERANCE[dtype]


FEATURES = [dict(window=5), dict(chunk=16), dict(sinks=True), dict(window=20, sinks=True), dict(chunk=7, sinks=True)]
FEATURE_IDS = ["window", "chunk", "sinks", "window+sinks", "chunk+sinks"]


def _features(features, H, dtype):
    features = dict(features)
    if features.pop("sinks", False):
        features["sinks"] = torch.randn(H, generator=torch.Generator().manual_seed(9)).to(dtype)
    return features


@pytest.mark.parametrize("features", FEATURES, ids=FEATURE_IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=str)
def test_references_window_chunk_sinks(features, dtype):
    """Prefill (a chunk of queries over a longer context), decode and paged; SDPA where it has no sinks."""
    features = _features(features, 8, dtype)
    q, k, v = _prefill_inputs(2, 8, 2, 20, 45, 32, dtype)
    want = attention_fp64(q, k, v, True, 0.3, **features)
    for fn in PREFILL if "sinks" not in features else [naive_attention]:
        assert rel_error(fn(q, k, v, True, 0.3, **features), want) < TOLERANCE[dtype], fn.__name__
    seq_lens = torch.tensor([45, 17], dtype=torch.int32)
    want = decode_fp64(q[:, :, 0], k, v, seq_lens, **features)
    for fn in DECODE if "sinks" not in features else [naive_decode]:
        assert rel_error(fn(q[:, :, 0], k, v, seq_lens, **features), want) < TOLERANCE[dtype], fn.__name__


def test_causal_mask_window_and_chunk():
    assert causal_mask(2, 5, window=2).tolist() == [[False, False, True, True, False],
                                                    [False, False, False, True, True]]
    assert causal_mask(3, 6, chunk=4).tolist() == [[True, True, True, True, False, False],
                                                   [False, False, False, False, True, False],
                                                   [False, False, False, False, True, True]]


def test_decode_equals_prefill_of_last_token():
    """Decode of the last token equals the last row of causal prefill over the same keys."""
    q, k, v = _prefill_inputs(1, 4, 2, 20, 20, 64, torch.float64)
    full = naive_attention(q, k, v, True)
    dec = naive_decode(q[:, :, -1], k, v, torch.tensor([20], dtype=torch.int32))
    assert rel_error(dec, full[:, :, -1]) < 1e-12


@pytest.mark.parametrize("impl", ["sdpa", "naive"])
@pytest.mark.parametrize("features", FEATURES[:2], ids=FEATURE_IDS[:2])
def test_paged_reference_window_chunk(impl, features):
    g = torch.Generator().manual_seed(3)
    kb, vb = torch.randn(2, 12, 8, 2, 32, generator=g, dtype=torch.float64)
    table = torch.tensor([[5, 2, 9, 0], [5, 2, 11, -1]], dtype=torch.int32)
    seq_lens = torch.tensor([30, 20], dtype=torch.int32)
    q = torch.randn(2, 8, 32, generator=g, dtype=torch.float64)
    out = paged_decode_reference(q, kb, vb, table, seq_lens, impl=impl, **features)
    assert rel_error(out, paged_fp64(q, kb, vb, table, seq_lens, **features)) < 1e-10


@pytest.mark.parametrize("impl", ["sdpa", "naive"])
@pytest.mark.parametrize("dtype", REF_DTYPES, ids=str)
def test_paged_reference(impl, dtype):
    g = torch.Generator().manual_seed(3)
    N_blk, P, H, H_kv, D = 12, 8, 8, 2, 64
    kb = torch.randn(N_blk, P, H_kv, D, generator=g).to(dtype)
    vb = torch.randn(N_blk, P, H_kv, D, generator=g).to(dtype)
    table = torch.tensor([[5, 2, 9, 0], [5, 2, 11, -1], [7, -1, -1, -1]], dtype=torch.int32)  # shares 5, 2
    seq_lens = torch.tensor([30, 20, 1], dtype=torch.int32)
    q = torch.randn(3, H, D, generator=g).to(dtype)
    out = paged_decode_reference(q, kb, vb, table, seq_lens, impl=impl)
    assert rel_error(out, paged_fp64(q, kb, vb, table, seq_lens)) < TOLERANCE[dtype]


def test_gather_paged_kv_layout():
    N_blk, P, H_kv, D = 4, 2, 3, 5
    kb = torch.arange(N_blk * P * H_kv * D, dtype=torch.float32).view(N_blk, P, H_kv, D)
    table = torch.tensor([[3, 1]], dtype=torch.int32)
    k, v = gather_paged_kv(kb, kb, table)
    assert k.shape == (1, H_kv, 2 * P, D)
    for t in range(2 * P):
        assert torch.equal(k[0, :, t], kb[table[0, t // P], t % P])


def _mla_pool(g, dtype, N_blk=12, P=8, R=32, Dr=16):
    blocks = torch.randn(N_blk, P, R + Dr, generator=g).to(dtype)  # (N_blk, P, R + Dr)
    table = torch.tensor([[5, 2, 9, 0], [5, 2, 11, -1], [7, -1, -1, -1]], dtype=torch.int32)  # shares 5, 2
    return blocks, table, torch.tensor([30, 20, 1], dtype=torch.int32)


@pytest.mark.parametrize("dtype", REF_DTYPES, ids=str)
def test_mla_reference(dtype):
    g = torch.Generator().manual_seed(4)
    blocks, table, seq_lens = _mla_pool(g, dtype)
    q_latent = torch.randn(3, 8, 32, generator=g).to(dtype)
    q_rope = torch.randn(3, 8, 16, generator=g).to(dtype)
    out = mla_decode_reference(q_latent, q_rope, blocks, table, seq_lens, sm_scale=0.15)
    assert out.shape == q_latent.shape and out.dtype == dtype
    assert rel_error(out, mla_fp64(q_latent, q_rope, blocks, table, seq_lens, 0.15)) < TOLERANCE[dtype]


def test_mla_absorbed_equals_unabsorbed():
    """The absorbed form equals DeepSeek-V3's attention as transformers computes it (`expand_kv`:
    kv_b_proj up-projects each cached latent to per-head K_nope and V; keys [K_nope, k_R], queries
    [q_nope, q_rope], softmax * scaling, P V), once q_nope is multiplied by W_UK and the latent output
    by W_UV (DeepSeek-V2, arXiv:2405.04434, section 2.1.3)."""
    g = torch.Generator().manual_seed(5)
    H, R, Dr, dn, dv = 4, 32, 16, 24, 20
    blocks, table, seq_lens = _mla_pool(g, torch.float64, R=R, Dr=Dr)
    kv_b = torch.randn(H * (dn + dv), R, generator=g, dtype=torch.float64)  # kv_b_proj.weight
    q_nope = torch.randn(3, H, dn, generator=g, dtype=torch.float64)  # (B, H, dn)
    q_rope = torch.randn(3, H, Dr, generator=g, dtype=torch.float64)  # (B, H, Dr)
    scale = (dn + Dr) ** -0.5

    w = kv_b.view(H, dn + dv, R)
    w_uk, w_uv = w[:, :dn], w[:, dn:]  # (H, dn, R), (H, dv, R)
    q_latent = torch.einsum("bhd,hdr->bhr", q_nope, w_uk)  # (B, H, R)
    o_latent = mla_decode_reference(q_latent, q_rope, blocks, table, seq_lens, sm_scale=scale)  # (B, H, R)
    absorbed = torch.einsum("bhr,hvr->bhv", o_latent, w_uv)  # (B, H, dv)

    cache = gather_paged_latent(blocks, table)  # (B, S, R + Dr)
    for b, n in enumerate(seq_lens.tolist()):
        c, k_rot = cache[b, :n, :R], cache[b, :n, R:]  # (n, R), (n, Dr)
        kv = (c @ kv_b.T).view(n, H, dn + dv).transpose(0, 1)  # (H, n, dn + dv)
        k = torch.cat([kv[..., :dn], k_rot.expand(H, n, Dr)], dim=-1)  # (H, n, dn + Dr)
        q = torch.cat([q_nope[b], q_rope[b]], dim=-1)[:, None, :]  # (H, 1, dn + Dr)
        p = torch.softmax(q @ k.transpose(1, 2) * scale, dim=-1)  # (H, 1, n)
        unabsorbed = (p @ kv[..., dn:])[:, 0]  # (H, dv)
        assert rel_error(absorbed[b], unabsorbed) < 1e-12


def test_gather_paged_latent_layout():
    blocks = torch.arange(5 * 2 * 3, dtype=torch.float32).view(5, 2, 3)  # (N_blk, P, R + Dr)
    table = torch.tensor([[4, 1], [0, -1]], dtype=torch.int32)
    cache = gather_paged_latent(blocks, table)
    assert cache.shape == (2, 4, 3)
    for t in range(4):
        assert torch.equal(cache[0, t], blocks[table[0, t // 2], t % 2])


def test_import_without_triton():
    """`import kernels` and the references work without triton; the kernels say what is missing."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys; sys.modules['triton'] = None\n"  # makes `import triton` fail
        "import torch, kernels\n"
        "q = torch.randn(1, 2, 3, 4); k = torch.randn(1, 1, 3, 4)\n"
        "assert kernels.sdpa_attention(q, k, k).shape == q.shape\n"
        "assert kernels.num_kv_splits(1, 8, 4096, 132) > 1\n"
        "try:\n    kernels.flash_decoding\nexcept ImportError as e:\n    print(e)\n"
        "try:\n    kernels.mla_decode\nexcept ImportError as e:\n    print(e)\n"
    )
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "kernels.flash_decoding needs triton" in res.stdout
    assert "kernels.mla_decode needs triton" in res.stdout
