"""flash_decoding against float64 attention: ragged lengths, GQA/MQA, splits (forced and heuristic), head dims.

Stage 1's split partials are poisoned with NaN too (`poisoned_partials`), so a slot that stage 1 forgets
to write, or that stage 2 reads past `num_splits`, fails the test. With a sliding window or chunk, the
cached keys before the query's first visible one are NaN as well: decode must not read them.
"""

from __future__ import annotations

import pytest
import torch
from attention_fp64 import (
    DTYPES,
    HAS_CUDA,
    TOLERANCE,
    decode_fp64,
    first_key,
    nan_like,
    rel_error,
)

pytest.importorskip("triton")
import kernels.decode as fd  # noqa: E402
from kernels import flash_decoding  # noqa: E402


@pytest.fixture(autouse=True)
def poisoned_partials(monkeypatch):
    """Split partials allocated NaN-filled (one slot more than asked, which must never be read)."""

    def alloc(B, H, S, D, device):
        o = torch.full((B, H, S + 1, D), float("nan"), device=device)[:, :, :S]
        lse = torch.full((B, H, S + 1), float("nan"), device=device)[:, :, :S]
        return o, lse

    monkeypatch.setattr(fd, "_alloc_partials", alloc)


def _inputs(device, lens, H, H_kv, D, S_max=None, dtype=torch.float32, seed=0, *, window=None, chunk=None):
    g = torch.Generator().manual_seed(seed)
    B = len(lens)
    S_max = S_max or max(lens)
    q = torch.randn(B, H, D, generator=g).to(device, dtype)  # (B, H, D)
    k = torch.randn(B, H_kv, S_max, D, generator=g).to(device, dtype)  # (B, H_kv, S_max, D)
    v = torch.randn(B, H_kv, S_max, D, generator=g).to(device, dtype)
    # Garbage past each length: NaN there would poison the output if the kernel read it.
    # and before the first key the query (at position n - 1) sees through a window or chunk.
    for b, n in enumerate(lens):
        unseen = first_key(n - 1, window, chunk)
        for cache in (k, v):
            cache[b, :, n:] = float("nan")
            cache[b, :, :unseen] = float("nan")
    return q, k, v, torch.tensor(lens, dtype=torch.int32, device=device)


def _check(q, k, v, seq_lens, num_splits, sm_scale=None, out=None, **features):
    out = nan_like(q) if out is None else out
    got = flash_decoding(q, k, v, seq_lens, num_splits, sm_scale=sm_scale, out=out, **features)
    assert got is out and got.dtype == q.dtype and got.shape == q.shape
    err = rel_error(got, decode_fp64(q, k, v, seq_lens.cpu(), sm_scale, **features))
    assert err < TOLERANCE[q.dtype], err


def _sinks(device, H, scale=1.0, dtype=torch.float32, seed=5):
    return (torch.randn(H, generator=torch.Generator().manual_seed(seed)) * scale).to(device, dtype)


RAGGED = [1, 7, 63, 129]


@pytest.mark.parametrize("num_splits", [1, 2, 5, 16, None], ids=lambda s: f"splits{s}")
def test_ragged_lengths_and_splits(device, num_splits):
    """16 splits leaves short sequences with empty splits; None uses the heuristic."""
    _check(*_inputs(device, RAGGED, 8, 2, 64, S_max=140), num_splits)


@pytest.mark.parametrize("H, H_kv", [(4, 4), (8, 2), (8, 1), (16, 2), (32, 1)],
                         ids=["mha", "gqa4", "mqa8", "gqa8", "mqa32"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_gqa(device, H, H_kv, num_splits):
    """Each KV head serves its G query heads in one tile (G=32 fills two 16-row dot tiles)."""
    _check(*_inputs(device, [9, 70], H, H_kv, 64), num_splits)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D", [64, 128, 48], ids=lambda d: f"D{d}")
def test_head_dims_and_dtypes(device, dtype, D):
    _check(*_inputs(device, [5, 63], 8, 2, D, dtype=dtype), 2)


def test_strided_cache_and_custom_scale(device):
    """A cache stored (B, S_max, H_kv, D) and viewed as (B, H_kv, S_max, D), q a slice of a wider tensor."""
    B, S_max, H, H_kv, D = 3, 50, 8, 2, 64
    g = torch.Generator().manual_seed(2)
    kv = torch.randn(B, S_max, 2, H_kv, D, generator=g).to(device)  # (B, S_max, 2, H_kv, D)
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)  # (B, H_kv, S_max, D) views
    q = torch.randn(B, H + 3, D, generator=g).to(device)[:, 3:]  # (B, H, D) view
    seq_lens = torch.tensor([50, 17, 33], dtype=torch.int32, device=device)
    _check(q, k, v, seq_lens, 3, sm_scale=0.2)


def test_unvalidated_launch_matches(device):
    """validate=False skips the host read of seq_lens; the result is the same."""
    q, k, v, seq_lens = _inputs(device, [3, 40], 4, 2, 64)
    a = flash_decoding(q, k, v, seq_lens, 2)
    b = flash_decoding(q, k, v, seq_lens, 2, validate=False)
    assert rel_error(a, b) < 1e-6


LOCAL = [dict(window=1), dict(window=20), dict(window=100), dict(chunk=16), dict(chunk=50)]


@pytest.mark.parametrize("local", LOCAL, ids=lambda f: "".join(f"{k}{v}" for k, v in f.items()))
@pytest.mark.parametrize("num_splits", [1, 3, None], ids=lambda s: f"splits{s}")
def test_window_and_chunk(device, local, num_splits):
    """Ragged lengths shorter and longer than the window or chunk, split over the visible keys only."""
    _check(*_inputs(device, RAGGED, 8, 2, 32, S_max=140, **local), num_splits, **local)


@pytest.mark.parametrize("features", [dict(), dict(window=30), dict(chunk=40)], ids=["full", "window", "chunk"])
@pytest.mark.parametrize("num_splits", [1, 2, 16], ids=lambda s: f"splits{s}")
def test_sinks_added_once(device, features, num_splits):
    """Sinks in the one-split kernel and in the combine (16 splits leave empty ones)."""
    _check(*_inputs(device, RAGGED, 8, 2, 32, S_max=140, **features), num_splits, sinks=_sinks(device, 8),
           **features)


@pytest.mark.parametrize("sink_scale", [30.0, -30.0])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_large_sinks(device, sink_scale, num_splits):
    """A sink far above every score dominates the denominator; far below, it vanishes."""
    _check(*_inputs(device, [5, 90], 4, 1, 32), num_splits, sinks=_sinks(device, 4, sink_scale, torch.bfloat16))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H, H_kv, D", [(32, 1, 48), (4, 4, 64)], ids=["mqa32_D48", "mha_D64"])
def test_features_dtypes_and_groups(device, dtype, H, H_kv, D):
    for local in (dict(window=24), dict(chunk=32)):
        _check(*_inputs(device, [9, 70], H, H_kv, D, dtype=dtype, **local), 3, sinks=_sinks(device, H), **local)


def test_heuristic_splits_the_visible_keys(device, monkeypatch):
    """The split heuristic sees at most the window or chunk, not the whole sequence."""
    seen = []
    alloc = fd._alloc_partials
    monkeypatch.setattr(fd, "device_num_sms", lambda device: 4)
    monkeypatch.setattr(fd, "_alloc_partials", lambda B, H, S, D, dev: seen.append(S) or alloc(B, H, S, D, dev))
    for local in (dict(window=600), dict(window=100), dict(chunk=1000)):
        _check(*_inputs(device, [900], 4, 1, 32, **local), None, **local)
    assert seen == [3, 4]  # window 600: 3 splits; window 100: one (no partials); chunk 1000: 900 keys, 4


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("features", [dict(window=128), dict(chunk=1024)], ids=["window", "chunk"])
@pytest.mark.parametrize("num_splits", [1, 5, None])
def test_gpu_local_and_sinks(device, dtype, features, num_splits):
    """gpt-oss-like attention (64 / 8 heads, D=64) with sinks on the autotuned configs, ragged lengths."""
    _check(*_inputs(device, [1, 1000, 4097, 130], 64, 8, 64, dtype=dtype, **features), num_splits,
           sinks=_sinks(device, 64, 2.0), **features)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("num_splits", [1, 7, None])
def test_gpu_realistic_shape(device, dtype, num_splits):
    """Autotuned configs on a Llama-3-8B-like shape (32 query / 8 KV heads, D=128), ragged lengths."""
    _check(*_inputs(device, [1, 1000, 4097, 2500], 32, 8, 128, dtype=dtype), num_splits)


def test_heuristic_splits_long_sequence(device, monkeypatch):
    """Without num_splits, one short batch on a small device is split (here 3 ways) and still exact."""
    seen = []
    alloc = fd._alloc_partials
    monkeypatch.setattr(fd, "device_num_sms", lambda device: 4)
    monkeypatch.setattr(fd, "_alloc_partials", lambda B, H, S, D, dev: seen.append(S) or alloc(B, H, S, D, dev))
    _check(*_inputs(device, [600], 4, 1, 64), None)
    assert seen == [fd.num_kv_splits(1, 1, 600, 4)] and seen[0] == 3
