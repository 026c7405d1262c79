// The work around a target's matmuls on an AVX2 CPU, in C (rows.py calls it):
// RMSNorm, rotary embedding and causal attention, one row (token) at a time. Every row is computed by the same
// instructions whatever the rows beside it, so a verify pass gives each token the bits of a
// one-token pass. In PyTorch these are a dozen small ops a layer, each paying dispatch.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <omp.h>

#include "exp8.h"

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// y[r] = w * (x[r] / sqrt(mean(x[r]^2) + eps)) for each of the n rows of k values.
void rms_norm(const float *x, const float *w, float *y, int n, int k, float eps) {
    for (int r = 0; r < n; r++) {
        const float *xr = x + (int64_t)r * k;
        float *yr = y + (int64_t)r * k;
        __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
        int i = 0;
        for (; i + 16 <= k; i += 16) {
            __m256 u = _mm256_loadu_ps(xr + i), v = _mm256_loadu_ps(xr + i + 8);
            a = _mm256_fmadd_ps(u, u, a);
            b = _mm256_fmadd_ps(v, v, b);
        }
        float s = hsum(_mm256_add_ps(a, b));
        for (; i < k; i++) s += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(s / k + eps);
        for (i = 0; i < k; i++) yr[i] = w[i] * (xr[i] * inv);
    }
}

// e^x for x <= 0 (scores minus their maximum), 8 at a time (exp8.h)
// (tests/test_kernel_rows.py checks the attention against PyTorch's to 1e-5).
static inline __m256 exp256(__m256 x) {
    return exp8_in_range(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)));  // below: negligible beside the maximum's 1
}

// Rotary embedding as transformers computes it: x cos + rotate_half(x) sin, each product
// rounded, then the sum (FLAGS: no fused multiply-add), so the bits are PyTorch's.
static void rotate(const float *x, const float *cos, const float *sin, float *y, int d) {
    int half = d / 2;
    for (int c = 0; c < half; c++) y[c] = x[c] * cos[c] - x[c + half] * sin[c];
    for (int c = half; c < d; c++) y[c] = x[c] * cos[c] + x[c - half] * sin[c];
}

void attention_rows(const float *q, const float *key, int64_t ks, const float *value,
                    int64_t vs, float *out, int m, int heads, int kv_heads, int t, int d,
                    int window, float scale, float *scratch, int threads);

// A layer's attention in the lean decoder, over its own cache: the m new rows' queries and
// keys rotated (cos, sin [m, d]), keys and values written at positions start.. of the cache
// ([kv_heads, capacity, d] with a head stride of cs), then attention_rows over all of it.
// q, k, v: the projections' outputs, [m, heads * d] and [m, kv_heads * d]; qr: m * heads * d
// floats of scratch; out [m, heads, d].
void rope_attend(const float *q, const float *k, const float *v, const float *cos,
                 const float *sin, float *kcache, float *vcache, int64_t cs, int start, int m,
                 int heads, int kv_heads, int d, float scale, float *qr, float *out,
                 float *scratch, int threads) {
    for (int i = 0; i < m; i++) {
        const float *c = cos + (int64_t)i * d, *s = sin + (int64_t)i * d;
        for (int h = 0; h < heads; h++)
            rotate(q + ((int64_t)i * heads + h) * d, c, s, qr + ((int64_t)i * heads + h) * d, d);
        for (int h = 0; h < kv_heads; h++) {
            int64_t at = h * cs + (int64_t)(start + i) * d, from = ((int64_t)i * kv_heads + h) * d;
            rotate(k + from, c, s, kcache + at, d);
            for (int e = 0; e < d; e++) vcache[at + e] = v[from + e];
        }
    }
    attention_rows(qr, kcache, cs, vcache, cs, out, m, heads, kv_heads, start + m, d, start + m,
                   scale, scratch, threads);
}

// w (<= 4) lanes of 8 outputs of h (<= 2) heads sharing their values: a[x][u] = sum over j in
// order of p[x][j] v[j][8u ..]. Each lane's sum is the same chain whatever w and h are; two
// heads' 4 lanes are 8 chains at once, which keep the multiply-adds from waiting on each
// other, and read each value once for both.
static inline __attribute__((always_inline)) void weigh(float *const *p, const float *v,
                                                        int64_t stride, int n, int w, int h,
                                                        __m256 (*a)[4]) {
    for (int x = 0; x < h; x++)
        for (int u = 0; u < w; u++) a[x][u] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        __m256 pj[2];
        for (int x = 0; x < h; x++) pj[x] = _mm256_set1_ps(p[x][j]);
        for (int u = 0; u < w; u++) {
            __m256 vj = _mm256_loadu_ps(v + j * stride + 8 * u);
            for (int x = 0; x < h; x++) a[x][u] = _mm256_fmadd_ps(pj[x], vj, a[x][u]);
        }
    }
}

// The scores of h (<= 4) query heads q [h, d] against keys j .. j + nk - 1 (nk <= 2) of k
// [n, d], each key loaded once for all h: s[u * t + j] = (q_u . k_j) scale, each dot product
// one chain over the inputs in order, as for one head alone. Two keys' chains are
// independent: a fused multiply-add waits 4 cycles on the one before, so a pair's 2h chains
// keep the units busy where one key's h chains left them waiting.
static inline __attribute__((always_inline)) void score_at(const float *q, const float *k, int j,
                                                           int nk, int d, float scale, int h,
                                                           float *s, int t) {
    __m256 a[2][4];
    for (int x = 0; x < nk; x++)
        for (int u = 0; u < h; u++) a[x][u] = _mm256_setzero_ps();
    for (int c = 0; c < d; c += 8) {
        __m256 kc[2];
        for (int x = 0; x < nk; x++) kc[x] = _mm256_loadu_ps(k + (int64_t)(j + x) * d + c);
        for (int u = 0; u < h; u++) {
            __m256 qu = _mm256_loadu_ps(q + (int64_t)u * d + c);
            for (int x = 0; x < nk; x++) a[x][u] = _mm256_fmadd_ps(qu, kc[x], a[x][u]);
        }
    }
    for (int x = 0; x < nk; x++)
        for (int u = 0; u < h; u++) s[(int64_t)u * t + j + x] = hsum(a[x][u]) * scale;
}

// ... against all n keys, two at a time
static inline __attribute__((always_inline)) void score_keys(const float *q, const float *k,
                                                             int n, int d, float scale, int h,
                                                             float *s, int t) {
    int j = 0;
    for (; j + 2 <= n; j += 2) score_at(q, k, j, 2, d, scale, h, s, t);
    if (j < n) score_at(q, k, j, 1, d, scale, h, s, t);
}

// One head's n scores s, overwritten by their exponentials (less the maximum); 1 / their sum.
static inline float softmax(float *s, int n) {
    float top = -INFINITY;
    for (int j = 0; j < n; j++) top = s[j] > top ? s[j] : top;
    __m256 sum8 = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(top)));
        _mm256_storeu_ps(s + j, e);
        sum8 = _mm256_add_ps(sum8, e);
    }
    float sum = hsum(sum8);
    for (; j < n; j++) {
        s[j] = _mm256_cvtss_f32(exp256(_mm256_set1_ps(s[j] - top)));
        sum += s[j];
    }
    return 1.0f / sum;
}

// h (<= 2) heads' outputs o[x] [d] from their n scores p[x] (softmax), the values v [n, d]
// weighed by them, in a fixed order.
static inline void softmax_weigh(float *const *p, const float *v, int n, int d, int h,
                                 float *const *o) {
    __m256 inv[2];
    for (int x = 0; x < h; x++) inv[x] = _mm256_set1_ps(softmax(p[x], n));
    for (int c0 = 0; c0 < d; c0 += 32) {
        __m256 a[2][4];
        int w = d - c0 >= 32 ? 4 : (d - c0) / 8;
        if (w == 4 && h == 2) weigh(p, v + c0, d, n, 4, 2, a);  // constants: in registers
        else if (w == 4) weigh(p, v + c0, d, n, 4, 1, a);
        else weigh(p, v + c0, d, n, w, h, a);
        for (int x = 0; x < h; x++)
            for (int u = 0; u < w; u++) _mm256_storeu_ps(o[x] + c0 + 8 * u, _mm256_mul_ps(a[x][u], inv[x]));
    }
}

// Causal attention of m new rows over t positions (the m rows are the last m), grouped-query:
// query head h reads key/value head h / (heads / kv_heads). Row i sees positions
// [max(0, end - window), end) with end = t - m + i + 1. q [m, heads, d] contiguous; key and
// value [kv_heads, t, d] with a position stride of d and a head stride of ks / vs; out
// [m, heads, d]. d a multiple of 8; scratch: (heads / kv_heads) t floats per thread. A job is
// a row's query heads of one key/value head, which read each key once (`score_keys`). Every
// output is computed by the same operations in the same order whatever m is: a row's bits
// never depend on the others in its pass. Jobs go to the threads in turn, so the rows of a
// causal pass, dearer the later they stand, are shared evenly.
void attention_rows(const float *q, const float *key, int64_t ks, const float *value,
                    int64_t vs, float *out, int m, int heads, int kv_heads, int t, int d,
                    int window, float scale, float *scratch, int threads) {
    int group = heads / kv_heads;
#pragma omp parallel for schedule(static, 1) num_threads(threads)
    for (int job = 0; job < m * kv_heads; job++) {  // a row's query heads of one key/value head
        int i = job / kv_heads, g = job % kv_heads;
        int end = t - m + i + 1, lo = end > window ? end - window : 0, n = end - lo;
        const float *kr = key + g * ks + (int64_t)lo * d;
        const float *vr = value + g * vs + (int64_t)lo * d;
        float *scores = scratch + (int64_t)omp_get_thread_num() * group * t;
        const float *q0 = q + ((int64_t)i * heads + (int64_t)g * group) * d;
        for (int u = 0; u < group; u += 4) {  // each key read once for up to 4 heads
            const float *qu = q0 + (int64_t)u * d;
            float *su = scores + (int64_t)u * t;
            switch (group - u < 4 ? group - u : 4) {  // h a constant: the chains in registers
                case 1: score_keys(qu, kr, n, d, scale, 1, su, t); break;
                case 2: score_keys(qu, kr, n, d, scale, 2, su, t); break;
                case 3: score_keys(qu, kr, n, d, scale, 3, su, t); break;
                default: score_keys(qu, kr, n, d, scale, 4, su, t);
            }
        }
        for (int u = 0; u < group; u += 2) {  // each value read once for up to 2 heads
            float *p[2], *o[2];
            int h = group - u < 2 ? 1 : 2;
            for (int x = 0; x < h; x++) {
                p[x] = scores + (int64_t)(u + x) * t;
                o[x] = out + ((int64_t)i * heads + (int64_t)g * group + u + x) * d;
            }
            softmax_weigh(p, vr, n, d, h, o);
        }
    }
}
