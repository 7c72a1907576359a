#!/usr/bin/env python3
# wg_layout_check.py - checks the index and bit arithmetic of the prefill's wgmma kernels on the
# CPU, with numpy, by emulating what the kernels compute (not the hardware: prmt as PTX defines
# it, the 8-bit wgmma A fragment as CUTLASS's ALayout_64x32 describes it):
# - wgr.cu (step 27): each thread's activation copies (chunk tid % 16 of rows tid / 16 + 16 v, one
#   swizzled offset plus 2048 v) land where wg_sw puts them and cover each tile exactly once, for
#   every block width; k_wg_bf16_q8's lane L writes its pairs where wg_perm_col reads them;
# - wgq.cu (step 28): its copies (chunk tid % 8 of rows tid / 8 + 32 v, + 4096 v); the FP4 -> e4m3
#   table's fast path against the conversion for every exponent offset it takes (-5 .. 6); one
#   warp's rows through the codes' permutation, the per-lane conversion, the fragments and the
#   promotion against the direct dot products of the reference numerics (exact while a row's
#   scales span at most 2^14 over its K);
# - wgr.cu's K loop (step 51): the stage, phase and refilled stage counted along the loop, the
#   descriptors from their two words, and SB's scale bounds (tc_sb_short).
# No GPU needed; run from anywhere: python3 tools/wg_layout_check.py (exit status 1 on a
# mismatch). Written in steps 27-28 and 51 (docs/cuda.md), before any GPU run of that code.
import numpy as np
rng = np.random.default_rng(1)

def e4m3_val(c):
    s = -1.0 if c & 0x80 else 1.0
    e = (c >> 3) & 15; m = c & 7
    if e == 0: return s * m * 2.0**-9
    return s * (1 + m / 8) * 2.0**(e - 7)
E4 = np.array([e4m3_val(c) for c in range(256)])
E4[0x7f] = np.nan; E4[0xff] = np.nan
def e4m3_enc(v):  # RNE, satfinite
    v = max(-448.0, min(448.0, v))
    best = None
    for c in range(256):
        if np.isnan(E4[c]): continue
        d = abs(E4[c] - v)
        if best is None or d < best[0] - 1e-300 or (d == best[0] and (c & 1) == 0 and (best[1] & 1)):
            best = (d, c)
    return best[1]
FP4 = [0, .5, 1, 1.5, 2, 3, 4, 6]
def fp4_val(code): return (-1 if code & 8 else 1) * FP4[code & 7]

def prmt(a, b, c):
    by = [(a >> (8*i)) & 255 for i in range(4)] + [(b >> (8*i)) & 255 for i in range(4)]
    d = 0
    for i in range(4):
        sel = (c >> (4*i)) & 15
        v = by[sel & 7]
        if sel & 8: v = 0xff if v & 0x80 else 0
        d |= v << (8*i)
    return d

def table(dp):  # wq_table
    if dp >= -5:
        return (0x3c383000 + dp*0x08080800) & 0xffffffff, (0x4c484440 + dp*0x08080808) & 0xffffffff
    b = [e4m3_enc(m * 2.0**dp) for m in FP4]
    return b[0]|b[1]<<8|b[2]<<16|b[3]<<24, b[4]|b[5]<<8|b[6]<<16|b[7]<<24

def e2m1x8(x, t0, t1):
    m = x & 0x77777777; sx = (x << 4) & 0xffffffff
    lo = prmt(t0, t1, m) | (prmt(sx, x, 0xd9c8) & 0x80808080)
    hi = prmt(t0, t1, m >> 16) | (prmt(sx, x, 0xfbea) & 0x80808080)
    return lo, hi

def perm_byte(c): return 32*((c & 15) >> 2) + 8*(c >> 5) + 4*((c >> 4) & 1) + (c & 3)

def run(spread, K=256, N=24):
    M = 16  # one warp: rows g, g + 8
    codes = rng.integers(0, 16, size=(M, K))
    S = rng.integers(120 - spread, 121, size=(M, K // 32))
    W = np.array([[fp4_val(codes[m, k]) * 2.0**(S[m, k // 32] - 127) for k in range(K)] for m in range(M)])
    packed = np.zeros((M, K // 2), dtype=np.int64)
    for m in range(M):
        for k in range(0, K, 2): packed[m, k // 2] = codes[m, k] | codes[m, k + 1] << 4
    # activations: act_quant per 128 and the codes kernel's permuted words
    x = rng.standard_normal((N, K)) * rng.uniform(0.01, 10, size=(N, 1))
    xq = np.zeros((N, K)); xc = np.zeros((N, K), dtype=np.int64); xs = np.zeros((N, K // 128))
    for n in range(N):
        for b in range(K // 128):
            blk = x[n, 128*b:128*b+128]
            amax = max(np.abs(blk).max(), 1e-4)
            s = 2.0**np.ceil(np.log2(amax / 448)); xs[n, b] = s
            for L in range(32):
                word = 8*((L >> 1) & 3) + 4*(L & 1) + (L >> 3)
                for j in range(4):
                    c = e4m3_enc(blk[4*L + j] / s)
                    xq[n, 128*b + 4*L + j] = E4[c] * s
                    xc[n, 128*b + 4*word + j] = c
    # check the permutation's inverse
    for n in range(N):
        for b in range(K // 128):
            for c in range(128):
                assert xq[n, 128*b + perm_byte(c)] == E4[xc[n, 128*b + c]] * xs[n, b]
    ref = W @ xq.T
    acc = np.zeros((M, N))
    for s in range(K // 128):
        A = np.zeros((M, 128))  # the fragments' values (as e4m3) per slice i: A[m][32 i + col]
        ws = np.zeros(M)
        for g in range(8):
            for h in range(2):
                m = g + 8*h
                sbs = [S[m, (s*128 + 32*t) // 32] for t in range(4)]
                B = S[m].max()  # wq_row_base: the row's largest scale over its whole K
                for t in range(4):
                    t0, t1 = table(sbs[t] - B + 6)
                    off = (s*128 + 32*t) // 2
                    words = [sum(int(packed[m, off + 4*q + r]) << (8*r) for r in range(4)) for q in range(4)]
                    for i in range(4):
                        lo, hi = e2m1x8(words[i], t0, t1)
                        # a[i][h] = lo: cols 4t..4t+3; a[i][2+h] = hi: cols 16+4t..
                        for j in range(4):
                            A[m, 32*i + 4*t + j] = E4[(lo >> (8*j)) & 255]
                            A[m, 32*i + 16 + 4*t + j] = E4[(hi >> (8*j)) & 255]
                ws[m] = 2.0**(B - 133)  # applied once, after the loop
        Bm = np.array([[E4[xc[n, 128*s + c]] for c in range(128)] for n in range(N)])
        part = A @ Bm.T
        acc += part * xs[:, s][None, :]  # the promotion: the activation scale only
    acc *= ws[:, None]
    err = np.abs(acc - ref).max() / np.abs(ref).max()
    return err

def fast_table(dp):
    return (0x3c383000 + dp*0x08080800) & 0xffffffff, (0x4c484440 + dp*0x08080808) & 0xffffffff

def wg_sw(r, c):  # wg.cuh
    return r * 128 + ((c ^ (r & 7)) << 4)

def wg_perm_col(q):  # wg.cuh: the source column of pair q's first element
    qq = q & 63; i = qq >> 3; m = qq & 7
    return (q >> 6) * 128 + 32 * (m & 3) + 4 * i + 2 * (m >> 2)

bad = 0
# wgr.cu's copies (bf16: 16 chunks of 16 bytes a row and step, two 64-k sub-tiles of BN x 128 B)
for BN in (64, 128, 192, 224, 256):
    SUB = BN * 128; seen = {}
    for tid in range(256):
        xc, xj = tid & 15, tid >> 4
        xoff = (xc >> 3) * SUB + wg_sw(xj, xc & 7)
        for v in range(BN * 16 // 256):
            j = xj + 16 * v
            if xoff + 2048 * v != (xc >> 3) * SUB + wg_sw(j, xc & 7):
                print("wgr copy offset wrong: BN", BN, "tid", tid, "v", v); bad += 1
            seen[(j, xc)] = seen.get((j, xc), 0) + 1
    if sorted(seen) != [(j, c) for j in range(BN) for c in range(16)] or set(seen.values()) != {1}:
        print("wgr copies do not cover the tile once: BN", BN); bad += 1
# k_wg_bf16_q8: lane L holds elements 4 L .. 4 L + 3 of a group; its pairs go to q0 and q0 + 4
for L in range(32):
    q0 = 8 * (L & 7) + (L >> 3)
    if wg_perm_col(q0) != 4 * L or wg_perm_col(q0 + 4) != 4 * L + 2:
        print("k_wg_bf16_q8 lane", L, "pairs misplaced"); bad += 1
# wgq.cu's copies (FP8: 8 chunks a row and step, one 128-byte swizzled tile of BN rows)
for BN in (32, 64, 128):
    seen = {}
    for tid in range(256):
        xc, xj = tid & 7, tid >> 3
        for v in range(BN * 8 // 256):
            j = xj + 32 * v
            if wg_sw(xj, xc) + 4096 * v != wg_sw(j, xc):
                print("wgq copy offset wrong: BN", BN, "tid", tid, "v", v); bad += 1
            seen[(j, xc)] = seen.get((j, xc), 0) + 1
    if sorted(seen) != [(j, c) for j in range(BN) for c in range(8)] or set(seen.values()) != {1}:
        print("wgq copies do not cover the tile once: BN", BN); bad += 1
print("copies and k_wg_bf16_q8's pairs:", "FAILED" if bad else "ok")

# wgr.cu's K loop after step 51: the stage and phase counted along the loop (stg, ph) against
# s % WR_ST and (s / WR_ST) & 1; the refilled stage by one select against (s + WR_AH) % WR_ST;
# and each slice's descriptor as the low word plus 2 ii
# over the constant high word (wg_desc_lo, wg_desc_of) against wg_desc of the slice's address
def wg_desc(a):  # wg.cuh, the whole descriptor
    return ((a & 0x3ffff) >> 4) | (1 << 16) | ((1024 >> 4) << 32) | (1 << 62)
WG_DESC_HI = (1024 >> 4) | (1 << 30)
for BN in (64, 128, 192, 224, 256):
    ST = 3 if BN > 192 else 4; AH = ST - 2; STAGE = BN * 256; SUB = BN * 128
    stg = ph = 0
    for st in range(70):
        if stg != st % ST or ph != (st // ST) & 1:
            print("wgr stage counters wrong: BN", BN, "step", st); bad += 1
        if (stg - 2 if stg >= 2 else stg + AH) != (st + AH) % ST:
            print("wgr refilled stage wrong: BN", BN, "step", st); bad += 1
        stg += 1
        if stg == ST: stg = 0; ph ^= 1
    for base in range(0x400, 0x40000 - ST * STAGE, 0x400 * 7):
        for sg in range(ST):
            for half in (0, 1):
                b0 = base + sg * STAGE + half * SUB
                lo = ((b0 & 0x3ffff) >> 4) | (1 << 16)
                for ii in range(4):
                    if ((WG_DESC_HI << 32) | (lo + 2 * ii)) != wg_desc(b0 + 32 * ii):
                        print("wgr descriptor wrong: BN", BN, "address", hex(b0), "slice", ii)
                        bad += 1
# SB (step 51): tc_sb_short's bounds are the largest scale bytes whose bf16x2_pow2 factor
# (2^(sb + bias - 127), bias 126 for FP4 and 120 for FP8) is a finite bf16: exponent field <= 254
for bias, short in ((126, 128), (120, 134)):
    if max(sb for sb in range(256) if sb + bias <= 254) != short:
        print("tc_sb_short wrong for bias", bias); bad += 1
print("wgr.cu's counters, descriptors and SB bounds:", "FAILED" if bad else "ok")

for dp in range(-5, 7):
    b = [e4m3_enc(m * 2.0**dp) for m in FP4]
    if fast_table(dp) != (b[0]|b[1]<<8|b[2]<<16|b[3]<<24, b[4]|b[5]<<8|b[6]<<16|b[7]<<24):
        print("table fast path wrong at dp", dp); bad += 1
for spread in (0, 3, 6, 10, 14, 20):
    err = run(spread)
    print("scale spread 2^%d within a row: relative error %.3g" % (spread, err))
    if err > (0 if spread <= 14 else 1e-4):
        print("  mismatch"); bad += 1
print("wg layout check:", "FAILED" if bad else "ok")
raise SystemExit(1 if bad else 0)
