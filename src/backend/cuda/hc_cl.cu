/* hc_cl.cu - hc_pre of a few rows (decode) on a thread block cluster a row (c->hc_cl,
 * DSI_CUDA_HC_CL=1; step 38, compiled only until measured: off).
 *
 * Why: k_hc_pre_one (hc.cu) spreads a row's mix over S blocks, and the block that completes the
 * row last (a global counter) runs all of its finish alone: the chunk sums, the comb's Sinkhorn,
 * the collapse of the hc x dim streams and the norm: 18 us a call at batch 1 on the H100, 8 calls
 * a 4-layer step (docs/cuda.md step 37). Here the S blocks of a row form one cluster: the
 * partial results stay in each block's shared memory and are read across the cluster (DSMEM)
 * after a hardware cluster barrier, and every block finishes its own slice of the row: the
 * collapse and the norm of dim / S columns; block 0 also the post and comb (its warp 0, while
 * the other warps collapse).
 *
 * Same bits as k_hc_pre_one for y, post and comb: the chunk values by chunk_dot, each output's
 * sum in chunk order from zero (+ 0.0f), the sum of squares per piece as its warp 0 adds them
 * and the pieces' sums in order, then the same expressions for rho, pre, post, the comb
 * (hc_comb_warp) and the collapse. The norm's sum of squares is added in another order (per
 * slice, then the slices in order): as between the other kernels, equal but for the rare
 * last-bit tie.
 *
 * Grid (S, n), cluster (S, 1, 1): S = ceil(len / 1024) pieces of 32 chunks of 32 (S <= 16,
 * Hopper's largest cluster, non-portable above 8); lane l of each warp takes chunk 32 s + l,
 * warp w the outputs w, w + 8, ... Dynamic shared memory: the staged chunk values ([nq][outputs
 * this block sums]: all of them in block 0, the hc of pre elsewhere), then the y slice for the
 * norm. Barriers: #1 after the chunk values (their DSMEM reads follow), #2 after the collapse
 * (the slices' sums of squares; block 0's warp 0 arrives before its Sinkhorn, which nothing in
 * #2 waits for), #3 before exit (no block leaves while another reads its shared memory). */
#include "gemm.cuh"
#include "hc.cuh"
#include "norm.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define CL_MAX 16 /* blocks a cluster at most */
#define CL_LD  36 /* floats a chunk's row of a block's chunk values (outputs <= 35) */
#define CL_CW  (CU_THREADS - 32) /* the collapse's threads: warps 1.. */

__device__ __forceinline__ void cl_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cl_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/* HC: hc when > 0 (4: V4's), else any hc <= 5 */
template <int HC> __global__ void __launch_bounds__(CU_THREADS) k_hc_pre_cl(struct hc_one_p p) {
    extern __shared__ float4 cl_sm4[];
    __shared__ float cvs[32 * CL_LD];
    __shared__ float mix_s[(2 + HC_MAX) * HC_MAX], pre_s[HC_MAX];
    __shared__ double ss_s, nrm_s, red[CU_WARPS], part[CL_MAX];
    cg::cluster_group cl = cg::this_cluster();
    constexpr int HM = HC > 0 ? HC : 5; /* streams held per float4 of the collapse */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hc = HC > 0 ? HC : p.hc;
    int n_mix = (2 + hc) * hc, S = (int)gridDim.x, s = (int)blockIdx.x;
    int64_t r = blockIdx.y, dim = p.dim, len = hc * dim, nq = len / 32, q = (int64_t)s * 32 + lane;
    const float *Xr = p.X + r * len;
    bool qv = q < nq;

    /* ---- the piece's chunk values and sum of squares (k_hc_pre_one's first part) */
    float xf[32], wf[32];
    load_x_chunk(p.fn + (warp < n_mix ? warp : 0) * p.ldw + (qv ? q * 32 : 0), qv && warp < n_mix,
                 wf); /* immutable: before the wait for the previous kernel */
    if (threadIdx.x == 0 && s == 0) {
        cu_prefetch_l2(p.base.data, (size_t)n_mix * vec_esize(p.base));
        cu_prefetch_l2(p.scale.data, 3 * vec_esize(p.scale));
        if (p.z) cu_prefetch_l2(p.nw.data, (size_t)dim * vec_esize(p.nw));
    }
    cu_pdl_enter();
    load_x_chunk(Xr + (qv ? q * 32 : 0), qv, xf);
    for (int o = warp; o < n_mix; o += CU_WARPS) {
        if (o != warp) load_x_chunk(p.fn + o * p.ldw + (qv ? q * 32 : 0), qv, wf);
        cvs[lane * CL_LD + o] = chunk_dot(xf, wf);
    }
    if (warp == 0) {
        double ss = 0.0;
#pragma unroll
        for (int e = 0; e < 32; e++)
            ss += (double)xf[e] * (double)xf[e];
        ss = warp_sum_d(ss);
        if (lane == 0) ss_s = ss;
    }
    cl.sync(); /* #1 */

    /* ---- the sums this block needs, in chunk order (all outputs in block 0; pre's elsewhere),
       from the cluster's chunk values staged here */
    int ncol = s == 0 ? n_mix : hc;
    float *st = (float *)cl_sm4;
#pragma unroll 4
    for (int qq = warp; qq < (int)nq; qq += CU_WARPS) { /* chunk qq: lane o its output o */
        const float *rem = cl.map_shared_rank(cvs, (unsigned)(qq >> 5)) + (qq & 31) * CL_LD;
        for (int o = lane; o < ncol; o += 32)
            st[qq * ncol + o] = rem[o];
    }
    if (threadIdx.x < S) part[threadIdx.x] = *cl.map_shared_rank(&ss_s, threadIdx.x);
    __syncthreads();
    if (warp == 0)
        for (int o0 = 0; o0 < ncol; o0 += 32) {
            int o = o0 + lane;
            float acc = 0.0f;
            if (o < ncol) {
#pragma unroll 16
                for (int64_t qq = 0; qq < nq; qq++)
                    acc += st[qq * ncol + o];
                mix_s[o] = acc + 0.0f;
            }
        }
    __syncthreads();
    double ss = 0.0;
    for (int b = 0; b < S; b++)
        ss += part[b];
    float rho = 1.0f / sqrtf((float)(ss / (double)len) + p.norm_eps);
    if (threadIdx.x < hc) {
        int k = threadIdx.x;
        float m0 = mix_s[k] * rho;
        pre_s[k] = sigmoid_ref(m0 * vec_get(p.scale, 0) + vec_get(p.base, k)) + p.hc_eps;
        if (s == 0) {
            float m1 = mix_s[hc + k] * rho;
            p.post[r * hc + k] =
                2.0f * sigmoid_ref(m1 * vec_get(p.scale, 1) + vec_get(p.base, hc + k));
        }
    }
    __syncthreads(); /* pre_s; st is free from here */

    /* ---- the slice's collapse and norm (warps 1..), block 0's comb (its warp 0, meanwhile) */
    int64_t d4 = dim / 4, e_lo = (int64_t)s * d4 / S, e_hi = (int64_t)(s + 1) * d4 / S;
    bool norm = p.z != nullptr;
    float4 *ys = cl_sm4; /* the slice's y, then z */
    if (warp == 0) {
        cl_arrive(); /* #2: nothing of warp 0 is read there */
        if (s == 0)
            hc_comb_warp(mix_s, rho, hc, p.base, p.scale, p.iters, p.hc_eps, p.comb + r * hc * hc);
        cl_wait();
        if (norm) { /* #3 */
            cl_arrive();
            cl_wait();
        }
        return;
    }
    const float4 *X4 = (const float4 *)Xr;
    float4 *y4 = (float4 *)(p.y + r * dim);
    int ct = threadIdx.x - 32;
    double zs = 0.0;
    for (int64_t e = e_lo + ct; e < e_hi; e += CL_CW) {
        float4 xv[HM];
#pragma unroll
        for (int k = 0; k < HM; k++)
            xv[k] = k < hc ? X4[k * d4 + e] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma unroll
        for (int k = 0; k < HM; k++)
            if (k < hc) {
                a0 += pre_s[k] * xv[k].x;
                a1 += pre_s[k] * xv[k].y;
                a2 += pre_s[k] * xv[k].z;
                a3 += pre_s[k] * xv[k].w;
            }
        float4 yv =
            make_float4(rbf(a0, p.round), rbf(a1, p.round), rbf(a2, p.round), rbf(a3, p.round));
        y4[e] = yv;
        if (norm) {
            ys[e - e_lo] = yv;
            rms_in4(yv, p.round, zs);
        }
    }
    if (norm) {
        zs = warp_sum_d(zs);
        if (lane == 0) red[warp] = zs;
        asm volatile("bar.sync 1, %0;" ::"n"(CL_CW) : "memory");
        if (ct == 0) {
            double t = 0.0;
            for (int w = 1; w < CU_WARPS; w++)
                t += red[w];
            nrm_s = t;
        }
    }
    cl_arrive(); /* #2 */
    cl_wait();
    if (!norm) return; /* (no shared memory is read across the cluster after #2) */

    /* the norm of the slice, then its act_quant copy (warps 1..; named barrier 1) */
    if (ct < S) part[ct] = *cl.map_shared_rank(&nrm_s, (unsigned)ct);
    asm volatile("bar.sync 1, %0;" ::"n"(CL_CW) : "memory");
    double tot = 0.0;
    for (int b = 0; b < S; b++)
        tot += part[b];
    float inv = rms_inv(tot, dim, p.z_eps, p.round, p.nw.data != nullptr);
    float4 *z4 = (float4 *)(p.z + r * dim);
    for (int64_t e = e_lo + ct; e < e_hi; e += CL_CW) {
        float4 o = rms_out4(ys[e - e_lo], inv, p.nw, e * 4, p.round);
        z4[e] = o;
        ys[e - e_lo] = o;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(CL_CW) : "memory");
    if (p.zq) {
        float4 *q4 = (float4 *)(p.zq + r * dim);
        for (int64_t b = e_lo / 32 + (warp - 1); b < e_hi / 32; b += CU_WARPS - 1)
            q8_warp_block(ys[b * 32 - e_lo + lane], q4 + b * 32 + lane);
    }
    cl_arrive(); /* #3 */
    cl_wait();
}

template <int HC>
static bool hc_cl_go(struct cu_ctx *c, const struct hc_one_p *p, int S, size_t sm) {
    static bool attr_done = false, attr_ok = false;
    if (!attr_done) {
        attr_done = true;
        attr_ok =
            cudaFuncSetAttribute(k_hc_pre_cl<HC>, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                 1) == cudaSuccess &&
            cudaFuncSetAttribute(k_hc_pre_cl<HC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)std::min<size_t>(c->smem_optin, 160 * 1024)) == cudaSuccess;
        if (!attr_ok) cudaGetLastError();
    }
    if (!attr_ok || sm > std::min<size_t>(c->smem_optin, 160 * 1024)) return false;
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)S;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)S, (unsigned)p->n);
    cfg.blockDim = dim3(CU_THREADS);
    cfg.dynamicSmemBytes = sm;
    cfg.stream = c->stream;
    cfg.attrs = at;
    cfg.numAttrs = c->pdl ? 2 : 1;
    int ncl = 0; /* a cluster of S blocks must fit the device at all */
    if (cudaOccupancyMaxActiveClusters(&ncl, k_hc_pre_cl<HC>, &cfg) != cudaSuccess || ncl < 1) {
        cudaGetLastError();
        return false;
    }
    cudaLaunchKernelEx(&cfg, k_hc_pre_cl<HC>, *p);
    return true;
}

bool hc_pre_cl(struct cu_ctx *c,
               const struct dsi_hc_pre_args *a,
               const struct cu_w *fn,
               bool norm) {
    int hc = (int)a->hc;
    int64_t dim = a->dim, len = hc * dim, nq = len / 32, S = cu_div_up(nq, 32),
            n_mix = (2 + hc) * hc;
    int64_t d4 = dim / 4;
    if (!c->hc_cl || S > CL_MAX || hc * hc > 32 || n_mix >= CL_LD || len % 32 || dim % 4 ||
        (norm && d4 % (32 * S)) || a->n > 65535)
        return false;
    size_t sm = (size_t)(nq * n_mix) * 4;
    if (norm) sm = std::max(sm, (size_t)(d4 / S) * 16);
    struct hc_one_p p = hc_one_params(a, fn, norm);
    int pf = cu_prof_begin(c, "hc_pre.cl");
    bool ok = hc == 4 ? hc_cl_go<4>(c, &p, (int)S, sm) : hc_cl_go<0>(c, &p, (int)S, sm);
    cu_prof_end(c, pf);
    if (ok) cu_check(c, "hc_pre (cluster)");
    return ok;
}
