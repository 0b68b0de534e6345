"""Independent float64 attention, written as plainly as possible, for the kernel and reference tests.

Each function loops over sequences and repeats K/V heads explicitly (no shared code with
`kernels.reference`), so a bug in the references cannot hide the same bug in the kernels.
Letters and layouts as in `kernels`: q (B, H, T_q, D), k/v (B, H_kv, T_kv, D); decode q (B, H, D);
latent attention q_latent (B, H, R), q_rope (B, H, Dr), latent_blocks (N_blk, P, R + Dr).
"""

from __future__ import annotations

import torch

# Relative error ||out - ref|| / ||ref|| the kernels and references must beat.
TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float64: 1e-10}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double().cpu()
    ref = ref.double().cpu()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), "output holds NaN/inf (an element was not written?)"
    return float((out - ref).norm() / ref.norm())


def _one(q, k, v, causal: bool, scale: float, window=None, chunk=None, sinks=None) -> torch.Tensor:
    """q (H, T_q, D); k, v (H, T_kv, D), same H: softmax(q k^T * scale) v with a bottom-right causal mask.

    Query i sits at position p = i + T_kv - T_q. A sliding `window` W hides keys j <= p - W; a `chunk`
    C hides keys with j // C != p // C. `sinks` (H,) is one more logit per head, dropped after the
    softmax. Each row reads only the keys it sees, so hidden keys may hold anything (NaN included)."""
    T_q, T_kv = q.shape[1], k.shape[1]
    rows = []
    for i in range(T_q):
        p = i + T_kv - T_q
        seen = [j for j in range(T_kv) if not ((causal and j > p) or (window is not None and j <= p - window)
                                               or (chunk is not None and j // chunk != p // chunk))]
        s = q[:, i : i + 1] @ k[:, seen].transpose(1, 2) * scale  # (H, 1, n)
        if sinks is not None:
            s = torch.cat([s, sinks.detach().double().cpu()[:, None, None]], dim=-1)  # (H, 1, n + 1)
        prob = torch.softmax(s, dim=-1)[..., : len(seen)]  # the sink's share is dropped
        rows.append(prob @ v[:, seen])  # (H, 1, D)
    return torch.cat(rows, dim=1)


def attention_fp64(q, k, v, causal: bool, sm_scale: float | None = None, *, window=None, chunk=None,
                   sinks=None) -> torch.Tensor:
    q, k, v = (t.detach().double().cpu() for t in (q, k, v))
    B, H, T_q, D = q.shape
    G = H // k.shape[1]
    scale = D**-0.5 if sm_scale is None else sm_scale
    return torch.stack([
        _one(q[b], k[b].repeat_interleave(G, 0), v[b].repeat_interleave(G, 0), causal, scale, window, chunk, sinks)
        for b in range(B)
    ])


def decode_fp64(q, k_cache, v_cache, seq_lens, sm_scale: float | None = None, *, window=None, chunk=None,
                sinks=None) -> torch.Tensor:
    """q (B, H, D); caches (B, H_kv, S_max, D): sequence b's query sits at position seq_lens[b] - 1 and
    attends to its first seq_lens[b] positions (less what a window or chunk hides)."""
    q, k_cache, v_cache = (t.detach().double().cpu() for t in (q, k_cache, v_cache))
    B, H, D = q.shape
    G = H // k_cache.shape[1]
    scale = D**-0.5 if sm_scale is None else sm_scale
    outs = []
    for b, n in enumerate(seq_lens.tolist()):
        k = k_cache[b, :, :n].repeat_interleave(G, 0)
        v = v_cache[b, :, :n].repeat_interleave(G, 0)
        outs.append(_one(q[b][:, None, :], k, v, True, scale, window, chunk, sinks)[:, 0])
    return torch.stack(outs)


def paged_fp64(q, key_blocks, value_blocks, block_tables, seq_lens, sm_scale: float | None = None,
               **features) -> torch.Tensor:
    """Gather token by token through the block table, then `decode_fp64` (window, chunk, sinks passed on)."""
    P, H_kv, D = key_blocks.shape[1:]
    B = q.shape[0]
    S = int(seq_lens.max())
    k_cache = torch.zeros(B, H_kv, S, D, dtype=torch.float64)
    v_cache = torch.zeros(B, H_kv, S, D, dtype=torch.float64)
    for b, n in enumerate(seq_lens.tolist()):
        for t in range(n):
            blk = int(block_tables[b, t // P])
            k_cache[b, :, t] = key_blocks[blk, t % P].double().cpu()
            v_cache[b, :, t] = value_blocks[blk, t % P].double().cpu()
    return decode_fp64(q, k_cache, v_cache, seq_lens.cpu(), sm_scale, **features)


def first_key(pos: int, window=None, chunk=None) -> int:
    """The first key a query at position `pos` sees (for poisoning the keys no query may read)."""
    if window is not None:
        return max(pos - window + 1, 0)
    if chunk is not None:
        return pos // chunk * chunk
    return 0


def mla_fp64(q_latent, q_rope, latent_blocks, block_tables, seq_lens, sm_scale: float) -> torch.Tensor:
    """Absorbed latent attention as plain MQA: token by token through the block table, every head's key
    is [c, k_R] and its value c. Returns (B, H, R)."""
    q_latent, q_rope, latent_blocks = (t.detach().double().cpu() for t in (q_latent, q_rope, latent_blocks))
    B, H, R = q_latent.shape
    P = latent_blocks.shape[1]
    outs = []
    for b, n in enumerate(seq_lens.tolist()):
        rows = torch.stack([latent_blocks[int(block_tables[b, t // P]), t % P] for t in range(n)])  # (n, R + Dr)
        q = torch.cat([q_latent[b], q_rope[b]], dim=-1)[:, None, :]  # (H, 1, R + Dr)
        k = rows.expand(H, n, rows.shape[1])  # (H, n, R + Dr)
        v = rows[:, :R].expand(H, n, R)  # (H, n, R)
        outs.append(_one(q, k, v, False, sm_scale)[:, 0])
    return torch.stack(outs)


HAS_CUDA = torch.cuda.is_available()
# bf16 runs only on the GPU: Triton's interpreter has no bf16 (a bf16 tl.dot is silently wrong there).
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if HAS_CUDA else [])


def nan_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer poisoned with NaN, so an element the kernel forgets to write fails the test."""
    return torch.full_like(t, float("nan"), memory_format=torch.contiguous_format)
