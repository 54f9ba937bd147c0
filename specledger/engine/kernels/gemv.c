/* Row-invariant skinny matmul for decode and verify: y[m, n] = sum_k x[m, k] * W[n, k] (+ b[n]).
 *
 * Built once per machine by specledger/engine/kernels/__init__.py (cc -O3 -march=native -fopenmp)
 * and called through ctypes. Why it exists: on the 2-core EPYC target, oneDNN and MKL reach
 * 25-35 % of the machine's read bandwidth on the decode shapes (1-9 rows x 576..49152 outputs),
 * while decode is a pure weight stream. This kernel reads the packed weights exactly once per
 * call as one sequential stream, whatever the number of rows.
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
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
#define NB 8
#define MB 3

int specledger_gemv_abi(void) { return 4; }
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

/* ---- one block: NB outputs x MM rows ------------------------------------------------------ */
#define BLOCK_BODY(LOADX, LOADW, STORE)                                                     \
    v16 acc[NB][MB];                                                                         \
    for (int i = 0; i < NB; i++)                                                             \
        for (int j = 0; j < MM; j++) acc[i][j] = (v16){0};                                   \
    for (int kk = 0; kk < kb; kk++) {                                                        \
        v16 xv[MB];                                                                          \
        for (int j = 0; j < MM; j++) xv[j] = LOADX(x + (size_t)(m0 + j) * K + kk * 16);     \
        for (int i = 0; i < NB; i++) {                                                       \
            v16 w = LOADW(Wb + ((size_t)kk * NB + i) * 16);                                  \
            for (int j = 0; j < MM; j++) acc[i][j] += w * xv[j];                             \
        }                                                                                    \
    }                                                                                        \
    for (int i = 0; i < NB; i++) {                                                           \
        int n = n0 + i;                                                                      \
        if (n >= N) break;                                                                   \
        for (int j = 0; j < MM; j++) {                                                       \
            float s = hsum16(acc[i][j]);                                                       \
            STORE;                                                                           \
        }                                                                                    \
    }

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
        int m0 = 0;
        for (; m0 + 3 <= M; m0 += 3) block_f32(x, Wb, b, r, y, m0, 3, bi * NB, N, K, kb);
        if (M - m0 == 2) block_f32(x, Wb, b, r, y, m0, 2, bi * NB, N, K, kb);
        else if (M - m0 == 1) block_f32(x, Wb, b, r, y, m0, 1, bi * NB, N, K, kb);
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
        int m0 = 0;
        for (; m0 + 3 <= M; m0 += 3) block_bf16(x, Wb, b, y, m0, 3, bi * NB, N, K, kb);
        if (M - m0 == 2) block_bf16(x, Wb, b, y, m0, 2, bi * NB, N, K, kb);
        else if (M - m0 == 1) block_bf16(x, Wb, b, y, m0, 1, bi * NB, N, K, kb);
    }
}
