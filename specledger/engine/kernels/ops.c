/* Row-wise float32 decoder ops beside gemv.c, for decode and verify rows (one shared library).
 *
 * Every function computes each row (and each query head) with one fixed sequence of float
 * operations that never depends on how many rows share the call, where a row sits in it, or
 * which thread runs it. Plain decode (1 row), a chain verify (g+1 rows), a packed batch and a
 * token tree therefore produce identical bits per row, which is what greedy exactness rests on.
 *
 * - specledger_rmsnorm_f32: y = w * (x * 1/sqrt(mean(x^2) + eps))            (HF RMSNorm, fp32)
 * - specledger_rope_f32:   x = x * cos[p] + rotate_half(x) * sin[p] on the first `rot` heads
 * - specledger_attn_f32:   write each row's k/v at (slot, pos), then per query head
 *                           out = sum_j softmax(q.k_j * scale)_j v_j over key slots j in [0, pos]
 * - specledger_silu_mul_f32: y = silu(gate) * up, gate|up the two halves of each input row
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

/* sum_i a[i] * b[i]: 16 lanes over i in increasing order then a fixed tree (n % 16 == 0), else sequential. */
static inline float dot(const float *a, const float *b, int n) {
    if (n % 16 == 0) {
        v16 acc = {0};
        for (int i = 0; i < n; i += 16) {
            v16 x, y;
            memcpy(&x, a + i, 64);
            memcpy(&y, b + i, 64);
            acc += x * y;
        }
        return hsum16(acc);
    }
    float s = 0.f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void specledger_rmsnorm_f32(const float *x, const float *w, float *y, int M, int D, float eps) {
    for (int m = 0; m < M; m++) {
        const float *xr = x + (size_t)m * D;
        float *yr = y + (size_t)m * D;
        float r = 1.0f / sqrtf(dot(xr, xr, D) / (float)D + eps);
        for (int i = 0; i < D; i++) yr[i] = w[i] * (xr[i] * r);
    }
}

/* x [M, H, hd] in place; rows' positions pos[M]; tables cos/sin [P, hd]; heads [0, rot) rotated. */
void specledger_rope_f32(float *x, const float *cos_t, const float *sin_t, const int64_t *pos, int M, int H,
                         int rot, int hd) {
    int half = hd / 2;
    float tmp[hd];
    for (int m = 0; m < M; m++) {
        const float *c = cos_t + (size_t)pos[m] * hd, *s = sin_t + (size_t)pos[m] * hd;
        for (int h = 0; h < rot; h++) {
            float *v = x + ((size_t)m * H + h) * hd;
            for (int i = 0; i < half; i++) tmp[i] = -v[i + half];
            for (int i = half; i < hd; i++) tmp[i] = v[i - half];
            for (int i = 0; i < hd; i++) {
                float a = v[i] * c[i], b = tmp[i] * s[i];
                v[i] = a + b;
            }
        }
    }
}

static void attend_one(const float *q, const float *K, const float *V, int len, int hd, float scale, float *out,
                       float *sc) {
    float mx = -INFINITY;
    for (int j = 0; j < len; j++) {
        sc[j] = dot(q, K + (size_t)j * hd, hd) * scale;
        if (sc[j] > mx) mx = sc[j];
    }
    float sum = 0.f;
    for (int j = 0; j < len; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    for (int d = 0; d < hd; d++) out[d] = 0.f;
    for (int j = 0; j < len; j++) {
        const float *v = V + (size_t)j * hd;
        float p = sc[j];
        for (int d = 0; d < hd; d++) out[d] += p * v[d];
    }
    float inv = 1.0f / sum;
    for (int d = 0; d < hd; d++) out[d] *= inv;
}

static inline void write_kv(const float *qkv, float *kc, float *vc, const int64_t *slots, const int64_t *pos,
                            int m, int h, int nh, int nkv, int hd, int cap) {
    const float *row = qkv + (size_t)m * (nh + 2 * nkv) * hd;
    size_t at = (((size_t)slots[m] * nkv + h) * cap + (size_t)pos[m]) * hd;
    memcpy(kc + at, row + (size_t)(nh + h) * hd, (size_t)hd * 4);
    memcpy(vc + at, row + (size_t)(nh + nkv + h) * hd, (size_t)hd * 4);
}

/* qkv [M, nh + 2*nkv, hd] (roped); caches [S, nkv, cap, hd]; out [M, nh, hd]; sc: this thread's scratch of
 * max(pos) + 1 floats. Inside a parallel region (orphaned ``omp for``s, a barrier after each):
 * tree == 0: rows' (slot, pos) are distinct -- all k/v are written first (one thread), then every (row, head)
 *            attends in parallel. tree == 1: row m writes then attends before row m+1 writes (a token tree's
 *            siblings reuse positions); parallel over kv heads, rows in order. */
static void attn_for(const float *qkv, float *kc, float *vc, float *out, const int64_t *slots, const int64_t *pos,
                     int M, int nh, int nkv, int hd, int cap, float scale, int tree, float *sc) {
    int group = nh / nkv;
    if (!tree) {
#pragma omp single
        for (int m = 0; m < M; m++)
            for (int h = 0; h < nkv; h++) write_kv(qkv, kc, vc, slots, pos, m, h, nh, nkv, hd, cap);
#pragma omp for schedule(static)
        for (int u = 0; u < M * nh; u++) {
            int m = u / nh, qh = u % nh, h = qh / group;
            size_t base = (((size_t)slots[m] * nkv + h) * cap) * hd;
            attend_one(qkv + ((size_t)m * (nh + 2 * nkv) + qh) * hd, kc + base, vc + base, (int)pos[m] + 1, hd,
                       scale, out + ((size_t)m * nh + qh) * hd, sc);
        }
        return;
    }
#pragma omp for schedule(static)
    for (int h = 0; h < nkv; h++)
        for (int m = 0; m < M; m++) {
            write_kv(qkv, kc, vc, slots, pos, m, h, nh, nkv, hd, cap);
            size_t base = (((size_t)slots[m] * nkv + h) * cap) * hd;
            for (int g = 0; g < group; g++) {
                int qh = h * group + g;
                attend_one(qkv + ((size_t)m * (nh + 2 * nkv) + qh) * hd, kc + base, vc + base, (int)pos[m] + 1,
                           hd, scale, out + ((size_t)m * nh + qh) * hd, sc);
            }
        }
}

static int max_len(const int64_t *pos, int M) {
    int maxlen = 0;
    for (int m = 0; m < M; m++) if (pos[m] + 1 > maxlen) maxlen = (int)pos[m] + 1;
    return maxlen;
}

void specledger_attn_f32(const float *qkv, float *kc, float *vc, float *out, const int64_t *slots,
                         const int64_t *pos, int M, int nh, int nkv, int hd, int cap, float scale, int tree,
                         int nthreads) {
    int maxlen = max_len(pos, M);
#pragma omp parallel num_threads(nthreads)
    {
        float *sc = malloc((size_t)maxlen * 4);
        attn_for(qkv, kc, vc, out, slots, pos, M, nh, nkv, hd, cap, scale, tree, sc);
        free(sc);
    }
}

void specledger_silu_mul_f32(const float *gu, float *y, int M, int H) {
    for (int m = 0; m < M; m++) {
        const float *g = gu + (size_t)m * 2 * H, *u = g + H;
        float *yr = y + (size_t)m * H;
        for (int i = 0; i < H; i++) yr[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* ---- a whole stack of decoder layers in one call --------------------------------------------------------
 * specledger_layers_f32 runs the layers ``ids[0..n)`` over rows x [M, dim] in place, each layer exactly as
 * engine/native_rows.block_rows does with the calls above (same functions, same order, same buffers' bits):
 *
 *     x += Wo . attend(rope(Wqkv . rmsnorm(x)))      x += W2 . silu_mul(W13 . rmsnorm(x))
 *
 * so a row's bits are those of the per-op path, and greedy exactness is untouched. One call per forward
 * instead of nine ctypes calls and four tensor allocations per layer, and one OpenMP parallel region instead
 * of five per layer (a barrier between ops where a fork and a join were): decode is a weight stream of
 * ~17-25 ms per token on the 2-core target, and the Python between the kernels was 1.5-2 ms of it.
 * Layer i's weights are ``w[i]`` (packed as gemv.c packs, biases NULL when absent); its k/v caches
 * [S, nkv, cap, hd] start at kv + i * layer_stride and kv + i * layer_stride + v_offset (floats).
 * scratch holds M * (dim + (nh + 2 nkv) hd + nh hd + 3 hidden) floats. */
typedef struct {
    const float *wqkv, *bqkv, *wo, *bo, *w13, *w2, *attn_norm, *mlp_norm;
} specledger_layer_f32;

void specledger_gemv_f32_for(const float *x, const float *Wp, const float *b, const float *r, float *y, int M, int N,
                             int K);

void specledger_layers_f32(const specledger_layer_f32 *w, const int32_t *ids, int n, float *x, float *kv,
                           int64_t layer_stride, int64_t v_offset, const int64_t *slots, const int64_t *pos, int M,
                           int dim, int nh, int nkv, int hd, int hidden, int cap, float eps, const float *cos_t,
                           const float *sin_t, float scale, int tree, float *scratch, int nthreads) {
    int nq = (nh + 2 * nkv) * hd, maxlen = max_len(pos, M);
    float *h = scratch, *qkv = h + (size_t)M * dim, *att = qkv + (size_t)M * nq, *gu = att + (size_t)M * nh * hd,
          *act = gu + (size_t)M * 2 * hidden;
    /* one parallel region for the whole stack: the matmuls and attention share their work among the threads
     * (orphaned omp for), the small row ops run on one thread; every op ends at a barrier, as a call did */
#pragma omp parallel num_threads(nthreads)
    {
        float *sc = malloc((size_t)maxlen * 4);
        for (int li = 0; li < n; li++) {
            const specledger_layer_f32 *L = w + ids[li];
            float *kc = kv + (size_t)ids[li] * layer_stride, *vc = kc + v_offset;
#pragma omp single
            specledger_rmsnorm_f32(x, L->attn_norm, h, M, dim, eps);
            specledger_gemv_f32_for(h, L->wqkv, L->bqkv, NULL, qkv, M, nq, dim);
#pragma omp single
            specledger_rope_f32(qkv, cos_t, sin_t, pos, M, nh + 2 * nkv, nh + nkv, hd);
            attn_for(qkv, kc, vc, att, slots, pos, M, nh, nkv, hd, cap, scale, tree, sc);
            specledger_gemv_f32_for(att, L->wo, L->bo, x, x, M, dim, nh * hd);
#pragma omp single
            specledger_rmsnorm_f32(x, L->mlp_norm, h, M, dim, eps);
            specledger_gemv_f32_for(h, L->w13, NULL, NULL, gu, M, 2 * hidden, dim);
#pragma omp single
            specledger_silu_mul_f32(gu, act, M, hidden);
            specledger_gemv_f32_for(act, L->w2, NULL, x, x, M, dim, hidden);
        }
        free(sc);
    }
}
