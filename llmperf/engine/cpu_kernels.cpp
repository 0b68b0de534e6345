// llmperf: a weight-streaming GEMM for the few rows of a CPU decode step (x86-64, AVX-512).
//
//   y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]),  1 <= M <= 8 rows, w stored (out, in) = (N, K).
//
// Each thread takes a contiguous band of output rows of W and streams it once from memory, R rows
// of W at a time (R = 4 for up to 4 rows of x, else 2), against the M rows of x, which stay in L1/L2.
// Accumulation is fp32: bf16 weights multiply bf16 activations with AVX512_BF16's VDPBF16PS (pairs
// of products added into fp32 lanes), fp32 with FMA. The result is rounded to the storage dtype
// once (bf16: round to nearest even). While it reads a block of R weight rows it prefetches the next
// block's lines into L2 (R rows ahead in each stream): without that the stream ran 20-25% slower on
// the development Xeon, and a prefetch 1 KiB ahead within the row gained only 5-10% (measured
// 2026-11-23; see llmperf/engine/cpu_kernels.py for the figures and when the kernel is used).
//
// Built at first use by llmperf/engine/cpu_kernels.py with the host compiler and OpenMP (the process
// shares torch's OpenMP runtime: both name libgomp.so.1).
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cmath>
#include <cstring>

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
    constexpr int R = M <= 4 ? 4 : 2;  // R * M accumulators + R weight lines + 1 x line <= 32 registers
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
// dtype (compiled with -ffp-contract=off, so no product is fused into the add). The features past
// rotary_dim are copied. x: token t, head h, feature i at x[t * x_tok + h * d + i]; cos, sin (tokens, rd);
// out (tokens, heads, d), contiguous.
template <class D>
void rope(const typename D::T *x, int64_t tokens, int64_t x_tok, int64_t heads, int64_t d, int64_t rd,
          const typename D::T *cos, const typename D::T *sin, typename D::T *out, int threads) {
    using T = typename D::T;
    const int64_t half = rd / 2;
#pragma omp parallel for num_threads(threads) if (tokens * heads * d >= (1 << 16))
    for (int64_t t = 0; t < tokens; t++) {
        const T *c = cos + t * rd, *s = sin + t * rd;
        for (int64_t h = 0; h < heads; h++) {
            const T *xi = x + t * x_tok + h * d;
            T *o = out + (t * heads + h) * d;
            for (int64_t i = 0; i < half; i++) {
                const float x1 = D::to_float(xi[i]), x2 = D::to_float(xi[i + half]);
                const float a = D::to_float(D::from_float(x1 * D::to_float(c[i])));
                const float b = D::to_float(D::from_float(-x2 * D::to_float(s[i])));
                const float a2 = D::to_float(D::from_float(x2 * D::to_float(c[i + half])));
                const float b2 = D::to_float(D::from_float(x1 * D::to_float(s[i + half])));
                o[i] = D::from_float(a + b);
                o[i + half] = D::from_float(a2 + b2);
            }
            for (int64_t i = rd; i < d; i++) o[i] = xi[i];
        }
    }
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

// Hugging Face's RMSNorm in bf16, one call instead of four framework calls (cast to fp32, normalise,
// cast back, scale): y = bf16(w * bf16(x * rsqrt(mean(x^2) + eps))), the mean accumulated in fp32.
extern "C" int llmperf_rms_norm_bf16(const uint16_t *x, const uint16_t *w, uint16_t *y, int64_t rows, int64_t n,
                                     float eps, int threads) {
    if (rows < 1 || n < 1 || threads < 1) return 1;
#pragma omp parallel for num_threads(threads) if (rows * n >= (1 << 16))
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * n;
        uint16_t *yr = y + r * n;
        __m512 acc = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(xr + i));
            const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        float ss = _mm512_reduce_add_ps(acc);
        for (; i < n; i++) { float v = bf16_to_float(xr[i]); ss += v * v; }
        const float inv = 1.0f / std::sqrt(ss / float(n) + eps);
        for (int64_t j = 0; j < n; j++) {
            const float h = bf16_to_float(float_to_bf16(bf16_to_float(xr[j]) * inv));
            yr[j] = float_to_bf16(bf16_to_float(w[j]) * h);
        }
    }
    return 0;
}

extern "C" int llmperf_rope_bf16(const uint16_t *x, int64_t tokens, int64_t x_tok, int64_t heads, int64_t d,
                                 int64_t rd, const uint16_t *cos, const uint16_t *sin, uint16_t *out, int threads) {
    if (tokens < 0 || heads < 1 || d < 1 || rd < 0 || rd > d || rd % 2 || threads < 1) return 1;
    rope<BF16>(x, tokens, x_tok, heads, d, rd, cos, sin, out, threads);
    return 0;
}

extern "C" int llmperf_rope_f32(const float *x, int64_t tokens, int64_t x_tok, int64_t heads, int64_t d,
                                int64_t rd, const float *cos, const float *sin, float *out, int threads) {
    if (tokens < 0 || heads < 1 || d < 1 || rd < 0 || rd > d || rd % 2 || threads < 1) return 1;
    rope<F32>(x, tokens, x_tok, heads, d, rd, cos, sin, out, threads);
    return 0;
}
