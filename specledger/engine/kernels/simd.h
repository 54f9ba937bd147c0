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
#endif
