/* Shared by gemv.c and ops.c: the 16-lane float vector and its horizontal sum in one fixed order
 * (halves, then quarters, then a fixed pairing), so a dot product's rounding never depends on the
 * call it happens in: the row-invariance both kernels promise rests on it. */
#ifndef SPECLEDGER_SIMD_H
#define SPECLEDGER_SIMD_H
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));

static inline float hsum16(v16 a) {
    float s[16];
    memcpy(s, &a, 64);
    float t[8], u[4];
    for (int i = 0; i < 8; i++) t[i] = s[i] + s[i + 8];
    for (int i = 0; i < 4; i++) u[i] = t[i] + t[i + 4];
    return (u[0] + u[2]) + (u[1] + u[3]);
}

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

/* e^x for 16 lanes, one fixed sequence of float operations per lane (so a lane's bits never depend on its neighbours
 * or on which call it is in): x clamped to [-103.97, 88.72], n = rint(x log2 e), r = x - n ln2 (two-part ln2, Cody
 * and Waite), e^r by cephes' degree-7 polynomial (1 + r + r^2 p(r)), times 2^n by scalef (subnormals and overflow
 * handled by the instruction). Within 2 ulp of expf; without AVX-512, expf itself per lane. */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline v16 vexp16(v16 v) {
    __m512 x = _mm512_max_ps(_mm512_min_ps((__m512)v, _mm512_set1_ps(88.7228393554688f)),
                             _mm512_set1_ps(-103.972084045410f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return (v16)_mm512_scalef_ps(y, n);
}
#else
#include <math.h>
static inline v16 vexp16(v16 v) {
    float t[16];
    memcpy(t, &v, 64);
    for (int i = 0; i < 16; i++) t[i] = expf(t[i]);
    memcpy(&v, t, 64);
    return v;
}
#endif

#if defined(__AVX512F__)
/* hsum16's pairings across several vectors at once (transposing reductions, bit for bit per vector):
 * halves: lanes 0-7 = a[i] + a[i + 8], lanes 8-15 = b[i] + b[i + 8];
 * quarters: of two halves' results holding vectors 0, 1 and 2, 3, 128-bit block i = u0..u3 of vector i;
 * pairs: lanes 0 and 1 of each block = u0 + u2 and u1 + u3 (their sum is hsum16). */
static inline __m512 hsum_halves(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}

static inline __m512 hsum_quarters(__m512 t0, __m512 t1) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(t0, t1, _MM_SHUFFLE(3, 1, 3, 1)));
}

static inline __m512 hsum_pairs(__m512 u) { return _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(1, 0, 3, 2))); }

/* lane t = hsum16(a[t]) for 16 vectors at once, bit for bit. */
static inline v16 hsum16x16(const v16 *a) {
    __m512 t[8], v[4];
    for (int p = 0; p < 8; p++) t[p] = hsum_halves((__m512)a[2 * p], (__m512)a[2 * p + 1]);
    for (int q = 0; q < 4; q++) v[q] = hsum_pairs(hsum_quarters(t[2 * q], t[2 * q + 1]));  /* block i: a[4q + i] */
    __m512 x01 = _mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(1, 0, 1, 0));  /* block i: v0.l0 v0.l1 v1.l0 v1.l1 */
    __m512 x23 = _mm512_shuffle_ps(v[2], v[3], _MM_SHUFFLE(1, 0, 1, 0));
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(x01, x23, _MM_SHUFFLE(2, 0, 2, 0)),   /* block i lane q: a[4q + i] */
                             _mm512_shuffle_ps(x01, x23, _MM_SHUFFLE(3, 1, 3, 1)));
    __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return (v16)_mm512_permutexvar_ps(idx, r);
}
#endif
#endif
