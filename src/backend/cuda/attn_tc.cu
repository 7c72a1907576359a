/* attn_tc.cu - the attention's two products on tensor cores for `fast` numerics
 * (dsi_attn_args.fast): scores S = Q K^T * scale and the output O = P K, mma.sync m16n8k16 with
 * bf16 operands and fp32 accumulation; the softmax between them stays attn.cu's.
 *
 * Numerics: q, the keys and (with round_probs) the probabilities are bf16 values in `fast`
 * numerics (the forward rounds them as in `reference`), so the bf16 operands are exact and only
 * the order of the fp32 sums differs from the CPU reference.
 *
 * Scores: a block takes one row and 64 heads (the key set is shared by the heads: MQA), keeps
 * the row's q in shared memory as bf16 and walks the row's keys 64 at a time, head_dim in
 * chunks of 64, loading the next chunk of keys into registers while the warps (4 along the
 * heads x 2 along the keys) multiply the current one. P.V: a block takes one row, 64 heads and
 * 128 output dims and walks the keys 32 at a time, the probabilities and key rows of the next
 * chunk in registers likewise; the key tile is stored [key][dim] and read with ldmatrix.trans. */
#include "attn.cuh"
#include "gemm.cuh"
#include "tc.cuh"

#define AT_T   256
#define AT_HB  64 /* heads per block */
#define AT_KT  64 /* keys per score tile */
#define AT_DC  64 /* head dims per score step */
#define AT_LDK (AT_DC + 8)
#define PV_KC  32  /* keys per pv step */
#define PV_DB  128 /* output dims per pv block */
#define PV_LDP (PV_KC + 8)
#define PV_LDV (PV_DB + 8)

static size_t scores_smem(int hd) {
    return (size_t)AT_HB * (hd + 8) * 2 + (size_t)2 * AT_KT * AT_LDK * 2;
}
static size_t pv_smem(void) { return (size_t)2 * (AT_HB * PV_LDP + PV_KC * PV_LDV) * 2; }

bool attn_tc_ok(const struct attn_p *p) {
    return p->hd % PV_DB == 0 && p->hd <= 512 && (uintptr_t)p->q % 16 == 0 &&
           (uintptr_t)p->ring % 16 == 0 && (uintptr_t)p->entries % 16 == 0 &&
           (uintptr_t)p->ring8 % 8 == 0 && (uintptr_t)p->ent8 % 8 == 0 && p->rb % 8 == 0;
}

/* grid (rows, heads / 64). */
__global__ void __launch_bounds__(AT_T, 2) k_attn_scores_tc(struct attn_p p) {
    cu_pdl_enter();
    extern __shared__ uint4 at_smem[];
    int hd = p.hd, ldq = hd + 8;
    uint16_t *Qs = (uint16_t *)at_smem; /* [64][hd + 8] */
    uint16_t *Ks = Qs + AT_HB * ldq;    /* [2][64][AT_LDK] */
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wm = warp & 3, wn = warp >> 2;
    int r = p.r0 + blockIdx.x, h0 = blockIdx.y * AT_HB;
    int64_t w0;
    int nk = attn_nkeys(p, r, &w0);
    /* q rows -> bf16 (zeros past the last head) */
    int v4 = hd / 4;
    for (int e = tid; e < AT_HB * v4; e += AT_T) {
        int h = e / v4, c = e % v4;
        float4 f = h0 + h < p.H ? ((const float4 *)(p.q + ((int64_t)r * p.H + h0 + h) * hd))[c]
                                : make_float4(0, 0, 0, 0);
        *(uint2 *)(Qs + h * ldq + 4 * c) = make_uint2(bf16x2_rn(f.x, f.y), bf16x2_rn(f.z, f.w));
    }
    int nch = hd / AT_DC, ntile = (nk + AT_KT - 1) / AT_KT, steps = ntile * nch;
    float4 kr[4];
    auto load = [&](int s) {
        int tile = s / nch, ch = s % nch;
#pragma unroll
        for (int v = 0; v < 4; v++) {
            int idx = tid + v * AT_T, j = idx >> 4, q4 = idx & 15, jj = tile * AT_KT + j;
            kr[v] = jj < nk ? attn_k4(p, attn_kh(p, r, w0, jj), ch * AT_DC / 4 + q4)
                            : make_float4(0, 0, 0, 0);
        }
    };
    float acc[4][4];
    if (steps > 0) load(0);
    for (int s = 0; s < steps; s++) {
        int tile = s / nch, ch = s % nch, buf = s & 1;
        uint16_t *K = Ks + buf * AT_KT * AT_LDK;
#pragma unroll
        for (int v = 0; v < 4; v++) {
            int idx = tid + v * AT_T, j = idx >> 4, q4 = idx & 15;
            *(uint2 *)(K + j * AT_LDK + q4 * 4) =
                make_uint2(bf16x2_rn(kr[v].x, kr[v].y), bf16x2_rn(kr[v].z, kr[v].w));
        }
        __syncthreads();
        if (s + 1 < steps) load(s + 1);
        if (ch == 0) acc_zero(acc);
#pragma unroll
        for (int kk = 0; kk < AT_DC / 16; kk++) {
            uint32_t a[4];
            ldsm_x4(smem_u32(Qs + (wm * 16 + (lane & 15)) * ldq + ch * AT_DC + kk * 16 +
                             (lane >> 4) * 8),
                    a);
#pragma unroll
            for (int j = 0; j < 4; j += 2) {
                uint32_t b[4];
                ldsm_x4(smem_u32(K + (wn * 32 + j * 8 + (lane & 7) + ((lane >> 4) << 3)) * AT_LDK +
                                 kk * 16 + ((lane >> 3) & 1) * 8),
                        b);
                mma_bf16(acc[j], a, b[0], b[1]);
                mma_bf16(acc[j + 1], a, b[2], b[3]);
            }
        }
        if (ch == nch - 1) {
            int g = lane >> 2, t4 = lane & 3;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int h = h0 + wm * 16 + g + (i >> 1) * 8;
                    int jj = tile * AT_KT + wn * 32 + j * 8 + 2 * t4 + (i & 1);
                    if (h < p.H && jj < nk)
                        p.S[((int64_t)(r - p.r0) * p.H + h) * p.maxk + jj] = acc[j][i] * p.scale;
                }
        }
    }
}

/* grid (rows, heads / 64, head_dim / 128). */
__global__ void __launch_bounds__(AT_T, 2) k_attn_pv_tc(struct attn_p p) {
    cu_pdl_enter();
    extern __shared__ uint4 at_smem[];
    uint16_t *Ps = (uint16_t *)at_smem;     /* [2][64][PV_LDP] */
    uint16_t *Vs = Ps + 2 * AT_HB * PV_LDP; /* [2][PV_KC][PV_LDV] */
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wm = warp & 3, wn = warp >> 2;
    int r = p.r0 + blockIdx.x, h0 = blockIdx.y * AT_HB, d0 = blockIdx.z * PV_DB;
    int64_t w0;
    int nk = attn_nkeys(p, r, &w0);
    int steps = (nk + PV_KC - 1) / PV_KC;
    float pr[8];
    float4 vr[4];
    auto load = [&](int s) {
        int j0 = s * PV_KC;
#pragma unroll
        for (int v = 0; v < 8; v++) { /* probabilities: 64 heads x 32 keys, scalar (maxk any) */
            int idx = tid + v * AT_T, h = idx >> 5, j = idx & 31;
            pr[v] = h0 + h < p.H && j0 + j < nk
                        ? p.S[((int64_t)(r - p.r0) * p.H + h0 + h) * p.maxk + j0 + j]
                        : 0.0f;
        }
#pragma unroll
        for (int v = 0; v < 4; v++) { /* keys: 32 x 128 dims */
            int idx = tid + v * AT_T, j = idx >> 5, q4 = idx & 31;
            vr[v] = j0 + j < nk ? attn_k4(p, attn_kh(p, r, w0, j0 + j), d0 / 4 + q4)
                                : make_float4(0, 0, 0, 0);
        }
    };
    float acc[8][4];
    acc_zero(acc);
    if (steps > 0) load(0);
    for (int s = 0; s < steps; s++) {
        int buf = s & 1;
        uint16_t *P = Ps + buf * AT_HB * PV_LDP, *V = Vs + buf * PV_KC * PV_LDV;
#pragma unroll
        for (int v = 0; v < 8; v++) {
            int idx = tid + v * AT_T, h = idx >> 5, j = idx & 31;
            P[h * PV_LDP + j] = __bfloat16_as_ushort(__float2bfloat16_rn(pr[v]));
        }
#pragma unroll
        for (int v = 0; v < 4; v++) {
            int idx = tid + v * AT_T, j = idx >> 5, q4 = idx & 31;
            *(uint2 *)(V + j * PV_LDV + q4 * 4) =
                make_uint2(bf16x2_rn(vr[v].x, vr[v].y), bf16x2_rn(vr[v].z, vr[v].w));
        }
        __syncthreads();
        if (s + 1 < steps) load(s + 1);
#pragma unroll
        for (int kk = 0; kk < PV_KC / 16; kk++) {
            uint32_t a[4];
            ldsm_x4(smem_u32(P + (wm * 16 + (lane & 15)) * PV_LDP + kk * 16 + (lane >> 4) * 8), a);
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                uint32_t b[4];
                ldsm_x4_t(smem_u32(V + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * PV_LDV +
                                   wn * 64 + j * 8 + (lane >> 4) * 8),
                          b);
                mma_bf16(acc[j], a, b[0], b[1]);
                mma_bf16(acc[j + 1], a, b[2], b[3]);
            }
        }
    }
    int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int h = h0 + wm * 16 + g + (i >> 1) * 8, d = d0 + wn * 64 + j * 8 + 2 * t4 + (i & 1);
            if (h < p.H)
                p.out[((int64_t)r * p.H + h) * p.hd + d] = rbf(acc[j][i] + 0.0f, p.round_bf16);
        }
}

bool launch_attn_scores_tc(struct cu_ctx *c, const struct attn_p *p, int rows) {
    static bool done = false; /* the attribute for the largest head_dim taken */
    size_t sm = scores_smem(p->hd);
    if (!smem_limit(c, k_attn_scores_tc, scores_smem(512), &done, "attn scores (tensor cores)"))
        return false;
    dim3 g((unsigned)rows, (unsigned)cu_div_up(p->H, AT_HB));
    cu_launch(c, k_attn_scores_tc, g, AT_T, sm, *p);
    return cu_check(c, "attn scores (tensor cores)");
}

bool launch_attn_pv_tc(struct cu_ctx *c, const struct attn_p *p, int rows) {
    dim3 g((unsigned)rows, (unsigned)cu_div_up(p->H, AT_HB), (unsigned)(p->hd / PV_DB));
    cu_launch(c, k_attn_pv_tc, g, AT_T, pv_smem(), *p);
    return cu_check(c, "attn p.v (tensor cores)");
}
