// int4 weights times int8 activations on an x86 CPU (specgen's `int4-dyn`; cpu_int4.py
// compiles and calls it, and its `quantize` writes the format). Weights: blocks of 32
// inputs, each 16 bytes of nibbles q in 0..15 (byte j holds inputs j and j + 16), with a
// scale d and a minimum m in fp16: w = d q + m. Activations: quantized here to int8, per
// token and block of 32 (scale e, values a). A block contributes d e sum(q a) + m e sum(a),
// with exact integer sums (as llama.cpp's Q4_1 x Q8_1). Three paths (int4_path() says which
// this CPU has; cpu_int4.py picks one per pass): AVX2 (`vpmaddubsw`, a block at a time) and
// AVX512-VNNI (`vpdpbusd`, two blocks at a time) give the same bits: the same integer sums of
// 4 products per lane, scaled and added lane by lane in the same order (see row_dot_vnni). On
// both, every output is computed by the same instructions whatever the number of tokens, so
// a token's result never depends on the others in its pass; each weight block is unpacked
// once for up to 4 tokens. AMX-INT8 tiles (rows_amx) take prompts only.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "amx_tiles.h"

enum { AVX2 = 0, VNNI = 1, AMX = 2 };

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

// The AVX512-VNNI path. Lanes 0-7 of a 512-bit vector hold block b, lanes 8-15 block b + 1:
// each int32 lane is the sum of the same 4 products as the AVX2 path's lane (`vpdpbusd` adds
// 4 adjacent byte products as `vpmaddubsw` then `vpmaddwd` do), and the even blocks' lanes
// and the odd ones' accumulate as the AVX2 path's `even` and `odd`, so the results are equal.
#define AVX512_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni")))

// 32 bytes of nibbles (blocks b, b + 1) -> 64 bytes 0..15, in the order of the inputs.
AVX512_VNNI static inline __m512i unpack2(const uint8_t *p) {
    __m512i w = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p));
    w = _mm512_shuffle_i64x2(w, w, 0x50);  // 128-bit lanes 0, 0, 1, 1
    w = _mm512_srlv_epi64(w, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    return _mm512_and_si512(w, _mm512_set1_epi8(0x0F));
}

// Blocks b, b + 1 of one weight row against nt tokens, into acc.
AVX512_VNNI static inline __attribute__((always_inline)) void block2(
        const uint8_t *wr, const int8_t *qx, const float *scale, int nb, int nt, int b,
        __m512 *acc) {
    const __m512i pick = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512i w = unpack2(wr + b * 16);
    for (int t = 0; t < nt; t++) {
        __m512i xv = _mm512_loadu_si512(qx + ((int64_t)t * nb + b) * 32);
        __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, xv);
        __m512 s = _mm512_castsi512_ps(  // scales b, b + 1 in every pair of lanes
            _mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)(scale + t * nb + b))));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_permutexvar_ps(pick, s), acc[t]);
    }
}

// row_dot on the VNNI path; a last odd block goes to lanes 0-7, the even ones.
AVX512_VNNI static inline __attribute__((always_inline)) void row_dot_vnni(
        const uint8_t *wr, const int8_t *qx, const float *scale, int nb, int nt, float *out) {
    __m512 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        if ((b & 3) == 0) _mm_prefetch((const char *)wr + b * 16 + PREFETCH_BYTES, _MM_HINT_T0);
        block2(wr, qx, scale, nb, nt, b, acc);
    }
    if (b < nb) {
        __m512i w = _mm512_zextsi256_si512(unpack(wr + b * 16));
        for (int t = 0; t < nt; t++) {
            __m512i xv = _mm512_zextsi256_si512(
                _mm256_loadu_si256((const __m256i *)(qx + ((int64_t)t * nb + b) * 32)));
            __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, xv);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_set1_ps(scale[t * nb + b]), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) {
        __m256 even = _mm512_castps512_ps256(acc[t]);
        __m256 odd = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[t]), 1));
        out[t] = hsum(_mm256_add_ps(even, odd));
    }
}

// Each path's dot products of one weight row with up to 4 tokens, called with nt a constant.
static void dots_avx2(const uint8_t *wr, const int8_t *q, const float *scale, int nb, int nt,
                      float *out) {
    switch (nt) {  // constants: see row_dot()
        case 1: row_dot(wr, q, scale, nb, 1, out); break;
        case 2: row_dot(wr, q, scale, nb, 2, out); break;
        case 3: row_dot(wr, q, scale, nb, 3, out); break;
        default: row_dot(wr, q, scale, nb, 4, out);
    }
}

AVX512_VNNI static void dots_vnni(const uint8_t *wr, const int8_t *q, const float *scale, int nb,
                                  int nt, float *out) {
    switch (nt) {
        case 1: row_dot_vnni(wr, q, scale, nb, 1, out); break;
        case 2: row_dot_vnni(wr, q, scale, nb, 2, out); break;
        case 3: row_dot_vnni(wr, q, scale, nb, 3, out); break;
        default: row_dot_vnni(wr, q, scale, nb, 4, out);
    }
}

// The AMX path, for wide passes (a prompt): the same int8 activations and integer block sums,
// by tile products of 16 weight rows by 16 tokens over one block (32 inputs), each block's
// sums then scaled in fp32. Its sums are added in another order than the other paths' (a
// block's whole integer sum, not 8 partial ones), so its bits differ from theirs, and
// cpu_int4.py gives it only passes wider than any verify pass. Tiles: 0 the sums C [16 rows,
// 16 tokens] int32, 1 the weights A [16 rows, 32 bytes] u8, 2 the tokens B [8 quads, 16
// tokens x 4] s8.
#define AMX_INT8 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,amx-tile,amx-int8")))

static const tile_config INT8_TILES = {
    .palette = 1,
    .colsb = {64, 32, 64},
    .rows = {16, 16, 8},
};

// Per group of 16 tokens and block: the tokens' scales e and scale-times-sum s [16 tokens]
// side by side, zero past the last token.
static void pack_scales(const float *ex, const float *sx, int n, int nb, float *eg, float *sg) {
    for (int g = 0; g < (n + TOKENS - 1) / TOKENS; g++)
        for (int b = 0; b < nb; b++)
            for (int t = 0; t < TOKENS; t++) {
                int token = g * TOKENS + t;
                int64_t at = ((int64_t)g * nb + b) * TOKENS + t;
                eg[at] = token < n ? ex[(int64_t)token * nb + b] : 0.f;
                sg[at] = token < n ? sx[(int64_t)token * nb + b] : 0.f;
            }
}

// Weight rows [r0, r0 + nr) (nr <= 16) against every group of tokens into y. Scratch: wa
// 16 * k bytes (the rows unpacked, zero past nr), dm 2 * 16 * k / 32 floats.
AMX_INT8 static void rows_amx(const uint8_t *qw, const uint16_t *dw, const uint16_t *mw,
                              const float *bias, int r0, int nr, int n, int k, int o,
                              const uint32_t *xq, const float *eg, const float *sg,
                              uint8_t *wa, float *dm, float *y) {
    int nb = k / 32, groups = (n + TOKENS - 1) / TOKENS;
    float *d = dm, *m = dm + 16 * nb;  // [block][row]: a block's 16 rows side by side
    for (int i = 0; i < 16; i++)
        for (int b = 0; b < nb; b++) {
            int64_t at = (int64_t)(r0 + i) * nb + b;
            __m256i w = i < nr ? unpack(qw + at * 16) : _mm256_setzero_si256();
            _mm256_storeu_si256((__m256i *)(wa + (int64_t)i * k + b * 32), w);
            d[b * 16 + i] = i < nr ? _cvtsh_ss(dw[at]) : 0.f;
            m[b * 16 + i] = i < nr ? _cvtsh_ss(mw[at]) : 0.f;
        }
    int32_t sums[16 * TOKENS];
    float out[16 * TOKENS];
    for (int g = 0; g < groups; g++) {
        __m512 acc[16];  // acc[i]: row i, a lane per token
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            int64_t at = (int64_t)g * nb + b;
            _tile_zero(0);
            _tile_loadd(1, wa + b * 32, k);
            _tile_loadd(2, xq + at * 8 * TOKENS, TOKENS * 4);
            _tile_dpbusd(0, 1, 2);
            _tile_stored(0, sums, TOKENS * 4);
            __m512 e = _mm512_loadu_ps(eg + at * TOKENS), sx = _mm512_loadu_ps(sg + at * TOKENS);
            for (int i = 0; i < 16; i++) {  // d e (sum q a) + m e (sum a)
                __m512 c = _mm512_cvtepi32_ps(_mm512_loadu_si512(sums + i * TOKENS));
                acc[i] = _mm512_fmadd_ps(c, _mm512_mul_ps(_mm512_set1_ps(d[b * 16 + i]), e), acc[i]);
                acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(m[b * 16 + i]), sx, acc[i]);
            }
        }
        for (int i = 0; i < 16; i++) _mm512_storeu_ps(out + i * TOKENS, acc[i]);
        for (int t = 0; t < TOKENS && g * TOKENS + t < n; t++)
            for (int i = 0; i < nr; i++)
                y[(int64_t)(g * TOKENS + t) * o + r0 + i] = out[i * TOKENS + t] + (bias ? bias[r0 + i] : 0.f);
    }
}

static void linear_amx(const float *x, const uint8_t *qw, const uint16_t *dw, const uint16_t *mw,
                       const float *bias, float *y, int n, int k, int o, int8_t *qx, float *ex,
                       float *sx, int threads) {
    int nb = k / 32, groups = (n + TOKENS - 1) / TOKENS;
    quantize_rows(x, n, k, qx, ex, sx);
    size_t slots = (size_t)groups * nb * TOKENS;
    uint32_t *xq = malloc(slots * 8 * 4);
    float *eg = malloc(slots * 4), *sg = malloc(slots * 4);
    pack_tokens((const uint8_t *)qx, n, k, 32, xq);  // int8 quads, a block a step
    pack_scales(ex, sx, n, nb, eg, sg);
#pragma omp parallel num_threads(threads)
    {
        tile_config before;
        tiles_on(&before, &INT8_TILES);
        uint8_t *wa = malloc((size_t)16 * k);
        float *dm = malloc((size_t)2 * 16 * nb * sizeof(float));
#pragma omp for schedule(guided)
        for (int r0 = 0; r0 < o; r0 += 16)
            rows_amx(qw, dw, mw, bias, r0, o - r0 < 16 ? o - r0 : 16, n, k, o, xq, eg, sg, wa, dm, y);
        free(wa);
        free(dm);
        tiles_off(&before);
    }
    free(xq);
    free(eg);
    free(sg);
}

// The fastest path this CPU (and its OS) has: AMX where it has AMX-INT8 and Linux lets this
// process use the tiles, else VNNI where it has AVX512-VNNI, else AVX2. cpu_int4.py gives AMX
// only wide passes.
int int4_path(void) {
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
          && __builtin_cpu_supports("avx512vnni")))
        return AVX2;
    return __builtin_cpu_supports("amx-int8") && tiles_allowed() ? AMX : VNNI;
}

// y [n, o] = x [n, k] @ W.T (+ bias), W as qw [o, k / 32, 16] and fp16 dw, mw [o, k / 32],
// on `path` (AVX2, VNNI or AMX, as int4_path() allows). qx, ex and sx are scratch space of n * k
// bytes and 2 * n * k / 32 floats.
void int4_linear(const float *x, const uint8_t *qw, const uint16_t *dw, const uint16_t *mw,
                 const float *bias, float *y, int n, int k, int o, int8_t *qx, float *ex,
                 float *sx, int path, int threads) {
    if (path == AMX) {
        linear_amx(x, qw, dw, mw, bias, y, n, k, o, qx, ex, sx, threads);
        return;
    }
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
            if (path == VNNI) dots_vnni(wr, q, scale, nb, nt, out);
            else dots_avx2(wr, q, scale, nb, nt, out);
            for (int t = 0; t < nt; t++)
                y[(int64_t)(t0 + t) * o + row] = out[t] + dot_fp16(mr, sx + (int64_t)(t0 + t) * nb, nb)
                                                  + (bias ? bias[row] : 0.f);
        }
    }
}
