// Dense (bf16 or fp32 weight) linear layers over a few rows on an AVX2 CPU: y = x @ W.T + b.
// linear.py compiles and calls it for the short passes of decoding (a token, or a token
// and its drafts). Each weight row is read from memory once for all rows of x, so a pass over
// a few tokens costs about one over a single token; and every output is computed by the same
// instructions whatever the number of rows (one accumulator over the inputs in order, then a
// fixed horizontal sum), so a token's result never depends on the others in its pass. Threads
// split the weight rows. bf16 takes one of three paths, chosen by the caller for the whole
// process (`path`): AVX2 (weights widened to fp32 in registers, 8-lane multiply-adds); on CPUs
// with AVX512-BF16, `vdpbf16ps` (bf16 pairs multiplied and summed into 16 fp32 lanes: four
// times the products per instruction, and no widening); on CPUs with AMX, tile products of 16
// weight rows by 16 tokens, 32 inputs at a time. Each path sums an output the same way
// whatever the pass's width; a layer takes one path for every pass.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "amx_tiles.h"

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// 16 weights at p as two vectors of fp32: bf16 is the upper half of an fp32, exactly. bf16
// comes out even elements first, then odd (one load, a shift and a mask: half the
// instructions of widening 8 at a time), so its inputs are laid out the same way
// (`spread_bf16`).
static inline void load16(const char *p, int bf16, __m256 *w0, __m256 *w1) {
    if (bf16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)p);
        *w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        *w1 = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000)));
    } else {
        *w0 = _mm256_loadu_ps((const float *)p);
        *w1 = _mm256_loadu_ps((const float *)p + 8);
    }
}

static inline float weight(const void *w, int64_t i, int bf16) {
    if (bf16) {
        uint32_t u = (uint32_t)((const uint16_t *)w)[i] << 16;
        float f;
        __builtin_memcpy(&f, &u, 4);
        return f;
    }
    return ((const float *)w)[i];
}

// fp32 -> bf16, rounded to nearest even as PyTorch rounds; NaN stays NaN.
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return 0x7fc0;
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// A tile's weight rows are read from memory a step at a time; the rows after them (most often
// the same thread's next tile) are asked into L2 meanwhile, `per` lines at each step from
// `next` on: a burst would stall on full fill buffers. A prefetch changes no sum, and never
// faults: past a weight's last row it may ask for memory that is not there.
static inline __attribute__((always_inline)) void prefetch_step(const char *next, int64_t lines,
                                                                 int64_t per, int64_t step) {
    for (int64_t l = step * per; l < (step + 1) * per && l < lines; l++)
        _mm_prefetch(next + l * 64, _MM_HINT_T1);
}

// nw weight rows (from w, `stride` bytes apart) against nx rows of xf (fp32, k apart):
// out[x * nw + r]. Called with nw and nx constants, so the loops unroll into registers.
// `ahead`: the first sweep over these rows (it reads them from memory), which prefetches the
// rows after them; later sweeps find both in cache, where prefetching only crowds it.
static inline __attribute__((always_inline)) void tile(
        const char *w, int64_t stride, const void *xv, int k, int nw, int nx, int bf16,
        int ahead, float *out) {
    const float *xf = xv;
    __m256 acc[16];
    for (int i = 0; i < nw * nx; i++) acc[i] = _mm256_setzero_ps();
    int e = bf16 ? 2 : 4, kk = 0;
    int64_t lines = ahead ? nw * stride / 64 : 0, steps = k / 16 ? k / 16 : 1;
    int64_t per = (lines + steps - 1) / steps;
    for (; kk + 16 <= k; kk += 16) {
        prefetch_step(w + nw * stride, lines, per, kk / 16);
        for (int r = 0; r < nw; r++) {
            __m256 w0, w1;
            load16(w + r * stride + kk * e, bf16, &w0, &w1);
            for (int x = 0; x < nx; x++) {
                const float *xv = xf + (int64_t)x * k + kk;
                acc[x * nw + r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xv), acc[x * nw + r]);
                acc[x * nw + r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xv + 8), acc[x * nw + r]);
            }
        }
    }
    for (int x = 0; x < nx; x++)
        for (int r = 0; r < nw; r++) {
            float s = hsum(acc[x * nw + r]);
            for (int i = kk; i < k; i++) s += weight(w + r * stride, i, bf16) * xf[(int64_t)x * k + i];
            out[x * nw + r] = s;
        }
}

// Weight rows [r0, r0 + nw) against rows [x0, x0 + nx) of x (xrow bytes apart), gw weight
// rows and nx rows of x at a time by TILE.
#define SPAN(TILE, GW, NX) \
    for (int r = 0; r < nw; r += GW) { \
        int n = nw - r < GW ? nw - r : GW; \
        const char *wr = w + (int64_t)(r0 + r) * stride; \
        const void *xr = (const char *)xs + (int64_t)x0 * xrow; \
        if (n == GW) TILE(wr, stride, xr, k, GW, NX, bf16, x0 == 0, out); \
        else for (int i = 0; i < n; i++) { \
            float one[NX]; \
            TILE(wr + i * stride, stride, xr, k, 1, NX, bf16, x0 == 0, one); \
            for (int j = 0; j < NX; j++) out[j * n + i] = one[j]; } \
        for (int j = 0; j < NX; j++) \
            for (int i = 0; i < n; i++) acc_out[(int64_t)(x0 + j) * nw + r + i] = out[j * n + i]; \
    }

// Weight rows [r0, r0 + nw) against all m rows of x (fp32, spread when bf16). In AVX2's 16
// vector registers: 4 rows of x with 2 weight rows at a time while 4 are left (each weight
// vector converted once for 4 rows), then pairs with 4, then a single row with 8 (enough
// independent sums to hide the multiply-add's latency). `wide`, in the 32 registers AVX512VL
// gives the same 8-lane instructions: 4 rows with 4 weight rows (16 sums; each weight vector
// loaded once for 4 rows, each x vector once for 4 weight rows), pairs with 8. Each output is
// summed by the same instructions in the same order either way.
static inline __attribute__((always_inline)) void rows(
        const char *w, int64_t stride, const float *xs, int m, int k, int r0, int nw, int bf16,
        float *acc_out /* [m, nw] */, int wide) {
    float out[16];
    int64_t xrow = (int64_t)k * sizeof(float);
    int x0 = 0;
    if (wide) for (; x0 + 4 <= m; x0 += 4) SPAN(tile, 4, 4)
    else for (; x0 + 4 <= m; x0 += 4) SPAN(tile, 2, 4)
    if (wide) for (; x0 + 2 <= m; x0 += 2) SPAN(tile, 8, 2)
    else for (; x0 + 2 <= m; x0 += 2) SPAN(tile, 4, 2)
    if (x0 < m) SPAN(tile, 8, 1)
}

static void rows16(const char *w, int64_t stride, const float *xs, int m, int k, int r0, int nw,
                   int bf16, float *acc_out) {
    rows(w, stride, xs, m, k, r0, nw, bf16, acc_out, 0);
}

#define AVX512VL __attribute__((target("avx2,fma,avx512f,avx512vl")))
AVX512VL static void rows32(const char *w, int64_t stride, const float *xs, int m, int k, int r0,
                            int nw, int bf16, float *acc_out) {
    rows(w, stride, xs, m, k, r0, nw, bf16, acc_out, 1);
}

// The vector registers the AVX2 path's tiles use: 32 where the CPU has AVX512VL, else 16.
// Both give the same bits; avx2_registers(16) (tests, benches) makes a CPU with 32 use 16,
// and returns what it used before; avx2_registers(0) asks without changing anything.
static int registers = 0;

static int most_registers(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") ? 32 : 16;
}

int avx2_registers(int n) {
    int was = registers ? registers : most_registers();
    if (n) registers = n >= 32 ? most_registers() : 16;
    return was;
}

// The AVX512-BF16 path: x and W both bf16, as stored.
#define AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

AVX512_BF16 static inline float hsum16(__m512 v) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}

// As `tile`, 32 inputs at a time: each output one 16-lane accumulator, `vdpbf16ps` adding a
// pair of products per lane (exact products, rounded sums); the last k % 32 inputs are loaded
// with the rest masked to zero, whose products add nothing.
AVX512_BF16 static inline __attribute__((always_inline)) void tile_dot(
        const char *w, int64_t stride, const void *xv, int k, int nw, int nx, int bf16,
        int ahead, float *out) {
    (void)bf16;
    const uint16_t *x = xv;
    __m512 acc[16];
    for (int i = 0; i < nw * nx; i++) acc[i] = _mm512_setzero_ps();
    int64_t lines = ahead ? nw * stride / 64 : 0, steps = (k + 31) / 32;
    int64_t per = (lines + steps - 1) / steps;
    for (int kk = 0; kk < k; kk += 32) {
        prefetch_step(w + nw * stride, lines, per, kk / 32);
        __mmask32 keep = k - kk >= 32 ? 0xffffffffu : (1u << (k - kk)) - 1;
        __m512i xs[4];
        for (int j = 0; j < nx; j++) xs[j] = _mm512_maskz_loadu_epi16(keep, x + (int64_t)j * k + kk);
        for (int r = 0; r < nw; r++) {
            __m512i wv = _mm512_maskz_loadu_epi16(keep, w + r * stride + kk * 2);
            for (int j = 0; j < nx; j++)
                acc[j * nw + r] = _mm512_dpbf16_ps(acc[j * nw + r], (__m512bh)wv, (__m512bh)xs[j]);
        }
    }
    for (int j = 0; j < nx; j++)
        for (int r = 0; r < nw; r++) out[j * nw + r] = hsum16(acc[j * nw + r]);
}

// As `rows` for bf16 x as stored: 4 rows of x with 4 weight rows, pairs with 8, one with 8.
AVX512_BF16 static void rows_dot(const char *w, int64_t stride, const uint16_t *xs, int m, int k,
                                 int r0, int nw, int bf16, float *acc_out) {
    float out[16];
    int64_t xrow = (int64_t)k * 2;
    int x0 = 0;
    for (; x0 + 4 <= m; x0 += 4) SPAN(tile_dot, 4, 4)
    for (; x0 + 2 <= m; x0 += 2) SPAN(tile_dot, 8, 2)
    if (x0 < m) SPAN(tile_dot, 8, 1)
}

enum { AVX2 = 0, DOT = 1, AMX = 2 };

// The AMX path: C [16 weight rows, 16 tokens] += A [16 weight rows, 32 inputs] (W as stored)
// x B [16 input pairs, 16 tokens x 2] (x packed by pack_tokens, 32 inputs a step). Each
// output of the tile sums its own row of A with its own column of B, pair by pair in order; a
// token's outputs never depend on the other columns, padding included.

// Weight rows [r0, r0 + 16 * halves) against `groups` (1 or 2) groups of packed tokens:
// tiles 4-5 hold the weights, 6-7 the tokens, 0-3 the sums (group g, half h: tile 2g + h).
// A tile load costs about two tile products here, so each loaded tile serves two products
// where there are two. out [group][half][16 rows][16 tokens].
AMX_TILES static void block_amx(const uint16_t *w, int k, int r0, int halves, const uint32_t *xp,
                                int groups, float *out) {
    int steps = k / 32;
    int64_t group = (int64_t)steps * 16 * TOKENS;  // uint32 per group of packed tokens
    const uint16_t *w0 = w + (int64_t)r0 * k, *w1 = w0 + (int64_t)16 * k;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int s = 0; s < steps; s++) {
        const uint32_t *b = xp + (int64_t)s * 16 * TOKENS;
        _tile_loadd(6, b, TOKENS * 4);
        _tile_loadd(4, w0 + s * 32, k * 2);
        _tile_dpbf16ps(0, 4, 6);
        if (halves > 1) { _tile_loadd(5, w1 + s * 32, k * 2); _tile_dpbf16ps(1, 5, 6); }
        if (groups > 1) {
            _tile_loadd(7, b + group, TOKENS * 4);
            _tile_dpbf16ps(2, 4, 7);
            if (halves > 1) _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, out, TOKENS * 4);
    if (halves > 1) _tile_stored(1, out + 16 * TOKENS, TOKENS * 4);
    if (groups > 1) _tile_stored(2, out + 2 * 16 * TOKENS, TOKENS * 4);
    if (groups > 1 && halves > 1) _tile_stored(3, out + 3 * 16 * TOKENS, TOKENS * 4);
}

// Every tile 16 rows of 64 bytes (static: see tiles_on).
static const tile_config ALL_16x64 = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

// Which bf16 paths this CPU (and its OS) runs: DOT where it has AVX512-BF16, AMX where it
// also has AMX-BF16 and Linux lets this process use the tiles.
int bf16_path(void) {
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
          && __builtin_cpu_supports("avx512bf16")))
        return AVX2;
    return __builtin_cpu_supports("amx-bf16") && tiles_allowed() ? AMX : DOT;
}

// x [m, k] bf16 -> xf fp32, each 16 inputs even ones first, then odd (as load16 gives weights).
static void spread_bf16(const void *x, int m, int k, float *xf) {
    for (int r = 0; r < m; r++) {
        int64_t o = (int64_t)r * k;
        int i = 0;
        for (; i + 16 <= k; i += 16)
            for (int j = 0; j < 8; j++) {
                xf[o + i + j] = weight(x, o + i + 2 * j, 1);
                xf[o + i + 8 + j] = weight(x, o + i + 2 * j + 1, 1);
            }
        for (; i < k; i++) xf[o + i] = weight(x, o + i, 1);
    }
}

#define BLOCK 16  // weight rows a thread takes at a time (AMX: twice as many)
#define CHUNK 64  // rows of x a sweep over the weights takes (a long prompt takes several)

// The products of weight rows [r0, r0 + nw) with mc rows of x into acc [mc, nw] by `path`
// (xs: x as the path takes it: spread for AVX2, as stored for DOT, packed for AMX). AMX takes
// the rows 16 or 32 at a time and the tokens 32 at a time; a last block of rows that is not a
// multiple of 16 takes DOT (the same rows whatever m, so each output keeps one path).
static void products(int path, const void *w, int64_t stride, const void *xs, const void *x,
                     int mc, int k, int r0, int nw, int bf16, float *acc) {
    if (path == AMX && nw % 16 == 0) {
        int halves = nw / 16, groups = (mc + TOKENS - 1) / TOKENS;
        int64_t group = (int64_t)k / 32 * 16 * TOKENS;
        float out[4 * 16 * TOKENS];
        for (int g0 = 0; g0 < groups; g0 += 2) {
            block_amx(w, k, r0, halves, (const uint32_t *)xs + g0 * group,
                      groups - g0 < 2 ? groups - g0 : 2, out);
            for (int t = g0 * TOKENS; t < mc && t < (g0 + 2) * TOKENS; t++)
                for (int i = 0; i < nw; i++)
                    acc[t * nw + i] = out[((t / TOKENS - g0) * 2 + i / 16) * 16 * TOKENS
                                          + i % 16 * TOKENS + t % TOKENS];
        }
    } else if (path != AVX2) {
        rows_dot(w, stride, x, mc, k, r0, nw, bf16, acc);
    } else {
        if (registers == 32) rows32(w, stride, xs, mc, k, r0, nw, bf16, acc);
        else rows16(w, stride, xs, mc, k, r0, nw, bf16, acc);
    }
}

// y [m, n] = x [m, k] @ W [n, k].T (+ bias [n]); x, W, bias and y all bf16 (bf16 = 1) or all
// fp32. Sums in fp32; bf16 outputs rounded once, after the bias. `path` (bf16 only): AVX2,
// or what bf16_path() allows; AMX takes layers whose k is a multiple of 32, DOT the others.
void dense_linear(const void *x, const void *w, const void *bias, void *y, int m, int k, int n,
                  int bf16, int path, int threads) {
    path = !bf16 ? AVX2 : path == AMX && k % 32 ? DOT : path;
    if (!registers) registers = most_registers();  // a race that writes the same value
    int rows_at_once = m < CHUNK ? m : CHUNK;
    void *xs = path == AVX2 && bf16 ? malloc((size_t)rows_at_once * k * sizeof(float))
             : path == AMX ? malloc((size_t)(rows_at_once + TOKENS - 1) / TOKENS * TOKENS * k * 2)
             : NULL;
    int64_t stride = (int64_t)k * (bf16 ? 2 : 4);
    int block = path == AMX ? 2 * BLOCK : BLOCK, blocks = (n + block - 1) / block;
    for (int x0 = 0; x0 < m; x0 += CHUNK) {
        int mc = m - x0 < CHUNK ? m - x0 : CHUNK;
        const void *xc = (const char *)x + (int64_t)x0 * k * (bf16 ? 2 : 4);
        if (path == AVX2 && bf16) spread_bf16(xc, mc, k, xs);
        if (path == AMX) pack_tokens(xc, mc, 2 * k, 64, xs);
        const void *xp = path == DOT || !xs ? xc : xs;
// guided: a thread the OS or a VM stalls leaves its rows to the other
#pragma omp parallel num_threads(threads)
        {
            tile_config before;
            if (path == AMX) tiles_on(&before, &ALL_16x64);
#pragma omp for schedule(guided)
            for (int b = 0; b < blocks; b++) {
                int r0 = b * block, nw = n - r0 < block ? n - r0 : block;
                float acc[CHUNK * 2 * BLOCK];
                products(path, w, stride, xp, xc, mc, k, r0, nw, bf16, acc);
                for (int r = 0; r < mc; r++)
                    for (int i = 0; i < nw; i++) {
                        float s = acc[r * nw + i] + (bias ? weight(bias, r0 + i, bf16) : 0.f);
                        int64_t at = (int64_t)(x0 + r) * n + r0 + i;
                        if (bf16) ((uint16_t *)y)[at] = to_bf16(s);
                        else ((float *)y)[at] = s;
                    }
            }
            if (path == AMX) tiles_off(&before);
        }
    }
    free(xs);
}
