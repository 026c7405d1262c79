// GGUF's block-quantized weights, read as stored (the file's mapped bytes), times int8
// activations, on an x86 CPU; gguf.py compiles and calls it. y = x @ W.T with W's rows
// `row_bytes` apart, each row a sequence of ggml blocks:
//   Q4_0  (18 B / 32):  fp16 d, 16 B nibbles (byte j: input j low, input j + 16 high); w = d (q - 8)
//   Q5_0  (22 B / 32):  fp16 d, uint32 qh (bit j: input j's 5th bit), 16 B nibbles;   w = d (q - 16)
//   Q8_0  (34 B / 32):  fp16 d, 32 int8;                                              w = d q
//   Q4_K (144 B / 256): fp16 d, dmin, 12 B of 6-bit scales sc and mins m per sub-block of 32,
//                       128 B nibbles (32 B per 64 inputs: the low nibbles the first sub-block,
//                       the high ones the second);                       w = d sc q - dmin m
//   Q5_K (176 B / 256): as Q4_K with 32 B qh after the scales (sub-block s: bit s of qh[l])
//   Q6_K (210 B / 256): 128 B low nibbles, 64 B high 2 bits, 16 int8 scales (one per 16
//                       inputs), fp16 d;                                 w = d sc (q - 32)
// Activations are quantized here, per token: int8 with a float scale e = amax / 127 per block
// of 32 (the 32-blocks) or per super-block of 256 (the K-quants), rounded to nearest even.
//
// The bit contract. Every integer sum is exact, so its value never depends on the order or
// the instructions. The float work is one fixed sequence of operations per token and weight
// row, the same on every path (AVX2, AVX512-VNNI, AMX tiles) and whatever the number of tokens
// in the pass (see "The order of the float work" of each family below):
//   32-blocks: each block's exact sum of its 32 products is scaled into one of 16 lanes,
//   lane b mod 16, by one fused multiply-add; the lanes are summed in a fixed order.
//   K-quants: lane i of a super-block's integer sums holds inputs 4i..4i+3 of each 32 of it
//   times their sub-block's scale, on AVX2 by construction, on AVX512-VNNI by a register
//   holding the same 32 inputs of two super-blocks (lanes 0-7 the first's), on the tiles by
//   taking the inputs in that order; even and odd super-blocks add into two 8-lane
//   accumulators.
// Each weight block is unpacked once per tile of tokens; a token's result never depends on
// the tile it is in.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx_tiles.h"
#include "exp8.h"

enum { AVX2 = 0, VNNI = 1, AMX = 2 };
enum { Q4_0 = 2, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };  // ggml's type ids
static inline int is_kq(int fmt) { return fmt == Q4_K || fmt == Q5_K || fmt == Q6_K; }

#define AI static inline __attribute__((always_inline))
#define VNNI_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
// Weights are prefetched ahead as a row is read (rows follow each other in the file, so this
// runs into the next row). A pass of up to NARROW tokens is bound by how much of its memory
// waits overlap its arithmetic: it also prefetches into L2 further ahead, which keeps more
// lines on their way (far enough ahead to cover the memory's latency at the rate such a pass
// reads); a wider pass is bound by its arithmetic, which the extra instructions would slow
// (bench/kernel_costs.py stream measures both).
#define PREFETCH_BYTES 2048  // into L1, wider passes
#define PREFETCH_L1 1024     // into L1, narrow passes
#define PREFETCH_L2 8192     // into L2, narrow passes
#define NARROW 4             // tokens in a narrow pass, at most

// The lines of `bytes` bytes from p, ahead, for a pass of nt tokens (a constant once inlined)
AI void prefetch_weights(const void *p, int bytes, int nt) {
    for (int i = 0; i < bytes; i += 64) {
        if (nt <= NARROW) {
            _mm_prefetch((const char *)p + PREFETCH_L2 + i, _MM_HINT_T1);
            _mm_prefetch((const char *)p + PREFETCH_L1 + i, _MM_HINT_T0);
        } else
            _mm_prefetch((const char *)p + PREFETCH_BYTES + i, _MM_HINT_T0);
    }
}

// Tokens whose dot products share one unpacking of a weight block (a verify pass of 5 or 8
// rows is one tile).
#define TILE 8

// One call's activations. Token t's: q + t k, ex + 8 t k / 256, s16 + t k / 16, e + t k / 32;
// the 32-blocks' q4 + 512 t ng, e16 and c16 + 16 t ng (ng: groups of 16 blocks).
typedef struct {
    const int8_t *q;     // int8, inputs in order (the 32-blocks on AMX: zeros up to a whole
                         // tile of 16 tokens)
    const float *ex;     // K-quants: each super-block's scale 8 times, a vector's lanes
    const int16_t *s16;  // K-quants: sum of each 16 values (minimums, Q6_K's offset)
    const float *s32;    // K-quants: each 32 values' sum as a float, [token][super-block][8]
    const int8_t *qp;    // K-quants on VNNI: q with each pair of super-blocks interleaved by
                         // 32 (s's inputs 32j.., then s + 1's), an odd last one in order
    const int8_t *qa;    // K-quants on AMX: q by tiles of tokens, lane by lane (lanes_by_tile)
    const float *e;      // 32-blocks on AMX: each block's scale
    const int8_t *q4;    // 32-blocks on AVX2, VNNI: q by sets of 4 blocks (sets_of_4)
    const float *e16;    // 32-blocks on AVX2, VNNI: the blocks' scales and the offsets'
    const int32_t *c16;  // share, -offset sum(a), per group of 16 at the path's lanes
    int k;
} Acts;

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// The fixed horizontal sum every output ends with.
AI float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// The float step, lane by lane: acc +- float(isum) * scale, one explicit fused multiply-add
// (rounded once, the same instruction on both paths).
AI __m256 step(__m256 acc, __m256i isum, __m256 scale) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc);
}

AI __m256 step_sub(__m256 acc, __m256i isum, __m256 scale) {
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc);
}

// A call's activation buffers start on a cache line, so that the kernels' 512-bit loads of
// them never straddle two lines (malloc aligns to 16 bytes; a straddling load costs two).
static void *lines(size_t bytes, int zero) {
    size_t n = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, n ? n : 64);
    if (p && zero) memset(p, 0, n);
    return p;
}

// x [m, k] -> int8 q, scales e per `group` inputs. Vectorised; the rounding (nearest, ties to
// even: cvtps under the default MXCSR) is that of nearbyintf(x * (1 / e)) in a scalar loop.
static void quantize_acts(const float *x, int m, int k, int group, int8_t *q, float *e) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    int ng = k / group;
    for (int r = 0; r < m; r++)
        for (int g = 0; g < ng; g++) {
            const float *v = x + (int64_t)r * k + g * group;
            __m256 mx = _mm256_setzero_ps();
            for (int i = 0; i < group; i += 8)
                mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            float s = _mm_cvtss_f32(h) / 127.f, inv = s > 0.f ? 1.f / s : 0.f;
            e[(int64_t)r * ng + g] = s;
            __m256 iv = _mm256_set1_ps(inv);
            for (int i = 0; i < group; i += 32) {
                __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), iv));
                __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i + 8), iv));
                __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i + 16), iv));
                __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i + 24), iv));
                // packs interleave the 128-bit lanes; the permute puts the values back in order
                __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
                p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                _mm256_storeu_si256((__m256i *)(q + (int64_t)r * k + g * group + i), p);
            }
        }
}

// ---- 32-blocks: Q4_0, Q5_0, Q8_0 ---------------------------------------------------------

static inline int block_bytes(int fmt) { return fmt == Q4_0 ? 18 : fmt == Q5_0 ? 22 : 34; }

// The order of the float work of the 32-blocks, every path: a token's dot product with a
// weight row is, per block b, the exact integer sum isum_b of its 32 products a (q - offset),
// then 16 accumulators, lane L taking the blocks b = L mod 16 in order:
//     acc[b % 16] = fma(float(isum_b), d_b e_b, acc[b % 16])
// (a lane no block reaches stays +0), and the result is hsum8(E + O), E the lanes 0-7 and O
// the lanes 8-15. The paths hold the lanes in registers in their own order (below) and put
// them back in lane order before the sum. So the float work is one fused multiply-add per 16
// blocks on VNNI, per 8 on AVX2, and one per 16 weight rows on the tiles.
//
// AVX2 and VNNI take the blocks in sets of 4 from Acts.q4 (see sets_of_4): one register's
// bytes hold the inputs 0-15 of its blocks, another's the inputs 16-31 (the nibbles of Q4_0
// and Q5_0 as stored), so each block's sum collects in one 128-bit lane, then the lanes of
// several blocks add up by pairwise (hadd) steps to one block a lane.

// Where a group of 16 blocks' sums land: VNNI's register lane p holds block 4 (p % 4) + p / 4;
// AVX2 holds the group in two registers of 8, E's lane p block p < 4 ? 2p : 2p - 7 (O's the
// same + 8).
static inline int vnni_block(int p) { return 4 * (p % 4) + p / 4; }
static inline int avx2_block(int p) { return p < 8 ? (p < 4 ? 2 * p : 2 * p - 7) : 8 + avx2_block(p - 8); }

AI __m128i load16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }

// Two blocks' weights (b1 NULL: none, zeros) as the halves of `lo` (inputs 0-15 of b0, then
// of b1) and `hi` (inputs 16-31): q in 0..15 or 0..31 (the offset taken off through Acts.c16),
// or Q8_0's int8.
AI void pair_avx2(int fmt, const uint8_t *b0, const uint8_t *b1, __m256i *lo, __m256i *hi) {
    const __m128i z = _mm_setzero_si128();
    if (fmt == Q8_0) {
        *lo = _mm256_set_m128i(b1 ? load16(b1 + 2) : z, load16(b0 + 2));
        *hi = _mm256_set_m128i(b1 ? load16(b1 + 18) : z, load16(b0 + 18));
        return;
    }
    int at = fmt == Q4_0 ? 2 : 6;
    __m256i w = _mm256_set_m128i(b1 ? load16(b1 + at) : z, load16(b0 + at));
    const __m256i low = _mm256_set1_epi8(0x0F);
    *lo = _mm256_and_si256(w, low);
    *hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
    if (fmt == Q5_0) {  // byte j of a half: bit j of its block's 16 bits (ggml's bytes_from_bits_32)
        uint32_t h0, h1 = 0;
        memcpy(&h0, b0 + 2, 4);
        if (b1) memcpy(&h1, b1 + 2, 4);
        __m256i both = _mm256_set1_epi64x((int64_t)((uint64_t)h1 << 32 | h0));
        const __m256i pick = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0404040404040404, 0x0505050505050505);
        const __m256i bits = _mm256_set1_epi64x(0x8040201008040201), bit = _mm256_set1_epi8(0x10);
        __m256i l = _mm256_and_si256(_mm256_shuffle_epi8(both, pick), bits);
        __m256i h = _mm256_and_si256(_mm256_shuffle_epi8(both, _mm256_add_epi8(pick, _mm256_set1_epi8(2))), bits);
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_cmpeq_epi8(l, bits), bit));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_cmpeq_epi8(h, bits), bit));
    }
}

// A pair's sums for one token (a: its set's bytes, the pair's at a and a + 64): 4 lanes per
// block, b0's in the low 128 bits.
AI __m256i pair_sums_avx2(int fmt, __m256i lo, __m256i hi, const int8_t *a) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i al = _mm256_loadu_si256((const __m256i *)a), ah = _mm256_loadu_si256((const __m256i *)(a + 64));
    if (fmt == Q8_0)  // |q| * (a with q's sign): pairs within int16 (|q| <= 128, |a| <= 127)
        return _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(al, lo)), ones),
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(ah, hi)), ones));
    // q <= 31: two pairs of products stay within int16
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, al), _mm256_maddubs_epi16(hi, ah)), ones);
}

// Blocks b .. b + cnt - 1 (cnt 1..8: one of AVX2's registers of a group) against nt tokens:
// their sums at avx2_block's lanes (absent blocks 0, their scale 0), into acc.
AI void b32_eight_avx2(int fmt, const uint8_t *wr, int b, int cnt, int half, const Acts *A,
                       int t0, int nt, __m256 *acc) {
    const int bb = block_bytes(fmt), ng = (A->k / 32 + 15) / 16;
    const uint8_t *blk = wr + (int64_t)b * bb;
    __m256i lo[4], hi[4];
    for (int i = 0; i < 4; i++) {
        prefetch_weights(blk + 2 * i * bb, 2 * bb, nt);  // spread: a burst stalls on full fill buffers
        if (2 * i < cnt)
            pair_avx2(fmt, blk + 2 * i * bb, 2 * i + 1 < cnt ? blk + (2 * i + 1) * bb : NULL, &lo[i], &hi[i]);
        else
            lo[i] = hi[i] = _mm256_setzero_si256();
    }
    // d at avx2_block's lanes: blocks 0 2 4 6 1 3 5 7, absent ones 0
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7), _mm256_set1_epi32(bb));
    __m256i there = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    __m256i h = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)blk, idx, there, 1);
    h = _mm256_shuffle_epi8(h, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                                0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1));
    __m256 d = _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(h, 0x08)));
    int g = b / 16;
    for (int t = 0; t < nt; t++) {
        int64_t tok = t0 + t;
        const int8_t *a = A->q4 + (tok * ng + g) * 512 + (b % 16) * 32;  // the set of b
        __m256i p0 = pair_sums_avx2(fmt, lo[0], hi[0], a), p1 = pair_sums_avx2(fmt, lo[1], hi[1], a + 32);
        __m256i p2 = _mm256_setzero_si256(), p3 = _mm256_setzero_si256();
        if (cnt > 4) {
            p2 = pair_sums_avx2(fmt, lo[2], hi[2], a + 128);
            p3 = pair_sums_avx2(fmt, lo[3], hi[3], a + 160);
        }
        __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
        int64_t at = (tok * ng + g) * 16 + 8 * half;
        s = _mm256_add_epi32(s, _mm256_loadu_si256((const __m256i *)(A->c16 + at)));
        acc[t] = step(acc[t], s, _mm256_mul_ps(d, _mm256_loadu_ps(A->e16 + at)));
    }
}

// hsum8(E + O) of E and O at avx2_block's lanes.
AI float b32_finish_avx2(__m256 e, __m256 o) {
    return hsum8(_mm256_permutevar8x32_ps(_mm256_add_ps(e, o), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// One weight row against nt tokens t0 .. t0 + nt - 1 (nt a constant after inlining).
AI void b32_avx2(int fmt, const uint8_t *wr, int nb, const Acts *A, int t0, int nt, float *out) {
    __m256 even[TILE], odd[TILE];
    for (int t = 0; t < nt; t++) even[t] = odd[t] = _mm256_setzero_ps();
    int b = 0;
    for (; b + 16 <= nb; b += 16) {
        b32_eight_avx2(fmt, wr, b, 8, 0, A, t0, nt, even);
        b32_eight_avx2(fmt, wr, b + 8, 8, 1, A, t0, nt, odd);
    }
    // A last group of whole sets (the draft's K = 896: 28 blocks) with its counts constants,
    // so that its unpacking has no branches on them.
    int left = nb - b;
    if (left % 4) {
        if (left > 0) b32_eight_avx2(fmt, wr, b, left < 8 ? left : 8, 0, A, t0, nt, even);
        if (left > 8) b32_eight_avx2(fmt, wr, b + 8, left - 8, 1, A, t0, nt, odd);
    } else if (left) {
        b32_eight_avx2(fmt, wr, b, left == 4 ? 4 : 8, 0, A, t0, nt, even);
        if (left == 12) b32_eight_avx2(fmt, wr, b + 8, 4, 1, A, t0, nt, odd);
    }
    for (int t = 0; t < nt; t++) out[t] = b32_finish_avx2(even[t], odd[t]);
}

// A set of 4 blocks' weights (cnt 1..4 of them there, the rest zeros) as VNNI's unsigned
// bytes: lo the inputs 0-15 of each, hi 16-31, a block a 128-bit lane (Q8_0: q + 128, Acts.c16
// taking 128 sum(a) off). Q5_0: qh holds the 4 blocks' high bits in each 128-bit lane.
VNNI_TARGET AI void set_vnni(int fmt, const uint8_t *blk, int cnt, __m512i qh, __m512i *lo, __m512i *hi) {
    const int bb = block_bytes(fmt);
    const int at = fmt == Q4_0 ? 2 : fmt == Q5_0 ? 6 : 2;
    __m512i w = _mm512_setzero_si512(), w2 = _mm512_setzero_si512();
    if (cnt == 4) {
        w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(load16(blk + bb + at), load16(blk + at))),
                               _mm256_set_m128i(load16(blk + 3 * bb + at), load16(blk + 2 * bb + at)), 1);
        if (fmt == Q8_0)
            w2 = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_set_m128i(load16(blk + bb + 18), load16(blk + 18))),
                _mm256_set_m128i(load16(blk + 3 * bb + 18), load16(blk + 2 * bb + 18)), 1);
    } else {
        for (int i = 0; i < cnt; i++) {
            w = _mm512_mask_broadcast_i32x4(w, (__mmask16)(0xF << 4 * i), load16(blk + i * bb + at));
            if (fmt == Q8_0)
                w2 = _mm512_mask_broadcast_i32x4(w2, (__mmask16)(0xF << 4 * i), load16(blk + i * bb + 18));
        }
    }
    if (fmt == Q8_0) {
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        __mmask8 there = (__mmask8)((1u << 2 * cnt) - 1);  // absent blocks stay 0, not 128
        *lo = _mm512_maskz_xor_epi64(there, w, flip);
        *hi = _mm512_maskz_xor_epi64(there, w2, flip);
        return;
    }
    const __m512i low = _mm512_set1_epi8(0x0F);
    *lo = _mm512_and_si512(w, low);
    *hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
    if (fmt == Q5_0) {  // qh: the 4 blocks' in each 128-bit lane; lane i takes block i's bits
        const __m512i bits = _mm512_set1_epi64(0x8040201008040201);
        const __m512i lo_bytes = _mm512_setr_epi64(0, 0x0101010101010101, 0x0404040404040404,
                                                   0x0505050505050505, 0x0808080808080808,
                                                   0x0909090909090909, 0x0C0C0C0C0C0C0C0C,
                                                   0x0D0D0D0D0D0D0D0D);
        const __m512i two = _mm512_set1_epi8(2), bit = _mm512_set1_epi8(0x10);
        __mmask64 l = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, lo_bytes), bits);
        __mmask64 h = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, _mm512_add_epi8(lo_bytes, two)), bits);
        *lo = _mm512_mask_add_epi8(*lo, l, *lo, bit);
        *hi = _mm512_mask_add_epi8(*hi, h, *hi, bit);
    }
}

// Where the CPU has AVX512-VBMI, a whole set of 4 Q4_0 or Q5_0 blocks is unpacked from two
// loads by byte permutes (vpermt2b), in place of 4 loads and their inserts, and the blocks'
// scales and Q5_0's high bits come from the same loads, in place of a group's gathers (dear
// on Zen 4): the same bytes, so the same sums and bits. This is a one-token pass's fixed cost,
// which its memory waits do not hide for Q5_0. vpermt2b is written in asm so that one build
// serves CPUs with and without VBMI.
static int use_vbmi = -1;  // -1: not yet asked of the CPU

// Sets whether VNNI passes unpack by VBMI and returns it: `use` 1 where the CPU has VBMI, 0
// never, -1 the CPU's default (where it has it). Tests and benchmarks compare both ways.
int gguf_vbmi(int use) {
    int have = __builtin_cpu_supports("avx512vbmi");
    use_vbmi = use < 0 ? have : use && have;
    return use_vbmi;
}

// byte j of lane i (i = 0..3, j = 0..15) of a set's 4 blocks of bb bytes: Q4_0's and Q5_0's
// nibbles (at 2 and 6), Q5_0's qh bytes for inputs 0-15 (j / 8 at 2) and 16-31 (at 4)
#define LANE16(x) x, x + 1, x + 2, x + 3, x + 4, x + 5, x + 6, x + 7, x + 8, x + 9, x + 10, \
                  x + 11, x + 12, x + 13, x + 14, x + 15
#define HIGH16(x) x, x, x, x, x, x, x, x, x + 1, x + 1, x + 1, x + 1, x + 1, x + 1, x + 1, x + 1
#define SET(F, bb, at) F(at), F(bb + (at)), F(2 * (bb) + (at)), F(3 * (bb) + (at))
static const uint8_t Q4_0_NIBBLES[64] __attribute__((aligned(64))) = {SET(LANE16, 18, 2)};
static const uint8_t Q5_0_NIBBLES[64] __attribute__((aligned(64))) = {SET(LANE16, 22, 6)};
static const uint8_t Q5_0_QH_LO[64] __attribute__((aligned(64))) = {SET(HIGH16, 22, 2)};
static const uint8_t Q5_0_QH_HI[64] __attribute__((aligned(64))) = {SET(HIGH16, 22, 4)};
// the d of the set's block p / 4 in word p (p = 0..15): b32_group_vnni's word p takes it from
// set p % 4 (vnni_block)
#define D4(bb, i) bb * (i), bb * (i) + 1, bb * (i), bb * (i) + 1, bb * (i), bb * (i) + 1, bb * (i), bb * (i) + 1
#define D16(bb) D4(bb, 0), D4(bb, 1), D4(bb, 2), D4(bb, 3)
static const uint8_t Q4_0_D[64] __attribute__((aligned(64))) = {D16(18)};
static const uint8_t Q5_0_D[64] __attribute__((aligned(64))) = {D16(22)};
#undef D4
#undef D16
#undef LANE16
#undef HIGH16
#undef SET

// bytes idx[i] of the 128 at t (0-63) and u (64-127)
VNNI_TARGET AI __m512i permute2(__m512i t, const uint8_t *idx, __m512i u) {
    __m512i i = _mm512_load_si512(idx);
    __asm__("vpermt2b %2, %1, %0" : "+v"(t) : "v"(i), "v"(u));
    return t;
}

// Set s of a group, 4 whole Q4_0 or Q5_0 blocks, as set_vnni gives it, by VBMI; and their
// d into the words 4 i + s of dw, the words that b32_group_vnni converts (vnni_block).
VNNI_TARGET AI void set_vbmi(int fmt, const uint8_t *blk, int s, __m512i *lo, __m512i *hi,
                             __m512i *dw) {
    const int bb = block_bytes(fmt);
    __m512i t = _mm512_loadu_si512(blk);  // the set's bytes 0-63, then the rest (never past it)
    __m512i u = _mm512_maskz_loadu_epi8((__mmask64)((1ull << (4 * bb - 64)) - 1), blk + 64);
    *dw = _mm512_mask_mov_epi16(*dw, (__mmask32)(0x1111u << s),
                                permute2(t, fmt == Q4_0 ? Q4_0_D : Q5_0_D, u));
    __m512i w = permute2(t, fmt == Q4_0 ? Q4_0_NIBBLES : Q5_0_NIBBLES, u);
    const __m512i low = _mm512_set1_epi8(0x0F);
    *lo = _mm512_and_si512(w, low);
    *hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
    if (fmt == Q5_0) {  // byte j of a lane: bit j % 8 of its qh byte
        const __m512i bits = _mm512_set1_epi64(0x8040201008040201), bit = _mm512_set1_epi8(0x10);
        __mmask64 l = _mm512_test_epi8_mask(permute2(t, Q5_0_QH_LO, u), bits);
        __mmask64 h = _mm512_test_epi8_mask(permute2(t, Q5_0_QH_HI, u), bits);
        *lo = _mm512_mask_add_epi8(*lo, l, *lo, bit);
        *hi = _mm512_mask_add_epi8(*hi, h, *hi, bit);
    }
}

// [a0+a1, a2+a3, b0+b1, b2+b3] in each 128-bit lane
VNNI_TARGET AI __m512i hadd512(__m512i a, __m512i b) {
    __m512 x = _mm512_castsi512_ps(a), y = _mm512_castsi512_ps(b);
    return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(x, y, 0x88)),
                            _mm512_castps_si512(_mm512_shuffle_ps(x, y, 0xDD)));
}

// Blocks b .. b + cnt - 1 (cnt 1..16, a group of 16) against nt tokens, into acc at
// vnni_block's lanes (an absent block adds 0 times scale 0).
VNNI_TARGET AI void b32_group_vnni(int fmt, const uint8_t *wr, int b, int cnt, const Acts *A, int t0,
                                   int nt, __m512 *acc) {
    const int bb = block_bytes(fmt), ng = (A->k / 32 + 15) / 16;
    const uint8_t *blk = wr + (int64_t)b * bb;
    // whole sets by VBMI where the CPU has it (Q4_0, Q5_0); set_vnni takes the others
    const int by_vbmi = use_vbmi > 0 && (fmt == Q4_0 || fmt == Q5_0);
    // whole sets only: no gather (dear on some CPUs), d and qh come with the nibbles
    const int whole = by_vbmi && cnt % 4 == 0;
    __m512i lo[4], hi[4], qh = _mm512_setzero_si512(), dw = _mm512_setzero_si512();
    if (fmt == Q5_0 && !whole)  // the blocks' qh in order, absent ones 0
        qh = _mm512_mask_i32gather_epi32(
            qh, cnt == 16 ? 0xFFFF : (__mmask16)((1u << cnt) - 1),
            _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                               _mm512_set1_epi32(bb)), blk + 2, 1);
    for (int s = 0; s < 4; s++) {
        prefetch_weights(blk + 4 * s * bb, 4 * bb, nt);  // spread over the group: a burst stalls on full fill buffers
        if (by_vbmi && 4 * s + 4 <= cnt)
            set_vbmi(fmt, blk + 4 * s * bb, s, &lo[s], &hi[s], &dw);
        else if (4 * s < cnt)
            set_vnni(fmt, blk + 4 * s * bb, cnt - 4 * s < 4 ? cnt - 4 * s : 4,
                     _mm512_shuffle_i32x4(qh, qh, 0x55 * s), &lo[s], &hi[s]);
        else
            lo[s] = hi[s] = _mm512_setzero_si512();
    }
    __m512 d;
    if (whole) {
        d = _mm512_cvtph_ps(_mm512_castsi512_si256(dw));
    } else {
        const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        __mmask16 there = cnt == 16 ? 0xFFFF : _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(cnt), order);
        __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), there,
                                                _mm512_mullo_epi32(order, _mm512_set1_epi32(bb)), blk, 1);
        d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
    }
    int g = b / 16;
    for (int t = 0; t < nt; t++) {
        int64_t tok = t0 + t;
        const int8_t *a = A->q4 + (tok * ng + g) * 512;
        __m512i p[4];
        for (int s = 0; s < 4; s++) {
            if (4 * s < cnt)
                p[s] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[s],
                                                               _mm512_loadu_si512(a + 128 * s)),
                                           hi[s], _mm512_loadu_si512(a + 128 * s + 64));
            else
                p[s] = _mm512_setzero_si512();
        }
        __m512i sum = hadd512(hadd512(p[0], p[1]), hadd512(p[2], p[3]));
        sum = _mm512_add_epi32(sum, _mm512_loadu_si512(A->c16 + (tok * ng + g) * 16));
        __m512 de = _mm512_mul_ps(d, _mm512_loadu_ps(A->e16 + (tok * ng + g) * 16));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), de, acc[t]);
    }
}

VNNI_TARGET AI void b32_vnni(int fmt, const uint8_t *wr, int nb, const Acts *A, int t0, int nt,
                             float *out) {
    __m512 acc[TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    int b = 0;
    for (; b + 16 <= nb; b += 16) b32_group_vnni(fmt, wr, b, 16, A, t0, nt, acc);
    switch (nb - b) {  // a last group of whole sets with its count a constant, as AVX2's
        case 0: break;
        case 4: b32_group_vnni(fmt, wr, b, 4, A, t0, nt, acc); break;
        case 8: b32_group_vnni(fmt, wr, b, 8, A, t0, nt, acc); break;
        case 12: b32_group_vnni(fmt, wr, b, 12, A, t0, nt, acc); break;
        default: b32_group_vnni(fmt, wr, b, nb - b, A, t0, nt, acc);
    }
    // back to lane order (vnni_block is its own inverse), then hsum8(E + O)
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (int t = 0; t < nt; t++) {
        __m512 v = _mm512_permutexvar_ps(order, acc[t]);
        out[t] = hsum8(_mm256_add_ps(_mm512_castps512_ps256(v),
                                     _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
    }
}

// q [m, k] -> Acts.q4: per token, groups of 16 blocks (512 bytes, zeros past the last block),
// each 4 sets of 4 blocks: the 4 blocks' inputs 0-15, then their inputs 16-31.
static void sets_of_4(const int8_t *q, int m, int k, int8_t *q4) {
    int nb = k / 32, ng = (nb + 15) / 16;
    memset(q4, 0, (size_t)m * ng * 512);
    for (int64_t r = 0; r < m; r++)
        for (int b = 0; b < nb; b++) {
            int8_t *to = q4 + r * ng * 512 + (b / 4) * 128 + (b % 4) * 16;
            memcpy(to, q + r * k + 32 * b, 16);
            memcpy(to + 64, q + r * k + 32 * b + 16, 16);
        }
}

// ---- K-quants: Q4_K, Q5_K, Q6_K ------------------------------------------------------------

// The order of the float work of the K-quants, every path: a token's dot product with a
// weight row is split into super-blocks of 256, each giving exact 8-lane integer sums; even
// super-blocks add into accumulator E, odd ones into O, lane by lane:
//     acc = fma(float(isum), d e, acc)   [K4: then acc = fnma(float(msum), dmin e, acc)]
// and the result is hsum8(E + O). The VNNI path holds E and O as the halves of one 512-bit
// register and steps two super-blocks at once; AVX2 steps them one by one, into E or O.

// Q4_K/Q5_K's 12 bytes -> 8 scales and 8 mins of 6 bits (ggml's get_scale_min_k4).
static inline void scales_k4(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0xF) | ((s[j] >> 6) << 4);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
}

// The same 16 values as bytes, 8 scales then 8 mins, by 32-bit words (ggml's).
AI __m128i scales_mins8(const uint8_t *s) {
    uint32_t u[4];
    memcpy(u, s, 12);
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    uint32_t mins = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = mins;
    u[0] &= m1;
    return _mm_loadu_si128((const __m128i *)u);
}

// ... as int16
AI __m256i scales_mins16(const uint8_t *s) { return _mm256_cvtepu8_epi16(scales_mins8(s)); }

// bytes 2j, 2j + 1 of each 128-bit lane in all 16 words: a word broadcast by shuffle_epi8
AI __m256i word_mask(int j) { return _mm256_set1_epi16((short)(2 * j | (2 * j + 1) << 8)); }

// The sums in registers at this point: without it GCC computes all of a super-block's
// products for all tokens first and adds them up after (integer adds reassociate), which
// spills most of them with only 16 ymm registers.
AI void keep(__m256i *isum, int nt) {
    for (int t = 0; t < nt; t++) __asm__("" : "+x"(isum[t]));
}

// isum[t] += madd(maddubs(w, a), scale) for each token's 32 inputs at `at` (AVX2)
AI void madd_tokens(__m256i w, __m256i scale, const Acts *A, int64_t at, int t0, int nt, __m256i *isum) {
    for (int t = 0; t < nt; t++) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(A->q + (int64_t)(t0 + t) * A->k + at));
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), scale));
    }
    keep(isum, nt);
}

// A token's 16 sums of 16 of super-block s, times `by` in pairs (AVX2's 8 lanes)
AI __m256i times_s16(const Acts *A, int64_t tok, int s, __m256i by) {
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(A->s16 + tok * (A->k / 16) + s * 16)), by);
}

// Q4_K (q5 = 0) and Q5_K (q5 = 1): one super-block (AVX2) against nt tokens, into acc. Per
// token: isum (8 lanes) = sum_j sc_j * madd(maddubs(q_j, a_j)), msum = madd(sums of 16,
// mins paired), then acc = fma(isum, d e, acc), acc = fnma(msum, dmin e, acc).
AI void k4_unit_avx2(int q5, const uint8_t *blk, int s, int ns, const Acts *A, int t0, int nt,
                     __m256 *acc) {
    const int bb = q5 ? 176 : 144;
    const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i pairs = _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7,
                                           8, 9, 8, 9, 10, 11, 10, 11, 12, 13, 12, 13, 14, 15, 14, 15);
    const uint8_t *qs = blk + (q5 ? 48 : 16);
    prefetch_weights(blk, bb, nt);
    __m256 d = _mm256_set1_ps(f16(blk)), dmin = _mm256_set1_ps(f16(blk + 2));
    __m256i sm = scales_mins16(blk + 4);
    __m256i scales = _mm256_permute4x64_epi64(sm, 0x44);  // the 8 scales in both lanes
    // [m0 m0 m1 m1 ... m7 m7], against the sums of 16
    __m256i m16 = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(sm, 0xEE), pairs);
    __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
    __m256i isum[TILE];
    for (int t = 0; t < nt; t++) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
        __m256i w = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(raw, 4) : raw, low);
        if (q5)
            w = _mm256_or_si256(w, _mm256_slli_epi16(
                _mm256_and_si256(_mm256_srli_epi16(qh, j), one), 4));
        madd_tokens(w, _mm256_shuffle_epi8(scales, word_mask(j)), A, s * 256 + 32 * j, t0, nt, isum);
    }
    for (int t = 0; t < nt; t++) {
        int64_t tok = t0 + t;
        __m256i msum = times_s16(A, tok, s, m16);
        __m256 e = _mm256_loadu_ps(A->ex + (tok * ns + s) * 8);
        acc[t] = step(acc[t], isum[t], _mm256_mul_ps(d, e));
        acc[t] = step_sub(acc[t], msum, _mm256_mul_ps(dmin, e));
    }
}

// Q6_K: one super-block (AVX2). isum = sum_g sc_g * (q . a over group g of 16), q in 0..63,
// less 32 sum_g sc_g s16_g (exact, lane by lane); then acc = fma(isum, d e, acc).
AI void k6_unit_avx2(const uint8_t *blk, int s, int ns, const Acts *A, int t0, int nt, __m256 *acc) {
    const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x30);
    prefetch_weights(blk, 210, nt);
    __m256 d = _mm256_set1_ps(f16(blk + 208));
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
    __m256i isum[TILE];
    for (int t = 0; t < nt; t++) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int c = 0; c < 2; c++) {  // 128 inputs: groups 8c .. 8c + 7
        __m256i half = c ? _mm256_permute4x64_epi64(sc16, 0xEE)  // their 8 scales, twice
                         : _mm256_permute4x64_epi64(sc16, 0x44);
        __m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * c));
        __m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * c + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * c));
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {  // inputs 128c + 32i on: groups 8c + 2i, + 1
            __m256i l = i == 0 ? ql0 : i == 1 ? ql1 : i == 2 ? _mm256_srli_epi16(ql0, 4)
                                                             : _mm256_srli_epi16(ql1, 4);
            __m256i h = i == 0 ? _mm256_slli_epi16(qh, 4) : i == 1 ? _mm256_slli_epi16(qh, 2)
                      : i == 2 ? qh : _mm256_srli_epi16(qh, 2);
            __m256i w = _mm256_or_si256(_mm256_and_si256(l, low), _mm256_and_si256(h, two));
            __m256i scale = _mm256_shuffle_epi8(half, _mm256_set_m128i(
                _mm256_castsi256_si128(word_mask(2 * i + 1)), _mm256_castsi256_si128(word_mask(2 * i))));
            madd_tokens(w, scale, A, s * 256 + 128 * c + 32 * i, t0, nt, isum);
        }
    }
    for (int t = 0; t < nt; t++) {
        int64_t tok = t0 + t;
        __m256i is = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(times_s16(A, tok, s, sc16), 5));
        acc[t] = step(acc[t], is, _mm256_mul_ps(d, _mm256_loadu_ps(A->ex + (tok * ns + s) * 8)));
    }
}

// fmt Q4_K, Q5_K or Q6_K: a row of ns super-blocks on AVX2, even ones into E, odd into O.
AI void kq_avx2(int fmt, const uint8_t *wr, int ns, const Acts *A, int t0, int nt, float *out) {
    const int bb = fmt == Q4_K ? 144 : fmt == Q5_K ? 176 : 210;
    __m256 even[TILE], odd[TILE];
    for (int t = 0; t < nt; t++) even[t] = odd[t] = _mm256_setzero_ps();
    for (int s = 0; s < ns; s++) {
        __m256 *acc = s % 2 ? odd : even;
        if (fmt == Q6_K) k6_unit_avx2(wr + (int64_t)s * bb, s, ns, A, t0, nt, acc);
        else k4_unit_avx2(fmt == Q5_K, wr + (int64_t)s * bb, s, ns, A, t0, nt, acc);
    }
    for (int t = 0; t < nt; t++) out[t] = hsum8(_mm256_add_ps(even[t], odd[t]));
}

// [a x 8 | b x 8] from the fp16 at a and at b, by one conversion
VNNI_TARGET AI __m512 two_halves(const uint8_t *a, const uint8_t *b) {
    uint16_t ha, hb;
    memcpy(&ha, a, 2);
    memcpy(&hb, b, 2);
    __m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(ha | (int)hb << 16)));
    return _mm512_permutexvar_ps(_mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi32(1), 1), f);
}

// E and O at the end of a row: an odd last unit has gone into `last` (E's lanes).
VNNI_TARGET AI float finish(__m512 acc, __m256 last) {
    return hsum8(_mm256_add_ps(last, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1))));
}

// word indices: lanes 0-7 a, 8-15 b, 16-23 c, 24-31 d
VNNI_TARGET AI __m512i word_index(int a, int b, int c, int d) {
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16((short)b), _mm_set1_epi16((short)a))),
        _mm256_set_m128i(_mm_set1_epi16((short)d), _mm_set1_epi16((short)c)), 1);
}

// The integer sums of one super-block (VNNI) for nt tokens: isum[t] (16 lanes; lanes i and
// i + 8 together are AVX2's lane i). K4: sum_j sc_j q_j . a_j; Q6_K: sum_g sc_g q_g . a_g.
VNNI_TARGET AI void kq_ints_vnni(int fmt, const uint8_t *blk, __m128i sm8, int s, const Acts *A,
                                 int t0, int nt, __m512i *isum) {
    const int k = A->k;
    const int bb = fmt == Q4_K ? 144 : fmt == Q5_K ? 176 : 210;
    const __m512i low = _mm512_set1_epi8(0x0F);
    prefetch_weights(blk, bb, nt);
    // vpdpwssd adds into its accumulator (5 cycles a step): few tokens keep several partial
    // sums apiece, so that the 4 steps of a super-block need not wait on each other
    const int parts = nt <= 2 ? 4 : nt <= 4 ? 2 : 1;
    __m512i part[TILE][4];
    for (int t = 0; t < nt; t++)
        for (int i = 0; i < parts; i++) part[t][i] = _mm512_setzero_si512();
    if (fmt == Q6_K) {
        const __m512i two = _mm512_set1_epi8(0x30);
        // per 16-bit lane: the first 32 inputs' shift, then the second's
        const __m512i up = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
        const __m512i down = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
        // the 16 int8 scales in each 128-bit lane; a scale is made a word by vpshufb into the
        // word's high byte and an arithmetic shift (its sign)
        __m512i sc = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(blk + 192)));
        for (int c = 0; c < 2; c++) {
            __m512i ql = _mm512_loadu_si512(blk + 64 * c);
            __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * c)));
            for (int v = 0; v < 2; v++) {  // inputs 128c + 64v on: groups g .. g + 3
                __m512i l = v ? _mm512_srli_epi16(ql, 4) : ql;
                __m512i h = v ? _mm512_srlv_epi16(qh, down) : _mm512_sllv_epi16(qh, up);
                __m512i w = _mm512_or_si512(_mm512_and_si512(l, low), _mm512_and_si512(h, two));
                int g = 8 * c + 4 * v;
                __m512i scale = _mm512_srai_epi16(_mm512_shuffle_epi8(sc, word_index(
                    g << 8 | 0x80, (g + 1) << 8 | 0x80, (g + 2) << 8 | 0x80, (g + 3) << 8 | 0x80)), 8);
                for (int t = 0; t < nt; t++) {
                    __m512i a = _mm512_loadu_si512(A->q + (int64_t)(t0 + t) * k + s * 256 + 128 * c + 64 * v);
                    __m512i *to = &part[t][(2 * c + v) % parts];
                    *to = _mm512_dpwssd_epi32(*to, _mm512_maddubs_epi16(w, a), scale);
                }
            }
        }
    } else {
    const int q5 = fmt == Q5_K;
    const __m512i one = _mm512_set1_epi8(1);
    const uint8_t *qs = blk + (q5 ? 48 : 16);
    // the 16 scale and min bytes in each 128-bit lane: vpshufb makes any word of them (a
    // byte and a zero) where vpermw would cost twice as much
    __m512i sm = _mm512_broadcast_i32x4(sm8);
    __m512i qh = q5 ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)))
                    : _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {  // 128 inputs: sub-blocks 4h .. 4h + 3
        __m512i raw = _mm512_loadu_si512(qs + 64 * h);
        __m512i lo = _mm512_and_si512(raw, low);                          // [4h | 4h + 2]
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);    // [4h + 1 | 4h + 3]
        for (int v = 0; v < 2; v++) {  // [4h + 2v | 4h + 2v + 1]: inputs 128h + 64v on
            __m512i w = v ? _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2))
                          : _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
            int j = 4 * h + 2 * v;
            if (q5)
                w = _mm512_or_si512(w, _mm512_slli_epi16(_mm512_and_si512(
                    _mm512_srlv_epi16(qh, word_index(j, j, j + 1, j + 1)), one), 4));
            __m512i scale = _mm512_shuffle_epi8(
                sm, word_index(0x8000 | j, 0x8000 | j, 0x8000 | (j + 1), 0x8000 | (j + 1)));
            for (int t = 0; t < nt; t++) {
                __m512i a = _mm512_loadu_si512(A->q + (int64_t)(t0 + t) * k + s * 256 + 64 * (2 * h + v));
                __m512i *to = &part[t][(2 * h + v) % parts];
                *to = _mm512_dpwssd_epi32(*to, _mm512_maddubs_epi16(w, a), scale);
            }
        }
    }
    }
    for (int t = 0; t < nt; t++) {  // exact: any grouping gives the same integers
        isum[t] = part[t][0];
        for (int i = 1; i < parts; i++) isum[t] = _mm512_add_epi32(isum[t], part[t][i]);
    }
}

// A pair of super-blocks s, s + 1 (VNNI) as its products take it. Each register of w holds 32
// inputs of s and the same 32 of s + 1, as A->qp holds a token's inputs. sc: the bytes each
// step's scales are made of (K4: each half's 16 scale and min bytes in its 128-bit lanes;
// Q6_K: each half's 16 int8 scales in its two 128-bit lanes). The float side: K4's d holds
// [d, dmin of s, d, dmin of s + 1] in its low 4 lanes and mins the mins as floats, [s's 8 |
// s + 1's 8] (float(msum) = min * float(sum of 32), exactly: Acts.s32); Q6_K's d is [s's d x 8
// | s + 1's x 8] and by what its sums of 16 are multiplied by, as words. A narrow pass unpacks
// a pair in registers for its one tile of tokens; a wider one unpacks each row's pairs once
// into memory for all its tiles (unpack_rows): the same values, so the same bits.
typedef struct {
    __m512i w[8], sc, by;
    __m512 d, mins;
} KPair;

VNNI_TARGET AI void kq_pair_unpack(int fmt, const uint8_t *b0, const uint8_t *b1, KPair *u) {
    const __m512i low = _mm512_set1_epi8(0x0F);
#define PAIR_LOAD(off) _mm512_inserti64x4(_mm512_castsi256_si512(                               \
        _mm256_loadu_si256((const __m256i *)(b0 + (off)))), _mm256_loadu_si256((const __m256i *)(b1 + (off))), 1)
    if (fmt == Q6_K) {
        const __m512i two = _mm512_set1_epi8(0x30);
        u->sc = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + 192)))),
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b1 + 192))), 1);
        for (int c = 0; c < 2; c++) {
            __m512i ql0 = PAIR_LOAD(64 * c), ql1 = PAIR_LOAD(64 * c + 32), qh = PAIR_LOAD(128 + 32 * c);
            for (int i = 0; i < 4; i++) {  // inputs 128c + 32i on: groups 8c + 2i, + 1
                __m512i l = i == 0 ? ql0 : i == 1 ? ql1 : i == 2 ? _mm512_srli_epi16(ql0, 4)
                                                                 : _mm512_srli_epi16(ql1, 4);
                __m512i h = i == 0 ? _mm512_slli_epi16(qh, 4) : i == 1 ? _mm512_slli_epi16(qh, 2)
                          : i == 2 ? qh : _mm512_srli_epi16(qh, 2);
                u->w[4 * c + i] = _mm512_or_si512(_mm512_and_si512(l, low), _mm512_and_si512(h, two));
            }
        }
        u->d = two_halves(b0 + 208, b1 + 208);
        u->by = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + 192))),
            _mm_loadu_si128((const __m128i *)(b1 + 192)), 1));
    } else {
        const int q5 = fmt == Q5_K;
        const __m512i one = _mm512_set1_epi8(1);
        const int at = q5 ? 48 : 16;
        uint32_t h0, h1;
        memcpy(&h0, b0, 4);
        memcpy(&h1, b1, 4);
        __m128i sm0 = scales_mins8(b0 + 4), sm1 = scales_mins8(b1 + 4);
        u->d = _mm512_zextps128_ps512(_mm_cvtph_ps(_mm_set_epi32(0, 0, (int)h1, (int)h0)));
        u->mins = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi64(sm0, sm1)));
        u->sc = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(sm0)),
                                   _mm256_broadcastsi128_si256(sm1), 1);
        __m512i qh = q5 ? PAIR_LOAD(16) : _mm512_setzero_si512();
        for (int i = 0; i < 4; i++) {  // sub-blocks 2i (low nibbles) and 2i + 1 (high)
            __m512i raw = PAIR_LOAD(at + 32 * i);
            for (int v = 0; v < 2; v++) {
                int j = 2 * i + v;
                __m512i w = _mm512_and_si512(v ? _mm512_srli_epi16(raw, 4) : raw, low);
                if (q5)
                    w = _mm512_or_si512(w, _mm512_slli_epi16(
                        _mm512_and_si512(_mm512_srli_epi16(qh, j), one), 4));
                u->w[j] = w;
            }
        }
    }
#undef PAIR_LOAD
}

// A pair's products for nt tokens, added into acc: per token the integer sums (isum's lanes
// 0-7 s's AVX2 lanes and 8-15 s + 1's, as they are summed: no fold), then the float steps.
VNNI_TARGET AI void kq_pair_dots(int fmt, const KPair *u, int s, const Acts *A, int t0, int nt,
                                 __m512 *acc) {
    const int k = A->k, ns = k / 256;
    // vpdpwssd adds into its accumulator (5 cycles a step): few tokens keep several partial
    // sums apiece, so that the 8 steps of a pair need not wait on each other
    const int parts = nt <= 2 ? 4 : nt <= 4 ? 2 : 1;
    __m512i part[TILE][4];
    for (int t = 0; t < nt; t++)
        for (int i = 0; i < parts; i++) part[t][i] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        // K4: sub-block j's scale, a byte and a zero (vpshufb where vpermw costs twice as
        // much); Q6_K: groups 2j and 2j + 1, by vpshufb into the word's high byte and an
        // arithmetic shift (its sign)
        __m512i scale = fmt == Q6_K
            ? _mm512_srai_epi16(_mm512_shuffle_epi8(u->sc, word_index(
                  2 * j << 8 | 0x80, (2 * j + 1) << 8 | 0x80, 2 * j << 8 | 0x80, (2 * j + 1) << 8 | 0x80)), 8)
            : _mm512_shuffle_epi8(u->sc, _mm512_set1_epi16((short)(0x8000 | j)));
        __m512i w = u->w[j];
        for (int t = 0; t < nt; t++) {
            __m512i a = _mm512_loadu_si512(A->qp + (int64_t)(t0 + t) * k + s * 256 + 64 * j);
            __m512i *to = &part[t][j % parts];
            *to = _mm512_dpwssd_epi32(*to, _mm512_maddubs_epi16(w, a), scale);
        }
    }
    // lanes 0-7 from lane 0 (2) of [d, dmin, d', dmin'] times scales, 8-15 from lane 2 (3)
    const __m512i by_d = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi32(2), 1);
    const __m512i by_dmin = _mm512_inserti64x4(_mm512_set1_epi32(1), _mm256_set1_epi32(3), 1);
    for (int t = 0; t < nt; t++) {
        int64_t tok = t0 + t;
        __m512i is = part[t][0];  // exact: any grouping gives the same integers
        for (int i = 1; i < parts; i++) is = _mm512_add_epi32(is, part[t][i]);
        if (fmt == Q6_K) {
            __m512 e = _mm512_loadu_ps(A->ex + (tok * ns + s) * 8);
            __m512i sums = _mm512_madd_epi16(_mm512_loadu_si512(A->s16 + tok * (k / 16) + s * 16), u->by);
            is = _mm512_sub_epi32(is, _mm512_slli_epi32(sums, 5));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(u->d, e), acc[t]);
        } else {
            // d e and dmin e of both super-blocks by one 4-lane multiply ([e, e, e', e'] is
            // the token's scales from the 7th of s's 8 copies on), each product then
            // spread over its super-block's 8 lanes: the lanes' products, fewer multiplies
            __m128 de4 = _mm_mul_ps(_mm512_castps512_ps128(u->d), _mm_loadu_ps(A->ex + (tok * ns + s) * 8 + 6));
            __m512 de = _mm512_castps128_ps512(de4);
            __m512 msum = _mm512_mul_ps(u->mins, _mm512_loadu_ps(A->s32 + (tok * ns + s) * 8));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_permutexvar_ps(by_d, de), acc[t]);
            acc[t] = _mm512_fnmadd_ps(msum, _mm512_permutexvar_ps(by_dmin, de), acc[t]);
        }
    }
}

// Per super-block, what its integer sums are scaled by: d (and dmin), and what the sums of 16
// are multiplied by (K4: the mins, paired; Q6_K: the scales, the offset 32 taken off).
VNNI_TARGET AI void kq_scales(int fmt, const uint8_t *blk, float *d, float *dmin, __m256i *by) {
    if (fmt == Q6_K) {
        *d = f16(blk + 208);
        *by = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        return;
    }
    // [m0 m0 m1 m1 ... m7 m7] as words: min bytes 8..15 of the decoded 16, each and a zero
    const __m256i pairs = _mm256_setr_epi16(
        0x8008, 0x8008, 0x8009, 0x8009, 0x800A, 0x800A, 0x800B, 0x800B,
        0x800C, 0x800C, 0x800D, 0x800D, 0x800E, 0x800E, 0x800F, 0x800F);
    *d = f16(blk);
    *dmin = f16(blk + 2);
    *by = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(scales_mins8(blk + 4)), pairs);
}

// The end of a row of ns super-blocks on VNNI whose pairs are in acc: an odd last
// super-block (an even unit, on 256 bits), then the sums.
VNNI_TARGET AI void kq_vnni_end(int fmt, const uint8_t *wr, int ns, const Acts *A, int t0, int nt,
                                const __m512 *acc, float *out) {
    const int bb = fmt == Q4_K ? 144 : fmt == Q5_K ? 176 : 210, k = A->k, s = ns - 1;
    __m256 last[TILE];
    for (int t = 0; t < nt; t++) last[t] = _mm512_castps512_ps256(acc[t]);
    if (ns % 2) {
        const uint8_t *b0 = wr + (int64_t)s * bb;
        __m512i i0[TILE];
        kq_ints_vnni(fmt, b0, fmt == Q6_K ? _mm_setzero_si128() : scales_mins8(b0 + 4), s, A, t0, nt, i0);
        float d0, m0 = 0;
        __m256i by;
        kq_scales(fmt, b0, &d0, &m0, &by);
        __m256 d = _mm256_set1_ps(d0), dmin = _mm256_set1_ps(m0);
        for (int t = 0; t < nt; t++) {
            int64_t tok = t0 + t;
            __m256i is = _mm256_add_epi32(_mm512_castsi512_si256(i0[t]), _mm512_extracti64x4_epi64(i0[t], 1));
            __m256i sums = _mm256_madd_epi16(
                _mm256_loadu_si256((const __m256i *)(A->s16 + tok * (k / 16) + s * 16)), by);
            __m256 e = _mm256_loadu_ps(A->ex + (tok * ns + s) * 8);
            if (fmt == Q6_K) {
                last[t] = step(last[t], _mm256_sub_epi32(is, _mm256_slli_epi32(sums, 5)), _mm256_mul_ps(d, e));
            } else {
                last[t] = step(last[t], is, _mm256_mul_ps(d, e));
                last[t] = step_sub(last[t], sums, _mm256_mul_ps(dmin, e));
            }
        }
    }
    for (int t = 0; t < nt; t++) out[t] = finish(acc[t], last[t]);
}

// A row of ns super-blocks on VNNI: two at a time, E and O as the halves of one register;
// the pairs unpacked here, or taken from `pairs` (the row's, unpacked before).
VNNI_TARGET AI void kq_vnni_from(int fmt, const uint8_t *wr, const KPair *pairs, int ns, const Acts *A,
                                 int t0, int nt, float *out) {
    const int bb = fmt == Q4_K ? 144 : fmt == Q5_K ? 176 : 210;
    __m512 acc[TILE];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int s = 0; s + 2 <= ns; s += 2) {
        if (pairs) {
            kq_pair_dots(fmt, &pairs[s / 2], s, A, t0, nt, acc);
        } else {
            KPair u;
            prefetch_weights(wr + (int64_t)s * bb, 2 * bb, nt);
            kq_pair_unpack(fmt, wr + (int64_t)s * bb, wr + (int64_t)(s + 1) * bb, &u);
            kq_pair_dots(fmt, &u, s, A, t0, nt, acc);
        }
    }
    kq_vnni_end(fmt, wr, ns, A, t0, nt, acc, out);
}

// K-quant rows whose tokens' inputs would not stay in L1 over a whole row (a long row; a
// narrow pass of SPAN_TOKENS tokens or more, or a wide pass's whole tile of TILE tokens): nr
// rows at a time (at most SPAN_MAX_ROWS) over a span of their pairs, the span short enough
// that its inputs for the nt tokens t0 .. stay in L1 while every row reads them. A row's
// accumulators wait in memory between spans and take its pairs in kq_vnni's order, so every
// row has kq_vnni's bits. The pairs are unpacked here, the weights prefetched a row ahead
// (the next row's same pair, read next; past a block's last row too: a prefetch never
// faults), or taken from `pairs` (a wide pass's rows, unpacked before: row r's at r np).
#define SPAN_ROWS 16      // a narrow pass's rows at a time
#define SPAN_MAX_ROWS 32  // a wide pass's (ROW_BLOCK)
#define SPAN_TOKENS 5
#define SPAN_BYTES 20480  // a span's inputs and their scales, all tokens: well within L1
// Pairs of super-blocks in a span of nt tokens: per pair and token, 512 inputs and their ex,
// s32 and s16 (32 bytes each a super-block).
static inline int span_pairs(int nt) {
    int pairs = SPAN_BYTES / (nt * (512 + 192));
    return pairs > 0 ? pairs : 1;
}
// Whether nt tokens' inputs over a row of k inputs outgrow one span: such rows go by spans.
static inline int long_row(int nt, int k) { return k / 512 > span_pairs(nt); }
VNNI_TARGET AI void kq_vnni_spans(int fmt, const uint8_t *w, int64_t row_bytes, const KPair *pairs,
                                  int nr, int ns, const Acts *A, int t0, int nt, float *out) {
    const int bb = fmt == Q4_K ? 144 : fmt == Q5_K ? 176 : 210, np = ns / 2, span = span_pairs(nt);
    __m512 acc[SPAN_MAX_ROWS][TILE];
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) acc[r][t] = _mm512_setzero_ps();
    for (int p0 = 0; p0 < np; p0 += span) {
        int p1 = p0 + span < np ? p0 + span : np;
        for (int r = 0; r < nr; r++) {
            const uint8_t *wr = w + (int64_t)r * row_bytes;
            __m512 a[TILE];
            for (int t = 0; t < nt; t++) a[t] = acc[r][t];
            for (int p = p0; p < p1; p++) {
                if (pairs) {
                    kq_pair_dots(fmt, &pairs[(size_t)r * np + p], 2 * p, A, t0, nt, a);
                } else {
                    const uint8_t *b0 = wr + (int64_t)2 * p * bb;
                    for (int i = 0; i < 2 * bb; i += 64) _mm_prefetch((const char *)b0 + row_bytes + i, _MM_HINT_T0);
                    KPair u;
                    kq_pair_unpack(fmt, b0, b0 + bb, &u);
                    kq_pair_dots(fmt, &u, 2 * p, A, t0, nt, a);
                }
            }
            for (int t = 0; t < nt; t++) acc[r][t] = a[t];
        }
    }
    for (int r = 0; r < nr; r++) kq_vnni_end(fmt, w + (int64_t)r * row_bytes, ns, A, t0, nt, acc[r], out + r * nt);
}

VNNI_TARGET AI void kq_vnni(int fmt, const uint8_t *wr, int ns, const Acts *A, int t0, int nt, float *out) {
    kq_vnni_from(fmt, wr, NULL, ns, A, t0, nt, out);
}

// ---- AMX: wide passes of the K-quants ------------------------------------------------------
// A pass of AMX_ROWS tokens or more computes the K-quants' integer sums by tile products, 16
// tokens by 16 weight rows at a time, and does the float work of every (token, row) with the
// rows in the lanes of a 512-bit register. The integers are the same exact sums, and each
// (token, row) gets the float operations of the order above, in that order, lane L of a unit
// one vector of 16 rows; so every row has the bits of a one-token pass on AVX2 or VNNI.
//   Lane L of a unit sums inputs 32j + 4L .. 32j + 4L + 3 (j = 0 .. 7, the 32-input chunks)
// times their scale: one tile product of K = 32 if the tokens' inputs are taken in that order
// (Acts.qa) and the weights times their scales, w = sc q (at most 16 bits), are split into
// bytes: isum = a . low bytes + 256 (a . high bytes).
#define AMX_INT8 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8,prfchw")))
#define AMX_ROWS 16  // tokens from which a K-quant pass takes the tiles (a tile of them)
#define RB 16        // weight rows a tile product takes

// One super-block of RB weight rows as the tiles take it.
typedef struct {
    uint8_t b[8][2][8 * 64];  // lane L, byte (low, high): [chunk j][row r][4 inputs]
    float d[RB], dmin[RB];
    int32_t pair[8][RB];      // Q6_K, per lane: the two words a token's pair of s16 multiplies
    float mins[8][RB];        // K4, per lane: its sub-block's min (float(msum) = min * s32)
} KTile;

// w = sc q per 16-bit word, split into the bytes of 4 inputs per 32-bit lane: q holds 4
// weights (0 .. 63) of a row per lane, sw its scale in both words of the lane.
AMX_INT8 AI void split_scaled(__m512i q, __m512i sw, uint8_t *lo, uint8_t *hi) {
    const __m512i even = _mm512_set1_epi32(0x00FF00FF);
    __m512i pe = _mm512_mullo_epi16(_mm512_and_si512(q, even), sw);
    __m512i po = _mm512_mullo_epi16(_mm512_srli_epi16(q, 8), sw);
    _mm512_storeu_si512(lo, _mm512_or_si512(_mm512_and_si512(pe, even), _mm512_slli_epi16(po, 8)));
    _mm512_storeu_si512(hi, _mm512_or_si512(_mm512_srli_epi16(pe, 8), _mm512_andnot_si512(even, po)));
}

AI int32_t word2(int a, int b) { return (int32_t)((uint32_t)(uint16_t)a | (uint32_t)(uint16_t)b << 16); }

// Q4_K/Q5_K: the RB rows' d, dmin, mins and scales (sw: each scale in both words), from
// their bytes gathered 4 at a time by scales_mins8's 32-bit steps.
AMX_INT8 static void k4_scales16(const uint8_t *base, __m512i at, KTile *T, int32_t (*sw)[RB]) {
    const __m512i m1 = _mm512_set1_epi32(0x3f3f3f3f), m2 = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i m3 = _mm512_set1_epi32(0x03030303), byte = _mm512_set1_epi32(0xFF);
    __m512i h = _mm512_i32gather_epi32(at, base, 1);  // d, dmin
    _mm512_storeu_ps(T->d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)));
    _mm512_storeu_ps(T->dmin, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16))));
    __m512i u0 = _mm512_i32gather_epi32(at, base + 4, 1), u1 = _mm512_i32gather_epi32(at, base + 8, 1);
    __m512i u2 = _mm512_i32gather_epi32(at, base + 12, 1);
    __m512i sc[2], mn[2];  // scales 0-3, 4-7; mins 0-3, 4-7, a byte each
    sc[0] = _mm512_and_si512(u0, m1);
    sc[1] = _mm512_or_si512(_mm512_and_si512(u2, m2),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), m3), 4));
    mn[0] = _mm512_and_si512(u1, m1);
    mn[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m2),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), m3), 4));
    for (int j = 0; j < 8; j++) {
        __m512i c = _mm512_and_si512(_mm512_srli_epi32(sc[j / 4], 8 * (j % 4)), byte);
        _mm512_storeu_si512(sw[j], _mm512_or_si512(c, _mm512_slli_epi32(c, 16)));
        __m512i m = _mm512_and_si512(_mm512_srli_epi32(mn[j / 4], 8 * (j % 4)), byte);
        _mm512_storeu_ps(T->mins[j], _mm512_cvtepi32_ps(m));
        _mm512_storeu_si512(T->pair[j], _mm512_setzero_si512());
    }
}

// Super-block s of the RB rows at `rows` (byte offsets from w + s * bb) into T.
AMX_INT8 static void ktile_decode(int fmt, const uint8_t *w, const int32_t *rows, int s, KTile *T) {
    const int bb = fmt == Q4_K ? 144 : fmt == Q5_K ? 176 : 210;
    const uint8_t *base = w + (int64_t)s * bb;
    const __m512i at = _mm512_loadu_si512(rows), low = _mm512_set1_epi8(0x0F);
    int32_t sw[16][RB];  // per scale (K4: sub-block, Q6_K: group of 16) and row
    if (fmt == Q6_K)
        for (int r = 0; r < RB; r++) {
            const uint8_t *blk = base + rows[r];
            const int8_t *sc = (const int8_t *)(blk + 192);
            T->d[r] = f16(blk + 208);
            T->dmin[r] = 0.f;
            for (int g = 0; g < 16; g++) sw[g][r] = word2(sc[g], sc[g]);
            for (int L = 0; L < 8; L++) T->pair[L][r] = word2(sc[2 * L], sc[2 * L + 1]), T->mins[L][r] = 0.f;
        }
    else
        k4_scales16(base, at, T, sw);
    for (int L = 0; L < 8; L++) {
        if (fmt == Q6_K) {
            const __m512i three = _mm512_set1_epi8(3);
            for (int c = 0; c < 2; c++) {
                __m512i g0 = _mm512_i32gather_epi32(at, base + 64 * c + 4 * L, 1);
                __m512i g1 = _mm512_i32gather_epi32(at, base + 64 * c + 32 + 4 * L, 1);
                __m512i gh = _mm512_i32gather_epi32(at, base + 128 + 32 * c + 4 * L, 1);
                for (int i = 0; i < 4; i++) {  // chunk j = 4c + i: groups 8c + 2i, + 1
                    int j = 4 * c + i;
                    __m512i src = i & 1 ? g1 : g0;
                    __m512i q = _mm512_and_si512(i >= 2 ? _mm512_srli_epi32(src, 4) : src, low);
                    q = _mm512_or_si512(q, _mm512_slli_epi32(
                        _mm512_and_si512(_mm512_srli_epi32(gh, 2 * i), three), 4));
                    split_scaled(q, _mm512_loadu_si512(sw[8 * c + 2 * i + (L >= 4)]),
                                 T->b[L][0] + 64 * j, T->b[L][1] + 64 * j);
                }
            }
        } else {
            const int q5 = fmt == Q5_K;
            __m512i qh = q5 ? _mm512_i32gather_epi32(at, base + 16 + 4 * L, 1) : _mm512_setzero_si512();
            for (int h = 0; h < 4; h++) {  // chunks 2h (low nibbles) and 2h + 1 (high)
                __m512i g = _mm512_i32gather_epi32(at, base + (q5 ? 48 : 16) + 32 * h + 4 * L, 1);
                for (int v = 0; v < 2; v++) {
                    int j = 2 * h + v;
                    __m512i q = _mm512_and_si512(v ? _mm512_srli_epi32(g, 4) : g, low);
                    if (q5)
                        q = _mm512_or_si512(q, _mm512_slli_epi32(_mm512_and_si512(
                            _mm512_srli_epi32(qh, j), _mm512_set1_epi8(1)), 4));
                    split_scaled(q, _mm512_loadu_si512(sw[j]), T->b[L][0] + 64 * j, T->b[L][1] + 64 * j);
                }
            }
        }
    }
}

// Tiles: 1 the tokens' 32 inputs of a lane, 2 and 3 the weights' low and high bytes; the sums
// of the low and high bytes (16 tokens x RB rows) in 0 and 4 for even lanes, 5 and 6 for odd
// ones (static: see tiles_on).
static const tile_config KQ_TILES = {
    .palette = 1,
    .colsb = {64, 32, 64, 64, 64, 64, 64},
    .rows = {16, 16, 8, 8, 16, 16, 16},
};

// A lane's integer sums: [16 tokens][low bytes' sums, high bytes'][RB rows].
typedef int32_t LaneSums[16][2][RB];

// The float work of one unit's lane L for nt tokens, rows in the vector lanes (a row's
// operations are those of kq_avx2 / kq_vnni, in their order). de, dme: d e and dmin e;
// first: acc starts from zero (the accumulator's first unit).
AMX_INT8 AI void ktile_floats(int fmt, const KTile *T, int L, const LaneSums c, const Acts *A,
                              int t0, int nt, int s, const __m512 *de, const __m512 *dme,
                              int first, __m512 *acc) {
    const int k = A->k;
    __m512i pair = _mm512_loadu_si512(T->pair[L]);
    __m512 mins = _mm512_loadu_ps(T->mins[L]);
    for (int t = 0; t < nt; t++) {
        int64_t tok = t0 + t;
        __m512i is = _mm512_add_epi32(_mm512_loadu_si512(c[t][0]), _mm512_slli_epi32(_mm512_loadu_si512(c[t][1]), 8));
        if (first) acc[t] = _mm512_setzero_ps();
        if (fmt == Q6_K) {
            int32_t s2;
            memcpy(&s2, A->s16 + tok * (k / 16) + s * 16 + 2 * L, 4);
            __m512i sums = _mm512_madd_epi16(_mm512_set1_epi32(s2), pair);
            is = _mm512_sub_epi32(is, _mm512_slli_epi32(sums, 5));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), de[t], acc[t]);
        } else {
            __m512 msum = _mm512_mul_ps(mins, _mm512_set1_ps(A->s32[(tok * (k / 256) + s) * 8 + L]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), de[t], acc[t]);
            acc[t] = _mm512_fnmadd_ps(msum, dme[t], acc[t]);
        }
    }
}

// The tile products of lane L of super-block T for a tile of tokens (qa: their 32 inputs of
// the lane, [16][32]), into tiles LO and HI.
#define KTILE_PRODUCTS(LO, HI, qa, T, L)                         \
    do {                                                          \
        _tile_loadd(1, qa, 32);                                   \
        _tile_loadd(2, (T)->b[L][0], 64);                         \
        _tile_loadd(3, (T)->b[L][1], 64);                         \
        _tile_zero(LO);                                           \
        _tile_zero(HI);                                           \
        _tile_dpbsud(LO, 1, 2);                                   \
        if (fmt == Q6_K) _tile_dpbssd(HI, 1, 3);                  \
        else _tile_dpbsud(HI, 1, 3);                              \
    } while (0)

// hsum8's order over the 8 lanes E[L] + O[L], for 16 rows at once.
AMX_INT8 AI __m512 ktile_finish(const __m512 *e, const __m512 *o) {
    __m512 v[8];
    for (int L = 0; L < 8; L++) v[L] = _mm512_add_ps(e[L], o[L]);
    __m512 s0 = _mm512_add_ps(v[0], v[4]), s1 = _mm512_add_ps(v[1], v[5]);
    __m512 s2 = _mm512_add_ps(v[2], v[6]), s3 = _mm512_add_ps(v[3], v[7]);
    return _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3));
}

// Weight rows r0 .. r0 + nr - 1 (nr <= RB), decoded in T [ns], against all m tokens. The
// products of the next lane are issued before the float work of this one, which they do not
// wait for.
AMX_INT8 static void ktile_rows(int fmt, const KTile *T, int ns, const Acts *A, int m, int r0, int nr,
                                const float *bias, float *y, int n) {
    const int k = A->k;
    __m512 even[8][16], odd[8][16], de[16], dme[16];
    LaneSums c[2] __attribute__((aligned(64)));
    const __mmask16 valid = (__mmask16)((1u << nr) - 1);
    __m512 b = bias ? _mm512_maskz_loadu_ps(valid, bias + r0) : _mm512_setzero_ps();
    for (int t0 = 0; t0 < m; t0 += 16) {
        int nt = m - t0 < 16 ? m - t0 : 16;
        const int8_t *qa = A->qa + (int64_t)t0 * k;  // [s][L][16 tokens][32]
        if (ns == 1)  // no odd unit
            for (int L = 0; L < 8; L++)
                for (int t = 0; t < nt; t++) odd[L][t] = _mm512_setzero_ps();
        KTILE_PRODUCTS(0, 4, qa, T, 0);
        for (int s = 0; s < ns; s++) {
            const KTile *Ts = T + s;
            __m512 d = _mm512_loadu_ps(Ts->d), dmin = _mm512_loadu_ps(Ts->dmin);
            for (int t = 0; t < nt; t++) {
                __m512 e = _mm512_set1_ps(A->ex[((int64_t)(t0 + t) * ns + s) * 8]);
                de[t] = _mm512_mul_ps(d, e);
                dme[t] = _mm512_mul_ps(dmin, e);
            }
            for (int L = 0; L < 8; L += 2) {  // lane L's sums in tiles 0, 4; L + 1's in 5, 6
                KTILE_PRODUCTS(5, 6, qa + 512 * (8 * s + L + 1), Ts, L + 1);
                _tile_stored(0, c[0][0][0], sizeof c[0][0]);
                _tile_stored(4, c[0][0][1], sizeof c[0][0]);
                ktile_floats(fmt, Ts, L, c[0], A, t0, nt, s, de, dme, s < 2, s % 2 ? odd[L] : even[L]);
                if (L + 2 < 8) KTILE_PRODUCTS(0, 4, qa + 512 * (8 * s + L + 2), Ts, L + 2);
                else if (s + 1 < ns) KTILE_PRODUCTS(0, 4, qa + 4096 * (s + 1), Ts + 1, 0);
                _tile_stored(5, c[1][0][0], sizeof c[1][0]);
                _tile_stored(6, c[1][0][1], sizeof c[1][0]);
                ktile_floats(fmt, Ts, L + 1, c[1], A, t0, nt, s, de, dme, s < 2,
                             s % 2 ? odd[L + 1] : even[L + 1]);
            }
        }
        for (int t = 0; t < nt; t++) {
            __m512 e8[8], o8[8];
            for (int L = 0; L < 8; L++) e8[L] = even[L][t], o8[L] = odd[L][t];
            __m512 out = ktile_finish(e8, o8);
            if (bias) out = _mm512_add_ps(out, b);
            _mm512_mask_storeu_ps(y + (int64_t)(t0 + t) * n + r0, valid, out);
        }
    }
}
#undef KTILE_PRODUCTS

// The RB weight rows from r0 as the gathers read them: byte offsets of rows r0 .. r0 + nr - 1,
// the last repeated past n (those lanes are never stored); returns nr.
AI int row_group(int r0, int n, int64_t row_bytes, int32_t *rows) {
    int nr = n - r0 < RB ? n - r0 : RB;
    for (int r = 0; r < RB; r++) rows[r] = (int32_t)((r < nr ? r : nr - 1) * row_bytes);
    return nr;
}

// q [m, k] -> qa: per tile of 16 tokens (zero past the last) and super-block, lane by lane
// (lane L: inputs 32j + 4L .. + 3 for j = 0 .. 7), the 16 tokens' 32 inputs of the lane one
// after the other: [tile][super-block][L][16 tokens][32], a tile product's contiguous 512 bytes.
static int8_t *lanes_by_tile(const int8_t *q, int m, int k) {
    int tiles = (m + 15) / 16;
    int8_t *qa = aligned_alloc(64, (size_t)tiles * 16 * k + 64);
    memset(qa, 0, (size_t)tiles * 16 * k);
    for (int64_t r = 0; r < m; r++)
        for (int s = 0; s < k / 256; s++)
            for (int L = 0; L < 8; L++)
                for (int j = 0; j < 8; j++)
                    memcpy(qa + r / 16 * 16 * k + 4096 * s + 512 * L + 32 * (r % 16) + 4 * j,
                           q + r * k + 256 * s + 32 * j + 4 * L, 4);
    return qa;
}

// ---- AMX: wide passes of the 32-blocks ------------------------------------------------------
// A pass of AMX_ROWS tokens or more takes each block's exact sums for 16 tokens by 16 weight
// rows from one tile product of K = 32 (the tokens' int8 inputs of the block times the rows'
// weights q - offset as int8, signed by signed), then does the float work of the 32-blocks'
// order (above) token by token, the 16 rows in the lanes of a 512-bit register and the 16
// lanes of the order in 16 registers.

// Tiles: 0 a block's sums (16 tokens x RB rows), 1 the tokens' 32 inputs, 2 the rows' 32
// weights (VNNI layout: 8 rows of [RB rows][4 inputs]); 3, 4 and 5, 6, 7 the same again,
// so two blocks' products are under way at once.
static const tile_config B32_TILES = {
    .palette = 1,
    .colsb = {64, 32, 64, 64, 32, 64},
    .rows = {16, 16, 8, 16, 16, 8},
};

// 4 weights of 4 bits a lane (bits 4 .. 7 of each byte free) -> 0x10 in byte i where bit i is set
AMX_INT8 AI __m512i spread4(__m512i bits) {
    __m512i x = _mm512_mullo_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0xF)), _mm512_set1_epi32(0x00204081));
    return _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x01010101)), 4);
}

// Block b of the RB rows at `rows` (byte offsets from w) into B (512 bytes: [input quad][row]
// [4 inputs], as int8 q - offset) and D (the rows' d).
AMX_INT8 static void btile_decode(int fmt, const uint8_t *w, const int32_t *rows, int b, int8_t *B,
                                  float *D) {
    const int bb = block_bytes(fmt);
    const uint8_t *base = w + (int64_t)b * bb;
    const __m512i at = _mm512_loadu_si512(rows);
    _mm512_storeu_ps(D, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(at, base, 1))));
    if (fmt == Q8_0) {
        for (int j = 0; j < 8; j++)
            _mm512_storeu_si512(B + 64 * j, _mm512_i32gather_epi32(at, base + 2 + 4 * j, 1));
        return;
    }
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i off = _mm512_set1_epi8(fmt == Q4_0 ? 8 : 16);
    __m512i qh = fmt == Q5_0 ? _mm512_i32gather_epi32(at, base + 2, 1) : _mm512_setzero_si512();
    for (int j = 0; j < 4; j++) {  // nibble bytes 4j .. 4j + 3: inputs 4j .., 16 + 4j ..
        __m512i g = _mm512_i32gather_epi32(at, base + (fmt == Q5_0 ? 6 : 2) + 4 * j, 1);
        __m512i l = _mm512_and_si512(g, low), h = _mm512_and_si512(_mm512_srli_epi32(g, 4), low);
        if (fmt == Q5_0) {
            l = _mm512_or_si512(l, spread4(_mm512_srli_epi32(qh, 4 * j)));
            h = _mm512_or_si512(h, spread4(_mm512_srli_epi32(qh, 16 + 4 * j)));
        }
        _mm512_storeu_si512(B + 64 * j, _mm512_sub_epi8(l, off));
        _mm512_storeu_si512(B + 64 * (4 + j), _mm512_sub_epi8(h, off));
    }
}

// Block b's sums for the token tile at qt (its rows k bytes apart) into C (tile C, with
// tiles QT, WT for the inputs and weights). The sums of block b + 2 are asked for in write
// state first: the tile stores are what a pass waits on most, their lines being out of L1.
#define BTILE_PRODUCT(C, QT, WT, b)                                                        \
    do {                                                                                    \
        _tile_loadd(QT, qt + 32 * (b), k);                                                  \
        _tile_loadd(WT, B + 512 * (b), 64);                                                 \
        _tile_zero(C);                                                                      \
        _tile_dpbssd(C, QT, WT);                                                            \
        for (int line = 0; line < 16; line++)                                               \
            _mm_prefetch((const char *)(sums + 256 * ((b) + 2) + 16 * line), _MM_HINT_ET0); \
        _tile_stored(C, sums + 256 * (b), 64);                                              \
    } while (0)

// Weight rows r0 .. r0 + nr - 1 (nr <= RB), decoded in B and D, against all m tokens; sums:
// a block's 16 x RB sums per block.
AMX_INT8 static void btile_rows(const int8_t *B, const float *D, int nb, const Acts *A, int m,
                                int r0, int nr, const float *bias, float *y, int n, int32_t *sums) {
    const int k = A->k;
    const __mmask16 valid = (__mmask16)((1u << nr) - 1);
    __m512 bv = bias ? _mm512_maskz_loadu_ps(valid, bias + r0) : _mm512_setzero_ps();
    for (int t0 = 0; t0 < m; t0 += 16) {
        int nt = m - t0 < 16 ? m - t0 : 16;
        const int8_t *qt = A->q + (int64_t)t0 * k;  // zeros past the last token
        int b = 0;
        for (; b + 2 <= nb; b += 2) {
            BTILE_PRODUCT(0, 1, 2, b);
            BTILE_PRODUCT(3, 4, 5, b + 1);
        }
        if (b < nb) BTILE_PRODUCT(0, 1, 2, b);
        for (int t = 0; t < nt; t++) {
            const float *e = A->e + (int64_t)(t0 + t) * nb;
            __m512 acc[16];
            for (int L = 0; L < 16; L++) acc[L] = _mm512_setzero_ps();
            for (int b0 = 0; b0 < nb; b0 += 16) {
#pragma GCC unroll 16
                for (int L = 0; L < 16; L++) {
                    int bl = b0 + L;
                    if (bl < nb) {
                        __m512 de = _mm512_mul_ps(_mm512_loadu_ps(D + 16 * bl), _mm512_set1_ps(e[bl]));
                        __m512 s = _mm512_cvtepi32_ps(_mm512_loadu_si512(sums + 256 * bl + 16 * t));
                        acc[L] = _mm512_fmadd_ps(s, de, acc[L]);
                    }
                }
            }
            __m512 out = ktile_finish(acc, acc + 8);  // lanes 0-7 plus 8-15, hsum8's order
            if (bias) out = _mm512_add_ps(out, bv);
            _mm512_mask_storeu_ps(y + (int64_t)(t0 + t) * n + r0, valid, out);
        }
    }
}
#undef BTILE_PRODUCT

// A pass on the tiles: each thread takes RB weight rows at a time, decodes them once (a
// K-quant's super-blocks into KTiles, a 32-block format's blocks into B and D) and runs
// every token against them.
AMX_INT8 static void tile_linear(int fmt, const uint8_t *w, int64_t row_bytes, const float *bias,
                                 float *y, int m, int n, const Acts *A, int threads) {
    int kq = is_kq(fmt);
    int ns = A->k / 256, nb = A->k / 32, blocks = (n + RB - 1) / RB;
#pragma omp parallel num_threads(threads)
    {
        tile_config before;
        tiles_on(&before, kq ? &KQ_TILES : &B32_TILES);
        KTile *T = kq ? aligned_alloc(64, sizeof(KTile) * ns) : NULL;
        int8_t *B = kq ? NULL : aligned_alloc(64, (size_t)nb * 512);
        float *D = kq ? NULL : aligned_alloc(64, sizeof(float) * 16 * nb);
        int32_t *sums = kq ? NULL : aligned_alloc(64, sizeof(int32_t) * 256 * (nb + 2));  // + 2: prefetched
#pragma omp for schedule(guided)
        for (int bl = 0; bl < blocks; bl++) {
            int32_t rows[RB];
            int r0 = bl * RB, nr = row_group(r0, n, row_bytes, rows);
            const uint8_t *group = w + (int64_t)r0 * row_bytes;
            if (kq) {
                for (int s = 0; s < ns; s++) ktile_decode(fmt, group, rows, s, T + s);
                ktile_rows(fmt, T, ns, A, m, r0, nr, bias, y, n);
            } else {
                for (int b = 0; b < nb; b++) btile_decode(fmt, group, rows, b, B + 512 * b, D + 16 * b);
                btile_rows(B, D, nb, A, m, r0, nr, bias, y, n, sums);
            }
        }
        free(T);
        free(B);
        free(D);
        free(sums);
        tiles_off(&before);
    }
}

// ---- dispatch ------------------------------------------------------------------------------

// Each kernel (a path, a format, a count of tokens nt) is a function of its own, compiled with
// nt a constant so that its token loops unroll, and a table picks it. Held all in one function
// behind switches, they cost gcc's optimiser time growing faster than the code (a first run
// waits for this file's compile); each kernel's code is the same either way.
AI void row_avx2(int fmt, const uint8_t *wr, int k, const Acts *A, int t0, int nt, float *out) {
    if (is_kq(fmt)) kq_avx2(fmt, wr, k / 256, A, t0, nt, out);
    else b32_avx2(fmt, wr, k / 32, A, t0, nt, out);
}

VNNI_TARGET AI void row_vnni(int fmt, const uint8_t *wr, int k, const Acts *A, int t0, int nt, float *out) {
    if (is_kq(fmt)) kq_vnni(fmt, wr, k / 256, A, t0, nt, out);
    else b32_vnni(fmt, wr, k / 32, A, t0, nt, out);
}

// A row against nt tokens t0 ..: the wide passes' unit (out: nt sums).
typedef void DotsFn(const uint8_t *wr, int k, const Acts *A, int t0, float *out);
// Two weight rows w0, w1 against a narrow pass's nt tokens (out: w0's nt sums, then w1's), each
// row's work exactly as a one-row call's (so its bits): in one function the two rows'
// independent work overlaps, and the fixed cost per row (the call, the final sums, a short
// row's scales) is paid once for two.
typedef void PairFn(const uint8_t *w0, const uint8_t *w1, int k, const Acts *A, float *out);
// A K-quant row whose pairs are unpacked against nt tokens t0 .. (VNNI's wide passes).
typedef void UnpackedFn(const uint8_t *wr, const KPair *pairs, int k, const Acts *A, int t0, float *out);
// nr K-quant rows (at most SPAN_ROWS) against a narrow pass's nt tokens by spans (VNNI; out:
// the first row's nt sums, then the next row's).
typedef void SpansFn(const uint8_t *w, int64_t row_bytes, int nr, int k, const Acts *A, float *out);
// nr K-quant rows whose pairs are unpacked (row r's at r k / 512) against a wide pass's tile of
// TILE tokens t0 .. by spans (VNNI; out as SpansFn's).
typedef void UnpackedSpansFn(const uint8_t *w, int64_t row_bytes, const KPair *pairs, int nr, int k,
                             const Acts *A, int t0, float *out);

#define KERNELS(PATH, TARGET, F, NT)                                                              \
    TARGET static void dots_##PATH##_##F##_##NT(const uint8_t *wr, int k, const Acts *A, int t0,  \
                                                float *out) {                                     \
        row_##PATH(F, wr, k, A, t0, NT, out);                                                     \
    }                                                                                             \
    TARGET static void pair_##PATH##_##F##_##NT(const uint8_t *w0, const uint8_t *w1, int k,      \
                                                const Acts *A, float *out) {                      \
        row_##PATH(F, w0, k, A, 0, NT, out);                                                      \
        row_##PATH(F, w1, k, A, 0, NT, out + NT);                                                 \
    }
#define UNPACKED(F, NT)                                                                           \
    VNNI_TARGET static void unpacked_vnni_##F##_##NT(const uint8_t *wr, const KPair *pairs, int k, \
                                                     const Acts *A, int t0, float *out) {         \
        kq_vnni_from(F, wr, pairs, k / 256, A, t0, NT, out);                                      \
    }
#define SPANS(F, NT)                                                                              \
    VNNI_TARGET static void spans_vnni_##F##_##NT(const uint8_t *w, int64_t row_bytes, int nr, int k, \
                                                  const Acts *A, float *out) {                    \
        kq_vnni_spans(F, w, row_bytes, NULL, nr, k / 256, A, 0, NT, out);                         \
    }
// a wide pass's whole tile of unpacked rows by spans (out: row by row, TILE sums each)
#define UNPACKED_SPANS(F)                                                                         \
    VNNI_TARGET static void unpacked_spans_vnni_##F(const uint8_t *w, int64_t row_bytes, const KPair *pairs, \
                                                    int nr, int k, const Acts *A, int t0, float *out) { \
        kq_vnni_spans(F, w, row_bytes, pairs, nr, k / 256, A, t0, TILE, out);                     \
    }
// X(..., nt) for nt = 1 .. TILE
_Static_assert(TILE == 8, "EACH_NT and BY_NT name the kernels for nt = 1 .. TILE");
#define EACH_NT(X, ...) X(__VA_ARGS__, 1) X(__VA_ARGS__, 2) X(__VA_ARGS__, 3) X(__VA_ARGS__, 4) \
                        X(__VA_ARGS__, 5) X(__VA_ARGS__, 6) X(__VA_ARGS__, 7) X(__VA_ARGS__, 8)
#define EACH_FORMAT(X, ...) X(__VA_ARGS__, Q4_0) X(__VA_ARGS__, Q5_0) X(__VA_ARGS__, Q8_0) \
                            X(__VA_ARGS__, Q4_K) X(__VA_ARGS__, Q5_K) X(__VA_ARGS__, Q6_K)
#define FORMAT_KERNELS(PATH, TARGET, F) EACH_NT(KERNELS, PATH, TARGET, F)
EACH_FORMAT(FORMAT_KERNELS, avx2, )
EACH_FORMAT(FORMAT_KERNELS, vnni, VNNI_TARGET)
EACH_NT(UNPACKED, Q4_K)
EACH_NT(UNPACKED, Q5_K)
EACH_NT(UNPACKED, Q6_K)
_Static_assert(SPAN_TOKENS == 5, "EACH_SPAN_NT and BY_SPAN_NT name the kernels for nt = 5 .. TILE");
#define EACH_SPAN_NT(X, F) X(F, 5) X(F, 6) X(F, 7) X(F, 8)
EACH_SPAN_NT(SPANS, Q4_K)
EACH_SPAN_NT(SPANS, Q5_K)
EACH_SPAN_NT(SPANS, Q6_K)
UNPACKED_SPANS(Q4_K)
UNPACKED_SPANS(Q5_K)
UNPACKED_SPANS(Q6_K)

// The tables: [format's slot][nt - 1], the slots in EACH_FORMAT's order.
static int slot(int fmt) {
    switch (fmt) {
        case Q4_0: return 0;
        case Q5_0: return 1;
        case Q8_0: return 2;
        case Q4_K: return 3;
        case Q5_K: return 4;
        default: return 5;
    }
}
#define BY_NT(NAME, F) {NAME##_##F##_1, NAME##_##F##_2, NAME##_##F##_3, NAME##_##F##_4, \
                        NAME##_##F##_5, NAME##_##F##_6, NAME##_##F##_7, NAME##_##F##_8}
#define BY_FORMAT(NAME) {BY_NT(NAME, Q4_0), BY_NT(NAME, Q5_0), BY_NT(NAME, Q8_0), \
                         BY_NT(NAME, Q4_K), BY_NT(NAME, Q5_K), BY_NT(NAME, Q6_K)}
static DotsFn *const DOTS[2][6][TILE] = {BY_FORMAT(dots_avx2), BY_FORMAT(dots_vnni)};
static PairFn *const PAIRS[2][6][TILE] = {BY_FORMAT(pair_avx2), BY_FORMAT(pair_vnni)};
static UnpackedFn *const UNPACKED_VNNI[3][TILE] = {  // the K-quants' slots, less 3
    BY_NT(unpacked_vnni, Q4_K), BY_NT(unpacked_vnni, Q5_K), BY_NT(unpacked_vnni, Q6_K)};
#define BY_SPAN_NT(F) {NULL, NULL, NULL, NULL, spans_vnni_##F##_5, spans_vnni_##F##_6, \
                       spans_vnni_##F##_7, spans_vnni_##F##_8}
static SpansFn *const SPANS_VNNI[3][TILE] = {BY_SPAN_NT(Q4_K), BY_SPAN_NT(Q5_K), BY_SPAN_NT(Q6_K)};
static UnpackedSpansFn *const UNPACKED_SPANS_VNNI[3] = {
    unpacked_spans_vnni_Q4_K, unpacked_spans_vnni_Q5_K, unpacked_spans_vnni_Q6_K};

// The fastest path this CPU has: VNNI where it has AVX512-VNNI (and BW, VL), else AVX2; AMX
// where it also has AMX-INT8 and Linux lets this process use the tiles.
int gguf_path(void) {
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
          && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")))
        return AVX2;
    return __builtin_cpu_supports("amx-int8") && tiles_allowed() ? AMX : VNNI;
}

// The narrowest pass the AMX path computes on the tiles (narrower ones take VNNI).
int gguf_amx_rows(void) { return AMX_ROWS; }

// Bytes of a row of k inputs, 0 for an unknown format or a k that is not whole blocks.
int64_t gguf_row_bytes(int fmt, int k) {
    switch (fmt) {
        case Q4_0: case Q5_0: case Q8_0: return k % 32 ? 0 : (int64_t)k / 32 * block_bytes(fmt);
        case Q4_K: return k % 256 ? 0 : (int64_t)k / 256 * 144;
        case Q5_K: return k % 256 ? 0 : (int64_t)k / 256 * 176;
        case Q6_K: return k % 256 ? 0 : (int64_t)k / 256 * 210;
    }
    return 0;
}

// Whether a narrow pass of m tokens over rows of k inputs takes the K-quants' rows by spans
// on VNNI (kq_vnni_spans): its tokens' inputs over a row would overflow L1 (from 5 tokens at
// the demo's k = 8960: its down layers in a verify pass).
static inline int by_spans(int m, int k, int path) {
    return path == VNNI && m >= SPAN_TOKENS && m <= TILE && long_row(m, k);
}

// Weight rows a thread takes at a time: a narrow pass (one tile of tokens or fewer) two
// (PAIRS; its threads share the rows finely) or SPAN_ROWS by spans, a wider one ROW_BLOCK,
// whose weights stay in L2 while each tile of tokens' inputs is read once for all of them
// (row by row, a prompt's pass read every token's inputs again for every weight row).
#define ROW_BLOCK 32
_Static_assert(ROW_BLOCK <= SPAN_MAX_ROWS && SPAN_ROWS <= SPAN_MAX_ROWS, "kq_vnni_spans holds a block's rows");
static inline int rows_at_a_time(int m, int k, int path) {
    return m > TILE ? ROW_BLOCK : by_spans(m, k, path) ? SPAN_ROWS : 2;
}

// A thread's unpacked pairs, kept for its next call: a wide pass's block of rows takes a few
// hundred kB, which malloc would map anew (and fault in) for every block.
static __thread KPair *unpacked;
static __thread size_t unpacked_count;

// Rows r0 .. r1 - 1's pairs unpacked (VNNI, a K-quant of 2 super-blocks or more), row by row;
// NULL where there is no memory for them.
VNNI_TARGET static KPair *unpack_rows(int fmt, const uint8_t *w, int64_t row_bytes, int k, int r0, int r1) {
    const int bb = fmt == Q4_K ? 144 : fmt == Q5_K ? 176 : 210, np = k / 512;
    size_t count = (size_t)(r1 - r0) * np;
    if (count > unpacked_count) {
        free(unpacked);
        unpacked = aligned_alloc(64, count * sizeof(KPair));
        unpacked_count = unpacked ? count : 0;
    }
    if (!unpacked) return NULL;
    for (int row = r0; row < r1; row++)
        for (int p = 0; p < np; p++) {
            const uint8_t *b0 = w + (int64_t)row * row_bytes + (int64_t)2 * p * bb;
            prefetch_weights(b0, 2 * bb, TILE);
            kq_pair_unpack(fmt, b0, b0 + bb, &unpacked[(size_t)(row - r0) * np + p]);
        }
    return unpacked;
}

// y's rows r0 .. r0 + nr - 1 for tokens t0 .. t0 + nt - 1 from out (row by row, nt sums each),
// plus the bias.
static void store_rows(const float *out, int nr, int nt, const float *bias, float *y, int n, int r0, int t0) {
    for (int i = 0; i < nr; i++)
        for (int t = 0; t < nt; t++)
            y[(int64_t)(t0 + t) * n + r0 + i] = bias ? out[i * nt + t] + bias[r0 + i] : out[i * nt + t];
}

// Rows r0 .. r1 - 1 of y: a narrow pass two rows at a time against all its tokens, a wider
// one ROW_BLOCK rows at a time, a tile of up to TILE tokens at a time against them in turn.
// path is AVX2 or VNNI, the tables' (an AMX pass takes the tiles: tile_linear).
static void dot_rows(int fmt, const uint8_t *w, int64_t row_bytes, const float *bias, float *y,
                     int m, int n, int path, const Acts *A, int r0, int r1) {
    const int f = slot(fmt);
    PairFn *pair = PAIRS[path][f][m <= TILE ? m - 1 : 0];
    if (m == 1)  // the commonest pass, its stores plain
        for (; r0 + 2 <= r1; r0 += 2) {
            const uint8_t *w0 = w + (int64_t)r0 * row_bytes;
            float out[2];
            pair(w0, w0 + row_bytes, A->k, A, out);
            for (int i = 0; i < 2; i++) y[r0 + i] = bias ? out[i] + bias[r0 + i] : out[i];
        }
    else if (m <= TILE && is_kq(fmt) && by_spans(m, A->k, path))
        for (; r0 < r1; r0 += SPAN_ROWS) {
            const int nr = r1 - r0 < SPAN_ROWS ? r1 - r0 : SPAN_ROWS;
            float out[SPAN_ROWS * TILE];
            SPANS_VNNI[f - 3][m - 1](w + (int64_t)r0 * row_bytes, row_bytes, nr, A->k, A, out);
            store_rows(out, nr, m, bias, y, n, r0, 0);
        }
    else if (m <= TILE) {
        for (; r0 + 2 <= r1; r0 += 2) {
            const uint8_t *w0 = w + (int64_t)r0 * row_bytes;
            float out[2 * TILE];
            pair(w0, w0 + row_bytes, A->k, A, out);
            for (int i = 0; i < 2; i++)
                for (int t = 0; t < m; t++)
                    y[(int64_t)t * n + r0 + i] = bias ? out[i * m + t] + bias[r0 + i] : out[i * m + t];
        }
    }
    for (int b0 = r0; b0 < r1; b0 += ROW_BLOCK) {
        int b1 = b0 + ROW_BLOCK < r1 ? b0 + ROW_BLOCK : r1;
        // a wide pass of the K-quants on VNNI unpacks each row's pairs once for all its tiles
        const int np = A->k / 512;
        const KPair *pairs = m > TILE && path == VNNI && is_kq(fmt) && np
            ? unpack_rows(fmt, w, row_bytes, A->k, b0, b1) : NULL;
        for (int t0 = 0; t0 < m; t0 += TILE) {
            int nt = m - t0 < TILE ? m - t0 : TILE;
            if (pairs && nt == TILE && long_row(TILE, A->k)) {  // a whole tile over long rows
                float out[ROW_BLOCK * TILE];
                UNPACKED_SPANS_VNNI[f - 3](w + (int64_t)b0 * row_bytes, row_bytes, pairs, b1 - b0, A->k, A, t0, out);
                store_rows(out, b1 - b0, TILE, bias, y, n, b0, t0);
                continue;
            }
            for (int row = b0; row < b1; row++) {
                const uint8_t *wr = w + (int64_t)row * row_bytes;
                float out[TILE];
                if (pairs) UNPACKED_VNNI[f - 3][nt - 1](wr, pairs + (size_t)(row - b0) * np, A->k, A, t0, out);
                else DOTS[path][f][nt - 1](wr, A->k, A, t0, out);
                for (int t = 0; t < nt; t++)
                    y[(int64_t)(t0 + t) * n + row] = bias ? out[t] + bias[row] : out[t];
            }
        }
    }
}

// The path a pass of m tokens of format fmt takes when `path` is asked for: AMX takes the
// passes of AMX_ROWS tokens or more, VNNI the narrower ones.
int gguf_pass_path(int fmt, int m, int path) {
    (void)fmt;
    return path == AMX && m < AMX_ROWS ? VNNI : path;
}

// The 32-blocks' activations on AVX2 or VNNI: q by sets of 4 blocks, and per group of 16
// blocks their scales and offsets' share at the path's lanes (absent blocks 0).
static void b32_acts(int fmt, const int8_t *q, const float *e, int m, int k, int path, Acts *A,
                     int8_t **q4, float **e16, int32_t **c16) {
    int nb = k / 32, ng = (nb + 15) / 16;
    // q - offset: Q4_0 8, Q5_0 16; Q8_0 on VNNI takes q + 128 (AVX2 uses none)
    int off = fmt == Q4_0 ? 8 : fmt == Q5_0 ? 16 : path == VNNI ? 128 : 0;
    *q4 = lines((size_t)m * ng * 512 + 64, 0);
    *e16 = lines((size_t)m * ng * 16 * sizeof(float), 1);
    *c16 = lines((size_t)m * ng * 16 * sizeof(int32_t), 1);
    sets_of_4(q, m, k, *q4);
    for (int64_t r = 0; r < m; r++)
        for (int g = 0; g < ng; g++)
            for (int p = 0; p < 16; p++) {
                int b = 16 * g + (path == VNNI ? vnni_block(p) : avx2_block(p));
                if (b >= nb) continue;
                int sum = 0;
                for (int j = 0; j < 32; j++) sum += q[r * k + 32 * b + j];
                (*e16)[(r * ng + g) * 16 + p] = e[r * nb + b];
                (*c16)[(r * ng + g) * 16 + p] = -off * sum;
            }
    A->q4 = *q4;
    A->e16 = *e16;
    A->c16 = *c16;
}

// A pass's activations as the kernels read them, and the buffers that hold them. They depend
// on the format only through its family (K-quants) or, for the 32-blocks, the format itself
// (prepared_for), so layers of one input share them.
typedef struct {
    Acts A;
    int8_t *q, *qp, *qa, *q4;
    float *e, *ex, *s32, *e16;
    int16_t *s16;
    int32_t *c16;
} Prepared;

static int prepared_for(int fmt) { return is_kq(fmt) ? Q4_K : fmt; }

// Token r's K-quant activations from its int8 q and scales e (Acts): the sums of 16 and 32,
// each super-block's scale 8 times, and on VNNI (qp) the pairs of super-blocks interleaved.
static void kq_acts(const Prepared *P, int r, int k) {
    const int8_t *q = P->q + (int64_t)r * k;
    int16_t *s16 = P->s16 + (int64_t)r * (k / 16);
    for (int i = 0; i < k / 16; i++) {
        int sum = 0;
        for (int j = 0; j < 16; j++) sum += q[16 * i + j];
        s16[i] = (int16_t)sum;
    }
    float *ex = P->ex + (int64_t)r * (k / 32);
    for (int i = 0; i < k / 32; i++) ex[i] = P->e[(int64_t)r * (k / 256) + i / 8];
    float *s32 = P->s32 + (int64_t)r * (k / 32);
    for (int i = 0; i < k / 32; i++) s32[i] = (float)(s16[2 * i] + s16[2 * i + 1]);
    if (!P->qp) return;
    int8_t *to = P->qp + (int64_t)r * k;
    int ns = k / 256;
    for (int s = 0; s + 2 <= ns; s += 2)
        for (int j = 0; j < 8; j++) {
            memcpy(to + 256 * s + 64 * j, q + 256 * s + 32 * j, 32);
            memcpy(to + 256 * s + 64 * j + 32, q + 256 * (s + 1) + 32 * j, 32);
        }
    if (ns % 2) memcpy(to + 256 * (ns - 1), q + 256 * (ns - 1), 256);
}

// Tokens from which a pass's threads share its per-token work, quantizing the activations and
// SwiGLU (a narrower pass does it on one thread: no fork and join to pay).
#define SHARED_ROWS 16

// x [m, k] quantized per token for a pass of format fmt on `path` (as gguf_pass_path gave it).
// Each token's values are its own, whichever thread makes them.
static void prepare(int fmt, const float *x, int m, int k, int path, int threads, Prepared *P) {
    int kq = is_kq(fmt), group = kq ? 256 : 32;
    if (use_vbmi < 0) gguf_vbmi(-1);
    memset(P, 0, sizeof *P);
    int rows = path == AMX && !kq ? (m + 15) / 16 * 16 : m;  // the tiles read whole tiles of tokens
    int8_t *q = P->q = lines((size_t)rows * k + 64, 1);
    float *e = P->e = lines(sizeof(float) * ((size_t)m * k / group + 1), 0);
    if (kq) {
        P->s16 = lines(sizeof(int16_t) * ((size_t)m * k / 16), 0);
        P->ex = lines(sizeof(float) * 8 * ((size_t)m * k / group), 0);
        P->s32 = lines(sizeof(float) * ((size_t)m * k / 32), 0);
        if (path == VNNI && k >= 512)  // pairs of super-blocks interleaved by 32 inputs
            P->qp = lines((size_t)m * k + 64, 0);
    }
#pragma omp parallel for schedule(static) num_threads(threads) if (m >= SHARED_ROWS)
    for (int r = 0; r < m; r++) {
        quantize_acts(x + (int64_t)r * k, 1, k, group, q + (int64_t)r * k, e + (int64_t)r * (k / group));
        if (kq) kq_acts(P, r, k);
    }
    P->A = (Acts){.q = q, .e = e, .k = k, .s16 = P->s16, .ex = P->ex, .s32 = P->s32, .qp = P->qp};
    if (!kq && path != AMX)
        b32_acts(fmt, q, e, m, k, path, &P->A, &P->q4, &P->e16, &P->c16);
    if (kq && path == AMX) P->A.qa = P->qa = lanes_by_tile(q, m, k);
}

static void release(Prepared *P) {
    free(P->q);
    free(P->e);
    free(P->s16);
    free(P->ex);
    free(P->s32);
    free(P->qp);
    free(P->qa);
    free(P->q4);
    free(P->e16);
    free(P->c16);
}

// y [m, n] = x [m, k] @ W.T (+ bias [n]), W's row r at w + r * row_bytes in format fmt, on
// `path` (AVX2, or VNNI or AMX where gguf_path() says so; gguf_pass_path says which a pass
// takes). Threads take weight rows as they finish.
void gguf_linear(int fmt, const float *x, const uint8_t *w, int64_t row_bytes, const float *bias,
                 float *y, int m, int k, int n, int path, int threads) {
    path = gguf_pass_path(fmt, m, path);
    Prepared P;
    prepare(fmt, x, m, k, path, threads, &P);
    if (path == AMX)
        tile_linear(fmt, w, row_bytes, bias, y, m, n, &P.A, threads);
    else if (threads <= 1)  // no OpenMP region: a one-thread call pays no fork and join
        dot_rows(fmt, w, row_bytes, bias, y, m, n, path, &P.A, 0, n);
    else {
        const int step = rows_at_a_time(m, k, path);
#pragma omp parallel for schedule(guided) num_threads(threads)
        for (int row = 0; row < n; row += step)
            dot_rows(fmt, w, row_bytes, bias, y, m, n, path, &P.A, row, row + step < n ? row + step : n);
    }
    release(&P);
}

#define MANY 4  // the most layers one gguf_linear_many call joins

// `count` layers that read the same x [m, k] (a decoder layer's q/k/v, its gate/up), as one
// call: layer i's y [m, ns[i]] follows layer i - 1's in `y`. Each row is computed as
// gguf_linear computes it, so each layer's output has the bits of its own call; the input
// is quantized once per format family and the threads share one region over every row. A
// pass on the AMX tiles (or more than MANY layers) takes one gguf_linear call a layer.
void gguf_linear_many(int count, const int *fmts, const float *x, const uint8_t *const *ws,
                      const int64_t *row_bytes, const float *const *biases, float *y, int m, int k,
                      const int *ns, int path, int threads) {
    int tiles = count > MANY;
    for (int i = 0; i < count && !tiles; i++) tiles = gguf_pass_path(fmts[i], m, path) == AMX;
    if (tiles) {
        for (int i = 0; i < count; y += (int64_t)m * ns[i], i++)
            gguf_linear(fmts[i], x, ws[i], row_bytes[i], biases[i], y, m, k, ns[i], path, threads);
        return;
    }
    path = gguf_pass_path(fmts[0], m, path);  // not AMX: the path asked, or VNNI for AMX
    Prepared P[MANY];
    int owner[MANY], first[MANY + 1];  // whose Prepared a layer reads; its first row of all
    float *ys[MANY];
    first[0] = 0;
    for (int i = 0; i < count; i++) {
        owner[i] = i;
        for (int j = 0; j < i; j++)
            if (owner[j] == j && prepared_for(fmts[j]) == prepared_for(fmts[i])) owner[i] = j;
        if (owner[i] == i) prepare(fmts[i], x, m, k, path, threads, &P[i]);
        ys[i] = i ? ys[i - 1] + (int64_t)m * ns[i - 1] : y;
        first[i + 1] = first[i] + ns[i];
    }
    if (threads <= 1) {
        for (int i = 0; i < count; i++)
            dot_rows(fmts[i], ws[i], row_bytes[i], biases[i], ys[i], m, ns[i], path, &P[owner[i]].A, 0, ns[i]);
    } else {
        const int step = rows_at_a_time(m, k, path);
#pragma omp parallel for schedule(guided) num_threads(threads)
        for (int r = 0; r < first[count]; r += step) {  // as gguf_linear
            for (int at = r; at < r + step && at < first[count];) {  // rows may span two layers
                int i = 0;
                while (at >= first[i + 1]) i++;
                int row = at - first[i], end = r + step < first[i + 1] ? r + step - first[i] : ns[i];
                dot_rows(fmts[i], ws[i], row_bytes[i], biases[i], ys[i], m, ns[i], path,
                         &P[owner[i]].A, row, end);
                at += end - row;
            }
        }
    }
    for (int i = 0; i < count; i++)
        if (owner[i] == i) release(&P[i]);
}

// ---- a decoder layer in one call ------------------------------------------------------------
// A Llama-family decoder layer whose linears are all block layers: the lean decoder calls it
// once a layer instead of a dozen small ops, each paying Python and dispatch. Its steps are the
// ones the lean decoder's own loop takes, each row alone: rows.c's RMSNorm and attention (by
// the pointers the caller passes), these kernels' linears, the float adds of the residual
// stream, and gguf_swiglu, which the lean decoder's loop calls too: both give the same bits.

// e^x for any x, 8 at a time (exp8.h, clamped to its range: e^-87.3 and e^88 stand for the
// values beyond, which SiLU takes to the same result within float's precision)
AI __m256 exp8(__m256 x) {
    return exp8_in_range(_mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.0f)));
}

// silu(g) u = g / (1 + e^-g) u for 8 values
AI __m256 swiglu8(__m256 g, __m256 u) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

// out [m, n] = silu(gate) * up, gate and up [m, n]: a row's tail is taken as 8 values too
// (zero-padded), so every value has the same instructions wherever it stands, on any thread.
void gguf_swiglu(const float *gate, const float *up, float *out, int m, int n, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (m >= SHARED_ROWS)
    for (int64_t r = 0; r < m; r++) {
        const float *g = gate + r * n, *u = up + r * n;
        float *o = out + r * n;
        int j = 0;
        for (; j + 8 <= n; j += 8) _mm256_storeu_ps(o + j, swiglu8(_mm256_loadu_ps(g + j), _mm256_loadu_ps(u + j)));
        if (j < n) {
            float gt[8] = {0}, ut[8] = {0}, ot[8];
            memcpy(gt, g + j, sizeof(float) * (n - j));
            memcpy(ut, u + j, sizeof(float) * (n - j));
            _mm256_storeu_ps(ot, swiglu8(_mm256_loadu_ps(gt), _mm256_loadu_ps(ut)));
            memcpy(o + j, ot, sizeof(float) * (n - j));
        }
    }
}

// Layers that read one input, as gguf_linear_many takes them.
typedef struct {
    int count;
    const int *fmts;
    const uint8_t *const *ws;
    const int64_t *row_bytes;
    const float *const *biases;
    const int *ns;
} Joint;

typedef void (*NormFn)(const float *x, const float *w, float *y, int n, int k, float eps);
typedef void (*AttendFn)(const float *q, const float *k, const float *v, const float *cos,
                         const float *sin, float *kcache, float *vcache, int64_t cs, int start,
                         int m, int heads, int kv_heads, int d, float scale, float *qr,
                         float *out, float *scratch, int threads);

// One decoder layer: q/k/v (q, k and v, in that order), o, gate/up (gate, then up) and down;
// its norms' weights; its attention's shape; rows.c's rms_norm and rope_attend.
typedef struct {
    Joint qkv, o, gate_up, down;
    const float *norm1, *norm2;
    float eps1, eps2;
    int hidden, heads, kv_heads, d, ff;
    float scaling;
    NormFn rms_norm;
    AttendFn rope_attend;
} Layer;

static int64_t total(const Joint *J) {
    int64_t n = 0;
    for (int i = 0; i < J->count; i++) n += J->ns[i];
    return n;
}

// Floats of `work` a call of m rows at position `start` needs.
int64_t gguf_layer_work(const Layer *L, int m, int start, int threads) {
    int64_t qkv = total(&L->qkv), att = (int64_t)L->heads * L->d;
    // the attention's scratch: a group of query heads' scores per thread (rows.c)
    int64_t scores = (int64_t)threads * (L->heads / L->kv_heads) * (start + m);
    return m * (L->hidden + qkv + 2 * att + L->hidden + 3 * (int64_t)L->ff) + scores;
}

static void joint(const Joint *J, const float *x, float *y, int m, int k, int path, int threads) {
    gguf_linear_many(J->count, J->fmts, x, J->ws, J->row_bytes, J->biases, y, m, k, J->ns, path, threads);
}

static void add_into(float *y, const float *a, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a[i];
}

// y [m, hidden] = the layer over x [m, hidden]: the attention block unless
// `attend` is 0, then the MLP block unless `mlp` is 0 (a skipped block adds nothing). The
// keys and values of rows start.. go into the cache ([kv_heads, capacity, d], head stride cs).
void gguf_layer(const Layer *L, const float *x, float *y, int m, const float *cos,
                const float *sin, float *kcache, float *vcache, int64_t cs, int start, int attend,
                int mlp, float *work, int path, int threads) {
    int64_t hid = (int64_t)m * L->hidden, att = (int64_t)m * L->heads * L->d, ff = (int64_t)m * L->ff;
    float *h = work, *qkv = h + hid, *qr = qkv + m * total(&L->qkv), *a = qr + att,
          *o = a + att, *gu = o + hid, *act = gu + 2 * ff, *scratch = act + ff;
    if (y != x) memcpy(y, x, sizeof(float) * hid);
    if (attend) {
        L->rms_norm(y, L->norm1, h, m, L->hidden, L->eps1);
        joint(&L->qkv, h, qkv, m, L->hidden, path, threads);
        const float *q = qkv, *k = q + (int64_t)m * L->qkv.ns[0], *v = k + (int64_t)m * L->qkv.ns[1];
        L->rope_attend(q, k, v, cos, sin, kcache, vcache, cs, start, m, L->heads, L->kv_heads,
                       L->d, L->scaling, qr, a, scratch, threads);
        joint(&L->o, a, o, m, L->heads * L->d, path, threads);
        add_into(y, o, hid);
    }
    if (mlp) {
        L->rms_norm(y, L->norm2, h, m, L->hidden, L->eps2);
        joint(&L->gate_up, h, gu, m, L->hidden, path, threads);
        gguf_swiglu(gu, gu + ff, act, m, L->ff, threads);
        joint(&L->down, act, o, m, L->ff, path, threads);
        add_into(y, o, hid);
    }
}

// ---- dequantization (gguf.quants.dequantize's float32 bits) ---------------------------------

static void dequantize_row(int fmt, const uint8_t *w, int k, float *y) {
    if (fmt == Q4_0 || fmt == Q5_0 || fmt == Q8_0) {
        int bb = block_bytes(fmt);
        for (int b = 0; b < k / 32; b++, w += bb, y += 32) {
            float d = f16(w);
            if (fmt == Q8_0) {
                for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)w[2 + j] * d;
                continue;
            }
            uint32_t qh = 0;
            if (fmt == Q5_0) memcpy(&qh, w + 2, 4);
            const uint8_t *qs = w + (fmt == Q5_0 ? 6 : 2);
            int off = fmt == Q5_0 ? 16 : 8;
            for (int j = 0; j < 16; j++) {
                int lo = (qs[j] & 15) | ((qh >> j) & 1) << 4, hi = (qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
                y[j] = d * (float)(lo - off);
                y[j + 16] = d * (float)(hi - off);
            }
        }
    } else if (fmt == Q4_K || fmt == Q5_K) {
        int bb = fmt == Q5_K ? 176 : 144;
        for (int s = 0; s < k / 256; s++, w += bb, y += 256) {
            float d = f16(w), dmin = f16(w + 2);
            uint8_t sc[8], mn[8];
            scales_k4(w + 4, sc, mn);
            const uint8_t *qh = w + 16, *qs = w + (fmt == Q5_K ? 48 : 16);
            for (int j = 0; j < 8; j++) {
                float ds = d * (float)sc[j], dm = dmin * (float)mn[j];
                const uint8_t *q = qs + 32 * (j / 2);
                int shift = 4 * (j % 2);
                if (fmt == Q5_K)
                    for (int l = 0; l < 32; l++)
                        y[32 * j + l] = ds * (float)(((q[l] >> shift) & 15) | ((qh[l] >> j) & 1) << 4) - dm;
                else
                    for (int l = 0; l < 32; l++) y[32 * j + l] = ds * (float)((q[l] >> shift) & 15) - dm;
            }
        }
    } else {  // Q6_K
        for (int s = 0; s < k / 256; s++, w += 210, y += 256) {
            const int8_t *sc = (const int8_t *)(w + 192);
            float d = f16(w + 208);
            for (int c = 0; c < 2; c++)
                for (int l = 0; l < 32; l++) {
                    const uint8_t *ql = w + 64 * c, *qh = w + 128 + 32 * c;
                    int q[4] = {(ql[l] & 15) | (qh[l] & 3) << 4, (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4,
                                (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4, (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4};
                    for (int i = 0; i < 4; i++) {
                        int at = 128 * c + 32 * i + l;
                        y[at] = (d * (float)sc[at / 16]) * (float)(q[i] - 32);
                    }
                }
        }
    }
}

// out [nrows, k] = the rows `rows` (all n where rows is NULL) of W, as float32.
void gguf_dequantize(int fmt, const uint8_t *w, int64_t row_bytes, const int64_t *rows, int nrows,
                     int k, float *out, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (nrows > 64)
    for (int i = 0; i < nrows; i++)
        dequantize_row(fmt, w + (rows ? rows[i] : i) * row_bytes, k, out + (int64_t)i * k);
}
