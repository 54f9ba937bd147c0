/* Row-invariant matmul on GGUF block-quantized weights, kept quantized: y[m, n] = sum_k x[m, k] W[n, k] (+ b) (+ r).
 *
 * Formats (GGUF, 32 weights per block, per-block fp16 scales):  Q8_0  w = d * q,       q int8
 *                                                                Q4_0  w = d * (q - 8), q in 0..15
 *                                                                Q4_1  w = d * q + m,   q in 0..15
 * Activations are quantized per row as llama.cpp does (Q8, 32 per block): dx = max|x| / 127, qx = rint(x * 127 /
 * max|x|), sx = dx * sum(qx). Then, for one output n of row m, with I_b the block's exact integer dot product
 * (sum of q * qx, for Q4_0 minus 8 * sum(qx)):
 *
 *     acc = 0;  for b = 0 .. K/32 - 1 in order:  acc = fma(float(I_b), d_b * dx_b, acc)  [; acc = fma(m_b, sx_b, acc)]
 *
 * Exactness: I_b is an integer sum (exact whatever the instruction set), the float steps are the same for every
 * output, in the same order, and the quantization of a row depends on that row alone. So a row's bits never depend
 * on how many rows share the call, where it sits in it, which thread runs it -- or whether the AVX-512 VNNI, AVX2
 * or portable path computes it: plain decode (1 row), a verify pass (k rows) and a packed batch agree bit for bit.
 *
 * Packed layout: outputs in groups of QN = 16 (the 16 lanes of a vector, one output each); per group, per block b,
 * one chunk: the 16 outputs' fp16 d (and for Q4_1 their fp16 m), then the quants as 4-byte words, word l of row
 * ``g`` = 4 consecutive quants of output l: Q8_0 rows g = 0..7 hold quants 4g..4g+3; Q4 rows h = 0..3 hold in their
 * low nibbles quants 4h..4h+3 and in the high nibbles quants 16+4h.. (GGUF's own byte order, transposed by words).
 * Groups go in pairs, their chunks interleaved block by block: chunk (g, b) at ((g / 2 * K/32 + b) * 2 + g % 2),
 * so a decode step works on two groups at once (one row's broadcasts loaded once for 32 outputs) in one
 * sequential stream. Bytes are exactly the GGUF file's (20 per 32 weights for Q4_1; outputs past N, up to a
 * multiple of 32, zero): a k-row call streams them once.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "specledger_kernels.h"
#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
#endif

#define QN 16
#define QMB 8
#ifndef QPF
#define QPF 8 /* chunks ahead the weight stream is prefetched */
#endif
enum { KIND_F32 = 0, KIND_Q8_0 = 1, KIND_Q4_0 = 2, KIND_Q4_1 = 3 };

static inline int scale_bytes(int kind) { return kind == KIND_Q4_1 ? 64 : 32; }
static inline int chunk_bytes(int kind) { return scale_bytes(kind) + (kind == KIND_Q8_0 ? 512 : 256); }
static inline int gguf_block_bytes(int kind) { return kind == KIND_Q8_0 ? 34 : kind == KIND_Q4_0 ? 18 : 20; }

int specledger_qchunk_bytes(int kind) { return chunk_bytes(kind); }

/* groups padded to pairs; where group g's first chunk lies (its next blocks' chunks follow 2 chunks apart) */
static inline int pair_groups(int N) { return (N + 2 * QN - 1) / (2 * QN) * 2; }
static inline size_t group_at(int g, int kb, int cb) { return ((size_t)(g / 2) * kb * 2 + (size_t)(g % 2)) * cb; }

static inline float half_to_float(uint16_t h) {  /* exact */
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, f = h & 0x3ff, u;
    if (e == 0) {
        if (f == 0) u = s;
        else {  /* subnormal: normalize */
            int sh = 0;
            while (!(f & 0x400)) f <<= 1, sh++;
            u = s | ((uint32_t)(113 - sh) << 23) | ((f & 0x3ff) << 13);
        }
    } else if (e == 31) u = s | 0x7f800000u | (f << 13);
    else u = s | ((e + 112) << 23) | (f << 13);
    float out;
    memcpy(&out, &u, 4);
    return out;
}

/* GGUF rows src [N][K/32 blocks] -> the packed layout above (outputs past N zero: d = m = 0). */
void specledger_qpack(int kind, const uint8_t *src, uint8_t *dst, int N, int K) {
    int kb = K / 32, groups = pair_groups(N), cb = chunk_bytes(kind), sb = scale_bytes(kind);
    int bb = gguf_block_bytes(kind), hdr = kind == KIND_Q4_1 ? 4 : 2, words = kind == KIND_Q8_0 ? 8 : 4;
    memset(dst, 0, (size_t)groups * kb * cb);
    for (int g = 0; g < groups; g++)
        for (int b = 0; b < kb; b++) {
            uint8_t *c = dst + group_at(g, kb, cb) + (size_t)b * 2 * cb;
            for (int l = 0; l < QN && g * QN + l < N; l++) {
                const uint8_t *blk = src + ((size_t)(g * QN + l) * kb + b) * bb;
                memcpy(c + 2 * l, blk, 2);
                if (kind == KIND_Q4_1) memcpy(c + 32 + 2 * l, blk + 2, 2);
                for (int w = 0; w < words; w++) memcpy(c + sb + w * 64 + 4 * l, blk + hdr + 4 * w, 4);
            }
        }
}

/* Rows ``rows`` of the dequantized weight (float32 [R][K]): w = d * q (Q8_0), d * (q - 8), d * q + m. */
void specledger_qdequant_rows(int kind, const uint8_t *Wp, const int64_t *rows, int R, int N, int K, float *out) {
    int kb = K / 32, cb = chunk_bytes(kind), sb = scale_bytes(kind);
    for (int r = 0; r < R; r++) {
        int64_t n = rows[r];
        float *o = out + (size_t)r * K;
        if (n < 0 || n >= N) { memset(o, 0, (size_t)K * 4); continue; }
        int g = (int)(n / QN), l = (int)(n % QN);
        for (int b = 0; b < kb; b++) {
            const uint8_t *c = Wp + group_at(g, kb, cb) + (size_t)b * 2 * cb;
            uint16_t dh, mh = 0;
            memcpy(&dh, c + 2 * l, 2);
            if (kind == KIND_Q4_1) memcpy(&mh, c + 32 + 2 * l, 2);
            float d = half_to_float(dh), m = half_to_float(mh);
            for (int k = 0; k < 32; k++) {
                float w;
                if (kind == KIND_Q8_0) w = d * (float)(int8_t)c[sb + (k / 4) * 64 + 4 * l + k % 4];
                else {
                    int kk = k & 15;
                    uint8_t byte = c[sb + (kk / 4) * 64 + 4 * l + kk % 4];
                    int q = k < 16 ? byte & 15 : byte >> 4;
                    w = kind == KIND_Q4_0 ? d * (float)(q - 8) : d * (float)q + m;
                }
                o[b * 32 + k] = w;
            }
        }
    }
}

/* ---- the activation rows, quantized ---------------------------------------------------------------------------
 * buffer layout for M rows of K: qx int8 [M][K] | dx float [M][K/32] | sx float [M][K/32] | si int32 [M][K/32] */
typedef struct {
    const int8_t *qx;
    const float *dx, *sx;
    const int32_t *si;
} qact;

static inline size_t qx_bytes(int M, int K) { return ((size_t)M * K + 63) & ~(size_t)63; }
size_t specledger_qact_bytes(int M, int K) { return qx_bytes(M, K) + (size_t)M * (K / 32) * 12 + 64; }

static inline qact qact_of(uint8_t *buf, int M, int K) {
    size_t nb = (size_t)M * (K / 32);
    float *dx = (float *)(buf + qx_bytes(M, K));
    qact a = {(const int8_t *)buf, dx, dx + nb, (const int32_t *)(dx + 2 * nb)};
    return a;
}

/* One block of 32: amax exact; d = amax / 127; q = rint(x * (127 / amax)) (round half to even); s = sum q. */
static inline void quant_block(const float *x, int8_t *q, float *dx, float *sx, int32_t *si) {
#if defined(__AVX512F__)
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    float id = amax > 0.f ? 127.f / amax : 0.f;
    __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(id)));
    __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(id)));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(qb));
    int s = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
#else
    float amax = 0.f;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    float id = amax > 0.f ? 127.f / amax : 0.f;
    int s = 0;
    for (int i = 0; i < 32; i++) {
        int v = (int)rintf(x[i] * id);
        q[i] = (int8_t)v;
        s += v;
    }
#endif
    float d = amax / 127.f;
    *dx = d, *si = s, *sx = d * (float)s;
}

/* x [M][K] -> buf (see qact); blocks shared among the threads of an enclosing parallel region (orphaned omp for). */
void specledger_q8_rows_for(const float *x, int M, int K, uint8_t *buf) {
    int kb = K / 32;
    qact a = qact_of(buf, M, K);
#pragma omp for schedule(static)
    for (int u = 0; u < M * kb; u++)
        quant_block(x + (size_t)u * 32, (int8_t *)a.qx + (size_t)u * 32, (float *)a.dx + u, (float *)a.sx + u,
                    (int32_t *)a.si + u);
}

/* Blocks [b0, b0 + nb) of row m (x_row: the row's first element) into buf, as specledger_q8_rows_for writes them:
 * for ops that finish a row's elements in their own pass (rmsnorm, attention heads, silu_mul chunks). */
void specledger_q8_blocks(const float *x_row, int m, int b0, int nb, int M, int K, uint8_t *buf) {
    int kb = K / 32;
    qact a = qact_of(buf, M, K);
    for (int b = b0; b < b0 + nb; b++) {
        size_t u = (size_t)m * kb + b;
        quant_block(x_row + (size_t)b * 32, (int8_t *)a.qx + u * 32, (float *)a.dx + u, (float *)a.sx + u,
                    (int32_t *)a.si + u);
    }
}

/* ---- one group of 16 outputs x MM rows ---------------------------------------------------------------------- */
static inline int corr_mul(int kind) { return kind == KIND_Q4_0 ? -8 : 0; }

/* Outputs n0 .. n0 + count - 1 (those below N) of row ``row``: y = s (+ b[n]) (+ r, added last as torch does). */
static inline void store_outputs(const float *s, int count, int row, int n0, int N, const float *bias, const float *r,
                                 float *y) {
    for (int l = 0; l < count && n0 + l < N; l++) {
        int n = n0 + l;
        float v = s[l];
        if (bias) v += bias[n];
        size_t at = (size_t)row * N + n;
        y[at] = r ? r[at] + v : v;
    }
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define QPATH "avx512-vnni"
#include "qgemv_vnni.h"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QPATH "avx2"
/* Eight outputs per 256-bit half of a chunk; the same integers and float steps per output as the VNNI path. */
static inline __attribute__((always_inline)) void qgroup(const int kind, const uint8_t *Wg, qact a, const float *bias,
                                                         const float *r, float *y, int m0, const int MM, int n0, int N,
                                                         int K, int kb) {
    const int cb = chunk_bytes(kind), sb = scale_bytes(kind), cm = corr_mul(kind);
    const __m256i lo = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int half = 0; half < 2; half++) {
        __m256 acc[QMB];
        for (int j = 0; j < MM; j++) acc[j] = _mm256_setzero_ps();
        for (int b = 0; b < kb; b++) {
            const uint8_t *c = Wg + (size_t)b * 2 * cb;
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(c + 16 * half)));
            __m256 mv = kind == KIND_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(c + 32 + 16 * half))) : d;
            __m256i w[8];
            if (kind == KIND_Q8_0) {
                for (int g = 0; g < 8; g++) w[g] = _mm256_loadu_si256((const __m256i *)(c + sb + 64 * g + 32 * half));
            } else {
                for (int h = 0; h < 4; h++) {
                    __m256i p = _mm256_loadu_si256((const __m256i *)(c + sb + 64 * h + 32 * half));
                    w[h] = _mm256_and_si256(p, lo);
                    w[h + 4] = _mm256_and_si256(_mm256_srli_epi16(p, 4), lo);
                }
            }
            for (int j = 0; j < MM; j++) {
                size_t at = (size_t)(m0 + j) * kb + b;
                const int32_t *xq = (const int32_t *)(a.qx + (size_t)(m0 + j) * K + (size_t)b * 32);
                __m256i is;
                if (kind == KIND_Q8_0) {
                    is = _mm256_setzero_si256();
                    for (int g = 0; g < 8; g++) {  /* |w| * (x * sign(w)): no int16 saturation (128 * 127 * 2 < 32768) */
                        __m256i xv = _mm256_set1_epi32(xq[g]);
                        __m256i t = _mm256_maddubs_epi16(_mm256_sign_epi8(w[g], w[g]), _mm256_sign_epi8(xv, w[g]));
                        is = _mm256_add_epi32(is, _mm256_madd_epi16(t, ones));
                    }
                } else {  /* 4-bit q: each int16 lane of a maddubs is q*x + q'*x', |.| <= 2 * 15 * 127 = 3810, so the 8
                           * of a block sum exactly in int16 (<= 30480 < 32768): one widening madd a block, not 8 */
                    __m256i s16 = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(xq[0]));
                    for (int g = 1; g < 8; g++)
                        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[g], _mm256_set1_epi32(xq[g])));
                    is = _mm256_madd_epi16(s16, ones);
                    if (kind == KIND_Q4_0) is = _mm256_add_epi32(is, _mm256_set1_epi32(cm * a.si[at]));
                }
                __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(a.dx[at]));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), dd, acc[j]);
                if (kind == KIND_Q4_1) acc[j] = _mm256_fmadd_ps(mv, _mm256_set1_ps(a.sx[at]), acc[j]);
            }
        }
        for (int j = 0; j < MM; j++) {
            float s8[8];
            _mm256_storeu_ps(s8, acc[j]);
            store_outputs(s8, 8, m0 + j, n0 + 8 * half, N, bias, r, y);
        }
    }
}
#else
#define QPATH "portable"
static inline void qgroup(const int kind, const uint8_t *Wg, qact a, const float *bias, const float *r, float *y,
                          int m0, const int MM, int n0, int N, int K, int kb) {
    const int cb = chunk_bytes(kind), sb = scale_bytes(kind);
    for (int j = 0; j < MM; j++)
        for (int l = 0; l < QN && n0 + l < N; l++) {
            float acc = 0.f;
            for (int b = 0; b < kb; b++) {
                const uint8_t *c = Wg + (size_t)b * 2 * cb;
                size_t at = (size_t)(m0 + j) * kb + b;
                const int8_t *xq = a.qx + (size_t)(m0 + j) * K + (size_t)b * 32;
                uint16_t dh, mh = 0;
                memcpy(&dh, c + 2 * l, 2);
                if (kind == KIND_Q4_1) memcpy(&mh, c + 32 + 2 * l, 2);
                int32_t is = corr_mul(kind) * a.si[at];
                for (int k = 0; k < 32; k++) {
                    int q;
                    if (kind == KIND_Q8_0) q = (int8_t)c[sb + (k / 4) * 64 + 4 * l + k % 4];
                    else {
                        int kk = k & 15;
                        uint8_t byte = c[sb + (kk / 4) * 64 + 4 * l + kk % 4];
                        q = k < 16 ? byte & 15 : byte >> 4;
                    }
                    is += q * xq[k];
                }
                float dd = half_to_float(dh) * a.dx[at];
                acc = fmaf((float)is, dd, acc);
                if (kind == KIND_Q4_1) acc = fmaf(half_to_float(mh), a.sx[at], acc);
            }
            store_outputs(&acc, 1, m0 + j, n0 + l, N, bias, r, y);
        }
}
#endif

const char *specledger_qpath(void) { return QPATH; }

static inline __attribute__((always_inline)) void qgroup_rows(const int kind, const uint8_t *Wg, qact a,
                                                              const float *bias, const float *r, float *y, int M,
                                                              int n0, int N, int K, int kb) {
    for (int m0 = 0; m0 < M; m0 += QMB) {
        int mm = M - m0 < QMB ? M - m0 : QMB;
        switch (mm) {  /* a constant row count per instance: the rows' accumulators stay in registers */
            case 1: qgroup(kind, Wg, a, bias, r, y, m0, 1, n0, N, K, kb); break;
            case 2: qgroup(kind, Wg, a, bias, r, y, m0, 2, n0, N, K, kb); break;
            case 3: qgroup(kind, Wg, a, bias, r, y, m0, 3, n0, N, K, kb); break;
            case 4: qgroup(kind, Wg, a, bias, r, y, m0, 4, n0, N, K, kb); break;
            case 5: qgroup(kind, Wg, a, bias, r, y, m0, 5, n0, N, K, kb); break;
            case 6: qgroup(kind, Wg, a, bias, r, y, m0, 6, n0, N, K, kb); break;
            case 7: qgroup(kind, Wg, a, bias, r, y, m0, 7, n0, N, K, kb); break;
            default: qgroup(kind, Wg, a, bias, r, y, m0, 8, n0, N, K, kb); break;
        }
    }
}

/* specledger_qgemv_for's outputs of groups [g0, g1) only (16 outputs each), on the calling thread, no barrier: for a
 * caller that shares the groups out itself (ops.c's decode layer: whole heads, matching gate and up ranges). One row:
 * the whole pairs among them two groups at once. */
void specledger_qgemv_groups(int kind, const uint8_t *buf, const uint8_t *Wp, const float *bias, const float *r,
                             float *y, int M, int N, int K, int g0, int g1) {
    int kb = K / 32, cb = chunk_bytes(kind);
    qact a = qact_of((uint8_t *)buf, M, K);
    for (int g = g0; g < g1;) {
        const uint8_t *Wg = Wp + group_at(g, kb, cb);
#ifdef QPAIR1
        if (g % 2 == 0 && g + 1 < g1) {  /* a whole pair: one row with its broadcasts shared, or up to 4 rows */
            if (M == 1 && kind == KIND_Q8_0) qpair1(KIND_Q8_0, Wg, a, bias, r, y, g * QN, N, kb);
            else if (M == 1 && kind == KIND_Q4_0) qpair1(KIND_Q4_0, Wg, a, bias, r, y, g * QN, N, kb);
            else if (M == 1) qpair1(KIND_Q4_1, Wg, a, bias, r, y, g * QN, N, kb);
            else if (kind == KIND_Q8_0) qpair_all_rows(KIND_Q8_0, Wg, a, bias, r, y, M, g * QN, N, K, kb);
            else if (kind == KIND_Q4_0) qpair_all_rows(KIND_Q4_0, Wg, a, bias, r, y, M, g * QN, N, K, kb);
            else qpair_all_rows(KIND_Q4_1, Wg, a, bias, r, y, M, g * QN, N, K, kb);
            g += 2;
            continue;
        }
#endif
        if (kind == KIND_Q8_0) qgroup_rows(KIND_Q8_0, Wg, a, bias, r, y, M, g * QN, N, K, kb);
        else if (kind == KIND_Q4_0) qgroup_rows(KIND_Q4_0, Wg, a, bias, r, y, M, g * QN, N, K, kb);
        else qgroup_rows(KIND_Q4_1, Wg, a, bias, r, y, M, g * QN, N, K, kb);
        g++;
    }
}

/* y = x W^T (+ b) (+ r) over rows already quantized into buf (specledger_q8_rows_for); the groups of 16 outputs are
 * shared among the threads of the enclosing parallel region (contiguous shares, as schedule(static) makes them, a
 * barrier at the end); called outside a region, all on the caller's thread. r may be y (in place). */
void specledger_qgemv_for(int kind, const uint8_t *buf, const uint8_t *Wp, const float *bias, const float *r, float *y,
                          int M, int N, int K) {
    int groups = (N + QN - 1) / QN, nth = omp_get_num_threads(), me = omp_get_thread_num();
    specledger_qgemv_groups(kind, buf, Wp, bias, r, y, M, N, K, (int)((int64_t)groups * me / nth),
                            (int)((int64_t)groups * (me + 1) / nth));
#pragma omp barrier
}

/* One linear on ``nthreads`` threads: quantize the rows of x, then y = x W^T (+ b) (+ r). */
void specledger_qlinear(int kind, const float *x, const uint8_t *Wp, const float *bias, const float *r, float *y, int M,
                        int N, int K, int nthreads) {
    uint8_t *buf = aligned_alloc(64, (specledger_qact_bytes(M, K) + 63) & ~(size_t)63);
    if (!buf) return;
#pragma omp parallel num_threads(nthreads)
    {
        specledger_q8_rows_for(x, M, K, buf);
        specledger_qgemv_for(kind, buf, Wp, bias, r, y, M, N, K);
    }
    free(buf);
}
