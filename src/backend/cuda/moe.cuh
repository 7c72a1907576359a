/* moe.cuh - the parameters and tile lookup shared by the MoE kernels (moe.cu: grouping,
 * tiled expert GEMMs, combine; moe_gv.cu: the decode variants for tiles of 1-2 rows). */
#ifndef DSI_CUDA_MOE_CUH
#define DSI_CUDA_MOE_CUH

#include "common.cuh"

struct moe_p {
    const float *x; /* [n, D] */
    int64_t n, D, I;
    int topk;
    const int32_t *perm; /* [nk] */
    const int4 *tiles;   /* routed tiles, or NULL: shared expert (implicit tiles) */
    const int32_t *n_tiles;
    const struct cu_moe_ent *tab;
    int sb_max;             /* the largest scale byte of the weights (255: not known) */
    bool fexp;              /* wg_finish's up: the gate's exp in single precision (c->wg_exp) */
    struct cu_w w1, w3, w2; /* formats (and, for the shared expert, the data) */
    const float *weight;    /* [nk] */
    float limit;
    bool round;
    bool stage;                /* stage x rows in shared memory (c->xstage) */
    float *h;                  /* [nk + n, I] */
    const uint16_t *x16, *h16; /* wg.cu: bf16 copies of x and h */
    bool x16_pos; /* x16 has a row per position (nk + n rows: the routed rows in perm's order,
                     then x's): wgr.cu's TMA copies (c->wgr_tma) */
    float *out;   /* [nk + n, D] */
    /* where set (c->moe_o16, `fast` rounded outputs, the routed down on wg.cu / wgr.cu): the
       routed rows' outputs ([nk, D]) in bf16 here instead of out (the combine reads them) */
    uint16_t *out16;
    /* wgq.cu (c->wg_q8): FP8 codes of x ([n, D]) and h ([nk + n, I]) in its K order, one byte
       an element, and their scales (one float per row and 128-block: [rows, D / 128], [rows, I
       / 128]) */
    const uint8_t *x8, *h8;
    const float *x8s, *h8s;
};

/* Routed tile t (< *p.n_tiles) of the grouping's table: expert e, first h position, rows. */
__device__ __forceinline__ void
moe_tile_at(const struct moe_p &p, int t, int *e, int64_t *pos0, int *rows) {
    int4 v = p.tiles[t];
    *e = v.x;
    *pos0 = v.y;
    *rows = v.z;
}

/* Tile t of this launch: expert e (or -1 for the shared one), first h position, rows. */
__device__ __forceinline__ bool
moe_tile(const struct moe_p &p, int RX, int *e, int64_t *pos0, int *rows) {
    int64_t nk = p.n * p.topk;
    if (p.tiles) {
        if ((int)blockIdx.y >= *p.n_tiles) return false;
        moe_tile_at(p, (int)blockIdx.y, e, pos0, rows);
    } else {
        int64_t r0 = (int64_t)blockIdx.y * RX;
        if (r0 >= p.n) return false;
        *e = -1;
        *pos0 = nk + r0;
        *rows = (int)(p.n - r0 < RX ? p.n - r0 : RX);
    }
    return true;
}

/* The expert GEMMs for tiles of rx <= 2 rows (moe_gv.cu): grid (column blocks, tiles) as
 * the tiled kernels' second dimension; false: not taken (shapes, shared memory). */
bool launch_moe_up_gv(struct cu_ctx *c, const struct moe_p *p, int type, int rx, unsigned tiles);
bool launch_moe_down_gv(struct cu_ctx *c, const struct moe_p *p, int type, int rx, unsigned tiles);

/* Tensor-core expert GEMMs of `fast` numerics (tc.cu): whether the weights fit them, the
 * activation rows per block for a mean of `rows` rows per tile (16, 32, 64 or 128: the tiles'
 * RX), and the launch (grid.y = tiles; up: h = SwiGLU(W1 x, W3 x) * weight, down: out). */
bool tc_moe_ok(const struct cu_w *w1,
               const struct cu_w *w3,
               const struct cu_w *w2,
               int64_t D,
               int64_t I,
               const float *x);
int tc_pick_bn(const struct cu_ctx *c, double rows);
bool launch_tc_moe(struct cu_ctx *c, const struct moe_p *p, bool up, int bn, unsigned tiles);

/* The same on wgmma (wg.cu, sm_90a) for tiles of 64 or 128 rows: the block width for a mean
 * of `rows` rows per tile (64; 128 or 192 (dyn: 256) if DSI_CUDA_WG_BN allows), and the launch
 * (as launch_tc_moe; p->x16 and p->h16 hold the bf16 copies of x and h; dyn: each block's wgmma
 * width its tile's rows rounded up to 32, c->wg_dyn). */
int wg_pick_bn(const struct cu_ctx *c, double rows, bool dyn);
/* rs: on wgr.cu's kernels, the weights in registers (c->wg_rs; p->x16 / p->h16 then the
 * permuted copies of launch_wg_bf16), where wgr_ok (D and I multiples of 128), blocks of
 * wgr_pick_bn's 64, 128, 192, 224 or 256 rows. */
bool launch_wg_moe(
    struct cu_ctx *c, const struct moe_p *p, bool up, int bn, bool rs, bool dyn, unsigned tiles);
bool wgr_ok(int64_t D, int64_t I);
bool wgr_w_ok(const struct cu_w *w); /* its scale blocks along K a power of two */
int wgr_pick_bn(const struct cu_ctx *c, double rows);
int wgr_pick_bn_routed(const struct cu_ctx *c, double mean); /* (the routed tiles') */
/* y[r * ldy + k] = bf16(x[r * ldx + k]), r < rows, k < cols (even): wg.cu's activations;
 * permuted: each group of 128 columns in wgr.cu's K order (cols a multiple of 128; wg.cuh's
 * wg_perm_col). */
void launch_wg_bf16(struct cu_ctx *c,
                    const float *x,
                    int64_t rows,
                    int64_t cols,
                    int64_t ldx,
                    uint16_t *y,
                    int64_t ldy,
                    bool permuted);

/* launch_wg_bf16 (permuted) of the rows of each position: y's row r < nk from x's row perm[r] /
 * topk, row nk + i from x's row i (i < n). With inv (slot s's position, -1: dropped;
 * k_moe_group's) and c->wg_tok, by token: each row of x read once and written to its positions
 * (rows of positions no slot holds are then left as they are: no tile reads them). */
void launch_wg_bf16_pos(struct cu_ctx *c,
                        const float *x,
                        int64_t n,
                        int64_t nk,
                        const int32_t *perm,
                        const int32_t *inv,
                        int topk,
                        int64_t cols,
                        uint16_t *y);
/* act_quant (blocks of 128) of rows 0 .. rows - 1 of x and their bf16 copy in wgr.cu's
 * permuted K order into y (launch_wg_bf16's, permuted) in one pass; x's rows from keep_from on get
 * the quantised values written back (the rows a later kernel reads as floats; the others keep
 * their inputs). false: not taken (cols not a multiple of 128, alignment), nothing launched. */
bool launch_wg_bf16_q8(struct cu_ctx *c,
                       float *x,
                       int64_t rows,
                       int64_t cols,
                       int64_t ldx,
                       uint16_t *y,
                       int64_t ldy,
                       int64_t keep_from);

/* wgq.cu: the MoE's block GEMMs on the FP8 tensor cores (c->wg_q8), the weights in registers
 * as FP8 (FP4 ones converted per step), on p->x8 / p->h8: where wgq_ok (D and I multiples of
 * 128), blocks of wgq_pick_bn's 64 or 128 activation rows (128 from 65 rows a tile unless
 * DSI_CUDA_WG_BN is below 128); the launch as launch_wg_moe's. */
bool wgq_ok(int64_t D, int64_t I);
int wgq_pick_bn(const struct cu_ctx *c, double rows);
bool launch_wgq_moe(
    struct cu_ctx *c, const struct moe_p *p, bool up, int bn, bool dyn, unsigned tiles);
/* wgp.cu: the routed experts' block GEMMs on the FP8 tensor cores with a producer warpgroup
 * (c->wg_p): FP4 weights with 32-blocks along K (wgp_w_ok), p->x8 / p->h8 as wgq.cu's, D and I
 * multiples of 128, p->tiles of up to 128 rows; grid (column blocks, tiles) as launch_wg_moe's.
 * false: not taken (nothing launched) or the launch failed (c's error set). */
bool wgp_w_ok(const struct cu_w *w);
bool launch_wgp_moe(struct cu_ctx *c, const struct moe_p *p, bool up, unsigned tiles);
/* The FP8 codes of rows 0 .. rows - 1 of x (cols a multiple of 128, row stride ldx) in wgq.cu's
 * K order into q (row stride cols) and their scales into qs ([rows, cols / 128]): act_quant's
 * codes and scales (blocks of 128; on rows already act_quant's output, the same values: the
 * scale is recomputed by act_quant's rule, exact as lt.cu's); xw (may be NULL): the quantised
 * values written back there for rows keep_from .. rows - 1 (the rows a later kernel reads as
 * floats). false: not taken (shape, alignment), nothing launched. */
bool launch_wgq_codes(struct cu_ctx *c,
                      const float *x,
                      int64_t rows,
                      int64_t cols,
                      int64_t ldx,
                      uint8_t *q,
                      float *qs,
                      float *xw,
                      int64_t keep_from);

/* Decode expert GEMMs of `fast` numerics (gvf.cu): whether the weights (and n rows of nt n8
 * tiles in shared memory) fit them, the n8 column
 * tiles for tiles of `rows` rows (1, 2, 4: at most 8, 16, 32 rows; routed tiles are grouped by
 * 8), and the launch (grid.y = tiles; as launch_tc_moe). */
bool gvf_moe_ok(const struct cu_ctx *c,
                const struct cu_w *w1,
                const struct cu_w *w3,
                const struct cu_w *w2,
                int64_t D,
                int64_t I,
                const float *x,
                int64_t n,
                int nt);
int gvf_moe_nt(int64_t rows);
bool launch_gvf_moe(struct cu_ctx *c, const struct moe_p *p, bool up, int nt, unsigned tiles);

#endif
