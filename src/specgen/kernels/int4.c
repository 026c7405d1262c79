// int4 weights times int8 activations on an x86 CPU (specgen's `int4-dyn`; int4.py
// compiles and calls it, and its `quantize` writes the format). Weights: blocks of 32
// inputs, each 16 bytes of nibbles q in 0..15 (byte j holds inputs j and j + 16), with a
// scale d and a minimum m in fp16: w = d q + m. Activations: quantized here to int8, per
// token and block of 32 (scale e, values a). A block contributes d e sum(q a) + m e sum(a),
// with exact integer sums (as llama.cpp's Q4_1 x Q8_1). Three paths (int4_path() says which
// this CPU has; int4.py picks one per pass): AVX2 (`vpmaddubsw`) and AVX512-VNNI
// (`vpdpbusd`, a 64-byte load of 4 blocks at a time) give the same bits: the same exact
// integer block sums, scaled and added lane by lane in the same order (see row_dot). On both,
// every output is computed by the same instructions whatever the number of tokens, so a
// token's result never depends on the others in its pass. VNNI unpacks each 64-byte load of
// weights once for up to 4 tokens; AVX2 unpacks it again for each token (an AND and a shift,
// cheaper than keeping the unpacked weights). Tile products take
// prompts only (rows_tiles): by AMX-INT8 where the CPU has it, else by AVX512-VNNI registers,
// with the same bits.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx_tiles.h"

enum { AVX2 = 0, VNNI = 1, AMX = 2, VNNI_TILES = 3 };

// Nibbles are prefetched this many bytes ahead as a row is read, a cache line at a time: a
// whole row asked for at once leaves long rows (a down projection's 4.5 KB) slower than short
// ones. Scales and minima are prefetched whole,
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

// The row-by-row paths read a token's int8 activations a quad of 4 blocks at a time, the way a
// 64-byte load of weights holds them: 128 bytes, the first 16 inputs of each of the 4 blocks
// (the weights' low nibbles), then their last 16 (the high ones). A row is QUAD_BYTES * quads
// long, a last partial quad zero.
#define QUAD_BYTES 128

static inline int quads(int nb) { return (nb + 3) / 4; }

// x [n, k] -> qx int8, its scales ex [n, k / 32] and sx = scale * sum of the block's values
// [n, k / 32]; each token on its own. qx is [n, k] in the inputs' order for the tiles, or in
// quads (above) for the row-by-row paths. Vectorised: the rounding (to nearest, ties to even)
// and the integer sums are those of the scalar loop.
static void quantize_rows(const float *x, int n, int k, int8_t *qx, float *ex, float *sx,
                          int in_quads) {
    int nb = k / 32;
    int64_t row_bytes = in_quads ? (int64_t)quads(nb) * QUAD_BYTES : k;
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (int r = 0; r < n; r++) {
        int8_t *row = qx + r * row_bytes;
        if (in_quads && nb % 4)  // the padding of a last partial quad
            for (int i = nb % 4; i < 4; i++) {
                int64_t at = (int64_t)(nb / 4) * QUAD_BYTES + i * 16;
                _mm_storeu_si128((__m128i *)(row + at), _mm_setzero_si128());
                _mm_storeu_si128((__m128i *)(row + at + 64), _mm_setzero_si128());
            }
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
            if (in_quads) {
                int8_t *at = row + (int64_t)(b / 4) * QUAD_BYTES + (b % 4) * 16;
                _mm_storeu_si128((__m128i *)at, _mm256_castsi256_si128(p));
                _mm_storeu_si128((__m128i *)(at + 64), _mm256_extracti128_si256(p, 1));
            } else {
                _mm256_storeu_si256((__m256i *)(row + b * 32), p);
            }
            __m256i t = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
            __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
            t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1));
            ex[r * nb + b] = e;
            sx[r * nb + b] = e * (float)_mm_cvtsi128_si32(t4);
        }
    }
}

// Both row-by-row paths take a row 16 blocks at a time: first each block's exact integer sum
// of products, then one float pass over the 16 blocks, lane by lane (blocks 0-7, then 8-15):
//     acc = fma(float(sum), d e, acc);  acc = fma(m, e sum(a), acc);  out = hsum(acc).
// Scaling a block once, not each of its partial sums, halves the instructions per weight.
// The integer sums are exact whatever the instructions and the
// float pass is the same lane by lane, so AVX2 and AVX512-VNNI give the same bits, and a
// token's result never depends on the others in its pass.
#define GROUP 16

// The float pass over 8 blocks b0 .. b0 + 7 (zero from nb on) given their integer sums in
// order; e and s are the token's activation scales and scale-times-sums.
static inline __attribute__((always_inline)) __m256 scale8(
        __m256i sums, const uint16_t *dr, const uint16_t *mr, const float *e, const float *s,
        int b0, int nb, __m256 acc) {
    uint16_t d[8] = {0}, m[8] = {0};
    float ev[8] = {0}, sv[8] = {0};
    const uint16_t *dp = dr + b0, *mp = mr + b0;
    const float *ep = e + b0, *sp = s + b0;
    if (nb - b0 < 8) {  // the row's end: zeros past it
        for (int i = 0; i < nb - b0; i++) d[i] = dp[i], m[i] = mp[i], ev[i] = ep[i], sv[i] = sp[i];
        dp = d, mp = m, ep = ev, sp = sv;
    }
    __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dp));
    __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mp));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dv, _mm256_loadu_ps(ep)), acc);
    return _mm256_fmadd_ps(mv, _mm256_loadu_ps(sp), acc);
}

// Blocks b .. b + 3 of a row against one token's quad xq: [0 0 2 2 | 1 1 3 3], each block's
// integer sum in two parts. Weights past the row's end (nb) read as zero.
static inline __attribute__((always_inline)) __m256i quad_avx2(
        const uint8_t *wr, const int8_t *xq, int b, int nb) {
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    uint8_t spare[64];
    const uint8_t *wq = wr + b * 16;
    if (b + 4 > nb) {
        for (int i = 0; i < 64; i++) spare[i] = i < (nb - b) * 16 ? wq[i] : 0;
        wq = spare;
    }
    __m256i v[2];
    for (int h = 0; h < 2; h++) {  // blocks b + 2h, b + 2h + 1: their low nibbles, then high
        __m256i w = _mm256_loadu_si256((const __m256i *)(wq + 32 * h));
        __m256i lo = _mm256_maddubs_epi16(_mm256_and_si256(w, low),
                                          _mm256_loadu_si256((const __m256i *)(xq + 32 * h)));
        __m256i hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w, 4), low),
                                          _mm256_loadu_si256((const __m256i *)(xq + 64 + 32 * h)));
        v[h] = _mm256_madd_epi16(_mm256_add_epi16(lo, hi), ones);  // |sums| < 2^15: exact
    }
    return _mm256_hadd_epi32(v[0], v[1]);
}

// One weight row against nt <= 4 tokens: qx, e, s are the first token's, `stride` bytes of qx
// a token. Called with nt a constant, so that the compiler unrolls the token loops and keeps
// the accumulators in registers.
static inline __attribute__((always_inline)) void row_dot(
        const uint8_t *wr, const uint16_t *dr, const uint16_t *mr, const int8_t *qx,
        const float *e, const float *s, int64_t stride, int nb, int nt, float *out) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256 acc[4][2];
    for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b += 8) {  // a half group: lanes 0-7 or 8-15 of the VNNI path's
        _mm_prefetch((const char *)wr + b * 16 + PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)wr + b * 16 + 64 + PREFETCH_BYTES, _MM_HINT_T0);
        for (int t = 0; t < nt; t++) {
            const int8_t *xq = qx + t * stride + (b / 4) * QUAD_BYTES;
            __m256i first = quad_avx2(wr, xq, b, nb);
            __m256i second = b + 4 < nb ? quad_avx2(wr, xq + QUAD_BYTES, b + 4, nb)
                                        : _mm256_setzero_si256();
            __m256i sums = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(first, second), order);
            int h = (b / 8) % 2;
            acc[t][h] = scale8(sums, dr, mr, e + t * nb, s + t * nb, b, nb, acc[t][h]);
        }
    }
    for (int t = 0; t < nt; t++) out[t] = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
}

// The AVX512-VNNI path: a 64-byte load holds a quad's weights, `vpdpbusd` sums 4 products a
// lane, and an unpack tree reduces 4 quads' lanes to the 16 blocks' sums.
#define AVX512_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni")))

// row_dot on the VNNI path, 16 blocks a step.
AVX512_VNNI static inline __attribute__((always_inline)) void row_dot_vnni(
        const uint8_t *wr, const uint16_t *dr, const uint16_t *mr, const int8_t *qx,
        const float *e, const float *s, int64_t stride, int nb, int nt, float *out) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    // after the tree lane 4i + j holds block 4j + i; this puts block L in lane L
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int g = 0; g < nb; g += GROUP) {
        __m512i v[4][4];  // token, quad: each 128-bit lane a block's 4 partial sums
        for (int j = 0; j < 4; j++) {
            int b = g + 4 * j;
            if (b >= nb) {
                for (int t = 0; t < nt; t++) v[t][j] = _mm512_setzero_si512();
                continue;
            }
            _mm_prefetch((const char *)wr + b * 16 + PREFETCH_BYTES, _MM_HINT_T0);
            __mmask64 in = nb - b >= 4 ? ~0ULL : (1ULL << ((nb - b) * 16)) - 1;
            __m512i w = _mm512_maskz_loadu_epi8(in, wr + b * 16);
            __m512i lo = _mm512_and_si512(w, low);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
            for (int t = 0; t < nt; t++) {
                const int8_t *xq = qx + t * stride + (b / 4) * QUAD_BYTES;
                __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq));
                v[t][j] = _mm512_dpbusd_epi32(d, hi, _mm512_loadu_si512(xq + 64));
            }
        }
        __mmask16 in = nb - g >= GROUP ? 0xFFFF : (__mmask16)((1u << (nb - g)) - 1);
        __m512 dv = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(in, dr + g)));
        __m512 mv = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(in, mr + g)));
        for (int t = 0; t < nt; t++) {
            __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(v[t][0], v[t][1]),
                                          _mm512_unpackhi_epi32(v[t][0], v[t][1]));
            __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(v[t][2], v[t][3]),
                                          _mm512_unpackhi_epi32(v[t][2], v[t][3]));
            __m512i sums = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd),
                                            _mm512_unpackhi_epi64(ab, cd));
            sums = _mm512_permutexvar_epi32(order, sums);
            __m512 de = _mm512_mul_ps(dv, _mm512_maskz_loadu_ps(in, e + t * nb + g));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), de, acc[t]);
            acc[t] = _mm512_fmadd_ps(mv, _mm512_maskz_loadu_ps(in, s + t * nb + g), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) {
        __m256 first = _mm512_castps512_ps256(acc[t]);
        __m256 second = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[t]), 1));
        out[t] = hsum(_mm256_add_ps(first, second));
    }
}

// Each path's dot products of one weight row with up to 4 tokens, called with nt a constant.
static void dots_avx2(const uint8_t *wr, const uint16_t *dr, const uint16_t *mr, const int8_t *q,
                      const float *e, const float *s, int64_t stride, int nb, int nt, float *out) {
    switch (nt) {  // constants: see row_dot()
        case 1: row_dot(wr, dr, mr, q, e, s, stride, nb, 1, out); break;
        case 2: row_dot(wr, dr, mr, q, e, s, stride, nb, 2, out); break;
        case 3: row_dot(wr, dr, mr, q, e, s, stride, nb, 3, out); break;
        default: row_dot(wr, dr, mr, q, e, s, stride, nb, 4, out);
    }
}

AVX512_VNNI static void dots_vnni(const uint8_t *wr, const uint16_t *dr, const uint16_t *mr,
                                  const int8_t *q, const float *e, const float *s, int64_t stride,
                                  int nb, int nt, float *out) {
    switch (nt) {
        case 1: row_dot_vnni(wr, dr, mr, q, e, s, stride, nb, 1, out); break;
        case 2: row_dot_vnni(wr, dr, mr, q, e, s, stride, nb, 2, out); break;
        case 3: row_dot_vnni(wr, dr, mr, q, e, s, stride, nb, 3, out); break;
        default: row_dot_vnni(wr, dr, mr, q, e, s, stride, nb, 4, out);
    }
}

// The tile paths, for wide passes (a prompt): the same int8 activations and integer block
// sums, by tile products of 16 weight rows by 16 tokens over one block (32 inputs), each
// block's sums then scaled in fp32. They add the scaled blocks in another order than the
// row-by-row paths (block after block into one sum, where those keep 16 blocks in 16 lanes),
// so their bits differ from those, and int4.py gives them only passes wider than any
// verify pass. The product is taken by AMX-INT8 tiles where the CPU has them, else by
// `vpdpbusd` on registers (VNNI_TILES): the integer sums are exact either way and the float
// pass is one code, so both give the same bits. Tiles: 0 the sums C [16 rows, 16 tokens]
// int32, 1 the weights A [16 rows, 32 bytes] u8, 2 the tokens B [8 quads, 16 tokens x 4] s8.
#define AMX_INT8 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,amx-tile,amx-int8")))
#define TILE_PATHS __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni,amx-tile,amx-int8")))

static const tile_config INT8_TILES = {
    .palette = 1,
    .colsb = {64, 32, 64},
    .rows = {16, 16, 8},
};

// C = A B for one block: A's 16 rows `k` bytes apart, B as pack_tokens lays it out.
AMX_INT8 static inline void product_amx(const uint8_t *a, int k, const uint32_t *b, int32_t *c) {
    _tile_zero(0);
    _tile_loadd(1, a, k);
    _tile_loadd(2, b, TOKENS * 4);
    _tile_dpbusd(0, 1, 2);
    _tile_stored(0, c, TOKENS * 4);
}

// The same product without AMX: a row's 4 weights of a quad broadcast against B's quad of 16
// tokens, so each of B's 8 registers serves all 16 rows (row by row a weight load serves at
// most 4 tokens).
AVX512_VNNI static inline void product_vnni(const uint8_t *a, int k, const uint32_t *b, int32_t *c) {
    __m512i quad[8];
    for (int q = 0; q < 8; q++) quad[q] = _mm512_loadu_si512(b + q * TOKENS);
    for (int i = 0; i < 16; i++) {
        const uint8_t *row = a + (int64_t)i * k;
        __m512i sum = _mm512_setzero_si512();
        for (int q = 0; q < 8; q++) {
            int32_t four;
            memcpy(&four, row + 4 * q, 4);
            sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi32(four), quad[q]);
        }
        _mm512_storeu_si512(c + i * TOKENS, sum);
    }
}

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

// Weight rows [r0, r0 + nr) (nr <= 16) against every group of tokens into y, by AMX tiles or
// by VNNI registers. Scratch: wa 16 * k bytes (the rows unpacked, zero past nr), dm
// 2 * 16 * k / 32 floats.
TILE_PATHS static void rows_tiles(const uint8_t *qw, const uint16_t *dw, const uint16_t *mw,
                                  const float *bias, int r0, int nr, int n, int k, int o,
                                  const uint32_t *xq, const float *eg, const float *sg,
                                  uint8_t *wa, float *dm, float *y, int amx) {
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
            if (amx) product_amx(wa + b * 32, k, xq + at * 8 * TOKENS, sums);
            else product_vnni(wa + b * 32, k, xq + at * 8 * TOKENS, sums);
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

static void linear_tiles(const float *x, const uint8_t *qw, const uint16_t *dw, const uint16_t *mw,
                         const float *bias, float *y, int n, int k, int o, int8_t *qx, float *ex,
                         float *sx, int amx, int threads) {
    int nb = k / 32, groups = (n + TOKENS - 1) / TOKENS;
    quantize_rows(x, n, k, qx, ex, sx, 0);
    size_t slots = (size_t)groups * nb * TOKENS;
    uint32_t *xq = malloc(slots * 8 * 4);
    float *eg = malloc(slots * 4), *sg = malloc(slots * 4);
    pack_tokens((const uint8_t *)qx, n, k, 32, xq);  // int8 quads, a block a step
    pack_scales(ex, sx, n, nb, eg, sg);
#pragma omp parallel num_threads(threads)
    {
        tile_config before;
        if (amx) tiles_on(&before, &INT8_TILES);
        uint8_t *wa = malloc((size_t)16 * k);
        float *dm = malloc((size_t)2 * 16 * nb * sizeof(float));
#pragma omp for schedule(guided)
        for (int r0 = 0; r0 < o; r0 += 16)
            rows_tiles(qw, dw, mw, bias, r0, o - r0 < 16 ? o - r0 : 16, n, k, o, xq, eg, sg, wa, dm, y, amx);
        free(wa);
        free(dm);
        if (amx) tiles_off(&before);
    }
    free(xq);
    free(eg);
    free(sg);
}

// The fastest path this CPU (and its OS) has: AMX where it has AMX-INT8 and Linux lets this
// process use the tiles, else VNNI where it has AVX512-VNNI, else AVX2. int4.py gives the
// tile paths (AMX, or VNNI_TILES where there is no AMX) only wide passes.
int int4_path(void) {
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
          && __builtin_cpu_supports("avx512vnni")))
        return AVX2;
    return __builtin_cpu_supports("amx-int8") && tiles_allowed() ? AMX : VNNI;
}

// y [n, o] = x [n, k] @ W.T (+ bias), W as qw [o, k / 32, 16] and fp16 dw, mw [o, k / 32],
// on `path` (AVX2, VNNI, AMX or VNNI_TILES, as int4_path() allows). qx, ex and sx are scratch space of
// n * QUAD_BYTES * quads(k / 32) bytes (at least n * k) and 2 * n * k / 32 floats.
void int4_linear(const float *x, const uint8_t *qw, const uint16_t *dw, const uint16_t *mw,
                 const float *bias, float *y, int n, int k, int o, int8_t *qx, float *ex,
                 float *sx, int path, int threads) {
    if (path == AMX || path == VNNI_TILES) {
        linear_tiles(x, qw, dw, mw, bias, y, n, k, o, qx, ex, sx, path == AMX, threads);
        return;
    }
    int nb = k / 32;
    int64_t stride = (int64_t)quads(nb) * QUAD_BYTES;
    quantize_rows(x, n, k, qx, ex, sx, 1);
// guided: a thread the OS or a VM stalls leaves its rows to the other
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
        float out[4];
        for (int t0 = 0; t0 < n; t0 += 4) {
            int nt = n - t0 < 4 ? n - t0 : 4;
            const int8_t *q = qx + t0 * stride;
            const float *e = ex + (int64_t)t0 * nb, *s = sx + (int64_t)t0 * nb;
            if (path == VNNI) dots_vnni(wr, dr, mr, q, e, s, stride, nb, nt, out);
            else dots_avx2(wr, dr, mr, q, e, s, stride, nb, nt, out);
            for (int t = 0; t < nt; t++)
                y[(int64_t)(t0 + t) * o + row] = out[t] + (bias ? bias[row] : 0.f);
        }
    }
}
