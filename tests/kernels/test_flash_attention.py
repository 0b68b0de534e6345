"""flash_attention against float64 attention: causal and not, GQA/MQA, ragged and chunked lengths, head dims,
sliding windows, chunked attention and sinks.

With a window or chunk, the keys that no query may see are NaN, so a tile the kernel should have skipped
(or an element it should not have loaded) poisons the output.
"""

from __future__ import annotations

import pytest
import torch
from attention_fp64 import DTYPES, HAS_CUDA, TOLERANCE, attention_fp64, first_key, nan_like, rel_error

pytest.importorskip("triton")
from kernels import flash_attention  # noqa: E402


def _inputs(device, B, H, H_kv, T_q, T_kv, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T_q, D, generator=g).to(device, dtype)  # (B, H, T_q, D)
    k = torch.randn(B, H_kv, T_kv, D, generator=g).to(device, dtype)  # (B, H_kv, T_kv, D)
    v = torch.randn(B, H_kv, T_kv, D, generator=g).to(device, dtype)
    return q, k, v


def _check(q, k, v, causal, sm_scale=None, out=None, **features):
    out = nan_like(q) if out is None else out
    got = flash_attention(q, k, v, causal, sm_scale, out=out, **features)
    assert got is out and got.dtype == q.dtype and got.shape == q.shape
    err = rel_error(got, attention_fp64(q, k, v, causal, sm_scale, **features))
    assert err < TOLERANCE[q.dtype], err


def _local_inputs(device, B, H, H_kv, T_q, T_kv, D, dtype=torch.float32, *, window=None, chunk=None, seed=0):
    q, k, v = _inputs(device, B, H, H_kv, T_q, T_kv, D, dtype, seed)
    unseen = first_key(T_kv - T_q, window, chunk)  # the first query (position T_kv - T_q) sees from here on
    k[:, :, :unseen] = float("nan")
    v[:, :, :unseen] = float("nan")
    return q, k, v


def _sinks(device, H, scale=1.0, dtype=torch.float32, seed=5):
    return (torch.randn(H, generator=torch.Generator().manual_seed(seed)) * scale).to(device, dtype)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T", [1, 7, 63, 129])
def test_ragged_lengths(device, causal, T):
    _check(*_inputs(device, 2, 4, 1, T, T, 64), causal)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("H, H_kv", [(4, 4), (8, 2), (8, 1), (16, 2)], ids=["mha", "gqa4", "mqa8", "gqa8"])
def test_gqa(device, causal, H, H_kv):
    _check(*_inputs(device, 1, H, H_kv, 40, 40, 64), causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D", [64, 128, 48, 8], ids=lambda d: f"D{d}")
def test_head_dims_and_dtypes(device, dtype, D):
    """64 and 128 natively; 48 and 8 are padded on chip to 64 and 16."""
    _check(*_inputs(device, 1, 4, 2, 33, 33, D, dtype), True)


@pytest.mark.parametrize("T_q, T_kv", [(1, 129), (7, 63), (33, 100), (63, 64), (16, 16)])
def test_bottom_right_causal_chunk(device, T_q, T_kv):
    """A chunk of T_q new queries against T_kv keys: the queries are the last T_q positions."""
    _check(*_inputs(device, 2, 4, 2, T_q, T_kv, 64), True)


@pytest.mark.parametrize("T_q, T_kv", [(129, 40), (5, 77)])
def test_non_causal_unequal_lengths(device, T_q, T_kv):
    _check(*_inputs(device, 1, 4, 2, T_q, T_kv, 64), False)


def test_chunks_reassemble_full_prefill(device):
    """Prefill in two chunks (bottom-right causal) equals one causal prefill."""
    q, k, v = _inputs(device, 1, 4, 2, 50, 50, 64)
    full = flash_attention(q, k, v, True)
    first = flash_attention(q[:, :, :20], k[:, :, :20], v[:, :, :20], True)
    second = flash_attention(q[:, :, 20:], k, v, True)
    assert rel_error(torch.cat([first, second], dim=2), full) < 1e-6


def test_strided_inputs_and_output(device):
    """Views from a (B, T, H, D) projection, a custom scale, and a strided `out` are all honoured."""
    B, T, H, H_kv, D = 2, 37, 4, 2, 64
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(B, T, H + 2 * H_kv, D, generator=g).to(device)  # (B, T, H + 2 H_kv, D)
    q, k, v = (x.transpose(1, 2) for x in qkv.split([H, H_kv, H_kv], dim=2))  # (B, heads, T, D) views
    out = torch.full((B, T, H, D), float("nan"), device=device).transpose(1, 2)  # (B, H, T, D) view
    _check(q, k, v, True, sm_scale=0.3, out=out)


def test_large_scores_stay_finite(device):
    """Scores around 1e3 exercise the running-max rescaling (a naive exp would overflow)."""
    q, k, v = _inputs(device, 1, 2, 1, 45, 45, 64)
    _check(q * 30, k * 30, v, True)


LOCAL = [dict(window=1), dict(window=7), dict(window=40), dict(chunk=5), dict(chunk=16), dict(chunk=64)]


@pytest.mark.parametrize("local", LOCAL, ids=lambda f: "".join(f"{k}{v}" for k, v in f.items()))
@pytest.mark.parametrize("T_q, T_kv", [(45, 45), (9, 130)])
def test_window_and_chunk(device, local, T_q, T_kv):
    """Windows of one key, within a tile and wider than a tile; chunks smaller and larger than a tile,
    for a prefill and a chunk of queries over a longer cache (whose unseen keys are NaN)."""
    _check(*_local_inputs(device, 2, 4, 2, T_q, T_kv, 32, **local), True, **local)


@pytest.mark.parametrize("features", [dict(), dict(window=12), dict(chunk=16)], ids=["full", "window", "chunk"])
@pytest.mark.parametrize("sink_scale", [1.0, 30.0], ids=["sinks", "large_sinks"])
def test_sinks(device, features, sink_scale):
    """Sinks of either sign; large ones (+-30, beyond every score) must join the running max."""
    q, k, v = _local_inputs(device, 1, 4, 1, 20, 70, 32, **features)
    _check(q, k, v, True, sinks=_sinks(device, 4, sink_scale), **features)


@pytest.mark.parametrize("sink_dtype", [torch.float16, torch.float64], ids=str)
def test_sinks_non_causal_any_float_dtype(device, sink_dtype):
    q, k, v = _inputs(device, 2, 8, 2, 17, 40, 64)
    _check(q, k, v, False, sinks=_sinks(device, 8, 2.0, sink_dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H, H_kv, D", [(8, 1, 48), (4, 4, 64)], ids=["mqa8_D48", "mha_D64"])
def test_features_dtypes_and_groups(device, dtype, H, H_kv, D):
    """Window + sinks and chunk + sinks together, in each dtype, for MQA with a padded head dim and MHA."""
    for local in (dict(window=20), dict(chunk=24)):
        q, k, v = _local_inputs(device, 1, H, H_kv, 33, 60, D, dtype, **local)
        _check(q, k, v, True, sinks=_sinks(device, H), **local)


def test_window_wider_than_context_is_causal(device):
    """A window or chunk that covers every key changes nothing."""
    q, k, v = _inputs(device, 1, 4, 2, 30, 50, 64)
    full = flash_attention(q, k, v, True)
    assert rel_error(flash_attention(q, k, v, True, window=50), full) < 1e-6
    assert rel_error(flash_attention(q, k, v, True, chunk=64), full) < 1e-6


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("features", [dict(window=128), dict(chunk=512)], ids=["window", "chunk"])
def test_gpu_local_and_sinks(device, dtype, features):
    """Autotuned configs on gpt-oss-like (64 / 8 heads, D=64) attention with sinks, ragged length."""
    q, k, v = _local_inputs(device, 2, 64, 8, 700, 1500, 64, dtype, **features)
    _check(q, k, v, True, sinks=_sinks(device, 64, 2.0), **features)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_realistic_shape(device, dtype, causal):
    """Autotuned configs on a Llama-3-8B-like shape (32 query / 8 KV heads, D=128), ragged length."""
    _check(*_inputs(device, 2, 32, 8, 1000, 1000, 128, dtype), causal)
