/* One query head's attention for ops.c, every float operation in an order fixed by the key index and the length
 * alone (never by the call, the row's place in it, or the thread): scores 16 keys at a time with one transposing
 * reduction, the softmax's sum over 16 lanes, the weighted sum of values in key order. Row invariance rests on it. */
#ifndef SPECLEDGER_ATTEND_H
#define SPECLEDGER_ATTEND_H
#include <math.h>
#include <string.h>

#include "simd.h"

/* sc[j] = dot(q, K_j) * scale for n keys K_j = K + j * hd, bit for bit as dot(): with 16 lanes and hd = 64,
 * 16 keys at a time, their 16 accumulators summed by one transposing reduction (hsum16's pairings). */
static void scores(const float *q, const float *K, int n, int hd, float scale, float *sc) {
    int j = 0;
#if defined(__AVX512F__)
    if (hd == 64) {
        v16 q0, q1, q2, q3;
        memcpy(&q0, q, 64), memcpy(&q1, q + 16, 64), memcpy(&q2, q + 32, 64), memcpy(&q3, q + 48, 64);
        for (; j + 16 <= n; j += 16) {
            v16 acc[16];
            for (int t = 0; t < 16; t++) {
                const float *k = K + (size_t)(j + t) * 64;
                v16 k0, k1, k2, k3;
                memcpy(&k0, k, 64), memcpy(&k1, k + 16, 64), memcpy(&k2, k + 32, 64), memcpy(&k3, k + 48, 64);
                v16 a = (v16){0};
                a += q0 * k0;
                a += q1 * k1;
                a += q2 * k2;
                a += q3 * k3;
                acc[t] = a;
            }
            v16 s = hsum16x16(acc) * scale;
            memcpy(sc + j, &s, 64);
        }
    }
#endif
    for (; j < n; j++) sc[j] = dot(q, K + (size_t)j * hd, hd) * scale;
}

/* sc[j] = e^(sc[j] - max sc) for j in [0, len), in place; returns their sum: 16 lanes (lane j % 16 adds sc[j] in
 * increasing j, lanes past len adding nothing), then hsum16. Every float operation is fixed by j and len alone; sc
 * has room for len rounded up to 16 (attn_plan's ``scores``). */
static inline float softmax_unscaled(float *sc, int len) {
    v16 mv = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
              -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int j = 0;
    for (; j + 16 <= len; j += 16) {
        v16 s;
        memcpy(&s, sc + j, 64);
        for (int t = 0; t < 16; t++) mv[t] = s[t] > mv[t] ? s[t] : mv[t];  /* lane-wise max: exact in any order */
    }
    float mx = -INFINITY, lane[16];
    memcpy(lane, &mv, 64);
    for (int t = 0; t < 16; t++) mx = lane[t] > mx ? lane[t] : mx;
    for (int t = j; t < len; t++) mx = sc[t] > mx ? sc[t] : mx;
    v16 acc = {0}, vm = mx - (v16){0};
    for (j = 0; j < len; j += 16) {
        v16 s;
        memcpy(&s, sc + j, 64);  /* lanes past len: scratch, masked out below */
        v16 e = vexp16(s - vm);
        if (j + 16 > len)
            for (int t = len - j; t < 16; t++) e[t] = 0.f;
        memcpy(sc + j, &e, 64);
        acc += e;
    }
    return hsum16(acc);
}

/* One query head: out = sum_j softmax(sc)_j V_j over keys j in [0, len): keys [0, pre) at K/V (contiguous, hd
 * apart), key pre + e at kx[e]/vx[e]. The order of every float operation is fixed by j alone. */
static void attend_one(const float *q, const float *K, const float *V, int pre, const float *const *kx,
                       const float *const *vx, int len, int hd, float scale, float *out, float *sc) {
    scores(q, K, pre, hd, scale, sc);
    for (int j = pre; j < len; j++) sc[j] = dot(q, kx[j - pre], hd) * scale;
    float inv = 1.0f / softmax_unscaled(sc, len);
    if (hd == 64) {  /* the same fma per element as the loop below, in four registers */
        v16 o0 = {0}, o1 = {0}, o2 = {0}, o3 = {0};
        for (int j = 0; j < len; j++) {
            const float *v = j < pre ? V + (size_t)j * 64 : vx[j - pre];
            v16 v0, v1, v2, v3;
            memcpy(&v0, v, 64), memcpy(&v1, v + 16, 64), memcpy(&v2, v + 32, 64), memcpy(&v3, v + 48, 64);
            float p = sc[j];
            o0 += p * v0;
            o1 += p * v1;
            o2 += p * v2;
            o3 += p * v3;
        }
        o0 *= inv, o1 *= inv, o2 *= inv, o3 *= inv;
        memcpy(out, &o0, 64), memcpy(out + 16, &o1, 64), memcpy(out + 32, &o2, 64), memcpy(out + 48, &o3, 64);
        return;
    }
    for (int d = 0; d < hd; d++) out[d] = 0.f;
    for (int j = 0; j < len; j++) {
        const float *v = j < pre ? V + (size_t)j * hd : vx[j - pre];
        float p = sc[j];
        for (int d = 0; d < hd; d++) out[d] += p * v[d];
    }
    for (int d = 0; d < hd; d++) out[d] *= inv;
}
#endif
