/* attn_fa.cu - the attention of `fast` numerics in one kernel (`DSI_CUDA_ATTN_FA`, from 1 row):
 * scores, softmax with the sink and p.v over tiles of 16 keys with a running maximum
 * (FlashAttention's online softmax), so that the scores never leave the chip and each key is
 * read once per row (attn_tc.cu's products read it twice and the scores go through memory
 * three times: most of the prefill's attention time, docs/cuda.md step 21).
 *
 * A block takes one row and 64 heads (the key set is shared by the heads: MQA): 16 warps, warp
 * (wm, wn) = (heads 16 wm.., a quarter wn of head_dim). Per tile: the tile's keys as bf16 in
 * shared memory (loaded into registers one tile ahead, two buffers); each warp's partial
 * scores over its quarter of head_dim (mma.sync m16n8k16); the four partials added in warp
 * order and scaled; per head the tile's maximum, the running maximum m, the factor
 * exp(m_old - m) for what is summed so far, e = exp(s - m) rounded to bf16 (the P operand) and
 * the running sum l of those values; then each warp rescales its output rows and adds P times
 * the keys of its quarter of head_dim (ldmatrix.trans on the same tile). At the end, with the
 * sink: mx = max(m, sink), out = o exp(m - mx) / (l exp(m - mx) + exp(sink - mx)).
 *
 * Below a block per SM (decode at 1-31 rows: one block a row) the keys are split (step 24,
 * FlashDecoding's way): block z takes tiles [z tps, (z + 1) tps) of its row and writes its
 * unnormalised output rows and its m and l to scratch; k_attn_fa_merge weighs the splits by
 * exp(m_z - mx) and applies the sink as above. Before, those rows took attn.cu's three launches
 * (scores, softmax, p.v): ~25 us a layer at batch 1.
 *
 * Numerics: q and the keys are bf16 values in `fast` numerics (exact operands); the scores are
 * fp32 sums in another order than the CPU's; the probabilities are rounded to bf16 before the
 * normalisation rather than after it (the CPU's p = bf16(e / z)), so this is not the
 * `reference` rounding: the op test bounds the difference (1e-2 of the largest output). */
#include "attn.cuh"
#include "norm.cuh"
#include "tc.cuh"
#include "wg.cuh"

#include <algorithm>

#define FA_HB 64 /* heads per block (or 32: attn_fa_cfg_of); FA_HB * 8 threads */
/* keys per tile: 16, or 32 with 64 heads a block (attn_fa_cfg_of, DSI_CUDA_ATTN_FA_KT: half
   the tiles and their barriers per row; step 24's experiment spilled 112 bytes at head_dim 512,
   16 in step 33's build) */
#define FA_KT 16

struct fa_smem_layout {
    size_t q, k, sp, pr, st, kp, cs, total;
};

__host__ __device__ static inline fa_smem_layout fa_layout(int hd, int hb, int kt) {
    fa_smem_layout l;
    size_t ldk = (size_t)hd + 8;
    l.q = 0;                                     /* Q bf16 [64][hd + 8] */
    l.k = l.q + (size_t)hb * ldk * 2;            /* K bf16 [2][kt][hd + 8] */
    l.sp = l.k + (size_t)2 * kt * ldk * 2;       /* partial scores [4][64][kt + 8] */
    l.pr = l.sp + (size_t)4 * hb * (kt + 8) * 4; /* P bf16 [hb][kt + 8] */
    l.st = l.pr + (size_t)hb * (kt + 8) * 2;     /* m, l, factor [3][hb] */
    l.kp = l.st + (size_t)3 * hb * 4;            /* key rows [2][kt] */
    l.cs = l.kp + (size_t)2 * kt * 8;            /* RoPE (cos, sin) of q and out [2][hd / 2] */
    l.total = l.cs + (size_t)hd * 8;
    return l;
}

/* FP8 rows read as 16-byte chunks (k_attn_fa's K8; c->attn_fa_k8, DSI_CUDA_ATTN_FA_K8=0: off,
 * each float4 through attn_k4): chunk q of a key's row is, for q < nope / 16, its 16 e4m3 codes
 * of dims 16 q .. 16 q + 15 with their 64-block's scale byte, else the 8 rope dims' bf16 of dims
 * nope + 8 (q - nope / 16) ..; row bytes and bases 16-byte aligned. */
static bool fa_k8_ok(const struct attn_p *p) {
    return p->fp8 && p->nope % 16 == 0 && (p->hd - p->nope) % 8 == 0 && p->rb % 16 == 0 &&
           (uintptr_t)p->ring8 % 16 == 0 && (uintptr_t)p->ent8 % 16 == 0;
}

bool attn_fa_ok(const struct cu_ctx *c, const struct attn_p *p) {
    return p->hd % 128 == 0 && p->hd <= 512 &&
           fa_layout(p->hd, FA_HB, FA_KT).total <= c->smem_optin && (uintptr_t)p->q % 16 == 0 &&
           (uintptr_t)p->ring % 16 == 0 && (uintptr_t)p->entries % 16 == 0 &&
           (uintptr_t)p->out % 16 == 0 && (uintptr_t)p->ring8 % 8 == 0 &&
           (uintptr_t)p->ent8 % 8 == 0 && p->rb % 8 == 0;
}

/* exp(x), x <= 0: correctly rounded (exp_ref, in double), or (p.fexp, DSI_CUDA_ATTN_FA_EXP=1)
 * the single-precision exp (a few ulp; the value is rounded to bf16 next), or (=2) exp_nb, the
 * branch-free double one (exp_ref's float but within ~2^-28 of values), or (=3, step 46) the
 * hardware's: ex2.approx of x log2(e) (__expf: two instructions, within ~2^-21 relative for
 * x >= -20 and flushed to 0 below ~-87; FlashAttention's way; the bf16 rounding after it is 2^-9)
 */
__device__ __forceinline__ float fa_exp(float x, int mode) {
    return mode == 1 ? expf(x) : mode == 2 ? exp_nb(x) : mode == 3 ? __expf(x) : exp_ref(x);
}

/* q staged with attn's q norm applied (p.qn_on): warp w of the block's HB / 4 takes heads
 * w, w + warps, ..., two at a time (their loads issued together), each lane 4 HQ values of a
 * head as k_rms_norm_warp<HQ, true> holds them, with its arithmetic (rms_in4, the sum of squares
 * in double by shuffles, rms_out4, rope4's rotation on the last qn_rope dims with the cosines and
 * sines of the block's table cs, rope_cs's values): the same values that kernel
 * writes and the unfused staging reads back, here rounded to bf16 straight into Qs (zeros past
 * the last head, whose row the warp reads in their place). */
template <int HQ, int HB>
__device__ __forceinline__ void fa_stage_q_norm(
    const struct attn_p &p, uint16_t *Qs, const float2 *cs, int r, int h0, int warp, int lane) {
    constexpr int HD = 128 * HQ, LDK = HD + 8, NW = HB / 4, HPW = HB / NW, HU = 2;
    static_assert(HPW % HU == 0, "q norm staging");
    const struct cu_vec now = {nullptr, 0};
    int rs = HD - p.qn_rope;
    /* p.qn_lean (DSI_CUDA_ATTN_QN_LEAN=0: off; step 45, on since step 46) with the bf16 rows: the
       same bits in fewer instructions (this staging was ~30% of the 8k prefill's attention
       instructions, most of them bf16_round's: on the inputs, which are bf16 already, and on
       the outputs, which the pack rounds again) */
    const bool lean = p.qn_lean && p.q16;
#pragma unroll 1
    for (int j0 = 0; j0 < HPW; j0 += HU) {
        float4 v[HU][HQ];
#pragma unroll
        for (int u = 0; u < HU; u++) {
            int h = warp + (j0 + u) * NW, hh = h0 + h < p.H ? h0 + h : p.H - 1;
            if (p.q16) { /* (the bf16 rows q would hold widened: the same floats) */
                const uint2 *xs = (const uint2 *)(p.q16 + ((int64_t)r * p.H + hh) * HD);
#pragma unroll
                for (int i = 0; i < HQ; i++) {
                    uint2 b = xs[i * 32 + lane];
                    v[u][i] =
                        make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u),
                                    __uint_as_float(b.y << 16), __uint_as_float(b.y & 0xffff0000u));
                }
            } else {
                const float4 *xs = (const float4 *)(p.q + ((int64_t)r * p.H + hh) * HD);
#pragma unroll
                for (int i = 0; i < HQ; i++)
                    v[u][i] = xs[i * 32 + lane];
            }
        }
#pragma unroll
        for (int u = 0; u < HU; u++) {
            int h = warp + (j0 + u) * NW;
            double ss = 0.0;
            if (lean) { /* bf16 values: rms_in4's rounding leaves them as they are, and their
                           squares are exact in double, so a fused multiply-add rounds as the
                           product then the sum do (the same bits, one instruction less) */
#pragma unroll
                for (int i = 0; i < HQ; i++) {
                    float4 x = v[u][i];
                    ss = fma((double)x.x, (double)x.x, ss);
                    ss = fma((double)x.y, (double)x.y, ss);
                    ss = fma((double)x.z, (double)x.z, ss);
                    ss = fma((double)x.w, (double)x.w, ss);
                }
            } else {
#pragma unroll
                for (int i = 0; i < HQ; i++)
                    v[u][i] = rms_in4(v[u][i], p.qn_round, ss);
            }
            float inv = rms_inv(warp_sum_d(ss), HD, p.qn_eps, p.qn_round, false);
#pragma unroll
            for (int i = 0; i < HQ; i++) {
                int e = (i * 32 + lane) * 4;
                uint2 st;
                if (lean && e < rs) { /* bf16x2_rn of rms_out's v inv: its rbf then the pack's
                                         rounding are one rounding (the same bits) */
                    float4 x = v[u][i];
                    st = make_uint2(bf16x2_rn(x.x * inv, x.y * inv),
                                    bf16x2_rn(x.z * inv, x.w * inv));
                } else {
                    float4 o = rms_out4(v[u][i], inv, now, e, p.qn_round);
                    if (e >= rs) { /* rope4's pairs, their cosines and sines from the table */
                        float2 c0 = cs[(e - rs) / 2], c1 = cs[(e - rs) / 2 + 1];
                        rope_rot(o.x, o.y, c0.x, c0.y, p.qn_round);
                        rope_rot(o.z, o.w, c1.x, c1.y, p.qn_round);
                    }
                    st = make_uint2(bf16x2_rn(o.x, o.y), bf16x2_rn(o.z, o.w));
                }
                if (h0 + h >= p.H) st = make_uint2(0, 0);
                *(uint2 *)(Qs + h * LDK + e) = st;
            }
        }
    }
}

/* The row's RoPE tables (k_attn_fa's CSq: nq pairs at qpos, CSo: no pairs at opos), threads tid,
 * tid + ft, ... one pair each. Out of line with scalar arguments: inlined, its registers spilled
 * into the kernel's tile loop (and with the parameters by reference, p went to the stack). */
__device__ __noinline__ void fa_rope_tables(int nq,
                                            int no,
                                            float qpos,
                                            float opos,
                                            const float *qf,
                                            const float *of,
                                            bool inv,
                                            float2 *csq,
                                            float2 *cso,
                                            int tid,
                                            int ft) {
    for (int i = tid; i < nq + no; i += ft) {
        if (i < nq)
            csq[i] = rope_cs<>(qpos, qf[i], false);
        else
            cso[i - nq] = rope_cs<>(opos, of[i - nq], inv);
    }
}

/* HQ = head_dim / 128: a warp's quarter of head_dim has 2 HQ k16 steps and 4 HQ n8 tiles. K8:
 * FP8 rows as 16-byte chunks (fa_k8_ok), decoded to bf16 as FP8 weights are (tc_decode_w). */
template <int HQ, bool K8, int HB, int KT>
__global__ void __launch_bounds__(HB * 8, 64 / HB) k_attn_fa(struct attn_p p) {
    constexpr int FT = HB * 8, WM = HB / 16; /* threads; warps along the heads */
    /* keys per thread in the softmax step (n8 tiles of scores); P's and the partial scores'
       row lengths */
    /* (LS: rows 8 floats apart in banks, so that the float2 stores of an mma fragment's pairs,
       a half-warp's rows g = 0..3, fill the 32 banks once; step 50's Nsight: with KT + 1 those
       scalar stores took 4 wavefronts each, two thirds of the CSA layer's excess shared
       wavefronts. The softmax step reads a head's KK keys as one vector.) */
    constexpr int KK = KT / 8, LP = KT + 8, LS = KT + 8;
    static_assert(KK == 2 || KK == 4, "k_attn_fa: tiles of 16 or 32 keys");
    cu_pdl_enter();
    constexpr int HD = 128 * HQ, LDK = HD + 8, DQ = HD / 4, NT = DQ / 8,
                  NV = K8 ? 1 : KT * HD / 4 / FT, /* float4 of a tile's keys per thread */
        NC = (KT * HD / 8 + FT - 1) / FT;         /* K8: a tile's chunks per thread at most */
    extern __shared__ uint4 fa_smem[];
    const fa_smem_layout L = fa_layout(HD, HB, KT);
    char *base = (char *)fa_smem;
    uint16_t *Qs = (uint16_t *)(base + L.q), *Ks = (uint16_t *)(base + L.k);
    float(*Sp)[HB][LS] = (float(*)[HB][LS])(base + L.sp);
    uint16_t *Ps = (uint16_t *)(base + L.pr);
    float *Ms = (float *)(base + L.st), *Ls = Ms + HB, *Fs = Ls + HB;
    int64_t *Kp = (int64_t *)(base + L.kp); /* [2][16]: the keys (attn_kh) of tiles t, t + 1 */
    /* the row's RoPE cosines and sines, q's (CSq[i]: qn_freq[i] at qn_pos[r]) and the output's
       (CSo[i]: or_freq[i] at or_pos[r], the sine negated for or_inv): rope_cs once a frequency,
       where each head computed them again (64x the double-precision sine and cosine; step 39) */
    float2 *CSq = (float2 *)(base + L.cs), *CSo = CSq + HD / 2;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wm = warp % WM, wn = warp / WM;
    int g = lane >> 2, t4 = lane & 3;
    int r = blockIdx.x, h0 = blockIdx.y * HB;
    int64_t w0;
    int nk = attn_nkeys(p, r, &w0);
    /* q rows -> bf16 (zeros past the last head), QB loads in flight per thread: the loads go
       first (heads past the last read the last head's row), then the stores (step 24: one
       load then its store per step made 16 dependent round trips per block at head_dim 512) */
    constexpr int QN = HB * (HD / 4) / FT, QB = QN % 8 == 0 ? 8 : QN % 4 == 0 ? 4 : QN;
    static_assert(QN * FT == HB * (HD / 4) && QN % QB == 0, "q staging");
    {
        int nq = p.qn_on ? p.qn_rope / 2 : 0, no = p.or_on && !p.fa_o ? p.or_rope / 2 : 0;
        if (nq + no > 0) {
            fa_rope_tables(nq, no, nq ? (float)p.qn_pos[r] : 0.0f, no ? (float)p.or_pos[r] : 0.0f,
                           p.qn_freq, p.or_freq, p.or_inv, CSq, CSo, tid, FT);
            __syncthreads();
        }
    }
    if (p.qn_on)
        fa_stage_q_norm<HQ, HB>(p, Qs, CSq, r, h0, warp, lane);
    else {
#pragma unroll
        for (int i0 = 0; i0 < QN; i0 += QB) {
            float4 f[QB];
#pragma unroll
            for (int i = 0; i < QB; i++) {
                int e = tid + (i0 + i) * FT, h = e / (HD / 4), c = e % (HD / 4);
                int hh = h0 + h < p.H ? h0 + h : p.H - 1;
                f[i] = ((const float4 *)(p.q + ((int64_t)r * p.H + hh) * HD))[c];
            }
#pragma unroll
            for (int i = 0; i < QB; i++) {
                int e = tid + (i0 + i) * FT, h = e / (HD / 4), c = e % (HD / 4);
                float4 v = h0 + h < p.H ? f[i] : make_float4(0, 0, 0, 0);
                *(uint2 *)(Qs + h * LDK + 4 * c) =
                    make_uint2(bf16x2_rn(v.x, v.y), bf16x2_rn(v.z, v.w));
            }
        }
    }
    if (tid < HB) {
        Ms[tid] = -INFINITY;
        Ls[tid] = 0.0f;
    }
    int ntile = (nk + KT - 1) / KT;
    /* this block's tiles [t0, t0 + nt) (split along the keys: blockIdx.z; else all) */
    int t0 = p.fa_o ? (int)blockIdx.z * p.fa_tps : 0;
    int nt = p.fa_o ? min(ntile - t0, p.fa_tps) : ntile;
    /* The key rows of a tile (window slot, selection, page table: dependent loads) are looked
     * up by lanes 0..15 of warp 0 two tiles ahead, kept in a register for a tile and written to
     * Kp before the barrier after which that tile's loads are issued: the chain's latency is
     * hidden behind a tile's work. */
    auto key_row = [&](int jj) { return jj < nk ? attn_kh(p, r, w0, jj) : (int64_t)-1; };
    if (tid < 2 * KT) Kp[tid] = key_row(t0 * KT + tid);
    int64_t nrow = -1;
    float4 kr[NV];
    /* K8: chunks tid + i FT of the tile (nq code chunks and the rope's a key) */
    const int nq = p.nope / 16, cpk = nq + (HD - p.nope) / 8;
    uint4 kc[K8 ? NC : 1];
    uint32_t ks[K8 ? NC : 1];
    /* the tile's keys: this thread's float4 c of key j, v = 0..NV-1 (K8: its chunks) */
    auto load =
        [&](int lt) { /* lt: the tile's index in the block's range */
                      const int64_t *kp = Kp + (lt & 1) * KT;
                      if constexpr (K8) {
#pragma unroll
                          for (int i = 0; i < NC; i++) {
                              int ch = tid + i * FT, j = ch / cpk, q = ch - j * cpk;
                              int64_t kq = j < KT ? kp[j] : -1;
                              kc[i] = make_uint4(0, 0, 0, 0);
                              ks[i] = 127;
                              if (kq >= 0) {
                                  bool ent = (kq & ATTN_KH_ENT) != 0;
                                  int64_t row = kq & (ATTN_KH_ENT - 1);
                                  const uint8_t *d = (ent ? p.ent8 : p.ring8) + row * p.rb;
                                  kc[i] =
                                      __ldg((const uint4 *)(d + (q < nq ? 16 * q
                                                                        : p.nope + 16 * (q - nq))));
                                  if (q < nq)
                                      ks[i] =
                                          __ldg((ent ? p.ent_sc : p.ring_sc) + row * p.sb + q / 4);
                              }
                          }
                      } else {
#pragma unroll
                          for (int v = 0; v < NV; v++) {
                              int idx = tid + v * FT, j = idx / (HD / 4), c = idx % (HD / 4);
                              int64_t kq = kp[j];
                              kr[v] = kq >= 0 ? attn_k4(p, kq, c) : make_float4(0, 0, 0, 0);
                          }
                      }
        };
    float acc[NT][4];
    acc_zero(acc);
    __syncthreads(); /* Kp of tiles 0 and 1 */
    if (nt > 0) load(0);
    for (int lt = 0; lt < nt; lt++) {
        int tile = t0 + lt;
        uint16_t *K = Ks + (lt & 1) * KT * LDK;
        /* tile + 1's rows into the slot of tile - 1 (read by its loads, before barrier B of
           tile - 1, which every thread has passed) */
        if (lt > 0 && tid < KT) Kp[((lt + 1) & 1) * KT + tid] = nrow;
        if constexpr (K8) { /* (a key past the tile's: zeros, scale 1) */
#pragma unroll
            for (int i = 0; i < NC; i++) {
                int ch = tid + i * FT, j = ch / cpk, q = ch - j * cpk;
                if (j >= KT) continue;
                if (q < nq) {
                    struct tc_wraw w;
                    w.v[0] = kc[i];
                    w.sb = ks[i];
                    uint4 o[2];
                    tc_decode_w<DSI_TYPE_F8_E4M3, 0, 2>(w, true, o);
                    /* the halves in the order (q >> 2) & 1, so that a quarter-warp's 8
                       consecutive chunks write 8 distinct 16-byte bank groups in each store
                       (in order, chunks 32 bytes apart took 2 wavefronts a store; step 50) */
                    int sw = (q >> 2) & 1;
                    *(uint4 *)(K + j * LDK + 16 * q + 8 * sw) = sw ? o[1] : o[0];
                    *(uint4 *)(K + j * LDK + 16 * q + 8 * (sw ^ 1)) = sw ? o[0] : o[1];
                } else {
                    *(uint4 *)(K + j * LDK + p.nope + 8 * (q - nq)) = kc[i];
                }
            }
        } else {
#pragma unroll
            for (int v = 0; v < NV; v++) {
                int idx = tid + v * FT, j = idx / (HD / 4), c = idx % (HD / 4);
                *(uint2 *)(K + j * LDK + 4 * c) =
                    make_uint2(bf16x2_rn(kr[v].x, kr[v].y), bf16x2_rn(kr[v].z, kr[v].w));
            }
        }
        __syncthreads(); /* A: the tile's keys, tile + 1's rows (and, first, q, statistics) */
        if (lt + 1 < nt) load(lt + 1);
        if (tid < KT) nrow = key_row((tile + 2) * KT + tid);
        /* partial scores: heads 16 wm.., keys 0..15, head_dim quarter wn */
        float s[KK][4];
#pragma unroll
        for (int j = 0; j < KK; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DQ / 16; kk++) {
            int k0 = wn * DQ + kk * 16;
            uint32_t a[4];
            ldsm_x4(smem_u32(Qs + (wm * 16 + (lane & 15)) * LDK + k0 + (lane >> 4) * 8), a);
#pragma unroll
            for (int kb = 0; kb < KT / 16; kb++) { /* keys 16 kb .. 16 kb + 15 */
                uint32_t b[4];
                ldsm_x4(smem_u32(K + (16 * kb + (lane & 7) + ((lane >> 4) << 3)) * LDK + k0 +
                                 ((lane >> 3) & 1) * 8),
                        b);
                mma_bf16(s[2 * kb], a, b[0], b[1]);
                mma_bf16(s[2 * kb + 1], a, b[2], b[3]);
            }
        }
#pragma unroll
        for (int j = 0; j < KK; j++) {
            *(float2 *)&Sp[wn][wm * 16 + g][j * 8 + 2 * t4] = make_float2(s[j][0], s[j][1]);
            *(float2 *)&Sp[wn][wm * 16 + g + 8][j * 8 + 2 * t4] = make_float2(s[j][2], s[j][3]);
        }
        __syncthreads(); /* B: the partial scores */
        {                /* softmax step: 8 threads a head, KK keys each */
            int h = tid >> 3, k = (tid & 7) * KK, jj = tile * KT + k;
            float v[KK], e[KK], sp[4][KK];
#pragma unroll
            for (int w = 0; w < 4; w++) {
                if constexpr (KK == 4) {
                    float4 x = *(const float4 *)&Sp[w][h][k];
                    sp[w][0] = x.x, sp[w][1] = x.y, sp[w][2] = x.z, sp[w][3] = x.w;
                } else {
                    float2 x = *(const float2 *)&Sp[w][h][k];
                    sp[w][0] = x.x, sp[w][1] = x.y;
                }
            }
#pragma unroll
            for (int i = 0; i < KK; i++) {
                v[i] = (sp[0][i] + sp[1][i] + sp[2][i] + sp[3][i]) * p.scale;
                if (jj + i >= nk) v[i] = -INFINITY;
            }
            float tm = v[0];
#pragma unroll
            for (int i = 1; i < KK; i++)
                tm = fmaxf(tm, v[i]);
#pragma unroll
            for (int o = 1; o < 8; o <<= 1)
                tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, o));
            float mo = Ms[h], mn = fmaxf(mo, tm); /* mn finite: key tile * KT < nk */
            float sum = 0.0f;
            uint32_t pw[KK / 2]; /* (P's KK values stored as one vector) */
#pragma unroll
            for (int i = 0; i < KK; i += 2) {
                e[i] = jj + i < nk ? bf16_round(fa_exp(v[i] - mn, p.fexp)) : 0.0f;
                e[i + 1] = jj + i + 1 < nk ? bf16_round(fa_exp(v[i + 1] - mn, p.fexp)) : 0.0f;
                pw[i / 2] = bf16x2_rn(e[i], e[i + 1]);
                sum = i == 0 ? e[i] + e[i + 1] : sum + (e[i] + e[i + 1]);
            }
            if constexpr (KK == 4)
                *(uint2 *)(Ps + h * LP + k) = make_uint2(pw[0], pw[1]);
            else
                *(uint32_t *)(Ps + h * LP + k) = pw[0];
#pragma unroll
            for (int o = 1; o < 8; o <<= 1)
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
            __syncwarp(); /* the head's 8 lanes read Ms[h] above before its owner writes it */
            if ((tid & 7) == 0) {
                float f = mo == -INFINITY ? 0.0f : fa_exp(mo - mn, p.fexp);
                Ms[h] = mn;
                Ls[h] = Ls[h] * f + sum;
                Fs[h] = f;
            }
        }
        __syncthreads(); /* C: P and the factors */
        {
            float fa = Fs[wm * 16 + g], fb = Fs[wm * 16 + g + 8];
#pragma unroll
            for (int j = 0; j < NT; j++) {
                acc[j][0] *= fa;
                acc[j][1] *= fa;
                acc[j][2] *= fb;
                acc[j][3] *= fb;
            }
#pragma unroll
            for (int kb = 0; kb < KT / 16; kb++) { /* keys 16 kb .. 16 kb + 15 */
                uint32_t a[4];
                ldsm_x4(smem_u32(Ps + (wm * 16 + (lane & 15)) * LP + 16 * kb + (lane >> 4) * 8), a);
#pragma unroll
                for (int j = 0; j < NT; j += 2) {
                    uint32_t b[4];
                    ldsm_x4_t(smem_u32(K + (16 * kb + (lane & 7) + ((lane >> 3) & 1) * 8) * LDK +
                                       wn * DQ + j * 8 + (lane >> 4) * 8),
                              b);
                    mma_bf16(acc[j], a, b[0], b[1]);
                    mma_bf16(acc[j + 1], a, b[2], b[3]);
                }
            }
        }
    }
    __syncthreads(); /* the last tile's statistics */
    if (p.fa_o) {    /* split: the partial rows and statistics as they are */
        size_t prow = ((size_t)blockIdx.z * gridDim.x + r) * p.H;
        if (tid < HB && h0 + tid < p.H) {
            p.fa_ml[(prow + h0 + tid) * 2] = Ms[tid];
            p.fa_ml[(prow + h0 + tid) * 2 + 1] = Ls[tid];
        }
        /* (a float2 a pair (d, d + 1), as the unsplit end: half the store instructions, whose
           burst at the end throttled the LSU queue at batch 1; step 36) */
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i += 2) {
                int h = h0 + wm * 16 + g + (i >> 1) * 8, d = wn * DQ + j * 8 + 2 * t4;
                if (h < p.H)
                    *(float2 *)(p.fa_o + (prow + h) * HD + d) =
                        make_float2(acc[j][i], acc[j][i + 1]);
            }
        return;
    }
    if (tid < HB) { /* the sink: mx = max(m, sink); out = o f / (l f + exp(sink - mx)) */
        float sink = h0 + tid < p.H ? vec_get(p.sinks, h0 + tid) : 0.0f;
        float m = Ms[tid], mx = fmaxf(m, sink);
        float f = m == -INFINITY ? 0.0f : exp_ref(m - mx);
        Fs[tid] = f / (Ls[tid] * f + exp_ref(sink - mx));
    }
    __syncthreads();
    float fa = Fs[wm * 16 + g], fb = Fs[wm * 16 + g + 8];
    /* out_rope (p.or_on): the lane's pair (d, d + 1) of each row rotated as k_rope does, the
       angle's cosine and sine once for both rows */
    int rs = HD - p.or_rope;
    /* o16 where a warp's quarter of head_dim is one 128-column group (NT 16): the lane's pairs
       p = 4 j + t4 of its two rows kept, then stored 16 bytes at a time: wg_perm_dst(4 j + t4)
       = 16 (j % 4) + 4 t4 + j / 4, so pairs j0, j0 + 4, j0 + 8, j0 + 12 fill the chunk at
       16 j0 + 4 t4 (a row's 4 lanes: 64 contiguous bytes; p.o16v, DSI_CUDA_ATTN_O16V); else a
       pair at a time */
    constexpr bool O16V = NT == 16 && DQ == 128;
    uint32_t o16p[2][O16V ? NT : 1];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        int d = wn * DQ + j * 8 + 2 * t4;
        float2 cs = make_float2(1.0f, 0.0f);
        bool rot = p.or_on && d >= rs;
        if (rot) cs = CSo[(d - rs) / 2];
#pragma unroll
        for (int i = 0; i < 4; i += 2) {
            int h = h0 + wm * 16 + g + (i >> 1) * 8;
            float f = i < 2 ? fa : fb;
            /* (the hardware rounding: bf16_round's bits, 2 instructions against ~8) */
            float x0 = rbf_cvt(acc[j][i] * f + 0.0f, p.round_bf16),
                  x1 = rbf_cvt(acc[j][i + 1] * f + 0.0f, p.round_bf16);
            if (rot) rope_rot(x0, x1, cs.x, cs.y, p.or_round);
            if (h < p.H && !p.o_skip)
                *(float2 *)(p.out + ((int64_t)r * p.H + h) * HD + d) = make_float2(x0, x1);
            if (O16V && p.o16v) {
                if constexpr (O16V) o16p[i >> 1][j] = bf16x2_rn(x0, x1);
            } else if (p.o16 && h < p.H) { /* column c = h HD + d: pair (c % 128) / 2 of its
                                              group at launch_wg_bf16's place */
                int q = wg_perm_dst((d & 127) >> 1);
                uint32_t *o = (uint32_t *)(p.o16 + ((int64_t)r * p.H + h) * HD + (d & ~127));
                o[q] = bf16x2_rn(x0, x1);
            }
        }
    }
    if constexpr (O16V) {
        if (p.o16 && p.o16v) {
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int h = h0 + wm * 16 + g + hh * 8;
                if (h >= p.H) continue;
                uint32_t *o = (uint32_t *)(p.o16 + ((int64_t)r * p.H + h) * HD + wn * DQ);
#pragma unroll
                for (int j0 = 0; j0 < 4; j0++)
                    *(uint4 *)(o + 16 * j0 + 4 * t4) = make_uint4(
                        o16p[hh][j0], o16p[hh][j0 + 4], o16p[hh][j0 + 8], o16p[hh][j0 + 12]);
            }
        }
    }
}

/* The splits' merge: grid (rows, heads), FA_MT threads. With the sink, mx = max(m_z, sink) over
 * the splits z, w_z = exp(m_z - mx) (0 for a split without keys), out = sum_z o_z w_z / (sum_z
 * l_z w_z + exp(sink - mx)), the unsplit kernel's end with the sums in split order. Its time is
 * a chain of loads, so they go out together (step 42; before, three or more round trips to L2
 * one after another: warp 0's m, thread 0's l split by split, then the rows): a thread's float4
 * of the first FA_MQ splits' rows is loaded first, then warp 0 loads every split's (m, l) as one
 * float2 a lane, and the RoPE pairs' (cos, sin) are computed while the rows are in flight. The
 * same operations in the same order as before (the denominator's products added in split order
 * by lane 0 through shuffles), so the same bits. hd <= 4 FA_MT (attn_fa_ok): a float4 a thread. */
#define FA_MT    128
#define FA_S_MAX FA_MT /* splits at most (a weight per thread) */
#define FA_MQ    8     /* splits' rows of a thread in flight at once */
__global__ void __launch_bounds__(FA_MT) k_attn_fa_merge(struct attn_p p, int splits) {
    cu_pdl_enter();
    __shared__ float w_s[FA_S_MAX];
    __shared__ float den_s;
    int r = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, rows = gridDim.x, d = tid * 4;
    size_t zs = (size_t)rows * p.H; /* from one split's (row, head) to the next one's */
    const float *orow = p.fa_o + ((size_t)r * p.H + h) * p.hd + d;
    bool dv = d < p.hd;
    float4 v[FA_MQ];
#pragma unroll
    for (int j = 0; j < FA_MQ; j++)
        v[j] = dv && j < splits ? *(const float4 *)(orow + j * zs * p.hd)
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (tid < 32) { /* warp 0: the maximum, the weights, the denominator (in split order) */
        const float2 *ml = (const float2 *)p.fa_ml + (size_t)r * p.H + h;
        float2 s[FA_S_MAX / 32];
#pragma unroll
        for (int i = 0; i < FA_S_MAX / 32; i++) {
            int z = tid + 32 * i;
            s[i] = z < splits ? ml[z * zs] : make_float2(-INFINITY, 0.0f);
        }
        float sink = vec_get(p.sinks, h), mx = sink;
#pragma unroll
        for (int i = 0; i < FA_S_MAX / 32; i++)
            mx = fmaxf(mx, s[i].x);
        mx = warp_max(mx);
        float lw[FA_S_MAX / 32];
#pragma unroll
        for (int i = 0; i < FA_S_MAX / 32; i++) {
            int z = tid + 32 * i;
            float w = s[i].x == -INFINITY ? 0.0f : exp_ref(s[i].x - mx);
            if (z < splits) w_s[z] = w;
            lw[i] = s[i].y * w;
        }
        float den = 0.0f;
#pragma unroll
        for (int i = 0; i < FA_S_MAX / 32; i++)
            for (int j = 0; j < 32 && 32 * i + j < splits; j++)
                den += __shfl_sync(0xffffffffu, lw[i], j);
        if (tid == 0) den_s = den + exp_ref(sink - mx);
    }
    int rs = p.hd - p.or_rope;
    bool rot = p.or_on && dv && d >= rs;
    float2 c0 = make_float2(1.0f, 0.0f), c1 = c0;
    if (rot) { /* out_rope's two pairs (as k_rope), while the rows are in flight */
        float pp = (float)p.or_pos[r];
        c0 = rope_cs<>(pp, p.or_freq[(d - rs) / 2], p.or_inv);
        c1 = rope_cs<>(pp, p.or_freq[(d - rs) / 2 + 1], p.or_inv);
    }
    __syncthreads();
    if (!dv) return;
    float inv = 1.0f / den_s;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int z0 = 0; z0 < splits; z0 += FA_MQ) {
        if (z0 > 0) {
#pragma unroll
            for (int j = 0; j < FA_MQ; j++)
                if (z0 + j < splits) v[j] = *(const float4 *)(orow + (z0 + j) * zs * p.hd);
        }
#pragma unroll
        for (int j = 0; j < FA_MQ; j++) {
            if (z0 + j >= splits) break;
            float w = w_s[z0 + j];
            o.x += v[j].x * w;
            o.y += v[j].y * w;
            o.z += v[j].z * w;
            o.w += v[j].w * w;
        }
    }
    float4 y =
        make_float4(rbf(o.x * inv + 0.0f, p.round_bf16), rbf(o.y * inv + 0.0f, p.round_bf16),
                    rbf(o.z * inv + 0.0f, p.round_bf16), rbf(o.w * inv + 0.0f, p.round_bf16));
    if (rot) {
        rope_rot(y.x, y.y, c0.x, c0.y, p.or_round);
        rope_rot(y.z, y.w, c1.x, c1.y, p.or_round);
    }
    *(float4 *)(p.out + ((int64_t)r * p.H + h) * p.hd + d) = y;
}

template <int HQ, bool K8, int HB, int KT>
static bool fa_go(struct cu_ctx *c, const struct attn_p *p, int rows, int splits) {
    static bool done = false;
    size_t sm = fa_layout(128 * HQ, HB, KT).total;
    if (!smem_limit(c, k_attn_fa<HQ, K8, HB, KT>, sm, &done, "attn (fused)")) return false;
    dim3 g((unsigned)rows, (unsigned)cu_div_up(p->H, HB), (unsigned)splits);
    cu_launch(c, k_attn_fa<HQ, K8, HB, KT>, g, HB * 8, sm, *p);
    if (p->fa_o)
        cu_launch(c, k_attn_fa_merge, dim3((unsigned)rows, (unsigned)p->H), FA_MT, 0, *p, splits);
    return cu_check(c, "attn (fused)");
}

/* The kernel for heads a block hb (64 or 32) and keys a tile kt (16, or 32 with 64 heads). */
template <int HQ>
static bool
fa_go_hb(struct cu_ctx *c, const struct attn_p *p, int rows, int splits, bool k8, int hb, int kt) {
    if (hb == 32)
        return k8 ? fa_go<HQ, true, 32, FA_KT>(c, p, rows, splits)
                  : fa_go<HQ, false, 32, FA_KT>(c, p, rows, splits);
    if (kt == 32)
        return k8 ? fa_go<HQ, true, FA_HB, 32>(c, p, rows, splits)
                  : fa_go<HQ, false, FA_HB, 32>(c, p, rows, splits);
    return k8 ? fa_go<HQ, true, FA_HB, FA_KT>(c, p, rows, splits)
              : fa_go<HQ, false, FA_HB, FA_KT>(c, p, rows, splits);
}

bool launch_attn_fa(struct cu_ctx *c, const struct attn_p *p0, int rows, bool *o16_kept) {
    /* Split along the keys where the grid is under a block per SM (decode at few rows): about
       one block per SM, at least 2 tiles a split (attention at 1-31 rows took three launches
       of the exact / tensor-core kernels before, step 24) */
    struct attn_p p = *p0;
    /* heads per block: 64, or 32 (half the shared memory and threads, two blocks per SM; step
       33); keys a tile: 32 with 64 heads where asked for and the layout fits, else 16 (attn.cuh's
       attn_fa_cfg_of: by the rows, or forced by DSI_CUDA_ATTN_FA_HB / _KT) */
    attn_fa_cfg fc = attn_fa_cfg_of(c, rows);
    int hb = fc.hb == 32 ? 32 : FA_HB;
    int kt = hb == FA_HB && fc.kt == 32 && fa_layout((int)p.hd, FA_HB, 32).total <= c->smem_optin
                 ? 32
                 : FA_KT;
    int64_t tiles = cu_div_up(p.maxk, kt), blocks = (int64_t)rows * cu_div_up(p.H, hb);
    int64_t splits = 1, tps = tiles;
    p.fa_o = p.fa_ml = NULL;
    p.fa_tps = 0;
    if (c->attn_fa_split && blocks < c->n_sms && tiles >= 4) {
        tps = std::max<int64_t>(2, cu_div_up(tiles, cu_div_up(c->n_sms, blocks)));
        tps = std::max<int64_t>(tps, cu_div_up(tiles, FA_S_MAX));
        splits = cu_div_up(tiles, tps);
    }
    if (splits > 1) {
        p.o16 = NULL; /* (the merge writes out) */
        p.o_skip = false;
        size_t ob = (size_t)(splits * rows * p.H * p.hd) * 4;
        char *s = (char *)cu_scratch(c, CU_SCR_OP, ob + (size_t)(splits * rows * p.H * 2) * 4);
        if (!s) return false;
        p.fa_o = (float *)s;
        p.fa_ml = (float *)(s + ob);
        p.fa_tps = (int)tps;
    }
    bool k8 = c->attn_fa_k8 && fa_k8_ok(&p);
    int sp = (int)splits;
    if (o16_kept) *o16_kept = p.o16 != NULL;
    switch (p.hd / 128) {
    case 1:
        return fa_go_hb<1>(c, &p, rows, sp, k8, hb, kt);
    case 2:
        return fa_go_hb<2>(c, &p, rows, sp, k8, hb, kt);
    case 3:
        return fa_go_hb<3>(c, &p, rows, sp, k8, hb, kt);
    default:
        return fa_go_hb<4>(c, &p, rows, sp, k8, hb, kt);
    }
}
