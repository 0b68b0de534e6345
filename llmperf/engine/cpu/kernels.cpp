// llmperf: a weight-streaming GEMM for the few rows of a CPU decode step (x86-64, AVX-512).
//
//   y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]),  1 <= M <= 8 rows, w stored (out, in) = (N, K).
//
// Each thread takes a contiguous band of output rows of W and streams it once from memory, R rows
// of W at a time (R = 4 for up to 4 rows of x, else 3 in fp32 and 2 in bf16), against the M rows of x,
// which stay in L1/L2.
// Accumulation is fp32: bf16 weights multiply bf16 activations with AVX512_BF16's VDPBF16PS (pairs
// of products added into fp32 lanes), fp32 with FMA. The result is rounded to the storage dtype
// once (bf16: round to nearest even). While it reads a block of R weight rows it prefetches the next
// block's lines into L2 (R rows ahead in each stream): without that the stream ran 20-25% slower on
// the development Xeon, and a prefetch 1 KiB ahead within the row gained only 5-10% (measured
// 2026-11-23; see llmperf/engine/cpu/kernels.py for the figures and when the kernel is used).
//
// Built at first use by llmperf/engine/cpu/kernels.py with the host compiler and OpenMP (the process
// shares torch's OpenMP runtime: both name libgomp.so.1).
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <ctime>
#include <type_traits>

namespace {

inline float bf16_to_float(uint16_t h) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

// 16 lanes at a time: bf16 -> fp32 is exact (a shift); fp32 -> bf16 rounds to nearest even exactly as
// float_to_bf16 does (NaN stays NaN, quietened). Tails use masks (AVX-512 BW, no VL needed).
inline __m512 bf16x16_to_f32(__m256i raw) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline __m256i f32x16_to_bf16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

// Load / store / round 16 lanes of a storage type as fp32 (n < 16: the first n lanes, the rest 0).
struct LanesBF16 {
    static __m512 load(const uint16_t *p, int64_t n = 16) {
        if (n >= 16) return bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
        return bf16x16_to_f32(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(__mmask32((1u << n) - 1), p)));
    }
    static void store(uint16_t *p, __m512 v, int64_t n = 16) {
        const __m256i h = f32x16_to_bf16(v);
        if (n >= 16) _mm256_storeu_si256(reinterpret_cast<__m256i *>(p), h);
        else _mm512_mask_storeu_epi16(p, __mmask32((1u << n) - 1), _mm512_castsi256_si512(h));
    }
    static __m512 round(__m512 v) { return bf16x16_to_f32(f32x16_to_bf16(v)); }  // to bf16 and back
};

struct LanesF32 {
    static __m512 load(const float *p, int64_t n = 16) {
        return n >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), p);
    }
    static void store(float *p, __m512 v, int64_t n = 16) {
        if (n >= 16) _mm512_storeu_ps(p, v);
        else _mm512_mask_storeu_ps(p, __mmask16((1u << n) - 1), v);
    }
    static __m512 round(__m512 v) { return v; }
};

inline __m512 negate(__m512 v) {  // exact, -0 for +0 (as torch's negation)
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(int(0x80000000u))));
}

// exp(x) for 16 lanes, within 2 ulp of the exact value over the fp32 range (Cephes' polynomial after a
// two-part ln 2 reduction; _mm512_scalef_ps applies 2^n, so overflow gives inf). Below x = -87 it gives 0,
// never a denormal: denormal results cost microcode assists on Intel cores. Measured 2026-11-24, decode
// attention of 4 x 16 heads over 512 fp32 keys with a peaked softmax (queries scaled 30x): 640 us with
// denormals, 153 without (and with FTZ/DAZ in the kernel); ordinary inputs pay ~6% for the two guards.
inline __m512 exp16(__m512 x) {
    const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(89.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(normal, _mm512_scalef_ps(p, n));
}

struct BF16 {
    using T = uint16_t;
    using V = __m512bh;
    static constexpr int L = 32;  // elements per 64-byte line
    static V load(const T *p) { return (V)_mm512_loadu_si512(p); }
    static V load_tail(const T *p, int64_t n) { return (V)_mm512_maskz_loadu_epi16(__mmask32((1ull << n) - 1), p); }
    static __m512 fma(__m512 acc, V x, V w) { return _mm512_dpbf16_ps(acc, x, w); }
    static float to_float(T v) { return bf16_to_float(v); }
    static T from_float(float v) { return float_to_bf16(v); }
};

struct F32 {
    using T = float;
    using V = __m512;
    static constexpr int L = 16;
    static V load(const T *p) { return _mm512_loadu_ps(p); }
    static V load_tail(const T *p, int64_t n) { return _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), p); }
    static __m512 fma(__m512 acc, V x, V w) { return _mm512_fmadd_ps(x, w, acc); }
    static float to_float(T v) { return v; }
    static T from_float(float v) { return v; }
};

// Output rows [n0, n1) of W, R at a time ((n1 - n0) % R == 0).
template <class D, int M, int R>
void band(const typename D::T *x, const typename D::T *w, const typename D::T *b, typename D::T *y,
          int64_t N, int64_t K, int64_t n0, int64_t n1) {
    using V = typename D::V;
    const int64_t full = K / D::L * D::L;
    for (int64_t n = n0; n < n1; n += R) {
        __m512 acc[R][M];
        for (int r = 0; r < R; r++)
            for (int m = 0; m < M; m++) acc[r][m] = _mm512_setzero_ps();
        for (int64_t k = 0; k < full; k += D::L) {
            V wv[R];
            for (int r = 0; r < R; r++) {
                const typename D::T *p = w + (n + r) * K + k;
                wv[r] = D::load(p);
                _mm_prefetch(reinterpret_cast<const char *>(p + R * K), _MM_HINT_T1);  // the next block's line
            }
            for (int m = 0; m < M; m++) {
                V xv = D::load(x + m * K + k);
                for (int r = 0; r < R; r++) acc[r][m] = D::fma(acc[r][m], xv, wv[r]);
            }
        }
        if (full < K) {
            V wv[R];
            for (int r = 0; r < R; r++) wv[r] = D::load_tail(w + (n + r) * K + full, K - full);
            for (int m = 0; m < M; m++) {
                V xv = D::load_tail(x + m * K + full, K - full);
                for (int r = 0; r < R; r++) acc[r][m] = D::fma(acc[r][m], xv, wv[r]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int m = 0; m < M; m++) {
                float s = _mm512_reduce_add_ps(acc[r][m]);
                if (b) s += D::to_float(b[n + r]);
                y[m * N + n + r] = D::from_float(s);
            }
    }
}

template <class D, int M>
void rows(const typename D::T *x, const typename D::T *w, const typename D::T *b, typename D::T *y,
          int64_t N, int64_t K, int64_t n0, int64_t n1) {
    // R * M accumulators + R weight lines + 1 x line <= 32 registers. Past 4 rows, fp32 reads 3 weight
    // rows at a time (8 rows: 25.3 GB/s against 23.8 with 2; the FMA port is ~80% busy there), bf16 2
    // (18.5 GB/s with 3 against 19.4 with 2: VDPBF16PS does twice the products per line).
    constexpr int R = M <= 4 ? 4 : sizeof(typename D::T) == 4 ? 3 : 2;
    const int64_t split = n0 + (n1 - n0) / R * R;
    band<D, M, R>(x, w, b, y, N, K, n0, split);
    band<D, M, 1>(x, w, b, y, N, K, split, n1);
}

template <class D>
int gemm(const typename D::T *x, const typename D::T *w, const typename D::T *b, typename D::T *y,
         int64_t M, int64_t N, int64_t K, int threads) {
    using T = typename D::T;
    using Fn = void (*)(const T *, const T *, const T *, T *, int64_t, int64_t, int64_t, int64_t);
    static const Fn by_rows[9] = {nullptr, rows<D, 1>, rows<D, 2>, rows<D, 3>, rows<D, 4>,
                                  rows<D, 5>, rows<D, 6>, rows<D, 7>, rows<D, 8>};
    if (M < 1 || M > 8 || N < 1 || K < 1 || threads < 1) return 1;
    const Fn fn = by_rows[M];
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t chunk = ((N + nt - 1) / nt + 15) / 16 * 16;  // bands of whole cache lines of y
        const int64_t n0 = t * chunk, n1 = n0 + chunk < N ? n0 + chunk : N;
        if (n0 < n1) fn(x, w, b, y, N, K, n0, n1);
    }
    return 0;
}


// Rotary embedding of the first `heads` heads of each token (the "rotate half" layout), rounding where
// torch rounds in `x * cos + cat(-x2, x1) * sin`: each product and the sum are rounded to the storage
// dtype (compiled with -ffp-contract=off and explicit multiply / add intrinsics, so no product is fused
// into the add). The features past rotary_dim are copied. x: token t, head h, feature i at
// x[t * x_tok + h * d + i]; cos, sin (tokens, rd); out likewise with o_tok (tokens, heads, d). out may be
// x (the same strides): each pair of features is read before it is written.
template <class T, class L>
void rope(const T *x, int64_t tokens, int64_t x_tok, int64_t heads, int64_t d, int64_t rd, const T *cos,
          const T *sin, T *out, int64_t o_tok, int threads) {
    const int64_t half = rd / 2;
#pragma omp parallel for num_threads(threads) if (tokens * heads * d >= (1 << 16))
    for (int64_t t = 0; t < tokens; t++) {
        const T *c = cos + t * rd, *s = sin + t * rd;
        for (int64_t h = 0; h < heads; h++) {
            const T *xi = x + t * x_tok + h * d;
            T *o = out + t * o_tok + h * d;
            for (int64_t i = 0; i < half; i += 16) {
                const int64_t n = half - i;
                const __m512 x1 = L::load(xi + i, n), x2 = L::load(xi + i + half, n);
                const __m512 a = L::round(_mm512_mul_ps(x1, L::load(c + i, n)));
                const __m512 b = L::round(_mm512_mul_ps(negate(x2), L::load(s + i, n)));
                const __m512 a2 = L::round(_mm512_mul_ps(x2, L::load(c + i + half, n)));
                const __m512 b2 = L::round(_mm512_mul_ps(x1, L::load(s + i + half, n)));
                L::store(o + i, _mm512_add_ps(a, b), n);
                L::store(o + i + half, _mm512_add_ps(a2, b2), n);
            }
            if (rd < d && o != xi) std::memcpy(o + rd, xi + rd, (d - rd) * sizeof(T));
        }
    }
}

// RoPE into a contiguous out (tokens, heads, d).
template <class T, class L>
void rope(const T *x, int64_t tokens, int64_t x_tok, int64_t heads, int64_t d, int64_t rd, const T *cos,
          const T *sin, T *out, int threads) {
    rope<T, L>(x, tokens, x_tok, heads, d, rd, cos, sin, out, heads * d, threads);
}

// RMSNorm of rows of n: y = w * (x * rsqrt(mean(x^2) + eps)), the mean accumulated in fp32. bf16 rounds
// as Hugging Face's LlamaRMSNorm: the normalised value to bf16, then the product with w. The rows are
// `heads` adjacent rows of each of `tokens` tokens: row h of token t at x + t * x_tok + h * n (y: y_tok),
// so the q or k heads of a fused QKV GEMM's output are normalised where they lie; y may be x (each row
// is read whole before it is written).
template <class T, class L>
void rms_norm(const T *x, int64_t x_tok, const T *w, T *y, int64_t y_tok, int64_t tokens, int64_t heads, int64_t n,
              float eps, int threads) {
    const int64_t rows = tokens * heads;
#pragma omp parallel for num_threads(threads) if (rows * n >= (1 << 16))
    for (int64_t r = 0; r < rows; r++) {
        const T *xr = x + r / heads * x_tok + r % heads * n;
        T *yr = y + r / heads * y_tok + r % heads * n;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            const __m512 v = L::load(xr + i, n - i);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / float(n) + eps));
        for (int64_t i = 0; i < n; i += 16) {
            const __m512 h = L::round(_mm512_mul_ps(L::load(xr + i, n - i), inv));
            L::store(yr + i, _mm512_mul_ps(L::load(w + i, n - i), h), n - i);
        }
    }
}

// RMSNorm of `rows` contiguous rows of n.
template <class T, class L>
void rms_norm(const T *x, const T *w, T *y, int64_t rows, int64_t n, float eps, int threads) {
    rms_norm<T, L>(x, n, w, y, n, rows, 1, n, eps, threads);
}

// SwiGLU's activation of `rows` rows of [gate | up] (2f wide): y = silu(gate) * up, silu(g) = g / (1 +
// exp(-g)) in fp32, rounded to the storage dtype before the product, as torch's `F.silu(gate) * up`.
template <class T, class L>
void silu_mul(const T *gu, T *y, int64_t rows, int64_t f, int threads) {
#pragma omp parallel for num_threads(threads) if (rows * f >= (1 << 13))
    for (int64_t r = 0; r < rows; r++) {
        const T *g = gu + r * 2 * f, *u = g + f;
        T *yr = y + r * f;
        for (int64_t i = 0; i < f; i += 16) {
            const __m512 gv = L::load(g + i, f - i);
            const __m512 a = L::round(_mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(negate(gv)))));
            L::store(yr + i, _mm512_mul_ps(a, L::load(u + i, f - i)), f - i);
        }
    }
}

// Lane j of the result = the sum of the 16 lanes of a[j] (a transposed reduction: 45 instructions for 16
// sums, against ~8 each one at a time).
inline __m512 sum16(const __m512 *a) {
    __m512 b[8], c[4];
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    const __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
    const __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, 0x88), _mm512_shuffle_f32x4(e0, e1, 0xdd));
}

// Decode attention: one query per sequence and head against the sequence's cached keys, the G = H / H_kv
// query heads of a KV head together (each key and value is read once for the group). Keys of sequence b:
// [max(0, len_b - window), len_b) (window 0: all), len_b = min(lens[b], S). Scores in fp32 (16 keys at a
// time), online softmax (running max and sum), fp32 accumulation of P V, one rounding of the output.
// q: (b, h) at q[b * q_b + h * q_h], D contiguous; k, v: (b, kv head, s) at [b * kv_b + h * kv_h + s * kv_s];
// out (B, H * D) contiguous. ND = ceil(D / 16).
//
// Paged (table non-null): key s of sequence b lives in block table[b * table_b + s / block], slot s % block:
// at k[table[...] * kv_b + (s % block) * kv_s + h * kv_h] (the cache's block pools, read in place).
template <class T, class L, int ND>
int decode_attention(const T *q, int64_t q_b, int64_t q_h, const T *k, const T *v, int64_t kv_b, int64_t kv_h,
                     int64_t kv_s, const int32_t *lens, int64_t S, int64_t window, const int32_t *table,
                     int64_t table_b, int64_t block, int64_t nblocks, T *out, int64_t B, int64_t H, int64_t H_kv,
                     int64_t D, float scale, int threads) {
    const int64_t G = H / H_kv, tasks = B * H_kv, per = G * ND * 16 + 2 * G;  // per thread: o, m, l
    for (int64_t b = 0; table && b < B; b++) {  // every block a sequence's keys sit in must exist
        const int64_t hi = lens[b] < S ? lens[b] : S;
        for (int64_t i = 0; i * block < hi; i++)
            if (table[b * table_b + i] < 0 || table[b * table_b + i] >= nblocks) return 3;
    }
    if (threads > tasks) threads = int(tasks);
    float *scratch = static_cast<float *>(std::malloc(sizeof(float) * per * threads));
    if (!scratch) return 2;
#pragma omp parallel num_threads(threads) if (tasks > 1)
    {
        const unsigned csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040);  // flush denormals to zero (FTZ, DAZ): tiny p * v products cost assists
        float *o = scratch + per * omp_get_thread_num();
        float *m = o + G * ND * 16, *l = m + G;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t b = task / H_kv, hk = task % H_kv;
            const int64_t hi = lens[b] < S ? (lens[b] > 0 ? lens[b] : 0) : S;
            const int64_t lo = window > 0 && hi > window ? hi - window : 0;
            const int64_t kb = table ? hk * kv_h : b * kv_b + hk * kv_h;  // offset of the sequence's key 0
            const int32_t *blocks = table ? table + b * table_b : nullptr;
            for (int64_t i = 0; i < G * ND * 16; i++) o[i] = 0.0f;
            for (int64_t g = 0; g < G; g++) m[g] = -INFINITY, l[g] = 0.0f;
            // paged: the block of key s and its slot, advanced key by key; the next 16 keys' addresses
            // are known one chunk ahead and their lines prefetched (a block's keys of one head sit
            // H_kv * D apart, which the hardware prefetcher follows less well than a contiguous row)
            int64_t bi = blocks ? lo / block : 0, slot = blocks ? lo % block : 0;
            int64_t base = blocks && lo < hi ? blocks[bi] * kv_b : 0;
            int64_t addr[2][16];  // offsets of the keys of this chunk and the next (in k and v alike)
            const auto fill = [&](int64_t s0, int64_t *a) {
                const int nk = hi - s0 < 16 ? int(hi - s0) : 16;
                for (int j = 0; j < nk; j++) {
                    a[j] = kb + base + slot * kv_s;
                    if (++slot == block && s0 + j + 1 < hi) slot = 0, base = blocks[++bi] * kv_b;
                }
            };
            if (blocks && lo < hi) fill(lo, addr[0]);
            for (int64_t s0 = lo, chunk = 0; s0 < hi; s0 += 16, chunk ^= 1) {
                const int nk = hi - s0 < 16 ? int(hi - s0) : 16;
                const __mmask16 valid = __mmask16((1u << nk) - 1);
                int64_t *at = addr[chunk];
                if (blocks && s0 + 16 < hi) {
                    int64_t *next = addr[chunk ^ 1];
                    fill(s0 + 16, next);
                    const int nn = hi - s0 - 16 < 16 ? int(hi - s0 - 16) : 16;
                    for (int j = 0; j < nn; j++)
                        for (int64_t e = 0; e < D; e += 64 / int64_t(sizeof(T))) {
                            _mm_prefetch(reinterpret_cast<const char *>(k + next[j] + e), _MM_HINT_T0);
                            _mm_prefetch(reinterpret_cast<const char *>(v + next[j] + e), _MM_HINT_T0);
                        }
                }
                if (!blocks)
                    for (int j = 0; j < nk; j++) at[j] = kb + (s0 + j) * kv_s;
                for (int64_t g = 0; g < G; g++) {
                    const T *qg = q + b * q_b + (hk * G + g) * q_h;
                    __m512 qv[ND], acc[16];
                    for (int c = 0; c < ND; c++)
                        qv[c] = _mm512_mul_ps(L::load(qg + 16 * c, D - 16 * c), _mm512_set1_ps(scale));
                    for (int j = 0; j < 16; j++) {
                        acc[j] = _mm512_setzero_ps();
                        if (j < nk) {
                            const T *kj = k + at[j];
                            for (int c = 0; c < ND; c++)
                                acc[j] = _mm512_fmadd_ps(qv[c], L::load(kj + 16 * c, D - 16 * c), acc[j]);
                        }
                    }
                    const __m512 sc = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY), sum16(acc));
                    const float m_new = std::fmax(m[g], _mm512_reduce_max_ps(sc));
                    const float corr = std::exp(m[g] - m_new);
                    const __m512 p = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(sc, _mm512_set1_ps(m_new))));
                    l[g] = l[g] * corr + _mm512_reduce_add_ps(p);
                    m[g] = m_new;
                    alignas(64) float pj[16];
                    _mm512_store_ps(pj, p);
                    float *og = o + g * ND * 16;
                    for (int c = 0; c < ND; c++) {
                        __m512 a = _mm512_mul_ps(_mm512_loadu_ps(og + 16 * c), _mm512_set1_ps(corr));
                        for (int j = 0; j < nk; j++)
                            a = _mm512_fmadd_ps(_mm512_set1_ps(pj[j]), L::load(v + at[j] + 16 * c, D - 16 * c), a);
                        _mm512_storeu_ps(og + 16 * c, a);
                    }
                }
            }
            for (int64_t g = 0; g < G; g++) {
                const __m512 inv = _mm512_set1_ps(l[g] > 0.0f ? 1.0f / l[g] : 0.0f);
                T *dst = out + b * H * D + (hk * G + g) * D;
                for (int c = 0; c < ND; c++)
                    L::store(dst + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(o + g * ND * 16 + 16 * c), inv), D - 16 * c);
            }
        }
        _mm_setcsr(csr);
    }
    std::free(scratch);
    return 0;
}
}  // namespace

extern "C" int llmperf_gemm_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y,
                                 int64_t M, int64_t N, int64_t K, int threads) {
    return gemm<BF16>(x, w, b, y, M, N, K, threads);
}

extern "C" int llmperf_gemm_f32(const float *x, const float *w, const float *b, float *y,
                                int64_t M, int64_t N, int64_t K, int threads) {
    return gemm<F32>(x, w, b, y, M, N, K, threads);
}

// ---- bf16 GEMM of 1-16 rows on AMX tiles -------------------------------------------------------------
// The weights are packed once (llmperf_amx_pack_bf16) into panels of 64 outputs: for each 32-wide block
// of K, four 1 KiB tiles of 16 k-pairs x 16 outputs x 2 (the VNNI layout TDPBF16PS reads), N padded to
// 64 and K to 32 with zeros. Each thread streams its panels in order, prefetching 3 k-blocks (12 KiB)
// ahead into L1, and accumulates the panel's 64 outputs of all M rows in four fp32 C tiles (M rows each).
// x is copied into a zero-padded (M, Kp) buffer first (K tails). Measured 2026-11-24 (12 layers'
// projections, cycled): 8 rows 25.0-26.8 GB/s against oneDNN's AMX GEMM 19.0-19.5 and VDPBF16PS's
// 16-18; 1 row 27.7 against 25.0; 4 rows 26.7 against 22.3; 16 rows 22.5 against oneDNN's 19.1.
namespace {
struct TileConfig {
    uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};
constexpr int64_t AMX_PANEL = 64, AMX_KB = 32, AMX_TILE = 16 * 32;  // outputs, k per block, bf16 per tile
constexpr int64_t AMX_PREFETCH = 3;  // k-blocks ahead
}  // namespace

// Ask Linux for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): 0 if granted.
extern "C" int llmperf_amx_enable() { return syscall(SYS_arch_prctl, 0x1023, 18) ? 1 : 0; }

// out: (N rounded up to 64) x (K rounded up to 32) bf16 (kernels.py: amx_packed_size).
extern "C" int llmperf_amx_pack_bf16(const uint16_t *w, int64_t N, int64_t K, uint16_t *out, int threads) {
    if (N < 1 || K < 1 || threads < 1) return 1;
    const int64_t KB = (K + AMX_KB - 1) / AMX_KB, P = (N + AMX_PANEL - 1) / AMX_PANEL;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < P; p++)
        for (int64_t kb = 0; kb < KB; kb++)
            for (int64_t t = 0; t < 4; t++) {
                uint16_t *tile = out + ((p * KB + kb) * 4 + t) * AMX_TILE;
                for (int64_t r = 0; r < 16; r++)
                    for (int64_t n = 0; n < 16; n++)
                        for (int64_t e = 0; e < 2; e++) {
                            const int64_t row = p * AMX_PANEL + t * 16 + n, col = kb * AMX_KB + 2 * r + e;
                            tile[r * 32 + n * 2 + e] = row < N && col < K ? w[row * K + col] : 0;
                        }
            }
    return 0;
}

extern "C" int llmperf_gemm_amx_bf16(const uint16_t *x, const uint16_t *wp, const uint16_t *b, uint16_t *y,
                                     int64_t M, int64_t N, int64_t K, int threads) {
    if (M < 1 || M > 16 || N < 1 || K < 1 || threads < 1) return 1;
    const int64_t KB = (K + AMX_KB - 1) / AMX_KB, Kp = KB * AMX_KB, P = (N + AMX_PANEL - 1) / AMX_PANEL;
    uint16_t *xp = static_cast<uint16_t *>(std::aligned_alloc(64, (M * Kp * 2 + 63) / 64 * 64));
    if (!xp) return 2;
    for (int64_t m = 0; m < M; m++) {
        std::memcpy(xp + m * Kp, x + m * K, K * 2);
        std::memset(xp + m * Kp + K, 0, (Kp - K) * 2);
    }
    if (threads > P) threads = int(P);
#pragma omp parallel num_threads(threads)
    {
        TileConfig cfg;
        for (int i = 0; i < 5; i++) cfg.rows[i] = uint8_t(M), cfg.colsb[i] = 64;  // C 0-3 (M x 16 fp32), A 4
        for (int i = 5; i < 8; i++) cfg.rows[i] = 16, cfg.colsb[i] = 64;          // B 5-7 (16 x 16 pairs)
        _tile_loadconfig(&cfg);
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        alignas(64) float c[4][16 * 16];
        for (int64_t p = P * t / nt; p < P * (t + 1) / nt; p++) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            const uint16_t *panel = wp + p * KB * 4 * AMX_TILE;
            for (int64_t kb = 0; kb < KB; kb++) {
                const uint16_t *tiles = panel + kb * 4 * AMX_TILE;
                const char *ahead = reinterpret_cast<const char *>(tiles + AMX_PREFETCH * 4 * AMX_TILE);
                for (int l = 0; l < 64; l++) _mm_prefetch(ahead + 64 * l, _MM_HINT_T0);
                _tile_loadd(4, xp + kb * AMX_KB, Kp * 2);
                _tile_loadd(5, tiles, 64);
                _tile_dpbf16ps(0, 4, 5);
                _tile_loadd(6, tiles + AMX_TILE, 64);
                _tile_dpbf16ps(1, 4, 6);
                _tile_loadd(7, tiles + 2 * AMX_TILE, 64);
                _tile_dpbf16ps(2, 4, 7);
                _tile_loadd(5, tiles + 3 * AMX_TILE, 64);
                _tile_dpbf16ps(3, 4, 5);
            }
            _tile_stored(0, c[0], 64);
            _tile_stored(1, c[1], 64);
            _tile_stored(2, c[2], 64);
            _tile_stored(3, c[3], 64);
            for (int64_t m = 0; m < M; m++)
                for (int64_t j = 0; j < AMX_PANEL && p * AMX_PANEL + j < N; j++) {
                    const int64_t n = p * AMX_PANEL + j;
                    float v = c[j / 16][m * 16 + j % 16];
                    if (b) v += bf16_to_float(b[n]);
                    y[m * N + n] = float_to_bf16(v);
                }
        }
        _tile_release();
    }
    std::free(xp);
    return 0;
}

#define LLMPERF_ROPE(NAME, T, L)                                                                             \
    extern "C" int NAME(const T *x, int64_t tokens, int64_t x_tok, int64_t heads, int64_t d, int64_t rd,        \
                        const T *cos, const T *sin, T *out, int64_t o_tok, int threads) {                       \
        if (tokens < 0 || heads < 1 || d < 1 || rd < 0 || rd > d || rd % 2 || o_tok < heads * d || threads < 1) \
            return 1;                                                                                           \
        rope<T, L>(x, tokens, x_tok, heads, d, rd, cos, sin, out, o_tok, threads);                              \
        return 0;                                                                                               \
    }
LLMPERF_ROPE(llmperf_rope_bf16, uint16_t, LanesBF16)
LLMPERF_ROPE(llmperf_rope_f32, float, LanesF32)

#define LLMPERF_RMS_NORM(NAME, T, L)                                                                         \
    extern "C" int NAME(const T *x, int64_t x_tok, const T *w, T *y, int64_t y_tok, int64_t tokens,            \
                        int64_t heads, int64_t n, float eps, int threads) {                                   \
        if (tokens < 1 || heads < 1 || n < 1 || x_tok < heads * n || y_tok < heads * n || threads < 1)        \
            return 1;                                                                                         \
        rms_norm<T, L>(x, x_tok, w, y, y_tok, tokens, heads, n, eps, threads);                               \
        return 0;                                                                                             \
    }
LLMPERF_RMS_NORM(llmperf_rms_norm_bf16, uint16_t, LanesBF16)
LLMPERF_RMS_NORM(llmperf_rms_norm_f32, float, LanesF32)

#define LLMPERF_SILU_MUL(NAME, T, L)                                                                         \
    extern "C" int NAME(const T *gu, T *y, int64_t rows, int64_t f, int threads) {                            \
        if (rows < 1 || f < 1 || threads < 1) return 1;                                                       \
        silu_mul<T, L>(gu, y, rows, f, threads);                                                              \
        return 0;                                                                                             \
    }
LLMPERF_SILU_MUL(llmperf_silu_mul_bf16, uint16_t, LanesBF16)
LLMPERF_SILU_MUL(llmperf_silu_mul_f32, float, LanesF32)

namespace {
// decode_attention with its argument checks, for any head dim up to 128 (ND = ceil(D / 16) chunks)
template <class T, class L>
int attend(const T *q, int64_t q_b, int64_t q_h, const T *k, const T *v, int64_t kv_b, int64_t kv_h, int64_t kv_s,
           const int32_t *lens, int64_t S, int64_t window, const int32_t *table, int64_t table_b, int64_t block,
           int64_t nblocks, T *out, int64_t B, int64_t H, int64_t H_kv, int64_t D, float scale, int threads) {
    if (B < 1 || H_kv < 1 || H % H_kv || D < 1 || D > 128 || S < 0 || window < 0 || threads < 1
        || (table && block < 1))
        return 1;
    using Fn = decltype(&decode_attention<T, L, 1>);
    static const Fn by_chunks[8] = {decode_attention<T, L, 1>, decode_attention<T, L, 2>, decode_attention<T, L, 3>,
                                    decode_attention<T, L, 4>, decode_attention<T, L, 5>, decode_attention<T, L, 6>,
                                    decode_attention<T, L, 7>, decode_attention<T, L, 8>};
    return by_chunks[(D + 15) / 16 - 1](q, q_b, q_h, k, v, kv_b, kv_h, kv_s, lens, S, window, table, table_b, block,
                                        nblocks, out, B, H, H_kv, D, scale, threads);
}
}  // namespace

#define LLMPERF_DECODE_ATTENTION(NAME, T, L)                                                                 \
    extern "C" int NAME(const T *q, int64_t q_b, int64_t q_h, const T *k, const T *v, int64_t kv_b,           \
                        int64_t kv_h, int64_t kv_s, const int32_t *lens, int64_t S, int64_t window,           \
                        const int32_t *table, int64_t table_b, int64_t block, int64_t nblocks, T *out,        \
                        int64_t B, int64_t H, int64_t H_kv, int64_t D, float scale, int threads) {            \
        return attend<T, L>(q, q_b, q_h, k, v, kv_b, kv_h, kv_s, lens, S, window, table, table_b, block,      \
                            nblocks, out, B, H, H_kv, D, scale, threads);                                     \
    }
LLMPERF_DECODE_ATTENTION(llmperf_decode_attention_bf16, uint16_t, LanesBF16)
LLMPERF_DECODE_ATTENTION(llmperf_decode_attention_f32, float, LanesF32)

// ---- A decode step's layers in one call --------------------------------------------------------------
// Every layer of a Llama-family decode step (RMSNorm, fused QKV GEMM, RoPE, KV write, decode attention,
// o_proj, residual, RMSNorm, fused gate/up GEMM, SwiGLU, down_proj, residual) runs the kernels above in
// the order and with the roundings the engine's Python runs them, so the result is the same bit for bit;
// what goes is the framework between them (measured 2026-11-24 after a weight stream: 10-55 us a call;
// see llmperf/engine/cpu/kernels.py). x (B, C) is the residual stream, updated in place. Per layer,
// ptrs holds LAYER_PTRS addresses (below; 0 for an absent bias) and scales its softmax scale. The cache
// is addressed as blocks: the K and V of layer l, block n, slot s, head h at ptrs[K / V] + n * kv_b +
// s * kv_s + h * kv_h; sequence b's key p in block table[b * table_b + p / block] (a paged cache's block
// tables; a contiguous cache passes each sequence's row as its one block of S_max slots). Its new token
// (position lens[b] - 1) is written there before attention reads it. With times, the seconds of each part
// of each layer (LAYER_PARTS in order) are stored at times[l * LAYER_PARTS + part] (CLOCK_MONOTONIC, the
// clock of Python's perf_counter). Returns 0, 1 for refused sizes, 2 out of memory, 3 a table naming a
// block outside the cache (checked before anything is written).
namespace {
enum LayerPtr { P_ATTN_NORM, P_QKV, P_QKV_B, P_O, P_O_B, P_MLP_NORM, P_GATE_UP, P_GATE_UP_B, P_DOWN, P_DOWN_B,
                P_K, P_V, LAYER_PTRS };
constexpr int LAYER_PARTS = 12;

inline double now() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

template <class T>
const T *at(const int64_t *p, int i) { return reinterpret_cast<const T *>(p[i]); }

template <class D>
int layer_gemm(const typename D::T *x, const int64_t *p, int w, int b, typename D::T *y, int64_t M, int64_t N,
               int64_t K, int amx, int threads) {
    using T = typename D::T;
    if constexpr (std::is_same<T, uint16_t>::value)
        if (amx) return llmperf_gemm_amx_bf16(x, at<T>(p, w), at<T>(p, b), y, M, N, K, threads);
    return gemm<D>(x, at<T>(p, w), at<T>(p, b), y, M, N, K, threads);
}

// x += o, the sum in fp32 and one rounding to the storage dtype (as torch's add)
template <class T, class L>
void residual(T *x, const T *o, int64_t n) {
    for (int64_t i = 0; i < n; i += 16)
        L::store(x + i, _mm512_add_ps(L::load(o + i, n - i), L::load(x + i, n - i)), n - i);
}

template <class D, class L>
int decode_layers(typename D::T *x, const int64_t *ptrs, const float *scales, int64_t layers, int64_t B, int64_t C,
                  int64_t H, int64_t H_kv, int64_t Dh, int64_t rd, int64_t F, float eps, const typename D::T *cos,
                  const typename D::T *sin, const int32_t *lens, int64_t S, int64_t window, const int32_t *table,
                  int64_t table_b, int64_t block, int64_t nblocks, int64_t kv_b, int64_t kv_s, int64_t kv_h,
                  int amx, double *times, int threads) {
    using T = typename D::T;
    if (layers < 1 || B < 1 || C < 1 || H_kv < 1 || H % H_kv || Dh < 1 || Dh > 128 || rd < 0 || rd > Dh || rd % 2
        || F < 1 || S < 1 || window < 0 || table_b < 1 || block < 1 || nblocks < 1 || threads < 1)
        return 1;
    for (int64_t b = 0; b < B; b++) {  // every block a sequence reads or writes must exist
        if (lens[b] < 1 || lens[b] > S || (lens[b] - 1) / block >= table_b) return 1;
        for (int64_t i = 0; i * block < lens[b]; i++)
            if (table[b * table_b + i] < 0 || table[b * table_b + i] >= nblocks) return 3;
    }
    const int64_t W = (H + 2 * H_kv) * Dh, QK = (H + H_kv) * Dh;
    const auto pad = [](int64_t n) { return (n + 31) / 32 * 32; };  // 64-byte aligned segments
    const int64_t sizes[6] = {pad(B * C), pad(B * W), pad(B * QK), pad(B * H * Dh), pad(B * 2 * F), pad(B * F)};
    int64_t total = 0;
    for (int64_t s : sizes) total += s;
    T *scratch = static_cast<T *>(std::aligned_alloc(64, (total * sizeof(T) + 63) / 64 * 64));
    if (!scratch) return 2;
    T *h = scratch, *qkv = h + sizes[0], *qk = qkv + sizes[1], *att = qk + sizes[2], *gu = att + sizes[3];
    T *act = gu + sizes[4], *o = h;  // o reuses h: the norm's output is dead once the GEMM has read it
    int rc = 0;
    for (int64_t l = 0; l < layers; l++) {
        const int64_t *p = ptrs + l * LAYER_PTRS;
        T *kc = reinterpret_cast<T *>(p[P_K]), *vc = reinterpret_cast<T *>(p[P_V]);
        double t[LAYER_PARTS + 1];
        int part = 0;
        const auto mark = [&] { if (times) t[++part] = now(); };
        t[0] = times ? now() : 0.0;
        rms_norm<T, L>(x, at<T>(p, P_ATTN_NORM), h, B, C, eps, threads);
        mark();
        if ((rc = layer_gemm<D>(h, p, P_QKV, P_QKV_B, qkv, B, W, C, amx, threads))) break;
        mark();
        rope<T, L>(qkv, B, W, H + H_kv, Dh, rd, cos, sin, qk, threads);
        mark();
        for (int64_t b = 0; b < B; b++) {
            const int64_t pos = lens[b] - 1;
            const int64_t slot = table[b * table_b + pos / block] * kv_b + pos % block * kv_s;
            for (int64_t g = 0; g < H_kv; g++) {
                std::memcpy(kc + slot + g * kv_h, qk + b * QK + (H + g) * Dh, Dh * sizeof(T));
                std::memcpy(vc + slot + g * kv_h, qkv + b * W + (H + H_kv + g) * Dh, Dh * sizeof(T));
            }
        }
        mark();
        if ((rc = attend<T, L>(qk, QK, Dh, kc, vc, kv_b, kv_h, kv_s, lens, S, window, table, table_b, block, nblocks,
                            att, B, H, H_kv, Dh, scales[l], threads)))
            break;
        mark();
        if ((rc = layer_gemm<D>(att, p, P_O, P_O_B, o, B, C, H * Dh, amx, threads))) break;
        mark();
        residual<T, L>(x, o, B * C);
        mark();
        rms_norm<T, L>(x, at<T>(p, P_MLP_NORM), h, B, C, eps, threads);
        mark();
        if ((rc = layer_gemm<D>(h, p, P_GATE_UP, P_GATE_UP_B, gu, B, 2 * F, C, amx, threads))) break;
        mark();
        silu_mul<T, L>(gu, act, B, F, threads);
        mark();
        if ((rc = layer_gemm<D>(act, p, P_DOWN, P_DOWN_B, o, B, C, F, amx, threads))) break;
        mark();
        residual<T, L>(x, o, B * C);
        mark();
        if (times)
            for (int i = 0; i < LAYER_PARTS; i++) times[l * LAYER_PARTS + i] = t[i + 1] - t[i];
    }
    std::free(scratch);
    return rc;
}
}  // namespace

#define LLMPERF_DECODE_LAYERS(NAME, D, L)                                                                   \
    extern "C" int NAME(D::T *x, const int64_t *ptrs, const float *scales, int64_t layers, int64_t B,          \
                        int64_t C, int64_t H, int64_t H_kv, int64_t Dh, int64_t rd, int64_t F, float eps,      \
                        const D::T *cos, const D::T *sin, const int32_t *lens, int64_t S, int64_t window,      \
                        const int32_t *table, int64_t table_b, int64_t block, int64_t nblocks, int64_t kv_b,   \
                        int64_t kv_s, int64_t kv_h, int amx, double *times, int threads) {                     \
        return decode_layers<D, L>(x, ptrs, scales, layers, B, C, H, H_kv, Dh, rd, F, eps, cos, sin, lens, S,  \
                                   window, table, table_b, block, nblocks, kv_b, kv_s, kv_h, amx, times,       \
                                   threads);                                                                   \
    }
LLMPERF_DECODE_LAYERS(llmperf_decode_layers_bf16, BF16, LanesBF16)
LLMPERF_DECODE_LAYERS(llmperf_decode_layers_f32, F32, LanesF32)
