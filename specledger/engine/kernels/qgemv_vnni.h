/* qgemv.c's AVX-512 VNNI path (included there, after the layout, the activation buffer and store_outputs):
 * qgroup -- one group of 16 outputs, up to 8 rows; qpair1 -- one row, a pair of groups, the row's broadcasts loaded
 * once for 32 outputs; qpair_rows -- up to 4 rows, a pair of groups. The same integers and the same float steps per
 * output in every one of them (and in the AVX2 and portable paths): a row's bits never depend on which runs it. */
#ifndef SPECLEDGER_QGEMV_VNNI_H
#define SPECLEDGER_QGEMV_VNNI_H
/* the chunk at c into the caches ahead of its use (non-temporal: the weights are read once per step) */
static inline void prefetch_chunk(const uint8_t *c, int cb) {
    for (int o = 0; o < cb; o += 64) __builtin_prefetch(c + o, 0, 0);
}

/* acc += the dot products of w's bytes (unsigned) with the 4 signed bytes at x, broadcast: vpdpbusd with its memory
 * operand broadcast ({1to16}), which GCC does not fold from the intrinsics (a separate broadcast per call). */
static inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const int32_t *x) {
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));
    return acc;
#else
    return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(*x));
#endif
}

/* A chunk's 8 x 64 quant bytes as vpdpbusd takes them: Q8_0's int8 + 128 (unsigned; corrected by -128 sum(qx)), Q4's
 * low nibbles as they are and high nibbles in place (16 q: their sum is shifted back in block_isum). */
static inline __attribute__((always_inline)) void chunk_weights(const int kind, const uint8_t *c, __m512i w[8]) {
    const int sb = scale_bytes(kind);
    if (kind == KIND_Q8_0) {
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        for (int g = 0; g < 8; g++) w[g] = _mm512_xor_si512(_mm512_loadu_si512(c + sb + 64 * g), flip);
        return;
    }
    for (int h = 0; h < 4; h++) {
        __m512i p = _mm512_loadu_si512(c + sb + 64 * h);
        w[h] = _mm512_and_si512(p, _mm512_set1_epi8(0x0f));
        w[h + 4] = _mm512_and_si512(p, _mm512_set1_epi8((char)0xf0));
    }
}

/* The 16 outputs' exact block sums I_b from base (= corr * sum(qx)) and the row's 8 qx words at xq, broadcast from
 * memory: two independent chains of four (an integer sum: the same whatever the order), the high nibbles' /16. */
static inline __attribute__((always_inline)) __m512i block_isum(const int kind, const __m512i w[8], __m512i base,
                                                                const int32_t *xq) {
    __m512i is0 = base, is1 = _mm512_setzero_si512();
    for (int g = 0; g < 4; g++) is0 = dpbusd_bcast(is0, w[g], xq + g);
    for (int g = 4; g < 8; g++) is1 = dpbusd_bcast(is1, w[g], xq + g);
    return _mm512_add_epi32(is0, kind == KIND_Q8_0 ? is1 : _mm512_srai_epi32(is1, 4));
}

/* acc = fma(float(I_b), d_b dx_b, acc) [; acc = fma(m_b, sx_b, acc) for Q4_1, m_b the chunk's second fp16 row]: the
 * float steps every path takes, in this order. */
static inline __attribute__((always_inline)) __m512 block_acc(const int kind, __m512 acc, __m512i is, __m512 d,
                                                              __m512 dx, const uint8_t *c, __m512 sx) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(d, dx), acc);
    if (kind == KIND_Q4_1)
        acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 32))), sx, acc);
    return acc;
}

static inline __attribute__((always_inline)) void qgroup(const int kind, const uint8_t *Wg, qact a, const float *bias,
                                                         const float *r, float *y, int m0, const int MM, int n0, int N,
                                                         int K, int kb) {
    __m512 acc[QMB];
    for (int j = 0; j < MM; j++) acc[j] = _mm512_setzero_ps();
    const int cb = chunk_bytes(kind);
    const int cm = kind == KIND_Q8_0 ? -128 : corr_mul(kind);  /* Q8_0: minus 128 * sum(qx) (see chunk_weights) */
    for (int b = 0; b < kb; b++) {
        const uint8_t *c = Wg + (size_t)b * 2 * cb;  /* this group's chunk of its pair's block b */
        prefetch_chunk(c + (size_t)QPF * 2 * cb, cb);
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)c));
        __m512i w[8];
        chunk_weights(kind, c, w);
        for (int j = 0; j < MM; j++) {
            size_t at = (size_t)(m0 + j) * kb + b;
            const int32_t *xq = (const int32_t *)(a.qx + (size_t)(m0 + j) * K + (size_t)b * 32);
            __m512i is = block_isum(kind, w, _mm512_set1_epi32(cm * a.si[at]), xq);
            acc[j] = block_acc(kind, acc[j], is, d, _mm512_set1_ps(a.dx[at]), c, _mm512_set1_ps(a.sx[at]));
        }
    }
    for (int j = 0; j < MM; j++) {
        float s16[QN];
        _mm512_storeu_ps(s16, acc[j]);
        store_outputs(s16, QN, m0 + j, n0, N, bias, r, y);
    }
}

/* One row, a pair of groups at once (decode): qgroup's arithmetic per output, unchanged (the same bits), with the
 * row's broadcasts (8 words of qx, its dx and sx per block) loaded once for 32 outputs; Wp2: the pair's first chunk. */
#define QPAIR1 1
static inline __attribute__((always_inline)) void qpair1(const int kind, const uint8_t *Wp2, qact a, const float *bias,
                                                         const float *r, float *y, int n0, int N, int kb) {
    const int cb = chunk_bytes(kind), cm = kind == KIND_Q8_0 ? -128 : corr_mul(kind);
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int b = 0; b < kb; b++) {
        const int32_t *xq = (const int32_t *)(a.qx + (size_t)b * 32);
        __m512i xb[8];  /* the row's broadcasts, in registers for both groups (block_isum reads them from memory) */
        for (int g = 0; g < 8; g++) xb[g] = _mm512_set1_epi32(xq[g]);
        const __m512 dx = _mm512_set1_ps(a.dx[b]), sx = _mm512_set1_ps(a.sx[b]);
        const __m512i base = _mm512_set1_epi32(cm * a.si[b]);
        for (int t = 0; t < 2; t++) {
            const uint8_t *c = Wp2 + ((size_t)b * 2 + t) * cb;
            prefetch_chunk(c + (size_t)QPF * cb, cb);
            __m512i w[8], is0 = base, is1 = _mm512_setzero_si512();  /* block_isum's two chains */
            chunk_weights(kind, c, w);
            for (int g = 0; g < 4; g++) is0 = _mm512_dpbusd_epi32(is0, w[g], xb[g]);
            for (int g = 4; g < 8; g++) is1 = _mm512_dpbusd_epi32(is1, w[g], xb[g]);
            __m512i is = _mm512_add_epi32(is0, kind == KIND_Q8_0 ? is1 : _mm512_srai_epi32(is1, 4));
            acc[t] = block_acc(kind, acc[t], is, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)c)), dx, c, sx);
        }
    }
    for (int t = 0; t < 2; t++) {
        float s16[QN];
        _mm512_storeu_ps(s16, acc[t]);
        store_outputs(s16, QN, 0, n0 + t * QN, N, bias, r, y);
    }
}

/* Rows m0 .. m0 + MM - 1 (MM <= QPM), a pair of groups at once (verify passes): qgroup's arithmetic per output (the
 * same bits), the pair's chunks read once, in one stream, for all the rows. */
#define QPM 4
static inline __attribute__((always_inline)) void qpair_rows(const int kind, const uint8_t *Wp2, qact a,
                                                             const float *bias, const float *r, float *y, int m0,
                                                             const int MM, int n0, int N, int K, int kb) {
    const int cb = chunk_bytes(kind), cm = kind == KIND_Q8_0 ? -128 : corr_mul(kind);
    __m512 acc[2][QPM];
    for (int t = 0; t < 2; t++)
        for (int j = 0; j < MM; j++) acc[t][j] = _mm512_setzero_ps();
    for (int b = 0; b < kb; b++) {
        for (int t = 0; t < 2; t++) {
            const uint8_t *c = Wp2 + ((size_t)b * 2 + t) * cb;
            prefetch_chunk(c + (size_t)QPF * cb, cb);
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)c));
            __m512i w[8];
            chunk_weights(kind, c, w);
            for (int j = 0; j < MM; j++) {
                size_t at = (size_t)(m0 + j) * kb + b;
                const int32_t *xq = (const int32_t *)(a.qx + (size_t)(m0 + j) * K + (size_t)b * 32);
                __m512i is = block_isum(kind, w, _mm512_set1_epi32(cm * a.si[at]), xq);
                acc[t][j] = block_acc(kind, acc[t][j], is, d, _mm512_set1_ps(a.dx[at]), c, _mm512_set1_ps(a.sx[at]));
            }
        }
    }
    for (int t = 0; t < 2; t++)
        for (int j = 0; j < MM; j++) {
            float s16[QN];
            _mm512_storeu_ps(s16, acc[t][j]);
            store_outputs(s16, QN, m0 + j, n0 + t * QN, N, bias, r, y);
        }
}

static inline __attribute__((always_inline)) void qpair_all_rows(const int kind, const uint8_t *Wp2, qact a,
                                                                 const float *bias, const float *r, float *y, int M,
                                                                 int n0, int N, int K, int kb) {
    for (int m0 = 0; m0 < M; m0 += QPM) {
        switch (M - m0 < QPM ? M - m0 : QPM) {  /* a constant row count per instance: accumulators in registers */
            case 1: qpair_rows(kind, Wp2, a, bias, r, y, m0, 1, n0, N, K, kb); break;
            case 2: qpair_rows(kind, Wp2, a, bias, r, y, m0, 2, n0, N, K, kb); break;
            case 3: qpair_rows(kind, Wp2, a, bias, r, y, m0, 3, n0, N, K, kb); break;
            default: qpair_rows(kind, Wp2, a, bias, r, y, m0, 4, n0, N, K, kb); break;
        }
    }
}
#endif
