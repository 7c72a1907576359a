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
    struct cu_w w1, w3, w2; /* formats (and, for the shared expert, the data) */
    const float *weight;    /* [nk] */
    float limit;
    bool round;
    bool stage; /* stage x rows in shared memory (c->xstage) */
    float *h;   /* [nk + n, I] */
    float *out; /* [nk + n, D] */
};

/* Tile t of this launch: expert e (or -1 for the shared one), first h position, rows. */
__device__ __forceinline__ bool
moe_tile(const struct moe_p &p, int RX, int *e, int64_t *pos0, int *rows) {
    int64_t nk = p.n * p.topk;
    if (p.tiles) {
        if ((int)blockIdx.y >= *p.n_tiles) return false;
        int4 t = p.tiles[blockIdx.y];
        *e = t.x;
        *pos0 = t.y;
        *rows = t.z;
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

#endif
