/* common.cuh - internals shared by the CUDA backend's files: the context (stream, sticky error,
 * weight slabs, scratch, caches), launch helpers, and the device helpers that reproduce the CPU
 * reference arithmetic bit for bit.
 *
 * Numerics. The backend is compiled with --fmad=false, so a*b+c is a rounded product and a
 * rounded sum as on the CPU (-ffp-contract=off); divisions and square roots are IEEE (no
 * fast-math). Dot products follow cpu_dot's order exactly (dot_ref, and the GEMM's chunk values
 * summed in chunk order, see gemm.cu), so every op whose CPU version has no transcendental
 * function is bitwise equal to it. exp/log1p/sin/cos are computed in double and rounded to
 * float: that is the correctly rounded result, which glibc's expf/sinf/cosf also return for
 * almost all arguments (they may differ in the last bit in rare cases; log1pf more often). */
#ifndef DSI_CUDA_COMMON_CUH
#define DSI_CUDA_COMMON_CUH

#ifdef __cplusplus
extern "C" {
#endif
#include "backend/backend.h"
#ifdef __cplusplus
}
#endif

#include <cuda_runtime.h>
#include <stdint.h>

#define CU_WARPS          8 /* warps per block in most kernels */
#define CU_THREADS        (CU_WARPS * 32)
#define CU_MAX_FREQ       16  /* rope frequency tables cached */
#define CU_MAX_MOE_TABLES 256 /* expert tables cached (one per MoE layer) */

/* A device copy of a host rope-frequency table (forward passes host arrays, see cuda.cu). */
struct cu_freq {
    const float *host;
    int n;
    bool is_device;
    float vals[64];
    float *dev;
};

/* Per expert: w1, w1 scale, w3, w3 scale, w2, w2 scale (device addresses). */
struct cu_moe_ent {
    const uint8_t *p[6];
};

/* The device-side expert table of one MoE layer, keyed by the host pointer array. */
struct cu_moe_table {
    const void *key; /* a->w1 */
    int n_experts;
    const void **snap;      /* [n_experts * 6] host snapshot of the device addresses */
    struct cu_moe_ent *dev; /* [n_experts], then two ints: the sb_max's device copies */
    /* the largest UE8M0 scale byte of the routed experts' weights (w1, w3, w2) and of the
       shared expert's (sb_max_sh, for its scales at ssnap), found once the table is built
       (k_moe_sb_max, outside a graph capture); -1: not known */
    int sb_max, sb_max_sh;
    const void *ssnap[3];
};

/* Per-op GPU time (DSI_CUDA_PROFILE=1 at backend creation): event pairs around every op,
 * harvested at sync, printed at free. */
struct cu_prof_pair {
    const char *name;
    cudaEvent_t a, b;
};

struct cu_prof_tot {
    const char *name;
    double ms;
    long calls;
};

#define CU_HC_ONE_MAX 64 /* rows of k_hc_pre_one at most (hc.cu) */

/* A copy of x that a gemm call made (c->xc): its kind (XC_LT: lt.cu's FP8 rows and scales in
 * CU_SCR_LT; XC_BF16 / XC_BF16P: wg_dense_copy's plain / permuted bf16 rows in CU_SCR_GEMM), x (n
 * rows of K, ldx) and where it lies */
enum { XC_LT = 1, XC_BF16 = 2, XC_BF16P = 3 };
struct cu_xc_key {
    int kind;
    const float *x;
    int64_t n, K, ldx;
    const void *buf;
};

struct cu_ctx {
    int device, n_sms;
    bool prof;
    bool xstage; /* GEMM kernels stage activations in shared memory (see gemm.cuh);
                    DSI_CUDA_NOSTAGE=1 turns it off (A/B measurements) */
    bool gemv;   /* decode GEMMs through k_gemv (gemv.cu); DSI_CUDA_NOGEMV=1: k_gemm */
    /* programmatic dependent launch (cu_launch) now; pdl_mode (DSI_CUDA_PDL): 0 never, 1 (the
       default) in recorded decode steps (graph_begin .. graph_end) of at most pdl_max rows
       (DSI_CUDA_PDL_MAX, default 32; measured slower at 128-256 rows, docs/cuda.md step 11),
       2 always (the op tests) */
    bool pdl;
    int pdl_mode, pdl_max;
    /* a probe (DSI_CUDA_PAD, step 41): after every cu_launch, this many empty dependent kernels
       (k_pad: 1 block, only cu_pdl_enter), so a step's time against the same step without them
       gives what a kernel boundary costs in a recorded step; 0 (the default): none */
    int pad;
    /* hc_pre's post_first inside k_hc_pre_one (DSI_CUDA_HC_PF=0: off, k_hc_post's launch
       first; step 41) */
    bool hc_pf;
    bool hc_tree;  /* k_hc_pre_one's pieces summed by shuffles in `fast` numerics
                      (DSI_CUDA_HC_TREE=0: off; step 41) */
    bool hc_early; /* k_hc_pre_one's finish issues its loads early (DSI_CUDA_HC_EARLY=1; step 42) */
    bool grouped;  /* grouped GEMMs in one launch (cuda_gemm); DSI_CUDA_GROUPED=0: one by one */
    /* `fast` numerics: tensor-core GEMMs (tc.cu) from this many activation rows (dense) and
       this many rows per expert on average (MoE, from gvf_min tokens); DSI_CUDA_TC_DENSE /
       DSI_CUDA_TC_MOE (defaults 64 and 0) */
    int tc_dense_min;
    bool tc_split; /* tc.cu: dense grids under 2 blocks per SM split along K (DSI_CUDA_TC_SPLIT=0:
                      off; step 23) */
    bool tc_split_grouped; /* ... grouped ones too, their outputs side by side
                              (DSI_CUDA_TC_SPLIT_GROUPED=0: off; step 25) */
    double tc_moe_min;
    int gvf_min, gvf_max; /* `fast` decode GEMMs (gvf.cu) for this many rows (DSI_CUDA_GVF_MIN,
                             DSI_CUDA_GVF; 0: off) */
    int gvf_moe_min;      /* the routed experts on gvf.cu / tc.cu from this many tokens
                             (DSI_CUDA_GVF_MOE_MIN; fewer: moe_gv.cu) */
    int gvf_ks_min;       /* gvf.cu: at least this many warps along K per tile (DSI_CUDA_GVF_KS;
                             0: gvf_ks1_min's rule) */
    int gvf_ks1_min;      /* gvf.cu: routed experts of this many tokens or more at least 1 warp
                             along K, fewer at least 2 (DSI_CUDA_GVF_KS1_MIN; 0: always 2) */
    bool gvf_ilv;         /* gvf.cu: a tile's warps interleave their K groups (DSI_CUDA_GVF_ILV) */
    bool gvf_nbar;        /* gvf.cu: a tile's ks warps meet on a named barrier of their own, not the
                             block's (DSI_CUDA_GVF_NBAR=1; step 33; measured level in step 35: off) */
    bool gvf_tail;        /* gvf.cu: more warps along K where the last tile iteration is then fuller
                             (DSI_CUDA_GVF_TAIL) */
    bool gvf_pair;        /* gvf.cu: a GEMM pair (dsi_gemm_args.w2) in one launch
                             (DSI_CUDA_GVF_PAIR=0: one by one; step 19) */
    bool gvf_ef;          /* gvf.cu: weight loads with an L2 evict-first policy, so that a decode
                             GEMM's stream leaves the lines of prefetch hints in L2
                             (DSI_CUDA_GVF_EF=1; measured level in step 36: off) */
    bool norm_q;     /* rms_norm's act_quant copy (yq) in the norm kernels (DSI_CUDA_NORM_Q=0: a
                        separate act_quant launch, as before step 17) */
    bool norm_rq;    /* rms_norm's RoPE / quantisation after the norm in the warp kernels
                        (DSI_CUDA_NORM_RQ=1; default off: the rope and act_quant launches; step 19) */
    bool norm_blk1;  /* the 1024-wide norm with a quantised copy (the q norm) on k_rms_norm_blk<1>
                        (DSI_CUDA_NORM_BLK1=0: the one-warp kernel and act_quant's launch) */
    int gvf_pre;     /* gvf.cu, dense: tile iterations of weight rows a block prefetches into L2
                        before it waits for the previous kernel (DSI_CUDA_GVF_PRE, default 1, at
                        most 256; 0: none) */
    int gvf_mpre;    /* gvf.cu, routed walks: tile iterations of weight rows a warp prefetches
                        into L2 behind its first loads (DSI_CUDA_GVF_MPRE, default 0, at most 64;
                        step 42) */
    int attn_fa_min; /* `fast` attention: the fused kernel (attn_fa.cu) from this many rows
                        (DSI_CUDA_ATTN_FA, default 1; 0: off, the products of attn_tc.cu /
                        attn.cu) */
    int attn_fa_exp; /* attn_fa.cu's exp: 1 single precision (the default since step 46), 2 exp_nb,
                        3 __expf, 0 exp_ref (DSI_CUDA_ATTN_FA_EXP) */
    bool attn_fa_split; /* attn_fa.cu: split along the keys below a block per SM
                           (DSI_CUDA_ATTN_FA_SPLIT=0: never) */
    /* attn_fa.cu's configuration, each for every call where set by its variable, else by the
       call's rows (0 / -1 here; attn.cuh's attn_fa_cfg_of): from attn_fa_big rows on 64 heads a
       block, tiles of 32 keys, the q norm and the output's RoPE fused; below, 32 heads a
       block, tiles of 16 keys, the norm and the RoPE their own launches (step 35) */
    int attn_fa_big;   /* rows (DSI_CUDA_ATTN_FA_BIG, default 192; 0: never "big") */
    int attn_fa_kt;    /* keys a tile with 64 heads a block, 16 or 32 (DSI_CUDA_ATTN_FA_KT;
                          step 33) */
    int attn_fa_hb;    /* heads per block, 64 or 32 (DSI_CUDA_ATTN_FA_HB; step 33) */
    int attn_fa_qn;    /* 1: apply attn's q_norm as q is staged, 0: not (DSI_CUDA_ATTN_FA_QN;
                          step 34) */
    int attn_fa_or;    /* 0: attn's out_rope in a launch of its own; else applied as out is
                          written (DSI_CUDA_ATTN_FA_OR; step 34, every row count since 38) */
    bool attn_fa_k8;   /* attn_fa.cu: FP8 rows as 16-byte chunks (step 30; DSI_CUDA_ATTN_FA_K8=0:
                          each float4 through attn_k4, step 29's) */
    int hc_split;      /* hc_pre's finish: at most this many blocks per row (DSI_CUDA_HC_SPLIT) */
    int hc_mix_min;    /* hc_pre / hc_head: the mix GEMM on k_hc_mix from this many rows
                          (DSI_CUDA_HC_MIX_MIN, default 2; 0: never, launch_gemm) */
    bool hc_mix_split; /* k_hc_mix splits K below a row block per SM (DSI_CUDA_HC_MIX_SPLIT=0:
                          never) */
    int hc_mix_rpl;    /* k_hc_mix: 2 rows per lane from 33 rows where its blocks fill the SMs
                          (DSI_CUDA_HC_MIX_RPL, default 2; 1: never; 3: wherever from 33 rows) */
    int tc_attn_min; /* attention products on tensor cores from this many rows (DSI_CUDA_TC_ATTN) */
    int tc_bn_max;   /* tc.cu's MoE tiles: activation rows per block at most (DSI_CUDA_TC_BN) */
    int gvf_moe_nt;  /* gvf.cu's routed tiles: 8 x this many rows (DSI_CUDA_GVF_MOE_NT; 0: auto) */
    int gvf_blocks;  /* gvf.cu's MoE grid: about this many blocks per SM (DSI_CUDA_GVF_BLOCKS) */
    int gvf_bal;     /* gvf.cu's routed tiles: one row of this many blocks per SM splitting the tile
                        table evenly (DSI_CUDA_GVF_BAL; 0: off, gx blocks a tile) */
    int gvf_bal_g;   /* in groups of this many blocks on the same items (DSI_CUDA_GVF_BALG) */
    bool tc_idx;     /* `fast` indexer scores on tensor cores (DSI_CUDA_TC_IDX=0: off) */
    int idx_tpb;     /* their key tiles per block (DSI_CUDA_IDX_TPB; 0: up to 8 by the grid) */
    bool hc_fuse;    /* hc_pre's finish adds the mix's split-K values (DSI_CUDA_HC_FUSE=1) */
    int hc_tf_min;   /* `fast` hc_pre: the mix on hc_tf.cu's 3xTF32 tensor cores from this many
                        rows (DSI_CUDA_HC_TF_MIN, default 128; 0: never) */
    int hc_ptf;      /* there, with the hc_post before it in the same pass (k_hc_mix_tf_post;
                        DSI_CUDA_HC_PTF=1: 16 d a step, the next step's loads ahead; 2: 32 d a
                        step (the default, step 47); 3: a ring in shared memory by cp.async; 0: off) */
    int wg_dense_min;   /* tc.cu's dense / grouped calls on wg.cu / wgr.cu from this many rows
                           (DSI_CUDA_WG_DENSE_MIN, default 512) */
    int wg_shared_min;  /* the MoE's shared expert on wg.cu / wgr.cu from this many rows
                           (DSI_CUDA_WG_SHARED_MIN, default 128 since step 37, 512 before;
                           fewer: tc.cu) */
    int wg_shared_bn;   /* below 512 rows, wgr.cu's shared-expert blocks at most this many
                           rows (DSI_CUDA_WG_SHARED_BN, default 64; step 37) */
    int wg_grouped_min; /* the same for grouped calls (the output projection's wo_a;
                           DSI_CUDA_WG_GROUPED_MIN, default 128; step 36) */
    bool hc_fin_norm;   /* hc_pre's finish runs the norm after it where it can (one block a row;
                           DSI_CUDA_HC_FIN_NORM=1; step 33; measured level in step 35: off) */
    int hc_one;     /* hc_pre in one launch (k_hc_pre_one) up to this many rows (DSI_CUDA_HC_ONE;
                       0: never; at most CU_HC_ONE_MAX) */
    bool hc_cl;     /* hc_pre's rows up to hc_one on a thread block cluster a row instead
                       (hc_cl.cu; DSI_CUDA_HC_CL=1; step 38, compiled only: off) */
    int *hc_cnt;    /* k_hc_pre_one's per-row counters [CU_HC_ONE_MAX] (owned; zero between
                       launches) */
    bool wg;        /* tc.cu's large tiles on wg.cu's wgmma kernels (DSI_CUDA_WG=0: off) */
    bool wg_bn_fit; /* wgr.cu's routed tiles: the block width by the mean rows an expert plus two
                       standard deviations (wgr_pick_bn_routed, step 48; the default from step
                       49, DSI_CUDA_WG_BN_FIT=0: wgr_pick_bn's) */
    int wg_bn;      /* wg.cu's MoE tiles: activation rows per block at most (DSI_CUDA_WG_BN, 224
                       since step 48, 192 before; wg.cu: 192 from 192 up; wgr.cu's: 224 or 256 take
                       blocks that wide) */
    bool wg_dyn;    /* wg.cu's MoE: routed tiles of equal rows, blocks up to 256 rows, each block's
                       wgmma as wide as its tile (DSI_CUDA_WG_DYN=0: off) */
    bool wg_rs;     /* wg.cu's calls (MoE and dense FP8) on wgr.cu's kernels, the weights in
                       registers (DSI_CUDA_WG_RS=0: off; on from step 26) */
    /* wgr.cu's MoE blocks read their activation tiles by TMA (step 27's; on from step 30,
       DSI_CUDA_WGR_TMA=0: each thread's cp.async copies); tmap_encode: the driver's
       cuTensorMapEncodeTiled (from the runtime's entry point at creation; NULL: wgr_tma is off) */
    bool wgr_tma;
    /* wgr.cu's MoE blocks (routed or shared) without the large-scale decode path where every
       scale byte of their weights is within the short path's (cu_moe_table's sb_max and
       sb_max_sh; DSI_CUDA_WGR_SB=0: always the checked kernels; step 51, not yet run on a GPU) */
    bool wgr_sb;
    /* the MoE block GEMMs' up epilogue (wg_finish: wg.cu, wgr.cu, wgq.cu): the gate's exp in
       single precision (step 51; on since step 52; DSI_CUDA_WG_EXP=0: exp_nb's double) */
    bool wg_exp;
    /* the residual streams in bf16 where the forward asks (cuda_xbf16_ok: from the rows hc_pre's
       TF32 mix takes; step 52, on; DSI_CUDA_XBF16=0: floats) */
    bool xbf16;
    void *tmap_encode;
    /* the MoE's block GEMMs on the FP8 tensor cores (wgq.cu, DSI_CUDA_WG_Q8=1; off: step 28's,
       not yet run on a GPU) */
    bool wg_q8;
    double wgq_min; /* with wg_q8, the routed tiles on wgq.cu from this many rows per expert too
                       (DSI_CUDA_WGQ_MIN; 0: only where wg.cu's rule takes them) */
    bool wgq_stg;   /* wgq.cu's warpgroups staggered by half a step (DSI_CUDA_WGQ_STG=1; off
                       from step 30) */
    /* the routed experts' block GEMMs of many rows on wgp.cu (FP8 tensor cores, a producer
       warpgroup; DSI_CUDA_WG_P=1, step 40; off: the 8k prefill measured +2.5%): the FP8 codes as
       wg_q8's, the shared expert on wgq.cu */
    bool wg_p;
    bool wgp_cf; /* wgp.cu: the consumers fence the stages, the copies arrive themselves
                    (DSI_CUDA_WGP_CF=0: the producer fences) */
    bool wgp_cc; /* wgp.cu: the consumers convert the weights, the producer only copies
                    (DSI_CUDA_WGP_CC=1; step 42) */
    bool wg_tok; /* wg.cu: the MoE's copy of x by position made by token, each row of x read once
                    (k_wg_bf16_tok; DSI_CUDA_WG_TOK=0: by position; step 47) */
    bool wg_cp;  /* wg.cu: the permuted bf16 copies a warp a row (k_wg_bf16_v; DSI_CUDA_WG_CP=0:
                    k_wg_bf16's thread a pair; step 43) */
    /* the attention's out rows kept in bf16 for the gemm after it (dsi_attn_args.out_to_gemm,
       dsi_gemm_args.x_from_attn): k_attn_fa writes them in wgr.cu's permuted K order into
       CU_SCR_GEMM's slot (buf: n rows of cols), which wg_dense_copy then takes for its copy of x
       where the shapes match (DSI_CUDA_ATTN_O16=0: off; step 43). valid: set by the attention,
       cleared by every attention and gemm op; take: the gemm running now may use it; no_out:
       the attention left out unwritten (dsi_attn_args.out_gemm, cu_gemm_takes_kept;
       DSI_CUDA_ATTN_OSKIP=0: off; step 44, on since step 45); took: wg_dense_copy used the rows */
    bool attn_o16, attn_oskip;
    bool attn_o16v;    /* k_attn_fa stores the kept rows 16 bytes at a time (DSI_CUDA_ATTN_O16V=0:
                          a pair at a time; on since step 45) */
    bool attn_qn_lean; /* k_attn_fa's q norm staging of bf16 rows without redundant roundings
                          (DSI_CUDA_ATTN_QN_LEAN=0: off; step 45, on since step 46) */
    struct {
        bool valid, take, no_out, took;
        const float *src;
        const uint16_t *buf;
        int64_t n, cols;
    } o16;
    /* a gemm op's pair of weights on the same x (dsi_gemm_args.w2, run as two calls): the
       activations' copy the first call made (key), taken by the second where it is the same
       (on: between the two; gen: scratch_gen then, so a moved slot is never taken;
       DSI_CUDA_XC=0: off; step 47) */
    bool xc_on_env;
    struct {
        bool on, valid;
        struct cu_xc_key key;
        uint64_t gen;
    } xc;
    /* the gemm's y handed to the attention after it (dsi_gemm_args.y_to_attn,
       dsi_attn_args.q_from_gemm): lt.cu leaves cuBLASLt's bf16 rows [n][cols] in CU_SCR_Q16's
       slot (buf) instead of widening them into src (row stride ld); the attention's fused
       kernel stages q from them, any other path widens them into src first (DSI_CUDA_ATTN_Q16=0:
       off; step 43). valid: set by the gemm, cleared by the next attention or gemm op */
    bool attn_q16;
    struct {
        bool valid;
        float *src;
        const uint16_t *buf;
        int64_t n, cols, ld;
    } q16;
    /* `fast` dense FP8 GEMMs through cuBLASLt (lt.cu) from this many rows (DSI_CUDA_LT_MIN;
       0: never); lt: its handle and plans (owned, cu_lt_new / cu_lt_free), NULL when off */
    int lt_min;
    int lt_min_out; /* lt.cu only for GEMMs of this many output columns or more
                       (DSI_CUDA_LT_MIN_OUT, default 0; narrower: tc.cu / wgr.cu; step 37) */
    struct cu_lt *lt;
    /* dense calls wgr.cu would take (the grouped wo_a) from this many rows on cuBLASLt's bf16
       matmul (ltb.cu; DSI_CUDA_LTB_MIN, default 2048; 0: never); ltb: its handle and plans
       (owned, cu_ltb_new / cu_ltb_free), NULL when off */
    int ltb_min;
    struct cu_ltb *ltb;
    bool moe_o16; /* the routed rows' down outputs in bf16 for the combine where wg.cu / wgr.cu
                     run them (moe_p.out16; DSI_CUDA_MOE_O16=0: off; step 47) */
    bool moe_lt;  /* the shared expert's down projection on lt.cu where it takes it
                     (DSI_CUDA_MOE_LT=0: off) */
    struct cu_prof_pair *pairs;
    int n_pairs, cap_pairs, n_events; /* events created: n_events pairs */
    struct cu_prof_tot tot[128];
    int n_tot;
    bool prof_shapes;        /* DSI_CUDA_PROFILE=2: ops also by shape (cu_prof_name) */
    char prof_names[64][48]; /* cu_prof_name's interned names */
    int n_prof_names;
    double prof_t0; /* host seconds at the profile's last mark (dsi_cuda_profile_dump) */
    size_t smem_optin;
    cudaStream_t stream;
    /* l2pf.cu: the prefetch hints' side stream and its fork / join events (NULL: hints off),
       the rows of a step up to which hints are taken (DSI_CUDA_L2PF), whether hints were issued
       since the main stream last waited for the side stream */
    cudaStream_t pf_stream;
    cudaEvent_t pf_fork, pf_join;
    int l2pf_max;
    bool pf_pending;
    /* moe.cu: the shared expert's side stream and its fork / join events (default on since step 38;
       DSI_CUDA_MOE_SIDE=0 / NULL: off; made at backend creation, freed with the backend) */
    cudaStream_t moe_side;
    cudaEvent_t moe_fork, moe_join;
    int sticky; /* first error (dsi_status), 0 if none */
    char msg[400];
    /* imported weights: bump-allocated slabs, freed with the backend */
    void **slabs;
    int n_slabs, cap_slabs;
    char *slab_cur;
    size_t slab_used, slab_cap;
    size_t imported_bytes;
    /* step scratch, grown on demand (stream-synchronised before it is replaced): one buffer
     * for the GEMM's split-K chunk values, one for an op's own intermediates, one for lt.cu
     * (CU_SCR_GEMM, CU_SCR_OP, CU_SCR_LT) */
    void *scratch[4];
    size_t scratch_bytes[4];
    struct cu_freq freq[CU_MAX_FREQ];
    int n_freq;
    struct cu_moe_table moe[CU_MAX_MOE_TABLES];
    int n_moe;
    /* captured steps (graph.cu): replayed while scratch_gen is the one they were captured at */
    struct cu_graph *graphs;
    int n_graphs;
    bool use_graphs;      /* DSI_CUDA_NOGRAPH=1 turns them off; never with the profiler */
    bool capturing;       /* between graph_begin(CAPTURE) and graph_end */
    bool capture_bad;     /* something in the capture cannot be replayed: run it eagerly */
    uint64_t scratch_gen; /* bumped whenever a scratch buffer moves */
    int cur_graph;        /* the entry being captured or replayed, -1: none */
};

/* The pair's copy of x (c->xc) may be taken where the key is the same and no scratch moved */
static inline bool cu_xc_take(const struct cu_ctx *c, const struct cu_xc_key *k) {
    const struct cu_xc_key *r = &c->xc.key;
    return c->xc.on && c->xc.valid && r->kind == k->kind && r->x == k->x && r->n == k->n &&
           r->K == k->K && r->ldx == k->ldx && r->buf == k->buf && c->xc.gen == c->scratch_gen;
}
/* Record the copy just made (where a pair is running) */
static inline void cu_xc_made(struct cu_ctx *c, const struct cu_xc_key *k) {
    if (!c->xc.on) return;
    c->xc.valid = true;
    c->xc.key = *k;
    c->xc.gen = c->scratch_gen;
}

/* lt.cu's cuBLASLt state: made at backend creation (NULL: cuBLASLt could not start; the
 * FP8 GEMMs then stay on tc.cu), freed with the backend. */
struct cu_lt *cu_lt_new(int layout);
void cu_lt_free(struct cu_lt *lt);
/* ltb.cu's cuBLASLt state: made at backend creation (NULL: off), freed with the backend. */
struct cu_ltb *cu_ltb_new(void);
void cu_ltb_free(struct cu_ltb *b);

static inline struct cu_ctx *cu_ctx_of(struct dsi_backend *be) { return (struct cu_ctx *)be->ctx; }

/* Record the first error (sticky; returned by sync). */
void cu_fail(struct cu_ctx *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* After a launch: record a launch error under `what`. Returns true if the launch is fine. */
bool cu_check(struct cu_ctx *c, const char *what);
/* c->pad empty dependent kernels on c->stream (the DSI_CUDA_PAD probe; misc.cu) */
void cu_pad(const struct cu_ctx *c);
#ifdef __CUDACC__
/* Launch kernel k on c->stream (programmatic dependent launch when c->pdl, see cu_pdl_enter);
 * errors surface through cu_check as with <<<>>>. */
template <typename... P, typename... A>
static inline void cu_launch(
    const struct cu_ctx *c, void (*k)(P...), dim3 grid, dim3 block, size_t smem, A &&...args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cfg.attrs = at;
    cfg.numAttrs = c->pdl ? 1 : 0;
    cudaLaunchKernelEx(&cfg, k, static_cast<A &&>(args)...);
    if (c->pad) cu_pad(c);
}
#endif
/* Scratch of at least `bytes` (256-byte aligned); NULL (sticky error set) on failure. The
 * previous contents are lost when it grows. Valid until the next op. Slot CU_SCR_GEMM belongs
 * to launch_gemm, CU_SCR_LT to launch_lt_gemm, CU_SCR_OP to the op being run (one request per
 * op: carve it up); CU_SCR_Q16 to lt.cu's rows handed to the attention (c->q16), valid until
 * the attention op after it. */
enum { CU_SCR_GEMM = 0, CU_SCR_OP = 1, CU_SCR_LT = 2, CU_SCR_Q16 = 3 };
void *cu_scratch(struct cu_ctx *c, int which, size_t bytes);
/* Profiler (DSI_CUDA_PROFILE=1): GPU time of a part of an op, under a name with a '.'
 * ("gemm.reduce"); such parts are listed with the ops but not added to the total (the op
 * around them already counts them). -1 / no-op when not profiling. */
int cu_prof_begin_(struct cu_ctx *c, const char *name);
void cu_prof_end_(struct cu_ctx *c, int i);
/* A profile name made from fmt (printf), interned in c (the profiler keys names by pointer); at
 * most 64 distinct ones, then a shared "x.other". */
const char *cu_prof_name(struct cu_ctx *c, const char *fmt, ...);
static inline int cu_prof_begin(struct cu_ctx *c, const char *name) {
    return c->prof ? cu_prof_begin_(c, name) : -1;
}
static inline void cu_prof_end(struct cu_ctx *c, int i) {
    if (c->prof && i >= 0) cu_prof_end_(c, i);
}
/* Device copy of a rope frequency table (see cuda.cu). */
const float *cu_freq_dev(struct cu_ctx *c, const float *freq, int n);
/* Device expert table for a MoE call (see moe.cu / cuda.cu). */
const struct cu_moe_ent *
cu_moe_table(struct cu_ctx *c, const struct dsi_moe_args *a, int *sb_max, int *sb_max_sh);

static inline int64_t cu_div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }
/* `pieces` units in at most `want` (>= 1) even parts: the parts' count, *per units each (the
 * last part may be shorter); split-K of gemm.cu and tc.cu. */
static inline int64_t cu_split_even(int64_t want, int64_t pieces, int64_t *per) {
    *per = cu_div_up(pieces, want < pieces ? want : pieces);
    return cu_div_up(pieces, *per);
}
static inline size_t cu_align(size_t x) { return (x + 255) & ~(size_t)255; }

/* ---- weight description passed to kernels by value ----------------------------------------- */

struct cu_w {
    const uint8_t *data;
    const uint8_t *scale; /* UE8M0 scales or NULL */
    int64_t K;            /* ne[0] */
    int64_t rows;         /* ne[1] */
    int64_t row_bytes;
    int64_t srs;  /* scale_row_stride */
    int sb0, sb1; /* scale block rows, cols */
    int sh0, sh1; /* log2 of sb0, sb1 where a power of two (the usual), else -1: shifts for the
                     scale indices instead of 64-bit divisions in the kernels' inner loops */
    int type;     /* enum dsi_type */
};

/* log2(v) for a power of two v > 0, else -1. */
static inline int cu_log2_exact(int v) {
    if (v <= 0 || (v & (v - 1))) return -1;
    int l = 0;
    while ((1 << l) < v)
        l++;
    return l;
}

static inline struct cu_w cu_w_of(const struct dsi_tensor *t) {
    struct cu_w w;
    w.data = (const uint8_t *)t->data;
    w.scale = t->scale ? (const uint8_t *)t->scale->data : NULL;
    w.K = t->ne[0];
    w.rows = t->ne[1] > 0 ? t->ne[1] : 1;
    w.row_bytes = dsi_tensor_row_bytes(t);
    w.srs = t->scale_row_stride;
    w.sb0 = t->scale_block[0] > 0 ? t->scale_block[0] : 1;
    w.sb1 = t->scale_block[1] > 0 ? t->scale_block[1] : 1;
    w.sh0 = cu_log2_exact(w.sb0);
    w.sh1 = cu_log2_exact(w.sb1);
    w.type = (int)t->type;
    return w;
}

/* A float vector tensor (F32/BF16/F16) by value. */
struct cu_vec {
    const void *data;
    int type;
};

static inline struct cu_vec cu_vec_of(const struct dsi_tensor *t) {
    struct cu_vec v;
    v.data = t ? t->data : NULL;
    v.type = t ? (int)t->type : 0;
    return v;
}

/* ---- device helpers: number formats (bit-exact copies of cpu/quant.c) ------------------------ */

#ifdef __CUDACC__

__device__ __forceinline__ float bf16_to_f32(uint32_t h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ float bf16_round(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float(((u >> 16) | 0x40u) << 16);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}

__device__ __forceinline__ float rbf(float x, bool on) { return on ? bf16_round(x) : x; }

/* rbf by the hardware conversion (cvt.rn.bf16.f32: bf16_round's bits but for a NaN's payload),
 * two instructions against bf16_round's ~8 and its NaN branch: `fast` numerics' code that
 * rounds many values side by side, such as the block GEMMs' end (wg.cuh) */
__device__ __forceinline__ float rbf_cvt(float x, bool on) {
    uint16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return on ? __uint_as_float((uint32_t)h << 16) : x;
}

__device__ __forceinline__ float f16_to_f32(uint32_t h) {
    uint32_t s = (h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return s ? -v : v;
    }
    if (e == 31) return __uint_as_float(s | 0x7f800000u | (m << 13));
    return __uint_as_float(s | ((e + 112) << 23) | (m << 13));
}

__device__ __forceinline__ float e4m3_to_f32(uint32_t b) {
    uint32_t s = (b >> 7) & 1, e = (b >> 3) & 0xf, m = b & 7;
    if (e == 15 && m == 7) return __uint_as_float(0x7fc00000u);
    float v = e == 0 ? (float)m * 0.001953125f /* 2^-9 */
                     : __uint_as_float(((e + 120) << 23) | (m << 20));
    return s ? -v : v;
}

__device__ __forceinline__ float e8m0_to_f32(uint32_t b) {
    if (b == 0xff) return __uint_as_float(0x7fc00000u);
    if (b == 0) return __uint_as_float(0x00400000u); /* 2^-127 */
    return __uint_as_float(b << 23);
}

__device__ __forceinline__ float fp4_to_f32(uint32_t c) {
    uint32_t e = (c >> 1) & 3, m = c & 1;
    float v = e ? __uint_as_float(((e + 126) << 23) | (m << 22)) : (m ? 0.5f : 0.0f);
    return (c & 8) ? -v : v;
}

/* Element i of a float vector tensor. */
__device__ __forceinline__ float vec_get(struct cu_vec v, int64_t i) {
    if (v.type == DSI_TYPE_F32) return ((const float *)v.data)[i];
    if (v.type == DSI_TYPE_BF16) return bf16_to_f32(((const uint16_t *)v.data)[i]);
    return f16_to_f32(((const uint16_t *)v.data)[i]);
}

__device__ __forceinline__ size_t vec_esize(struct cu_vec v) {
    return v.type == DSI_TYPE_F32 ? 4 : 2;
}

/* Element k of row `row` of a weight, dequantised (generic, any type; as cpu_decode_row). */
__device__ __forceinline__ float w_get(const struct cu_w &w, int64_t row, int64_t k) {
    const uint8_t *p = w.data + row * w.row_bytes;
    switch (w.type) {
    case DSI_TYPE_F32:
        return ((const float *)p)[k];
    case DSI_TYPE_BF16:
        return bf16_to_f32(((const uint16_t *)p)[k]);
    case DSI_TYPE_F16:
        return f16_to_f32(((const uint16_t *)p)[k]);
    case DSI_TYPE_F8_E4M3: {
        const uint8_t *s = w.scale + (row / w.sb0) * w.srs;
        return e4m3_to_f32(p[k]) * e8m0_to_f32(s[k / w.sb1]);
    }
    case DSI_TYPE_FP4_E2M1: {
        const uint8_t *s = w.scale + row * w.srs;
        uint32_t b = p[k / 2];
        return fp4_to_f32((k & 1) ? b >> 4 : b & 0xf) * e8m0_to_f32(s[k / w.sb1]);
    }
    default:
        return 0.0f;
    }
}

/* Correctly rounded transcendental functions (see the header comment). */
__device__ __forceinline__ float exp_ref(float x) { return (float)exp((double)x); }

/* exp_ref without branches, for `fast` numerics only: x clamped to [-110, 90] (exp_ref is 0
 * below ~-103.3 and inf above ~88.7 either way), n = round(x / ln 2), r = x - n ln 2 in two
 * parts (fdlibm's split of ln 2: n ln2_hi exact), e^r by its Taylor series to r^13 / 13! (|r| <=
 * 0.35: the next term ~1e-16 of the sum), times 2^n through the exponent field, in double; then
 * rounded to float. Its double is within ~2 ulp of CUDA's exp, so the float differs from
 * exp_ref's only where the value sits within that of a float rounding boundary (~2^-28 of
 * values). Straight-line code: the block GEMMs' end runs 48 of these side by side (exp_ref's
 * range test made each a branch of its own, in turn). */
__device__ __forceinline__ float exp_nb(float x) {
    double xd = (double)fminf(fmaxf(x, -110.0f), 90.0f);
    double n = rint(xd * 1.4426950408889634);
    double r = fma(-n, 6.93147180369123816490e-01, xd);
    r = fma(-n, 1.90821492927058770002e-10, r);
    double q = 1.0 / 6227020800.0;
    q = fma(q, r, 1.0 / 479001600.0);
    q = fma(q, r, 1.0 / 39916800.0);
    q = fma(q, r, 1.0 / 3628800.0);
    q = fma(q, r, 1.0 / 362880.0);
    q = fma(q, r, 1.0 / 40320.0);
    q = fma(q, r, 1.0 / 5040.0);
    q = fma(q, r, 1.0 / 720.0);
    q = fma(q, r, 1.0 / 120.0);
    q = fma(q, r, 1.0 / 24.0);
    q = fma(q, r, 1.0 / 6.0);
    q = fma(q, r, 0.5);
    q = fma(q, r, 1.0);
    q = fma(q, r, 1.0);
    double s = __longlong_as_double((long long)((int)n + 1023) << 52); /* 2^n, n in [-159, 130] */
    return (float)(q * s);
}
__device__ __forceinline__ float log1p_ref(float x) { return (float)log1p((double)x); }
__device__ __forceinline__ float cos_ref(float x) { return (float)cos((double)x); }
__device__ __forceinline__ float sin_ref(float x) { return (float)sin((double)x); }
__device__ __forceinline__ float sigmoid_ref(float x) { return 1.0f / (1.0f + exp_ref(-x)); }

/* cpu_dot, literally: 32-wide chunks of 8 partial sums, added in sequence; then the tail. */
__device__ __forceinline__ float dot_ref(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
    int64_t k = 0;
    for (; k + 32 <= n; k += 32) {
        float l[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            l[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j += 8)
#pragma unroll
            for (int i = 0; i < 8; i++)
                l[i] += a[k + j + i] * b[k + j + i];
        acc += ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
    float t = 0.0f;
    for (; k < n; k++)
        t += a[k] * b[k];
    return acc + t;
}

/* Round to the grid whose spacing in [2^e, 2^(e+1)) is 2^(e - mbits) (cpu/quant.c). */
__device__ __forceinline__ float round_grid(float x, int mbits, int emin) {
    if (x == 0.0f || !isfinite(x)) return x;
    int e;
    frexpf(fabsf(x), &e);
    e -= 1;
    if (e < emin) e = emin;
    float q = ldexpf(1.0f, e - mbits);
    return rintf(x / q) * q;
}

/* round_grid(t, 3, -6) (the e4m3 grid) by the exponent bits, for |t| <= 448: the division by
 * the power of two q is a multiplication by its exact inverse (the same correctly rounded
 * product), no frexpf / ldexpf; the same bits as round_grid. */
__device__ __forceinline__ float e4m3_grid(float t) {
    if (t == 0.0f || !isfinite(t)) return t;
    int e = (int)((__float_as_uint(t) >> 23) & 0xff) - 127;
    if (e < -6) e = -6;
    float inv_q = __uint_as_float((uint32_t)(127 + 3 - e) << 23),
          q = __uint_as_float((uint32_t)(127 + e - 3) << 23);
    return rintf(t * inv_q) * q;
}

/* act_quant's value: v / s clamped to +-448 on the e4m3 grid, times s; s a power of two (UE8M0)
 * and inv_s = 1 / s (exact): v * inv_s is v / s's correctly rounded value. */
__device__ __forceinline__ float q8_value(float v, float s, float inv_s) {
    float t = v * inv_s;
    t = t > 448.0f ? 448.0f : t < -448.0f ? -448.0f : t;
    return e4m3_grid(t) * s;
}

__device__ __forceinline__ float ue8m0_scale(float amax, float fmt_max, float amax_floor) {
    if (!(amax >= amax_floor)) amax = amax_floor;
    float v = amax / fmt_max;
    uint32_t u = __float_as_uint(v);
    int e = (int)((u >> 23) & 0xff) - 127;
    if (u & 0x7fffffu) e += 1;
    return ldexpf(1.0f, e);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum of squares of a row in double (exact products), reduced over the block: the CPU sums
 * sequentially, so the double results can differ in the last bits, which the rounding to
 * float almost never sees. `red` is shared scratch of at least 32 doubles. */
__device__ __forceinline__ double block_sum_d(double v, double *red) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < nw; i++)
        s += red[i];
    return s;
}

/* Address of entry i of the sequence in `slot` in a paged pool (cpu_paged). */
__device__ __forceinline__ int64_t paged(const int32_t *page_table,
                                         int max_pages,
                                         int page_tokens,
                                         int slot,
                                         int64_t i,
                                         int ratio,
                                         int64_t width) {
    int64_t per_page = page_tokens / ratio;
    int32_t page = page_table[(int64_t)slot * max_pages + i / per_page];
    return ((int64_t)page * per_page + i % per_page) * width;
}

/* ---- programmatic dependent launch (sm_90) --------------------------------------------------
 * Kernels are launched with cu_launch, which (when c->pdl; see cu_ctx.pdl_mode) lets the
 * next kernel of the stream start while this one finishes: its blocks are scheduled, load their
 * parameters and may load immutable data (weights), then wait in cu_pdl_enter until the
 * previous kernel has completed and its writes are visible. So every kernel calls cu_pdl_enter
 * before it touches memory another kernel writes, and writes nothing before it (rule of this
 * backend: it is the first statement of every kernel, or follows only weight loads).
 * cu_pdl_enter also lets this kernel's successor be launched (it then waits the same way). */
/* Bytes [p, p + n) into L2 (one bulk prefetch; the range widened to 16-byte bounds), e.g. weights
 * a kernel will need later, issued before cu_pdl_enter so that they stream in meanwhile. */
__device__ __forceinline__ void cu_prefetch_l2(const void *p, size_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (!p || !n) return;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)15, b = ((uintptr_t)p + n + 15) & ~(uintptr_t)15;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((unsigned)(b - a))
                 : "memory");
#endif
}

/* An L2 cache policy for cu_ldg_pol: evict-first (lines read once, which should not displace
 * others) or evict-normal (as a plain load). One createpolicy per kernel; both paths are one
 * code path with a different operand. */
__device__ __forceinline__ uint64_t cu_l2_policy(bool evict_first) {
    uint64_t f = 0, n = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(f));
    asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(n));
#endif
    return evict_first ? f : n;
}

/* 16 read-only bytes (as __ldg) under the L2 cache policy pol (cu_l2_policy). */
__device__ __forceinline__ uint4 cu_ldg_pol(const uint4 *p, uint64_t pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint4 v;
    asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(pol));
    return v;
#else
    (void)pol;
    return __ldg(p);
#endif
}

/* 16 bytes global -> shared (dst: a shared-space address), asynchronously; zeros when !valid
 * (src must be mapped anyway). Committed in groups (cu_cp_commit); cu_cp_wait<N> waits until at
 * most N of this thread's groups are in flight. */
__device__ __forceinline__ void cu_cp16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
/* 4 bytes, the same way (dst and src 4-byte aligned). */
__device__ __forceinline__ void cu_cp4(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 4 : 0)
                 : "memory");
}
__device__ __forceinline__ void cu_cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cu_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void cu_pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#endif /* __CUDACC__ */

/* The step description by value (the arrays are device memory). */
struct cu_step {
    int n;
    const int32_t *tokens, *pos, *slot, *row0, *page_table;
    int max_pages, page_tokens, ring_cap, window;
};

static inline struct cu_step cu_step_of(const struct dsi_step *st) {
    struct cu_step s;
    s.n = st->n;
    s.tokens = st->tokens;
    s.pos = st->pos;
    s.slot = st->slot;
    s.row0 = st->row0;
    s.page_table = st->page_table;
    s.max_pages = st->max_pages;
    s.page_tokens = st->page_tokens;
    s.ring_cap = st->ring_cap;
    s.window = st->window;
    return s;
}

/* ---- launchers (one file each) ------------------------------------------------------------- */

/* y[i, o] = x[i] . W[row0 + o] for o < n_out, i < n (cpu_gemm's numbers, bit for bit). */
void launch_gemm(struct cu_ctx *c,
                 const struct cu_w *w,
                 int64_t row0,
                 int64_t n_out,
                 const float *x,
                 int64_t n,
                 int64_t ldx,
                 float *y,
                 int64_t ldy,
                 bool round);
void launch_act_quant(struct cu_ctx *c,
                      const float *x,
                      float *y,
                      int64_t n,
                      int64_t dim,
                      int64_t ldx,
                      int64_t ldy,
                      int block);

#ifdef __cplusplus
extern "C" {
#endif
void cuda_gemm(struct dsi_backend *, const struct dsi_gemm_args *);
void cuda_act_quant(struct dsi_backend *, const struct dsi_act_quant_args *);
void cuda_hadamard_q4(struct dsi_backend *, const struct dsi_hadamard_q4_args *);
void cuda_embed(struct dsi_backend *, const struct dsi_embed_args *);
void cuda_add(struct dsi_backend *, const struct dsi_add_args *);
void cuda_copy(struct dsi_backend *, const struct dsi_copy_args *);
void cuda_rms_norm(struct dsi_backend *, const struct dsi_rms_norm_args *);
void cuda_rope(struct dsi_backend *, const struct dsi_rope_args *);
void cuda_hc_pre(struct dsi_backend *, const struct dsi_hc_pre_args *);
void cuda_hc_post(struct dsi_backend *, const struct dsi_hc_post_args *);
void cuda_hc_head(struct dsi_backend *, const struct dsi_hc_head_args *);
void cuda_attn(struct dsi_backend *, const struct dsi_attn_args *);
void cuda_indexer(struct dsi_backend *, const struct dsi_indexer_args *);
void cuda_kv_store(struct dsi_backend *, const struct dsi_kv_store_args *);
void cuda_comp_ape(struct dsi_backend *, const struct dsi_comp_ape_args *);
void cuda_compress(struct dsi_backend *, const struct dsi_compress_args *);
void cuda_comp_store(struct dsi_backend *, const struct dsi_comp_store_args *);
void cuda_entry_store(struct dsi_backend *, const struct dsi_entry_store_args *);
void cuda_gather(struct dsi_backend *, const struct dsi_gather_args *);
void cuda_moe_route(struct dsi_backend *, const struct dsi_moe_route_args *);
void cuda_moe(struct dsi_backend *, const struct dsi_moe_args *);
int cuda_graph_begin(struct dsi_backend *, uint64_t key);
/* l2pf.cu: the prefetch hints (cuda_prefetch is the op) */
int cu_l2pf_init(struct cu_ctx *c); /* at backend creation; -1: the side stream failed */
/* A side stream with its fork and join events (l2pf.cu, moe.cu): made at backend creation
   (-1: failed, nothing left made), freed with the backend (its work finished first; all three
   NULL after). */
int cu_fork_make(cudaStream_t *s, cudaEvent_t *fork, cudaEvent_t *join);
void cu_fork_free(cudaStream_t *s, cudaEvent_t *fork, cudaEvent_t *join);
int cu_moe_side_init(struct cu_ctx *c); /* moe.cu, at backend creation; -1: its stream failed */
void cu_moe_side_free(struct cu_ctx *c);
void cu_l2pf_free(struct cu_ctx *c);
void cu_l2pf_join(struct cu_ctx *c); /* the main stream waits for the hints issued so far */
bool cu_l2pf_on(const struct cu_ctx *c, int64_t rows); /* hints taken at this many rows */
extern "C" void cuda_prefetch(struct dsi_backend *, const struct dsi_prefetch_args *);
int cuda_graph_end(struct dsi_backend *);
void cuda_graph_reset(struct dsi_backend *);
void cuda_sample(struct dsi_backend *, const struct dsi_sample_args *);
#ifdef __cplusplus
}
#endif

#endif
