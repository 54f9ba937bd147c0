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
 * - specledger_layers_f32:   a whole stack of layers in one call (one parallel region)
 * - specledger_forward_f32:  embedding lookup + the stack + final norm + LM head in one call (decode, chains)
 * exp is simd.h's vexp16 (16 lanes, one fixed sequence per lane), the attention's pieces attend.h's.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "attend.h"
#include "simd.h"
#include "specledger_kernels.h"

/* The row ops below share their rows (silu_mul: 256-element chunks) among the threads of an enclosing parallel
 * region (orphaned ``omp for``, a barrier at the end); called outside one, they run on the caller's thread. Each
 * element's arithmetic is the same whichever thread runs it. */
/* ... and, with q (a quantized linear's buffer; NULL: none), each finished row quantized for the next matmul in the
 * same pass (one barrier instead of two; the quantized bits are those of a separate pass over the same floats). */
static inline void rmsnorm_row(const float *x, const float *w, float *y, int m, int M, int D, float eps, uint8_t *q) {
    const float *xr = x + (size_t)m * D;
    float *yr = y + (size_t)m * D;
    float r = 1.0f / sqrtf(dot(xr, xr, D) / (float)D + eps);
    for (int i = 0; i < D; i++) yr[i] = w[i] * (xr[i] * r);
    if (q) specledger_q8_blocks(yr, m, 0, D / 32, M, D, q);
}

static void rmsnorm_q_for(const float *x, const float *w, float *y, int M, int D, float eps, uint8_t *q) {
#pragma omp for schedule(static)
    for (int m = 0; m < M; m++) rmsnorm_row(x, w, y, m, M, D, eps, q);
}

void specledger_rmsnorm_f32(const float *x, const float *w, float *y, int M, int D, float eps) {
    rmsnorm_q_for(x, w, y, M, D, eps, NULL);
}

/* one head v[hd] in place: v = v * c + rotate_half(v) * s */
static inline void rope_head(float *v, const float *c, const float *s, int hd) {
    int half = hd / 2;
    float tmp[hd];
    for (int i = 0; i < half; i++) tmp[i] = -v[i + half];
    for (int i = half; i < hd; i++) tmp[i] = v[i - half];
    for (int i = 0; i < hd; i++) {
        float a = v[i] * c[i], b = tmp[i] * s[i];
        v[i] = a + b;
    }
}

/* x [M, H, hd] in place; rows' positions pos[M]; tables cos/sin [P, hd]; heads [0, rot) rotated. */
void specledger_rope_f32(float *x, const float *cos_t, const float *sin_t, const int64_t *pos, int M, int H,
                         int rot, int hd) {
#pragma omp for schedule(static)
    for (int u = 0; u < M * rot; u++)
        rope_head(x + ((size_t)u / rot * H + u % rot) * hd, cos_t + (size_t)pos[u / rot] * hd,
                  sin_t + (size_t)pos[u / rot] * hd, hd);
}

static inline void write_kv(const float *qkv, float *kc, float *vc, const int64_t *slots, const int64_t *pos,
                            int m, int h, int nh, int nkv, int hd, int cap) {
    const float *row = qkv + (size_t)m * (nh + 2 * nkv) * hd;
    size_t at = (((size_t)slots[m] * nkv + h) * cap + (size_t)pos[m]) * hd;
    memcpy(kc + at, row + (size_t)(nh + h) * hd, (size_t)hd * 4);
    memcpy(vc + at, row + (size_t)(nh + nkv + h) * hd, (size_t)hd * 4);
}

/* The attention of one call, worked out once for every layer and thread: ``scores`` floats of per-thread scratch
 * for the softmax (max(pos) + 1, padded), and for a token tree (tree == 1) where each row finds its keys. The rows
 * are written at (slot, pos) one after another, each attending right after its own write, so row m sees at
 * position p the k/v of the latest row m' <= m at (slot[m], p), else the cache's: from[m] is the first such
 * position (keys before it all come from the cache), src[m * D + (p - from[m])] the row for p in [from[m], pos[m]]
 * or -1 for the cache. A thread's scratch is ``scores`` floats, then 2 * D key/value pointers. */
typedef struct {
    int tree, scores, D;
    int *from, *src;
} attn_plan;

static attn_plan attn_plan_of(const int64_t *slots, const int64_t *pos, int M, int tree) {
    int maxlen = 0;
    for (int m = 0; m < M; m++) if (pos[m] + 1 > maxlen) maxlen = (int)pos[m] + 1;
    attn_plan t = {tree, (maxlen + 15) & ~15, 0, NULL, NULL};
    if (!tree) return t;
    t.from = malloc(sizeof(int) * (size_t)(M > 0 ? M : 1));
    for (int m = 0; m < M; m++) {
        int from = (int)pos[m];
        for (int r = 0; r <= m; r++)
            if (slots[r] == slots[m] && pos[r] < from) from = (int)pos[r];
        t.from[m] = from;
        if ((int)pos[m] - from + 1 > t.D) t.D = (int)pos[m] - from + 1;
    }
    t.src = malloc(sizeof(int) * (size_t)(M > 0 ? M : 1) * (t.D > 0 ? t.D : 1));
    for (int m = 0; m < M; m++)
        for (int p = t.from[m]; p <= pos[m]; p++) {
            int s = -1;
            for (int r = m; r >= 0 && s < 0; r--)
                if (slots[r] == slots[m] && pos[r] == p) s = r;
            t.src[m * t.D + (p - t.from[m])] = s;
        }
    return t;
}

static size_t attn_scratch_bytes(const attn_plan *ap) {
    return (size_t)ap->scores * 4 + 2 * sizeof(float *) * (size_t)ap->D;
}

static void attn_plan_free(attn_plan *ap) { free(ap->from), free(ap->src); }

/* every row's k/v into the cache, in row order, on one thread */
static void write_rows_kv(const float *qkv, float *kc, float *vc, const int64_t *slots, const int64_t *pos, int M,
                          int nh, int nkv, int hd, int cap) {
#pragma omp single
    for (int m = 0; m < M; m++)
        for (int h = 0; h < nkv; h++) write_kv(qkv, kc, vc, slots, pos, m, h, nh, nkv, hd, cap);
}

/* rope and the cache write in one pass (rows' (slot, pos) distinct: not a tree): every (row, q or k head) roped as
 * specledger_rope_f32 does; a k head's row then writes its k and v into the cache (one barrier instead of two). */
static void rope_write_for(float *qkv, float *kc, float *vc, const float *cos_t, const float *sin_t,
                           const int64_t *slots, const int64_t *pos, int M, int nh, int nkv, int hd, int cap) {
    int rot = nh + nkv, H = nh + 2 * nkv;
#pragma omp for schedule(static)
    for (int u = 0; u < M * rot; u++) {
        int m = u / rot, h = u % rot;
        rope_head(qkv + ((size_t)m * H + h) * hd, cos_t + (size_t)pos[m] * hd, sin_t + (size_t)pos[m] * hd, hd);
        if (h >= nh) write_kv(qkv, kc, vc, slots, pos, m, h - nh, nh, nkv, hd, cap);
    }
}

/* qkv [M, nh + 2*nkv, hd] (roped); caches [S, nkv, cap, hd]; out [M, nh, hd]; sc: this thread's scratch
 * (``attn_plan``). Inside a parallel region (orphaned ``omp for``s, a barrier after each), every (row, query
 * head) in parallel:
 * tree == 0: rows' (slot, pos) are distinct -- all k/v are written first (one thread), then every row attends
 *            over its cache slot's [0, pos].
 * tree == 1: a token tree's siblings share positions; row m attends over what it would see had the rows been
 *            written and attended one by one (the plan: its ancestors' k/v straight from qkv), and the
 *            k/v are written afterwards, in row order, leaving the cache as that sequence would. */
static void attn_for(const float *qkv, float *kc, float *vc, float *out, const int64_t *slots, const int64_t *pos,
                     int M, int nh, int nkv, int hd, int cap, float scale, const attn_plan *ap, float *sc,
                     uint8_t *q, int written) {  /* q: quantize each head's output for the next matmul (hd % 32 == 0;
                                                  * NULL: no); written: the rows' k/v are in the cache already */
    int group = nh / nkv, stride = (nh + 2 * nkv) * hd;
    if (!ap->tree && !written) write_rows_kv(qkv, kc, vc, slots, pos, M, nh, nkv, hd, cap);
    const float **kx = (const float **)(sc + ap->scores), **vx = kx + ap->D;
#pragma omp for schedule(static)
    for (int u = 0; u < M * nh; u++) {
        int m = u / nh, qh = u % nh, h = qh / group, len = (int)pos[m] + 1, pre = len;
        size_t base = (((size_t)slots[m] * nkv + h) * cap) * hd;
        if (ap->tree) {
            pre = ap->from[m];
            for (int p = pre; p < len; p++) {
                int r = ap->src[m * ap->D + (p - pre)];
                kx[p - pre] = r < 0 ? kc + base + (size_t)p * hd : qkv + (size_t)r * stride + (size_t)(nh + h) * hd;
                vx[p - pre] = r < 0 ? vc + base + (size_t)p * hd
                                    : qkv + (size_t)r * stride + (size_t)(nh + nkv + h) * hd;
            }
        }
        attend_one(qkv + (size_t)m * stride + (size_t)qh * hd, kc + base, vc + base, pre, kx, vx, len, hd, scale,
                   out + ((size_t)m * nh + qh) * hd, sc);
        if (q) specledger_q8_blocks(out + (size_t)m * nh * hd, m, qh * hd / 32, hd / 32, M, nh * hd, q);
    }
    if (ap->tree) write_rows_kv(qkv, kc, vc, slots, pos, M, nh, nkv, hd, cap);
}

void specledger_attn_f32(const float *qkv, float *kc, float *vc, float *out, const int64_t *slots,
                         const int64_t *pos, int M, int nh, int nkv, int hd, int cap, float scale, int tree,
                         int nthreads) {
    attn_plan ap = attn_plan_of(slots, pos, M, tree);
#pragma omp parallel num_threads(nthreads)
    {
        float *sc = malloc(attn_scratch_bytes(&ap));
        attn_for(qkv, kc, vc, out, slots, pos, M, nh, nkv, hd, cap, scale, &ap, sc, NULL, 0);
        free(sc);
    }
    attn_plan_free(&ap);
}

/* y[m][i] = silu(gate) up for i in [i0, i1) of row m, 16 at a time (a tail zero-padded; every lane's arithmetic is
 * its own, so the bits do not depend on where a range starts); q (i0, i1 on 32s): those blocks quantized, NULL: no */
static void silu_mul_row(const float *gu, float *y, int m, int M, int H, int i0, int i1, uint8_t *q) {
    const float *g = gu + (size_t)m * 2 * H, *u = g + H;
    float *yr = y + (size_t)m * H;
    for (int i = i0; i < i1; i += 16) {  /* silu(g) u = g / (1 + e^-g) u */
        int n = i1 - i < 16 ? i1 - i : 16;
        v16 gv = {0}, uv = {0};
        memcpy(&gv, g + i, (size_t)n * 4), memcpy(&uv, u + i, (size_t)n * 4);
        v16 yv = gv / (1.0f + vexp16(-gv)) * uv;
        memcpy(yr + i, &yv, (size_t)n * 4);
    }
    if (q) specledger_q8_blocks(yr, m, i0 / 32, (i1 - i0) / 32, M, H, q);
}

/* q: quantize each finished chunk for the next matmul (H % 32 == 0: chunks end on block boundaries); NULL: no */
static void silu_mul_q_for(const float *gu, float *y, int M, int H, uint8_t *q) {
    int chunks = (H + 255) / 256;
#pragma omp for schedule(static)
    for (int c = 0; c < M * chunks; c++) {
        int i0 = c % chunks * 256;
        silu_mul_row(gu, y, c / chunks, M, H, i0, i0 + 256 < H ? i0 + 256 : H, q);
    }
}

void specledger_silu_mul_f32(const float *gu, float *y, int M, int H) { silu_mul_q_for(gu, y, M, H, NULL); }

/* One linear inside the stack's parallel region: float32 (gemv.c), or quantized weights (qgemv.c) over rows that
 * the op before quantized into qbuf in its own pass (ready), else quantized here first (every thread waits at the
 * omp for's barrier before the matmul reads them). */
static void linear_for(int kind, int ready, const float *x, const float *W, const float *b, const float *r, float *y,
                       int M, int N, int K, uint8_t *qbuf) {
    if (kind == 0) {
        specledger_gemv_f32_for(x, W, b, r, y, M, N, K);
        return;
    }
    if (!ready) specledger_q8_rows_for(x, M, K, qbuf);
    specledger_qgemv_for(kind, qbuf, (const uint8_t *)W, b, r, y, M, N, K);
}

#ifndef OWN_NORM_ROWS
#define OWN_NORM_ROWS 2 /* up to this many rows, every thread runs a norm (and its quantization) for itself */
#endif

/* y = linear(rmsnorm(x)): with ``own``, this thread normalizes every row into its own buffers (own_h, own_q) and
 * the matmul reads them, no barrier between; else the rows are shared out (h, q, a barrier) as before. */
static void norm_then_linear(int own, const float *x, const float *norm, float *h, float *own_h, uint8_t *q,
                             uint8_t *own_q, int M, int dim, float eps, int kind, const float *W, const float *b,
                             float *y, int N, uint8_t *qbuf) {
    if (own) {
        for (int m = 0; m < M; m++) rmsnorm_row(x, norm, own_h, m, M, dim, eps, own_q);
        linear_for(kind, 1, own_h, W, b, NULL, y, M, N, dim, own_q);
        return;
    }
    rmsnorm_q_for(x, norm, h, M, dim, eps, q);
    linear_for(kind, 1, h, W, b, NULL, y, M, N, dim, qbuf);
}

/* One call's stack: specledger_layers_f32's arguments, and the ends (NULL: none) specledger_forward_f32 adds. */
typedef struct {
    const specledger_layer_f32 *w;
    const int32_t *ids;
    int n, M, dim, nh, nkv, hd, hidden, cap, tree;
    float *x, *kv, *scratch, *kv_out;
    int64_t layer_stride, v_offset;
    const int64_t *slots, *pos;
    float eps, scale;
    const float *cos_t, *sin_t;
    const specledger_ends_f32 *ends;  /* with head_rows [n_head], logits [n_head][vocab]; hx: n_head * dim floats */
    const int64_t *head_rows;
    int n_head;
    float *logits, *hx;
} stack_call;

/* Every layer, on this thread of the call's parallel region (see specledger_layers_f32). */
/* [lo, hi) of n units for this thread of the region (contiguous, sizes differing by at most one) */
static inline void my_share(int n, int *lo, int *hi) {
    int nth = omp_get_num_threads(), me = omp_get_thread_num();
    *lo = (int)((int64_t)n * me / nth), *hi = (int)((int64_t)n * (me + 1) / nth);
}

/* Norm, qkv, rope and the cache write of a decode layer with one barrier: every thread normalizes the rows itself
 * (own_h, own_q), computes whole heads of qkv (a head is hd / 16 groups), ropes its q and k heads and writes its k
 * and v heads into the cache -- the bits of norm_then_linear and rope_write_for (the same functions) without their
 * two barriers. */
static void qkv_rope_own(const stack_call *c, const specledger_layer_f32 *L, float *qkv, float *kc, float *vc,
                         float *own_h, uint8_t *own_q) {
    int M = c->M, nh = c->nh, nkv = c->nkv, hd = c->hd, heads = nh + 2 * nkv, per = hd / 16, h0, h1;
    for (int m = 0; m < M; m++) rmsnorm_row(c->x, L->attn_norm, own_h, m, M, c->dim, c->eps, own_q);
    my_share(heads, &h0, &h1);
    specledger_qgemv_groups(L->kind[0], own_q, (const uint8_t *)L->wqkv, L->bqkv, NULL, qkv, M, heads * hd, c->dim,
                            h0 * per, h1 * per);
    for (int m = 0; m < M; m++)
        for (int h = h0; h < h1; h++) {
            float *v = qkv + ((size_t)m * heads + h) * hd;
            if (h < nh + nkv) rope_head(v, c->cos_t + (size_t)c->pos[m] * hd, c->sin_t + (size_t)c->pos[m] * hd, hd);
            if (h >= nh) {  /* a k head (roped above) or a v head: into the cache at (slot, pos) */
                int kv = h < nh + nkv ? h - nh : h - nh - nkv;
                size_t at = (((size_t)c->slots[m] * nkv + kv) * c->cap + (size_t)c->pos[m]) * hd;
                memcpy((h < nh + nkv ? kc : vc) + at, v, (size_t)hd * 4);
            }
        }
#pragma omp barrier
}

/* Norm, w13, silu_mul and the quantization of its output for w2, with one barrier: every thread normalizes the rows
 * itself, computes the gate and the up outputs of the same hidden units (a range of 32s) and their silu_mul, whose
 * blocks it quantizes -- the bits of norm_then_linear and silu_mul_q_for without their two barriers. */
static void w13_silu_own(const stack_call *c, const specledger_layer_f32 *L, float *gu, float *act, float *own_h,
                         uint8_t *own_q, uint8_t *qbuf) {
    int M = c->M, H = c->hidden, p0, p1;
    for (int m = 0; m < M; m++) rmsnorm_row(c->x, L->mlp_norm, own_h, m, M, c->dim, c->eps, own_q);
    my_share(H / 32, &p0, &p1);
    for (int half = 0; half < 2; half++)  /* gate rows [0, H), up rows [H, 2H) */
        specledger_qgemv_groups(L->kind[2], own_q, (const uint8_t *)L->w13, NULL, NULL, gu, M, 2 * H, c->dim,
                                half * H / 16 + 2 * p0, half * H / 16 + 2 * p1);
    for (int m = 0; m < M; m++) silu_mul_row(gu, act, m, M, H, 32 * p0, 32 * p1, qbuf);
#pragma omp barrier
}

static void layers_for(const stack_call *c, const attn_plan *ap, float *sc, int own, float *own_h, uint8_t *own_q,
                       uint8_t *qbuf) {
    int M = c->M, dim = c->dim, nh = c->nh, nkv = c->nkv, hd = c->hd, hidden = c->hidden, nq = (nh + 2 * nkv) * hd;
    int fused = !c->tree && !c->kv_out;
    float *x = c->x, *h = c->scratch, *qkv = h + (size_t)M * dim, *att = qkv + (size_t)M * nq;
    float *gu = att + (size_t)M * nh * hd, *act = gu + (size_t)M * 2 * hidden;
    for (int li = 0; li < c->n; li++) {
        const specledger_layer_f32 *L = c->w + c->ids[li];
        float *kc = c->kv + (size_t)c->ids[li] * c->layer_stride, *vc = kc + c->v_offset;
        uint8_t *q0 = L->kind[0] ? qbuf : NULL, *q1 = L->kind[1] && hd % 32 == 0 ? qbuf : NULL;
        uint8_t *q2 = L->kind[2] ? qbuf : NULL, *q3 = L->kind[3] && hidden % 32 == 0 ? qbuf : NULL;
        if (fused && own && q0 && hd % 16 == 0) {
            qkv_rope_own(c, L, qkv, kc, vc, own_h, own_q);
        } else {
            norm_then_linear(own && q0, x, L->attn_norm, h, own_h, q0, own_q, M, dim, c->eps, L->kind[0], L->wqkv,
                             L->bqkv, qkv, nq, qbuf);
            if (fused) rope_write_for(qkv, kc, vc, c->cos_t, c->sin_t, c->slots, c->pos, M, nh, nkv, hd, c->cap);
            else specledger_rope_f32(qkv, c->cos_t, c->sin_t, c->pos, M, nh + 2 * nkv, nh + nkv, hd);
        }
        if (c->kv_out) {  /* the rows' roped k and v for a tree's commit: kv_out[layer id][2][M][nkv][hd] */
            float *dst = c->kv_out + (size_t)c->ids[li] * 2 * M * nkv * hd;
#pragma omp for schedule(static)
            for (int m = 0; m < M; m++)
                for (int half = 0; half < 2; half++)
                    memcpy(dst + ((size_t)half * M + m) * nkv * hd,
                           qkv + (size_t)m * nq + (size_t)(nh + half * nkv) * hd, (size_t)nkv * hd * 4);
        }
        attn_for(qkv, kc, vc, att, c->slots, c->pos, M, nh, nkv, hd, c->cap, c->scale, ap, sc, q1, fused);
        linear_for(L->kind[1], q1 != NULL, att, L->wo, L->bo, x, x, M, dim, nh * hd, qbuf);
        if (own && q2 && q3) {
            w13_silu_own(c, L, gu, act, own_h, own_q, q3);
        } else {
            norm_then_linear(own && q2, x, L->mlp_norm, h, own_h, q2, own_q, M, dim, c->eps, L->kind[2], L->w13, NULL,
                             gu, 2 * hidden, qbuf);
            silu_mul_q_for(gu, act, M, hidden, q3);
        }
        linear_for(L->kind[3], q3 != NULL, act, L->w2, NULL, x, x, M, dim, hidden, qbuf);
    }
}

/* logits[i] = head(rmsnorm(x[head_rows[i]])), as ops.rms_norm then the head's own linear compute them. */
static void head_for(const stack_call *c, float *own_h, uint8_t *own_q, uint8_t *qbuf) {
    const specledger_ends_f32 *e = c->ends;
    int R = c->n_head, dim = c->dim;
#pragma omp for schedule(static)
    for (int i = 0; i < R; i++) memcpy(c->hx + (size_t)i * dim, c->x + (size_t)c->head_rows[i] * dim, (size_t)dim * 4);
    norm_then_linear(e->head_kind && R <= OWN_NORM_ROWS, c->hx, e->norm, c->scratch, own_h, e->head_kind ? qbuf : NULL,
                     own_q, R, dim, c->eps, e->head_kind, e->head, e->head_bias, c->logits, e->vocab, qbuf);
}

/* The call in one parallel region: the matmuls and attention share their work among the threads (orphaned omp
 * for), and so do the row ops; an op ends at a barrier, as a call did, except that with few rows each thread
 * normalizes and quantizes them itself into its own buffers, so the matmul after a norm starts without a barrier
 * (the same bits: a row's arithmetic is the same whichever thread runs it), and that the rows' k/v are written
 * while roping (not a tree). */
static void run_stack(const stack_call *c, int nthreads) {
    attn_plan ap = attn_plan_of(c->slots, c->pos, c->M, c->tree);
    int quant = c->ends && c->ends->head_kind, kmax = c->dim > c->hidden ? c->dim : c->hidden;
    if (c->nh * c->hd > kmax) kmax = c->nh * c->hd;
    for (int li = 0; li < c->n; li++)
        for (int t = 0; t < 4; t++) quant |= c->w[c->ids[li]].kind[t] != 0;
    uint8_t *qbuf = quant ? malloc(specledger_qact_bytes(c->M, kmax)) : NULL;
    int own = quant && c->M <= OWN_NORM_ROWS, owned = own || (c->ends && c->n_head <= OWN_NORM_ROWS);
#pragma omp parallel num_threads(nthreads)
    {
        float *sc = malloc(attn_scratch_bytes(&ap));
        float *own_h = owned ? malloc((size_t)c->M * c->dim * 4) : NULL;
        uint8_t *own_q = owned ? malloc(specledger_qact_bytes(c->M, kmax)) : NULL;
        layers_for(c, &ap, sc, own, own_h, own_q, qbuf);
        if (c->ends) head_for(c, own_h, own_q, qbuf);
        free(sc), free(own_h), free(own_q);
    }
    free(qbuf);
    attn_plan_free(&ap);
}

/* ---- a whole stack of decoder layers in one call --------------------------------------------------------
 * specledger_layers_f32 runs the layers ``ids[0..n)`` over rows x [M, dim] in place, each layer exactly as
 * engine/native_rows.block_rows does with the calls above (same functions, same order, same buffers' bits):
 *
 *     x += Wo . attend(rope(Wqkv . rmsnorm(x)))      x += W2 . silu_mul(W13 . rmsnorm(x))
 *
 * so a row's bits are those of the per-op path, and greedy exactness is untouched. One call per forward
 * instead of nine ctypes calls and four tensor allocations per layer, and one OpenMP parallel region instead
 * of five per layer (a barrier between ops where a fork and a join were).
 * Layer i's weights are ``w[i]`` (packed as gemv.c packs, biases NULL when absent); its k/v caches
 * [S, nkv, cap, hd] start at kv + i * layer_stride and kv + i * layer_stride + v_offset (floats).
 * scratch holds M * (dim + (nh + 2 nkv) hd + nh hd + 3 hidden) floats. kv_out (NULL: not asked) receives every
 * row's roped k and v per layer, [n_layers][2][M][nkv][hd] indexed by layer id, as block_rows' kv_out. */
void specledger_layers_f32(const specledger_layer_f32 *w, const int32_t *ids, int n, float *x, float *kv,
                           int64_t layer_stride, int64_t v_offset, const int64_t *slots, const int64_t *pos, int M,
                           int dim, int nh, int nkv, int hd, int hidden, int cap, float eps, const float *cos_t,
                           const float *sin_t, float scale, int tree, float *scratch, float *kv_out,
                           int nthreads) {
    stack_call c = {w, ids, n, M, dim, nh, nkv, hd, hidden, cap, tree, x, kv, scratch, kv_out, layer_stride,
                    v_offset, slots, pos, eps, scale, cos_t, sin_t, NULL, NULL, 0, NULL, NULL};
    run_stack(&c, nthreads);
}

/* A decoder's forward over token rows in one call, decode and chain verify (not a tree): x = the tokens' embedding
 * rows (the table's own lookup: a float32 row copied, or a quantized row dequantized by specledger_qdequant_rows),
 * the stack as specledger_layers_f32 runs it, then logits [n_head][vocab] = head(rmsnorm(x[head_rows[i]])) in the
 * same parallel region -- bit for bit what the embedding module, the stack call, ops.rms_norm and the head's
 * linear compute one after another, without their Python and their second parallel region. Returns 0, or -1
 * before any work when a token is outside [0, vocab). */
int specledger_forward_f32(const specledger_ends_f32 *ends, const int64_t *tokens, const int64_t *head_rows, int n_head,
                           float *logits, const specledger_layer_f32 *w, const int32_t *ids, int n, float *kv,
                           int64_t layer_stride, int64_t v_offset, const int64_t *slots, const int64_t *pos, int M,
                           int dim, int nh, int nkv, int hd, int hidden, int cap, float eps, const float *cos_t,
                           const float *sin_t, float scale, int nthreads) {
    for (int m = 0; m < M; m++)
        if (tokens[m] < 0 || tokens[m] >= ends->vocab) return -1;
    size_t per_row = (size_t)2 * dim + (size_t)(nh + 2 * nkv) * hd + (size_t)nh * hd + (size_t)3 * hidden;
    float *x = malloc((size_t)M * dim * 4), *scratch = malloc((size_t)M * per_row * 4);
    if (ends->table_kind == 0)
        for (int m = 0; m < M; m++)
            memcpy(x + (size_t)m * dim, (const float *)ends->table + (size_t)tokens[m] * dim, (size_t)dim * 4);
    else
        specledger_qdequant_rows(ends->table_kind, ends->table, tokens, M, ends->vocab, dim, x);
    stack_call c = {w, ids, n, M, dim, nh, nkv, hd, hidden, cap, 0, x, kv, scratch, NULL, layer_stride, v_offset,
                    slots, pos, eps, scale, cos_t, sin_t, ends, head_rows, n_head, logits,
                    scratch + (size_t)M * (per_row - dim)};
    run_stack(&c, nthreads);
    free(x), free(scratch);
    return 0;
}
