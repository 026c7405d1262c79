// int4 weights times int8 activations on an AVX2 CPU (specgen's `int4-dyn`; cpu_int4.py
// compiles and calls it, and its `quantize` writes the format). Weights: blocks of 32
// inputs, each 16 bytes of nibbles q in 0..15 (byte j holds inputs j and j + 16), with a
// scale d and a minimum m in fp16: w = d q + m. Activations: quantized here to int8, per
// token and block of 32 (scale e, values a). A block contributes d e sum(q a) + m e sum(a),
// with exact integer sums (AVX2 vpmaddubsw, as llama.cpp's Q4_1 x Q8_1). Every output is
// computed by the same instructions whatever the number of tokens, so a token's result
// never depends on the others in its pass. Each weight block is unpacked once for up to 4
// tokens.
#include <immintrin.h>
#include <stdint.h>

// Nibbles are prefetched this many bytes ahead as a row is read, a cache line at a time: a
// whole row asked for at once (as before) left the 4.5 KB rows of a down projection 25%
// slower than short rows (bench/NOTES.md Round 12). Scales and minima are prefetched whole,
// PREFETCH_ROWS rows ahead.
#define PREFETCH_BYTES 4096
#define PREFETCH_ROWS 2

// 16 bytes of nibbles -> 32 bytes 0..15: low nibbles in the low lane, high in the high.
static inline __m256i unpack(const uint8_t *p) {
    __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    both = _mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0));
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// sum over i < n of h[i] * c[i], h in fp16
static inline float dot_fp16(const uint16_t *h, const float *c, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))),
                              _mm256_loadu_ps(c + i), acc);
    float s = hsum(acc);
    for (; i < n; i++) s += _cvtsh_ss(h[i]) * c[i];
    return s;
}

// scale[t * nb + b] = d[b] e[t * nb + b] for t < nt, d in fp16
static inline void scales(const uint16_t *d, const float *e, int nb, int nt, float *scale) {
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b)));
        for (int t = 0; t < nt; t++)
            _mm256_storeu_ps(scale + t * nb + b, _mm256_mul_ps(dv, _mm256_loadu_ps(e + t * nb + b)));
    }
    for (; b < nb; b++)
        for (int t = 0; t < nt; t++) scale[t * nb + b] = _cvtsh_ss(d[b]) * e[t * nb + b];
}

// x [n, k] -> qx [n, k] int8, its scales ex [n, k / 32] and sx = scale * sum of the block's
// values [n, k / 32]; each token on its own. Vectorised: the rounding (to nearest, ties to
// even) and the integer sums are those of the scalar loop.
static void quantize_rows(const float *x, int n, int k, int8_t *qx, float *ex, float *sx) {
    int nb = k / 32;
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (int r = 0; r < n; r++)
        for (int b = 0; b < nb; b++) {
            const float *v = x + (int64_t)r * k + b * 32;
            __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
            __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
            __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                     _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            float amax = _mm_cvtss_f32(h);
            float e = amax / 127.f, inv = e > 0.f ? 1.f / e : 0.f;
            __m256 s = _mm256_set1_ps(inv);
            __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, s)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, s));
            __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, s)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, s));
            // packs interleave the 128-bit lanes; the permute puts the 32 values back in order
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(qx + (int64_t)r * k + b * 32), p);
            __m256i t = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
            __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
            t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1));
            ex[r * nb + b] = e;
            sx[r * nb + b] = e * (float)_mm_cvtsi128_si32(t4);
        }
}

// Block b of one weight row against nt tokens, into acc; scale[t * nb + b] is d e.
static inline __attribute__((always_inline)) void block(
        const uint8_t *wr, const int8_t *qx, const float *scale, int nb, int nt, int b,
        __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i w = unpack(wr + b * 16);
    for (int t = 0; t < nt; t++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(qx + ((int64_t)t * nb + b) * 32));
        __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), ones);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_broadcast_ss(scale + t * nb + b), acc[t]);
    }
}

// One weight row against nt <= 4 tokens (qx, scale: theirs). Called with nt a constant, so
// that the compiler unrolls the token loops and keeps the accumulators in registers; two
// per token (even and odd blocks) keep the FMA latency off the critical path.
static inline __attribute__((always_inline)) void row_dot(
        const uint8_t *wr, const int8_t *qx, const float *scale, int nb, int nt, float *out) {
    __m256 even[4], odd[4];
    for (int t = 0; t < nt; t++) even[t] = odd[t] = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        if ((b & 3) == 0)  // a line is 4 blocks; prefetches never fault past the last row
            _mm_prefetch((const char *)wr + b * 16 + PREFETCH_BYTES, _MM_HINT_T0);
        block(wr, qx, scale, nb, nt, b, even);
        block(wr, qx, scale, nb, nt, b + 1, odd);
    }
    if (b < nb) block(wr, qx, scale, nb, nt, b, even);
    for (int t = 0; t < nt; t++) out[t] = hsum(_mm256_add_ps(even[t], odd[t]));
}

// y [n, o] = x [n, k] @ W.T (+ bias), W as qw [o, k / 32, 16] and fp16 dw, mw [o, k / 32].
// qx, ex and sx are scratch space of n * k bytes and 2 * n * k / 32 floats.
void int4_linear(const float *x, const uint8_t *qw, const uint16_t *dw, const uint16_t *mw,
                 const float *bias, float *y, int n, int k, int o, int8_t *qx, float *ex,
                 float *sx, int threads) {
    int nb = k / 32;
    quantize_rows(x, n, k, qx, ex, sx);
// guided: a thread the VM stalls leaves its rows to the other (bench/NOTES.md, Round 11)
#pragma omp parallel for schedule(guided) num_threads(threads)
    for (int row = 0; row < o; row++) {
        const uint8_t *wr = qw + (int64_t)row * nb * 16;
        if (row + PREFETCH_ROWS < o) {  // the hardware prefetcher alone leaves loads waiting
            const char *d = (const char *)(dw + (int64_t)(row + PREFETCH_ROWS) * nb);
            const char *m = (const char *)(mw + (int64_t)(row + PREFETCH_ROWS) * nb);
            for (int i = 0; i < nb * 2; i += 64) {
                _mm_prefetch(d + i, _MM_HINT_T0);
                _mm_prefetch(m + i, _MM_HINT_T0);
            }
        }
        const uint16_t *dr = dw + (int64_t)row * nb, *mr = mw + (int64_t)row * nb;
        float scale[4 * nb], out[4];
        for (int t0 = 0; t0 < n; t0 += 4) {
            int nt = n - t0 < 4 ? n - t0 : 4;
            scales(dr, ex + (int64_t)t0 * nb, nb, nt, scale);
            const int8_t *q = qx + (int64_t)t0 * k;
            switch (nt) {  // constants: see row_dot()
                case 1: row_dot(wr, q, scale, nb, 1, out); break;
                case 2: row_dot(wr, q, scale, nb, 2, out); break;
                case 3: row_dot(wr, q, scale, nb, 3, out); break;
                default: row_dot(wr, q, scale, nb, 4, out);
            }
            for (int t = 0; t < nt; t++)
                y[(int64_t)(t0 + t) * o + row] = out[t] + dot_fp16(mr, sx + (int64_t)(t0 + t) * nb, nb)
                                                  + (bias ? bias[row] : 0.f);
        }
    }
}
