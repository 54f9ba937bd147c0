/* The native kernel library's interface, declared once: every function gemv.c, ops.c and qgemv.c export, and the
 * layer struct of specledger_layers_f32. The ctypes bindings (engine/kernels/__init__.py ``_bind``) and the layer
 * Structure (engine/native_rows.py ``_LayerF32``) mirror this file; tests/test_kernel_interface.py checks that
 * they agree (names, argument counts and types, struct fields in order). One prototype per declaration, ending
 * in ``);`` -- the test reads them with a regular expression. */
#ifndef SPECLEDGER_KERNELS_H
#define SPECLEDGER_KERNELS_H
#include <stddef.h>
#include <stdint.h>

/* bumped with any change to a signature below (checked at load against kernels/__init__.py ``_ABI``) */
#define SPECLEDGER_ABI 7

/* ---- gemv.c: row-invariant float32 / bfloat16 skinny matmul ---- */
int specledger_gemv_abi(void);
int specledger_gemv_nb(void);
void specledger_pack_f32(const float *W, float *Wp, int N, int K);
void specledger_pack_bf16(const uint16_t *W, uint16_t *Wp, int N, int K);
void specledger_gemv_f32_for(const float *x, const float *Wp, const float *b, const float *r, float *y, int M, int N,
                             int K);
void specledger_gemv_f32(const float *x, const float *Wp, const float *b, const float *r, float *y, int M, int N,
                         int K, int nthreads);
void specledger_gemv_bf16(const uint16_t *x, const uint16_t *Wp, const uint16_t *b, uint16_t *y, int M, int N,
                          int K, int nthreads);

/* ---- ops.c: row-wise float32 decoder ops and the whole-stack call ---- */
void specledger_rmsnorm_f32(const float *x, const float *w, float *y, int M, int D, float eps);
void specledger_rope_f32(float *x, const float *cos_t, const float *sin_t, const int64_t *pos, int M, int H,
                         int rot, int hd);
void specledger_attn_f32(const float *qkv, float *kc, float *vc, float *out, const int64_t *slots,
                         const int64_t *pos, int M, int nh, int nkv, int hd, int cap, float scale, int tree,
                         int nthreads);
void specledger_silu_mul_f32(const float *gu, float *y, int M, int H);

/* One layer's pointers for specledger_layers_f32 (packed weights, biases or NULL, norm weights) and its linears'
 * kinds: wqkv, wo, w13, w2: 0 = float32 packed as gemv.c packs; else a GGUF block kind (qgemv.c). */
typedef struct {
    const float *wqkv;
    const float *bqkv;
    const float *wo;
    const float *bo;
    const float *w13;
    const float *w2;
    const float *attn_norm;
    const float *mlp_norm;
    int32_t kind[4];
} specledger_layer_f32;

void specledger_layers_f32(const specledger_layer_f32 *w, const int32_t *ids, int n, float *x, float *kv,
                           int64_t layer_stride, int64_t v_offset, const int64_t *slots, const int64_t *pos, int M,
                           int dim, int nh, int nkv, int hd, int hidden, int cap, float eps, const float *cos_t,
                           const float *sin_t, float scale, int tree, float *scratch, float *kv_out,
                           int nthreads);

/* The ends around the stack for specledger_forward_f32: the token embedding, the final norm and the LM head.
 * table: float32 rows [vocab][dim] (table_kind 0) or a quantized linear's packed blocks (table_kind its GGUF kind);
 * head: packed as gemv.c packs (head_kind 0) or as qgemv.c packs (its kind); head_bias NULL when absent. */
typedef struct {
    const void *table;
    const float *norm;
    const void *head;
    const float *head_bias;
    int32_t table_kind;
    int32_t head_kind;
    int32_t vocab;
} specledger_ends_f32;

int specledger_forward_f32(const specledger_ends_f32 *ends, const int64_t *tokens, const int64_t *head_rows, int n_head,
                           float *logits, const specledger_layer_f32 *w, const int32_t *ids, int n, float *kv,
                           int64_t layer_stride, int64_t v_offset, const int64_t *slots, const int64_t *pos, int M,
                           int dim, int nh, int nkv, int hd, int hidden, int cap, float eps, const float *cos_t,
                           const float *sin_t, float scale, int nthreads);

/* ---- qgemv.c: GGUF block-quantized weights, kept quantized ---- */
int specledger_qchunk_bytes(int kind);
void specledger_qpack(int kind, const uint8_t *src, uint8_t *dst, int N, int K);
void specledger_qdequant_rows(int kind, const uint8_t *Wp, const int64_t *rows, int R, int N, int K, float *out);
size_t specledger_qact_bytes(int M, int K);
void specledger_q8_rows_for(const float *x, int M, int K, uint8_t *buf);
void specledger_q8_blocks(const float *x_row, int m, int b0, int nb, int M, int K, uint8_t *buf);
const char *specledger_qpath(void);
void specledger_qgemv_for(int kind, const uint8_t *buf, const uint8_t *Wp, const float *bias, const float *r, float *y,
                          int M, int N, int K);
void specledger_qgemv_groups(int kind, const uint8_t *buf, const uint8_t *Wp, const float *bias, const float *r,
                             float *y, int M, int N, int K, int g0, int g1);
void specledger_qlinear(int kind, const float *x, const uint8_t *Wp, const float *bias, const float *r, float *y, int M,
                        int N, int K, int nthreads);

#endif
