/* attn.cu - attention with sinks over the window ring and the compressed entries (all of them,
 * or the indexer's selection), as cpu/attn.c, in three kernels:
 *   scores    s_j = dot(q_h, k_j) * scale for every (row, head, key), cpu_dot order;
 *   softmax   per (row, head): max (with the sink), e_j = exp(s_j - max), z summed in key order
 *             (+ the sink's term), p_j = e_j / z (bf16-rounded in reference numerics);
 *   pv        o[h][d] = sum_j p_j k_j[d] in key order.
 * Scores live in scratch [rows, heads, max_keys]; rows are processed in batches that keep it
 * under 256 MiB. K = V = the stored 512-vector; the key set is shared by all heads (MQA), so
 * the score kernel loads each key tile once for 16 heads.
 * Later: FlashMLA-style fused kernel with FP8 keys for the fast (non-batch-invariant) path. */
#include "attn.cuh"
#include "gemm.cuh"

#define ATT_HG 16 /* heads per score block */
#define ATT_TK 32 /* keys per score tile */
#define PV_HG  8  /* heads per pv block */
#define PV_DS  32 /* dims per pv block */
#define PV_TK  64 /* keys per pv tile */

/* n float4 of rows of v4 float4 (row j at src(j)) into dst (rows of stride dstride floats), by
 * a block of 256 threads, as cp.async copies (global -> shared without registers): every copy
 * of the block in flight at once, one memory latency for the lot (step 18; before, ATT_LU
 * loads per thread then their stores, a latency per round: most of these kernels' time at
 * decode). The caller waits (cp_wait_all) and syncs before reading dst. */
__device__ __forceinline__ void cp_async16(float *dst, const float *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src)
                 : "memory");
}
__device__ __forceinline__ void cp_async4(float *dst, const float *src) {
    asm volatile(
        "cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
        "l"(src)
        : "memory");
}
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
template <typename F>
__device__ __forceinline__ void stage_rows(float *dst, int dstride, int n, int v4, F src) {
    for (int e = (int)threadIdx.x; e < n; e += 256) {
        int j = e / v4, c = e - j * v4;
        cp_async16(dst + j * dstride + 4 * c, src(j) + 4 * c);
    }
}

/* Keys kh[0 .. n / v4) (attn_kh), dims d0 .. d0 + 4 v4 of each, into dst's rows: F32 rows as
 * cp.async copies (the caller waits), FP8 rows decoded through registers. */
__device__ __forceinline__ void stage_keys(
    const struct attn_p &p, float *dst, int dstride, int n, int v4, int d0, const int64_t *kh) {
    if (!p.fp8) {
        stage_rows(dst, dstride, n, v4, [&](int j) { return attn_kptr(p, kh[j]) + d0; });
        return;
    }
    for (int e = (int)threadIdx.x; e < n; e += 256) {
        int j = e / v4, c = e - j * v4;
        *(float4 *)(dst + j * dstride + 4 * c) = attn_k4(p, kh[j], d0 / 4 + c);
    }
}

/* Two of cpu_dot's sums at once, q rows qa and qb against the key row k (16-byte aligned shared
 * rows, n % 32 == 0): per 32 elements 8 partial sums of every 8th product, added as a tree into
 * the running sum; each sum's operations are cpu_dot's. The key's loads serve both heads. */
__device__ __forceinline__ void
dot2_smem(const float *qa, const float *qb, const float *k, int n, float *sa, float *sb) {
    float acc_a = 0.0f, acc_b = 0.0f;
    for (int c = 0; c < n; c += 32) {
        float la[8], lb[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            la[i] = lb[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j += 8) {
            float4 k0 = *(const float4 *)(k + c + j), k1 = *(const float4 *)(k + c + j + 4);
            float4 a0 = *(const float4 *)(qa + c + j), a1 = *(const float4 *)(qa + c + j + 4);
            float4 b0 = *(const float4 *)(qb + c + j), b1 = *(const float4 *)(qb + c + j + 4);
            la[0] += a0.x * k0.x;
            la[1] += a0.y * k0.y;
            la[2] += a0.z * k0.z;
            la[3] += a0.w * k0.w;
            la[4] += a1.x * k1.x;
            la[5] += a1.y * k1.y;
            la[6] += a1.z * k1.z;
            la[7] += a1.w * k1.w;
            lb[0] += b0.x * k0.x;
            lb[1] += b0.y * k0.y;
            lb[2] += b0.z * k0.z;
            lb[3] += b0.w * k0.w;
            lb[4] += b1.x * k1.x;
            lb[5] += b1.y * k1.y;
            lb[6] += b1.z * k1.z;
            lb[7] += b1.w * k1.w;
        }
        acc_a += ((la[0] + la[1]) + (la[2] + la[3])) + ((la[4] + la[5]) + (la[6] + la[7]));
        acc_b += ((lb[0] + lb[1]) + (lb[2] + lb[3])) + ((lb[4] + lb[5]) + (lb[6] + lb[7]));
    }
    *sa = acc_a + 0.0f;
    *sb = acc_b + 0.0f;
}

/* grid (rows, heads / ATT_HG, key tiles); 256 threads: warp w takes heads 2w, 2w + 1 (their q
 * rows read by the whole warp: one broadcast per load), lane j key j (rows hd + 4 floats apart:
 * the lanes' loads fall in different banks). Before: a thread per (head, 2 keys), each product's
 * q and key loaded for it alone (~3x the shared-memory traffic); at decode both take ~20 us
 * (step 17): the time is the staging of q and the keys (96 KB per block), not these reads. */
__global__ void __launch_bounds__(256) k_attn_scores(struct attn_p p) {
    cu_pdl_enter();
    extern __shared__ float sm[];
    __shared__ int64_t kp[ATT_TK];
    int hdp = p.hd + 4;
    float *qs = sm, *ks = sm + ATT_HG * hdp;
    int r = p.r0 + blockIdx.x, h0 = blockIdx.y * ATT_HG, j0 = blockIdx.z * ATT_TK;
    int64_t w0;
    int nk = attn_nkeys(p, r, &w0);
    if (j0 >= nk) return;
    int nh = p.H - h0 < ATT_HG ? p.H - h0 : ATT_HG, nt = nk - j0 < ATT_TK ? nk - j0 : ATT_TK;
    int v4 = p.hd / 4;
    /* q's copies first: they need no lookup, and fly while the key pointers are found */
    stage_rows(qs, hdp, nh * v4, v4,
               [&](int h) { return p.q + ((int64_t)r * p.H + h0 + h) * p.hd; });
    if (threadIdx.x < nt) kp[threadIdx.x] = attn_kh(p, r, w0, j0 + threadIdx.x);
    __syncthreads();
    stage_keys(p, ks, hdp, nt * v4, v4, 0, kp);
    cp_wait_all();
    __syncthreads();
    int ha = 2 * (threadIdx.x >> 5), j = threadIdx.x & 31;
    if (ha >= nh || j >= nt) return;
    int hb = ha + 1 < nh ? ha + 1 : ha;
    float sa, sb;
    dot2_smem(qs + ha * hdp, qs + hb * hdp, ks + j * hdp, p.hd, &sa, &sb);
    float *S = p.S + ((int64_t)(r - p.r0) * p.H + h0 + ha) * p.maxk + j0 + j;
    S[0] = sa * p.scale;
    if (hb != ha) S[p.maxk] = sb * p.scale;
}

/* grid (rows, heads / 8); one warp per head. */
__global__ void __launch_bounds__(256) k_attn_softmax(struct attn_p p) {
    cu_pdl_enter();
    __shared__ float buf[8][32];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = p.r0 + blockIdx.x, h = blockIdx.y * 8 + warp;
    if (h >= p.H) return;
    int64_t w0;
    int nk = attn_nkeys(p, r, &w0);
    float *S = p.S + ((int64_t)(r - p.r0) * p.H + h) * p.maxk;
    float sink = vec_get(p.sinks, h);
    float mx = sink;
    for (int j = lane; j < nk; j += 32)
        mx = fmaxf(mx, S[j]);
    mx = warp_max(mx);
    float z = 0.0f;
    for (int j0 = 0; j0 < nk; j0 += 32) {
        int j = j0 + lane;
        float e = 0.0f;
        if (j < nk) S[j] = e = exp_ref(S[j] - mx);
        buf[warp][lane] = e;
        __syncwarp();
        if (lane == 0) { /* in key order; the shared loads issued together */
            int cnt = nk - j0 < 32 ? nk - j0 : 32;
#pragma unroll
            for (int L = 0; L < 32; L++)
                if (L < cnt) z += buf[warp][L];
        }
        __syncwarp();
    }
    if (lane == 0) z += exp_ref(sink - mx);
    z = __shfl_sync(0xffffffffu, z, 0);
    for (int j = lane; j < nk; j += 32) {
        float pr = S[j] / z;
        S[j] = p.round_probs ? bf16_round(pr) : pr;
    }
}

/* grid (rows, heads / PV_HG, hd / PV_DS); thread = (dim, head): one sum per thread, in key
 * order. A tile's keys and probabilities come in as cp.async copies, all in flight at once; the
 * next tile's key pointers are looked up (pos, selection, page table: dependent loads) before
 * the current tile's sums, so their latency overlaps them. */
__global__ void __launch_bounds__(256) k_attn_pv(struct attn_p p) {
    cu_pdl_enter();
    __shared__ __align__(16) float ks[PV_TK][PV_DS];
    __shared__ float ps[PV_HG][PV_TK];
    __shared__ int64_t kp[2][PV_TK];
    int r = p.r0 + blockIdx.x, hb = blockIdx.y * PV_HG, d0 = blockIdx.z * PV_DS;
    int64_t w0;
    int nk = attn_nkeys(p, r, &w0);
    int dl = threadIdx.x % PV_DS, hl = threadIdx.x / PV_DS;
    const float *Sr = p.S + ((int64_t)(r - p.r0) * p.H + hb) * p.maxk;
    float acc = 0.0f;
    if (threadIdx.x < PV_TK && (int)threadIdx.x < nk)
        kp[0][threadIdx.x] = attn_kh(p, r, w0, threadIdx.x);
    __syncthreads();
    for (int j0 = 0, b = 0; j0 < nk; j0 += PV_TK, b ^= 1) {
        int nt = nk - j0 < PV_TK ? nk - j0 : PV_TK;
        stage_keys(p, &ks[0][0], PV_DS, nt * (PV_DS / 4), PV_DS / 4, d0, kp[b]);
#pragma unroll
        for (int i = 0; i < PV_HG * PV_TK / 256; i++) {
            int e = i * 256 + threadIdx.x, h = e / PV_TK, j = e % PV_TK;
            if (hb + h < p.H && j < nt)
                cp_async4(&ps[h][j], Sr + (int64_t)h * p.maxk + j0 + j);
            else
                ps[h][j] = 0.0f;
        }
        int jn = j0 + PV_TK + (int)threadIdx.x; /* the next tile's pointers (other buffer) */
        if (threadIdx.x < PV_TK && jn < nk) kp[b ^ 1][threadIdx.x] = attn_kh(p, r, w0, jn);
        cp_wait_all();
        __syncthreads();
        for (int j = 0; j < nt; j++)
            acc += ps[hl][j] * ks[j][dl];
        __syncthreads();
    }
    int d = d0 + dl;
    if (hb + hl < p.H) p.out[((int64_t)r * p.H + hb + hl) * p.hd + d] = rbf(acc, p.round_bf16);
}

/* attn's q_norm is the plain per-head norm (and RoPE) of q in place, what attn_fa.cu's staging
 * can apply (fa_stage_q_norm) */
static bool attn_qn_fusable(const struct dsi_rms_norm_args *qn, const struct dsi_attn_args *a) {
    int64_t hd = a->head_dim, ld = a->n_heads * hd;
    return qn->x == a->q && qn->y == a->q && qn->n == a->st->n && qn->n_groups == a->n_heads &&
           qn->dim == hd && qn->ldx == ld && qn->ldy == ld && !qn->w && !qn->yq && qn->q_dim <= 0 &&
           qn->rope_dim >= 0 && qn->rope_dim % 4 == 0 && qn->rope_dim <= hd &&
           qn->rope_dim <= 128 && (qn->rope_dim == 0 || (qn->pos && qn->freq));
}

/* attn's out_rope is the RoPE of each head's last dims of out in place, what attn_fa.cu's writes
 * of out can apply (rope_dim % 4 == 0: the merge's float4 wholly in or out of the rope dims) */
static bool attn_or_fusable(const struct dsi_rope_args *ro, const struct dsi_attn_args *a) {
    int64_t hd = a->head_dim;
    return ro->x == a->out && ro->n == a->st->n && ro->n_heads == a->n_heads &&
           ro->head_stride == hd && ro->width == hd && ro->ldx == a->n_heads * hd &&
           ro->rope_dim > 0 && ro->rope_dim % 4 == 0 && ro->rope_dim <= hd && ro->rope_dim <= 128 &&
           ro->pos && ro->freq;
}

static void attn_body(struct dsi_backend *be, const struct dsi_attn_args *a, bool *rope_done);

/* The attention, then out_rope unless the fused kernel applied it */
extern "C" void cuda_attn(struct dsi_backend *be, const struct dsi_attn_args *a) {
    bool rope_done = false;
    attn_body(be, a, &rope_done);
    if (a->out_rope && !rope_done && !cu_ctx_of(be)->sticky) cuda_rope(be, a->out_rope);
}

static void attn_body(struct dsi_backend *be, const struct dsi_attn_args *a, bool *rope_done) {
    struct cu_ctx *c = cu_ctx_of(be);
    const struct dsi_step *st = a->st;
    int n = st->n, H = (int)a->n_heads, hd = (int)a->head_dim;
    if (n <= 0 || H <= 0) return;
    if (hd % 32 || hd > 2048) {
        cu_fail(c, DSI_ERR_UNSUPPORTED, "attn: head_dim %d (want a multiple of 32, <= 2048)", hd);
        return;
    }
    if (a->entries.data && a->entries.dtype != a->ring.dtype) {
        cu_fail(c, DSI_ERR_INVALID, "attn: ring and entries in different formats");
        return;
    }
    if (a->entries.data && a->ratio <= 0) {
        cu_fail(c, DSI_ERR_INVALID, "attn: entries with ratio %d", a->ratio);
        return;
    }
    int64_t maxk = st->window;
    if (a->entries.data)
        maxk += a->sel ? a->topk : (int64_t)st->max_pages * st->page_tokens / a->ratio;
    if (maxk < 1) maxk = 1;
    size_t smem = (size_t)(ATT_HG + ATT_TK) * (hd + 4) * 4;
    static size_t smem_set = 0; /* per process: one device kind */
    if (smem > 48 * 1024 && smem > smem_set) {
        if (smem > c->smem_optin) {
            cu_fail(c, DSI_ERR_UNSUPPORTED, "attn: head_dim %d needs %zu bytes of shared memory",
                    hd, smem);
            return;
        }
        cudaFuncSetAttribute(k_attn_scores, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        smem_set = smem;
    }
    struct attn_p p;
    p.st = cu_step_of(st);
    p.q = a->q;
    p.out = a->out;
    p.o16 = NULL;
    p.q16 = NULL;
    c->o16.valid = c->o16.no_out = false; /* (what an earlier attention kept is for the op after it
                                             only) */
    p.o_skip = false;
    p.o16v = c->attn_o16v;
    p.H = H;
    p.hd = hd;
    p.fp8 = a->ring.dtype == DSI_KV_FP8;
    p.ring = p.fp8 ? NULL : (const float *)a->ring.data;
    p.entries = p.fp8 ? NULL : (const float *)a->entries.data;
    p.ring8 = p.fp8 ? (const uint8_t *)a->ring.data : NULL;
    p.ent8 = p.fp8 ? (const uint8_t *)a->entries.data : NULL;
    p.ring_sc = a->ring.sc;
    p.ent_sc = a->entries.sc;
    p.nope = a->ring.dim - a->ring.rope;
    p.rb = (int)dsi_kv_row_bytes(a->ring.dtype, a->ring.dim, a->ring.rope);
    p.sb = (int)dsi_kv_sc_bytes(a->ring.dtype, a->ring.dim, a->ring.rope);
    p.ratio = a->ratio;
    p.sel = a->sel;
    p.n_sel = a->n_sel;
    p.topk = a->topk;
    p.sinks = cu_vec_of(a->sinks);
    p.scale = a->scale;
    p.round_probs = a->round_probs;
    p.round_bf16 = a->round_bf16;
    p.S = NULL;
    p.maxk = maxk;
    p.r0 = 0;
    p.fexp = c->attn_fa_exp;
    p.qn_lean = c->attn_qn_lean;
    p.fa_o = p.fa_ml = NULL; /* (set by launch_attn_fa where it splits) */
    p.fa_tps = 0;
    p.qn_on = p.qn_round = false;
    p.qn_eps = 0.0f;
    p.qn_rope = 0;
    p.qn_pos = NULL;
    p.qn_freq = NULL;
    p.or_on = p.or_inv = p.or_round = false;
    p.or_rope = 0;
    p.or_pos = NULL;
    p.or_freq = NULL;
    /* `fast` numerics: one fused kernel from c->attn_fa_min rows (attn_fa.cu) */
    bool fa = a->fast && c->attn_fa_min > 0 && n >= c->attn_fa_min && attn_fa_ok(c, &p);
    attn_fa_cfg fc = attn_fa_cfg_of(c, n);
    /* q's rows as the gemm before left them (dsi_attn_args.q_from_gemm, c->q16): staged from
       there by the fused kernel with the q norm (which reads q once, as it stages it); for any
       other path, or rows that are not this op's, widened into their y first */
    p.q16 = NULL;
    if (c->q16.valid) {
        int64_t cols = (int64_t)H * hd;
        bool mine = a->q_from_gemm && c->q16.src == a->q && c->q16.n == n && c->q16.cols == cols &&
                    c->q16.ld == cols;
        bool staged = fa && fc.qn && a->q_norm && attn_qn_fusable(a->q_norm, a);
        if (mine && staged)
            p.q16 = c->q16.buf;
        else
            launch_lt_widen(c, c->q16.buf, c->q16.src, c->q16.n, c->q16.cols, c->q16.ld);
        c->q16.valid = false;
    }
    /* the q norm: in the fused kernel's staging of q (fc.qn), else its own op first */
    if (a->q_norm) {
        const struct dsi_rms_norm_args *qn = a->q_norm;
        if (fa && fc.qn && attn_qn_fusable(qn, a)) {
            p.qn_freq = qn->rope_dim > 0 ? cu_freq_dev(c, qn->freq, qn->rope_dim / 2) : NULL;
            if (qn->rope_dim > 0 && !p.qn_freq) return;
            p.qn_on = true;
            p.qn_round = qn->round_bf16;
            p.qn_eps = qn->eps;
            p.qn_rope = qn->rope_dim;
            p.qn_pos = qn->pos;
        } else {
            cuda_rms_norm(be, qn);
            if (c->sticky) return;
        }
    }
    if (fa) {
        const struct dsi_rope_args *ro = a->out_rope;
        if (ro && fc.orope && attn_or_fusable(ro, a)) {
            p.or_freq = cu_freq_dev(c, ro->freq, ro->rope_dim / 2);
            if (!p.or_freq) return;
            p.or_on = true;
            p.or_inv = ro->inverse;
            p.or_round = ro->round_bf16;
            p.or_rope = ro->rope_dim;
            p.or_pos = ro->pos;
        }
        /* out's rows in bf16 for the gemm after (dsi_attn_args.out_to_gemm): where its grouped
           projection runs on wgr.cu and reads a permuted copy (launch_tc_gemm's wg; the rows
           as launch_wg_bf16 would copy them after the RoPE, so with it fused or without one) */
        int64_t cols = (int64_t)H * hd;
        if (a->out_to_gemm && c->attn_o16 && c->wg && c->wg_rs && n >= c->wg_grouped_min &&
            n >= 128 && cols % 128 == 0 && (!ro || p.or_on)) {
            p.o16 = (uint16_t *)cu_scratch(c, CU_SCR_GEMM, (size_t)(n * cols) * 2);
            if (!p.o16 && c->sticky) return;
            /* out itself left unwritten where the gemm will read only these rows (the same
               rows, the groups' columns exactly out's) */
            const struct dsi_gemm_args *g = a->out_gemm;
            p.o_skip = p.o16 && c->attn_oskip && g && g->x == a->out && g->n == n &&
                       g->ldx == cols && (int64_t)(g->groups - 1) * g->gx + g->w->ne[0] == cols &&
                       cu_gemm_takes_kept(c, g);
        }
        bool kept = false;
        bool ok = launch_attn_fa(c, &p, n, &kept);
        *rope_done = ok && p.or_on;
        if (ok && kept) {
            c->o16.valid = true;
            c->o16.src = a->out;
            c->o16.buf = p.o16;
            c->o16.n = n;
            c->o16.cols = cols;
            c->o16.no_out = p.o_skip;
        }
        return;
    }
    int64_t per_row = (int64_t)H * maxk * 4, cap = (int64_t)256 << 20;
    int nb = (int)(per_row * n <= cap ? n : cap / per_row > 0 ? cap / per_row : 1);
    float *S = (float *)cu_scratch(c, CU_SCR_OP, (size_t)(per_row * nb));
    if (!S) return;
    p.S = S;
    /* `fast` numerics: the two products on tensor cores (attn_tc.cu) for many rows */
    bool tc = a->fast && n >= c->tc_attn_min && attn_tc_ok(&p);
    for (int r0 = 0; r0 < n; r0 += nb) {
        int rows = n - r0 < nb ? n - r0 : nb;
        p.r0 = r0;
        if (tc) {
            if (!launch_attn_scores_tc(c, &p, rows)) return;
        } else {
            dim3 g1(rows, (unsigned)cu_div_up(H, ATT_HG), (unsigned)cu_div_up(maxk, ATT_TK));
            cu_launch(c, k_attn_scores, g1, 256, smem, p);
        }
        dim3 g2(rows, (unsigned)cu_div_up(H, 8));
        cu_launch(c, k_attn_softmax, g2, 256, 0, p);
        if (tc) {
            if (!launch_attn_pv_tc(c, &p, rows)) return;
        } else {
            dim3 g3(rows, (unsigned)cu_div_up(H, PV_HG), (unsigned)cu_div_up(hd, PV_DS));
            cu_launch(c, k_attn_pv, g3, 256, 0, p);
        }
        if (!cu_check(c, "attn")) return;
    }
}
