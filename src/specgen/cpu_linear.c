// Dense (bf16 or fp32 weight) linear layers over a few rows on an AVX2 CPU: y = x @ W.T + b.
// cpu_linear.py compiles and calls it for the short passes of decoding (a token, or a token
// and its drafts). Each weight row is read from memory once for all rows of x, so a pass over
// a few tokens costs about one over a single token; and every output is computed by the same
// instructions whatever the number of rows (one accumulator of 8 lanes over the inputs 16 at
// a time, in order, then a fixed horizontal sum), so a token's result never depends on the
// others in its pass. Threads split the weight rows.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

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

// nw weight rows (from w, `stride` bytes apart) against nx rows of xf (fp32, k apart):
// out[x * nw + r]. Called with nw and nx constants, so the loops unroll into registers.
static inline __attribute__((always_inline)) void tile(
        const char *w, int64_t stride, const float *xf, int k, int nw, int nx, int bf16,
        float *out) {
    __m256 acc[8];
    for (int i = 0; i < nw * nx; i++) acc[i] = _mm256_setzero_ps();
    int e = bf16 ? 2 : 4, kk = 0;
    for (; kk + 16 <= k; kk += 16) {
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

// Weight rows [r0, r0 + nw) against rows [x0, x0 + nx) of x, gw weight rows and nx rows of x
// at a time (gw * nx <= 8 accumulators).
#define SPAN(GW, NX) \
    for (int r = 0; r < nw; r += GW) { \
        int n = nw - r < GW ? nw - r : GW; \
        const char *wr = w + (int64_t)(r0 + r) * stride; \
        const float *xr = xf + (int64_t)x0 * k; \
        if (n == GW) tile(wr, stride, xr, k, GW, NX, bf16, out); \
        else for (int i = 0; i < n; i++) { \
            float one[NX]; \
            tile(wr + i * stride, stride, xr, k, 1, NX, bf16, one); \
            for (int j = 0; j < NX; j++) out[j * n + i] = one[j]; } \
        for (int j = 0; j < NX; j++) \
            for (int i = 0; i < n; i++) acc_out[(int64_t)(x0 + j) * nw + r + i] = out[j * n + i]; \
    }

// Weight rows [r0, r0 + nw) against all m rows of x: 4 rows of x with 2 weight rows at a time
// while 4 are left (each weight vector converted once for 4 rows), then pairs with 4, then a
// single row with 8 (enough independent sums to hide the multiply-add's latency).
static void rows(const char *w, int64_t stride, const float *xf, int m, int k, int r0, int nw,
                 int bf16, float *acc_out /* [m, nw] */) {
    float out[8];
    int x0 = 0;
    for (; x0 + 4 <= m; x0 += 4) SPAN(2, 4)
    for (; x0 + 2 <= m; x0 += 2) SPAN(4, 2)
    if (x0 < m) SPAN(8, 1)
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

#define BLOCK 16  // weight rows a thread takes at a time
#define CHUNK 64  // rows of x a sweep over the weights takes (a long prompt takes several)

// y [m, n] = x [m, k] @ W [n, k].T (+ bias [n]); x, W, bias and y all bf16 (bf16 = 1) or all
// fp32. Sums in fp32; bf16 outputs rounded once, after the bias.
void dense_linear(const void *x, const void *w, const void *bias, void *y, int m, int k, int n,
                  int bf16, int threads) {
    float *spread = bf16 ? malloc((size_t)(m < CHUNK ? m : CHUNK) * k * sizeof(float)) : NULL;
    int64_t stride = (int64_t)k * (bf16 ? 2 : 4);
    int blocks = (n + BLOCK - 1) / BLOCK;
    for (int x0 = 0; x0 < m; x0 += CHUNK) {
        int mc = m - x0 < CHUNK ? m - x0 : CHUNK;
        const float *xf = (const float *)x + (int64_t)x0 * k;
        if (bf16) {
            spread_bf16((const uint16_t *)x + (int64_t)x0 * k, mc, k, spread);
            xf = spread;
        }
// guided: a thread the VM stalls leaves its rows to the other (bench/NOTES.md, Round 11)
#pragma omp parallel for schedule(guided) num_threads(threads)
        for (int b = 0; b < blocks; b++) {
            int r0 = b * BLOCK, nw = n - r0 < BLOCK ? n - r0 : BLOCK;
            float acc[CHUNK * BLOCK];
            rows((const char *)w, stride, xf, mc, k, r0, nw, bf16, acc);
            for (int r = 0; r < mc; r++)
                for (int i = 0; i < nw; i++) {
                    float s = acc[r * nw + i] + (bias ? weight(bias, r0 + i, bf16) : 0.f);
                    int64_t at = (int64_t)(x0 + r) * n + r0 + i;
                    if (bf16) ((uint16_t *)y)[at] = to_bf16(s);
                    else ((float *)y)[at] = s;
                }
        }
    }
    free(spread);
}
