// int8 weights times uint8 activations on an x86 CPU (specgen's `int8-dyn`; int8.py compiles
// and calls it). Weights: int8 [o, k] as stored, a scale per output row (bf16): read where
// they lie, so a cached model's weights are used as mapped, with nothing packed at load.
//
// The bits are those of PyTorch's fbgemm dynamic linear with 7-bit activations
// (`quantized::linear_dynamic(x, w, reduce_range=True)`), which int8-dyn used before:
// - the activations' scale and zero point from the min and max of the whole input, chosen as
//   PyTorch's ChooseQuantizationParams chooses them (double arithmetic, a float scale);
// - each activation fma(x, 1 / scale, zero point), rounded to nearest even, clipped to 0..255;
// - exact integer sums of activation times weight, less zero point times the weight row's sum;
// - output = float(sum) * (activation scale * weight scale), each product rounded to float.
// Integer sums are exact in any order, so every path and tiling gives the same bits.
// An `exact` call (a target's layer) first scales each row into [-1, 1] by its largest
// magnitude, as an anchor row [1, -1, 0...] did for fbgemm: min and max are then -1 and 1 for
// every call, so each row is quantized alone, and its output (times that magnitude) never
// depends on the other rows of its pass.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { AVX2 = 0, VNNI = 1 };

#define CHUNK 64  // bytes of a row per step; activation rows are padded to a multiple

static inline float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// PyTorch's choice of an activation scale and zero point for values in [lo, hi], 7-bit
// (reduce_range: 0..127). The scale is computed in double and kept as a float.
static void choose_qparams(float lo, float hi, float *scale_out, int *zp_out) {
    const int qmin = 0, qmax = 127;
    lo = lo < 0.f ? lo : 0.f;
    hi = hi > 0.f ? hi : 0.f;
    double scale = ((double)hi - lo) / (qmax - qmin);
    if ((float)scale == 0.0f || isinf(1.0f / (float)scale)) scale = 0.1;
    const float small = 6.1e-5f;  // PyTorch's SMALL_SCALE_THRESHOLD
    if (scale < small) {
        float org = (float)scale;
        scale = small;
        if (lo == 0.0f) hi = small * (qmax - qmin);
        else if (hi == 0.0f) lo = -small * (qmax - qmin);
        else {
            float amplifier = small / org;
            lo *= amplifier;
            hi *= amplifier;
        }
    }
    double from_min = qmin - lo / scale, from_max = qmax - hi / scale;
    double err_min = fabs((double)qmin) + fabs(lo / scale);
    double err_max = fabs((double)qmax) + fabs(hi / scale);
    double zp = err_min < err_max ? from_min : from_max;
    *zp_out = zp < qmin ? qmin : zp > qmax ? qmax : (int)nearbyint(zp);
    *scale_out = (float)scale;
}

// fbgemm's quantization (QuantizeAvx2): a fused multiply-add, clipped below 2^31 before the
// conversion (round to nearest even; _mm256_min_ps gives the bound for a NaN), then to 0..255.
static inline __m256i quantize8(__m256 x, __m256 inverse, __m256 zp) {
    __m256 t = _mm256_min_ps(_mm256_fmadd_ps(x, inverse, zp), _mm256_set1_ps(2147483520.f));
    __m256i r = _mm256_cvtps_epi32(t);
    return _mm256_min_epi32(_mm256_max_epi32(r, _mm256_setzero_si256()), _mm256_set1_epi32(255));
}

// Row x (k values, each divided by div first unless div is 1) into qx (kp bytes, zero padded).
static void quantize_row(const float *x, int k, int kp, float div, float inverse, float zp,
                         uint8_t *qx) {
    const __m256 iv = _mm256_set1_ps(inverse), zv = _mm256_set1_ps(zp), dv = _mm256_set1_ps(div);
    int i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        if (div != 1.f) v = _mm256_div_ps(v, dv);
        __m256i q = quantize8(v, iv, zv);
        __m128i q16 = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        _mm_storel_epi64((__m128i *)(qx + i), _mm_packus_epi16(q16, q16));
    }
    for (; i < k; i++) {  // the same instructions, one value at a time
        __m256 v = _mm256_set1_ps(div != 1.f ? x[i] / div : x[i]);
        qx[i] = (uint8_t)_mm256_cvtsi256_si32(quantize8(v, iv, zv));
    }
    memset(qx + k, 0, kp - k);
}

// The largest magnitude of x [len], and its min and max (exact in any order).
static void extremes(const float *x, int64_t len, float *amax, float *lo, float *hi) {
    __m256 mn = _mm256_set1_ps(x[0]), mx = mn;
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        mn = _mm256_min_ps(mn, v);
        mx = _mm256_max_ps(mx, v);
    }
    float a[8], b[8], l = x[0], h = x[0];
    _mm256_storeu_ps(a, mn);
    _mm256_storeu_ps(b, mx);
    for (int j = 0; j < 8; j++) {
        l = fminf(l, a[j]);
        h = fmaxf(h, b[j]);
    }
    for (; i < len; i++) {
        l = fminf(l, x[i]);
        h = fmaxf(h, x[i]);
    }
    *lo = l, *hi = h;
    *amax = fmaxf(-l, h);
}

// --- dot products -------------------------------------------------------------------------

#define AVX512_VNNI __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vnni")))

static inline int32_t hsum256(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

AVX512_VNNI static inline int32_t hsum512(__m512i v) {
    return hsum256(_mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}

// The sums of the 16 lanes of a, b, c and d, in that order.
AVX512_VNNI static inline __m128i sum4(__m512i a, __m512i b, __m512i c, __m512i d) {
    __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    // each 128-bit lane: partial sums of a, b, c, d
    __m512i abcd = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(abcd), _mm512_extracti64x4_epi64(abcd, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
}

// Tokens per block, on both paths: VNNI keeps 4 x 4 sums in registers, AVX2 4 x 2 (wider
// blocks spilled sums to the stack and ran slower).
#define TOKENS 4

// Sums of NT activation rows (stride ldx) times NO weight rows (stride ldw) over k inputs:
// s[t * NO + j]. Called with NT and NO constants.
AVX512_VNNI static inline __attribute__((always_inline)) void dots_vnni(
        const int8_t *w, int64_t ldw, const uint8_t *qx, int64_t ldx, int k, int nt, int no,
        int32_t *s) {
    __m512i acc[TOKENS][4];
    _Pragma("GCC unroll 4") for (int j = 0; j < no; j++)
        _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) acc[t][j] = _mm512_setzero_si512();
    int full = k / CHUNK * CHUNK;
    for (int i = 0; i < full; i += CHUNK) {
        __m512i wv[4];
        _Pragma("GCC unroll 4") for (int j = 0; j < no; j++)
            wv[j] = _mm512_loadu_si512(w + j * ldw + i);
        _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) {
            __m512i a = _mm512_loadu_si512(qx + t * ldx + i);
            _Pragma("GCC unroll 4") for (int j = 0; j < no; j++)
                acc[t][j] = _mm512_dpbusd_epi32(acc[t][j], a, wv[j]);
        }
    }
    if (full < k) {  // the last part of a row: weights past k read as zeros
        __mmask64 in = (1ULL << (k - full)) - 1;
        __m512i wv[4];
        _Pragma("GCC unroll 4") for (int j = 0; j < no; j++)
            wv[j] = _mm512_maskz_loadu_epi8(in, w + j * ldw + full);
        _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) {
            __m512i a = _mm512_loadu_si512(qx + t * ldx + full);
            _Pragma("GCC unroll 4") for (int j = 0; j < no; j++)
                acc[t][j] = _mm512_dpbusd_epi32(acc[t][j], a, wv[j]);
        }
    }
    if (no == 4)  // a token's four sums at once, by a tree (fewer steps than four hsum512s)
        _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++)
            _mm_storeu_si128((__m128i *)(s + t * 4), sum4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]));
    else
        _Pragma("GCC unroll 4") for (int j = 0; j < no; j++)
            _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) s[t * no + j] = hsum512(acc[t][j]);
}

// The same on AVX2: vpmaddubsw's pair sums cannot saturate here (activations of at most 128
// from 7-bit quantization, weights of at least -128), so its sums are exact as well.
static inline __attribute__((always_inline)) void dots_avx2(
        const int8_t *w, int64_t ldw, const uint8_t *qx, int64_t ldx, int k, int nt, int no,
        int32_t *s) {
    __m256i acc[TOKENS][2];
    const __m256i ones16 = _mm256_set1_epi16(1);
    _Pragma("GCC unroll 4") for (int j = 0; j < no; j++)
        _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) acc[t][j] = _mm256_setzero_si256();
    int full = k / 32 * 32;
    for (int i = 0; i < full; i += 32) {
        __m256i wv[2];
        _Pragma("GCC unroll 4") for (int j = 0; j < no; j++)
            wv[j] = _mm256_loadu_si256((const __m256i *)(w + j * ldw + i));
        _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(qx + t * ldx + i));
            _Pragma("GCC unroll 4") for (int j = 0; j < no; j++)
                acc[t][j] = _mm256_add_epi32(acc[t][j],
                                             _mm256_madd_epi16(_mm256_maddubs_epi16(a, wv[j]), ones16));
        }
    }
    _Pragma("GCC unroll 4") for (int j = 0; j < no; j++)
        _Pragma("GCC unroll 4") for (int t = 0; t < nt; t++) {
            int32_t v = hsum256(acc[t][j]);
            for (int i = full; i < k; i++) v += (int32_t)qx[t * ldx + i] * w[j * ldw + i];
            s[t * no + j] = v;
        }
}

// Weights are prefetched this many bytes ahead as they are first read (row_sums): rows are
// contiguous, so this reaches into the next block's rows, whose first loads would otherwise
// wait on memory while the hardware prefetcher finds the new streams.
#define PREFETCH_BYTES 4096

// The sum of each of `no` weight rows (stride ldw) of k values: c[j] (fbgemm's column offsets).
// The first read of a block's weights: the dot products then find them in the cache.
static void row_sums(const int8_t *w, int64_t ldw, int k, int no, int32_t *c) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int j = 0; j < no; j++) {
        const int8_t *r = w + j * ldw;
        __m256i acc = _mm256_setzero_si256();
        int i = 0;
        for (; i + 32 <= k; i += 32) {
            if (!(i & 63)) _mm_prefetch((const char *)r + i + PREFETCH_BYTES, _MM_HINT_T0);
            __m256i v = _mm256_loadu_si256((const __m256i *)(r + i));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16));
        }
        int32_t sum = hsum256(acc);
        for (; i < k; i++) sum += r[i];
        c[j] = sum;
    }
}

#define CASES(F, NT)                                          \
    case NT: F(w, ldw, qx, ldx, k, NT, NO, s); break;

#define VNNI_BLOCK(NO)                                                                        \
    AVX512_VNNI static void block_vnni_##NO(const int8_t *w, int64_t ldw, const uint8_t *qx,   \
                                            int64_t ldx, int k, int nt, int32_t *s) { \
        switch (nt) { CASES(dots_vnni, 1) CASES(dots_vnni, 2) CASES(dots_vnni, 3) CASES(dots_vnni, 4) } \
    }
#define AVX2_BLOCK(NO)                                                                        \
    static void block_avx2_##NO(const int8_t *w, int64_t ldw, const uint8_t *qx,               \
                                int64_t ldx, int k, int nt, int32_t *s) {          \
        switch (nt) { CASES(dots_avx2, 1) CASES(dots_avx2, 2) CASES(dots_avx2, 3) CASES(dots_avx2, 4) } \
    }
#define NO 4
VNNI_BLOCK(4)
#undef NO
#define NO 1
VNNI_BLOCK(1)
#undef NO
#define NO 2
AVX2_BLOCK(2)
#undef NO
#define NO 1
AVX2_BLOCK(1)
#undef NO

typedef void (*block_fn)(const int8_t *, int64_t, const uint8_t *, int64_t, int, int, int32_t *);

int int8_path(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
           && __builtin_cpu_supports("avx512vnni") ? VNNI : AVX2;
}

// y [n, o] = x [n, k] @ W.T with W as w int8 [o, k] and ws bf16 [o], on `path` (AVX2, or VNNI
// where int8_path() allows). `exact`: each row alone (above); its largest magnitudes go to
// amax [n]. qx: scratch of n * kp bytes, kp = k rounded up to 64.
void int8_linear(const float *x, const int8_t *w, const uint16_t *ws, float *y, int n, int k, int o,
                 uint8_t *qx, float *amax, int exact, int path, int threads) {
    int kp = (k + CHUNK - 1) / CHUNK * CHUNK;
    float scale;
    int zp;
    if (exact) {
        choose_qparams(-1.f, 1.f, &scale, &zp);
    } else {
        float a, lo, hi;
        extremes(x, (int64_t)n * k, &a, &lo, &hi);
        choose_qparams(lo, hi, &scale, &zp);
    }
    float inverse = 1.f / scale;
    // rows on every thread where there are enough of them (a prompt's)
#pragma omp parallel for num_threads(threads) if (n > 4)
    for (int r = 0; r < n; r++) {
        if (exact) {
            float a, lo, hi;
            extremes(x + (int64_t)r * k, k, &a, &lo, &hi);
            amax[r] = a > 1e-30f ? a : 1e-30f;
        }
        quantize_row(x + (int64_t)r * k, k, kp, exact ? amax[r] : 1.f, inverse, (float)zp,
                     qx + (int64_t)r * kp);
    }

    int wide = path == VNNI ? 4 : 2;  // outputs per block
    block_fn full = path == VNNI ? block_vnni_4 : block_avx2_2;
    block_fn one = path == VNNI ? block_vnni_1 : block_avx2_1;
    int blocks = (o + wide - 1) / wide;
// guided: a thread the OS or a VM stalls leaves its rows to the other
#pragma omp parallel for schedule(guided) num_threads(threads)
    for (int b = 0; b < blocks; b++) {
        int j0 = b * wide, no = o - j0 < wide ? o - j0 : wide;
        float mult[4];
        for (int j = 0; j < no; j++) mult[j] = scale * bf16_to_float(ws[j0 + j]);
        int32_t s[TOKENS * 4], c[4];
        row_sums(w + (int64_t)j0 * k, k, k, no, c);
        for (int t0 = 0; t0 < n; t0 += TOKENS) {
            int nt = n - t0 < TOKENS ? n - t0 : TOKENS;
            if (no == wide) full(w + (int64_t)j0 * k, k, qx + (int64_t)t0 * kp, kp, k, nt, s);
            else
                for (int j = 0; j < no; j++) {
                    int32_t s1[TOKENS];
                    one(w + (int64_t)(j0 + j) * k, k, qx + (int64_t)t0 * kp, kp, k, nt, s1);
                    for (int t = 0; t < nt; t++) s[t * wide + j] = s1[t];
                }
            for (int t = 0; t < nt; t++)
                for (int j = 0; j < no; j++) {
                    float v = (float)(s[t * wide + j] - zp * c[j]) * mult[j];
                    y[(int64_t)(t0 + t) * o + j0 + j] = exact ? v * amax[t0 + t] : v;
                }
        }
    }
}
