/* Row-invariant skinny matmul for decode and verify: y[m, n] = sum_k x[m, k] * W[n, k] (+ b[n]).
 *
 * Built once per machine by specledger/engine/kernels/__init__.py (cc -O3 -march=native -fopenmp)
 * and called through ctypes. Why it exists: on the 2-core EPYC target, oneDNN and MKL reach
 * 25-35 % of the machine's read bandwidth on the decode shapes (1-9 rows x 576..49152 outputs),
 * while decode is a pure weight stream. This kernel reads the packed weights exactly once per
 * call as one sequential stream, whatever the number of rows. Past ~3 rows (a verify pass, a tree) the call is
 * bound by arithmetic instead: a block of NB outputs stays in L1 while groups of up to MB rows reuse it, the next
 * block is prefetched into L2 meanwhile, and a block's NB sums per row are one transposing reduction.
 *
 * Exactness: every output y[m, n] is one 16-lane accumulator over k in increasing order followed
 * by a fixed-order horizontal sum, whatever M is and wherever row m sits in the call. So a row's
 * bits never depend on how many rows share the call: plain decode (1 row), a verify pass (g+1 rows)
 * and a packed batch compute identical logits, and greedy speculation stays token-identical.
 *
 * Layout of the packed weight: [ceil(N/NB)][K/16][NB][16], rows past N zero-filled. K % 16 == 0.
 * bf16 tensors are uint16 bit patterns; they are widened to float32 (exact), accumulated in float32
 * and the result rounded to nearest-even bf16 (NaN kept quiet), as torch rounds.
 */
#include <stdint.h>
#include <string.h>

#include "simd.h"
#include "specledger_kernels.h"
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
#define NB 8
#define MB 3

int specledger_gemv_abi(void) { return SPECLEDGER_ABI; }
int specledger_gemv_nb(void) { return NB; }

static inline v16 widen(const uint16_t *p) {
    u16x16 h;
    memcpy(&h, p, 32);
    u32x16 w = __builtin_convertvector(h, u32x16) << 16;
    v16 f;
    memcpy(&f, &w, 64);
    return f;
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- packing ----------------------------------------------------------------------------- */
void specledger_pack_f32(const float *W, float *Wp, int N, int K) {
    int nblk = (N + NB - 1) / NB, kb = K / 16;
    for (int b = 0; b < nblk; b++)
        for (int kk = 0; kk < kb; kk++)
            for (int i = 0; i < NB; i++) {
                int n = b * NB + i;
                float *dst = Wp + (((size_t)b * kb + kk) * NB + i) * 16;
                if (n < N) memcpy(dst, W + (size_t)n * K + kk * 16, 64);
                else memset(dst, 0, 64);
            }
}

void specledger_pack_bf16(const uint16_t *W, uint16_t *Wp, int N, int K) {
    int nblk = (N + NB - 1) / NB, kb = K / 16;
    for (int b = 0; b < nblk; b++)
        for (int kk = 0; kk < kb; kk++)
            for (int i = 0; i < NB; i++) {
                int n = b * NB + i;
                uint16_t *dst = Wp + (((size_t)b * kb + kk) * NB + i) * 16;
                if (n < N) memcpy(dst, W + (size_t)n * K + kk * 16, 32);
                else memset(dst, 0, 32);
            }
}

/* The NB horizontal sums hsum16(acc[i][j]), i < NB, of one row j, bit for bit: the same pairings as hsum16
 * (halves, quarters, then (u0 + u2) + (u1 + u3)) done across the 8 accumulators at once by a transposing
 * reduction, 14 shuffles and 14 vector adds instead of 8 x 15 scalar operations. With K = 576 a block does
 * only 36 FMAs per output, so the scalar sums had cost a third of a multi-row call. */
#if defined(__AVX512F__)
_Static_assert(NB == 8, "hsum_block transposes exactly 8 accumulators");
static inline __attribute__((always_inline)) void hsum_block(v16 acc[][MB], int j, float *out) {
    __m512 t[4], v[2];
    for (int p = 0; p < 4; p++) t[p] = hsum_halves((__m512)acc[2 * p][j], (__m512)acc[2 * p + 1][j]);
    for (int q = 0; q < 2; q++) {  /* lane 0 of block i: hsum16 of accumulator 4q + i */
        v[q] = hsum_pairs(hsum_quarters(t[2 * q], t[2 * q + 1]));
        v[q] = _mm512_add_ps(v[q], _mm512_permute_ps(v[q], _MM_SHUFFLE(2, 3, 0, 1)));
    }
    __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    _mm256_storeu_ps(out, _mm512_castps512_ps256(_mm512_permutex2var_ps(v[0], idx, v[1])));
}
#else
static inline void hsum_block(v16 acc[][MB], int j, float *out) {
    for (int i = 0; i < NB; i++) out[i] = hsum16(acc[i][j]);
}
#endif

/* ---- one block: NB outputs x MM rows ------------------------------------------------------ */
#define BLOCK_BODY(LOADX, LOADW, STORE)                                                     \
    v16 acc[NB][MB];                                                                         \
    for (int i = 0; i < NB; i++)                                                             \
        for (int j = 0; j < MM; j++) acc[i][j] = (v16){0};                                   \
    for (int kk = 0; kk < kb; kk++) {                                                        \
        v16 xv[MB];                                                                          \
        for (int j = 0; j < MM; j++) xv[j] = LOADX(x + (size_t)(m0 + j) * K + kk * 16);     \
        for (int i = 0; i < NB; i++) /* the next block into L2: a multi-row call is compute-bound */ \
            __builtin_prefetch(Wb + ((size_t)(kb + kk) * NB + i) * 16, 0, 2);                \
        for (int i = 0; i < NB; i++) {                                                       \
            v16 w = LOADW(Wb + ((size_t)kk * NB + i) * 16);                                  \
            for (int j = 0; j < MM; j++) acc[i][j] += w * xv[j];                             \
        }                                                                                    \
    }                                                                                        \
    for (int j = 0; j < MM; j++) {                                                           \
        float sums[NB];                                                                      \
        hsum_block(acc, j, sums);                                                            \
        for (int i = 0; i < NB; i++) {                                                       \
            int n = n0 + i;                                                                  \
            if (n >= N) break;                                                               \
            float s = sums[i];                                                               \
            STORE;                                                                           \
        }                                                                                    \
    }

/* How many of M rows go in groups of three; the rest go in twos, then one: 4 -> 2 + 2, not 3 + 1 (a one-row
 * group streams the block for 8 FMAs per 9 loads). A row's bits do not depend on its group. */
static inline int rows_in_threes(int M) { return M > 3 && M % 3 == 1 ? M - 4 : M - M % 3; }

static inline v16 load_f32(const float *p) { v16 v; memcpy(&v, p, 64); return v; }

static inline __attribute__((always_inline)) void block_f32(const float *x, const float *Wb, const float *b,
                                                            const float *r, float *y, int m0, const int MM,
                                                            int n0, int N, int K, int kb) {
    BLOCK_BODY(load_f32, load_f32, {
        if (b) s += b[n];
        size_t at = (size_t)(m0 + j) * N + n;
        y[at] = r ? r[at] + s : s;
    })
}

static inline __attribute__((always_inline)) void block_bf16(const uint16_t *x, const uint16_t *Wb,
                                                             const uint16_t *b, uint16_t *y, int m0,
                                                             const int MM, int n0, int N, int K, int kb) {
    BLOCK_BODY(widen, widen, { if (b) s += bf16_to_f32(b[n]); y[(size_t)(m0 + j) * N + n] = f32_to_bf16(s); })
}

/* The blocks of y = x W^T (+ b) (+ r) shared among the threads of the enclosing parallel region (an orphaned
 * ``omp for``, with its barrier at the end; called outside a region it runs them all on the caller's thread).
 * r [M, N] is an optional residual added last (as torch's ``r + linear(x)``); r may be y (in place). */
void specledger_gemv_f32_for(const float *x, const float *Wp, const float *b, const float *r, float *y, int M, int N,
                             int K) {
    int nblk = (N + NB - 1) / NB, kb = K / 16;
#pragma omp for schedule(static)
    for (int bi = 0; bi < nblk; bi++) {
        const float *Wb = Wp + (size_t)bi * kb * NB * 16;
        int m0 = 0, m3 = rows_in_threes(M);
        for (; m0 < m3; m0 += 3) block_f32(x, Wb, b, r, y, m0, 3, bi * NB, N, K, kb);
        for (; m0 + 2 <= M; m0 += 2) block_f32(x, Wb, b, r, y, m0, 2, bi * NB, N, K, kb);
        if (m0 < M) block_f32(x, Wb, b, r, y, m0, 1, bi * NB, N, K, kb);
    }
}

/* y = x W^T (+ b) (+ r) on ``nthreads`` threads (see specledger_gemv_f32_for). */
void specledger_gemv_f32(const float *x, const float *Wp, const float *b, const float *r, float *y, int M, int N,
                         int K, int nthreads) {
#pragma omp parallel num_threads(nthreads)
    specledger_gemv_f32_for(x, Wp, b, r, y, M, N, K);
}

void specledger_gemv_bf16(const uint16_t *x, const uint16_t *Wp, const uint16_t *b, uint16_t *y, int M, int N,
                          int K, int nthreads) {
    int nblk = (N + NB - 1) / NB, kb = K / 16;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int bi = 0; bi < nblk; bi++) {
        const uint16_t *Wb = Wp + (size_t)bi * kb * NB * 16;
        int m0 = 0, m3 = rows_in_threes(M);
        for (; m0 < m3; m0 += 3) block_bf16(x, Wb, b, y, m0, 3, bi * NB, N, K, kb);
        for (; m0 + 2 <= M; m0 += 2) block_bf16(x, Wb, b, y, m0, 2, bi * NB, N, K, kb);
        if (m0 < M) block_bf16(x, Wb, b, y, m0, 1, bi * NB, N, K, kb);
    }
}
