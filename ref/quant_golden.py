#!/usr/bin/env python3
"""Number-format and [QAT]-helper goldens: tests/golden/quant/.

    python3 ref/make_goldens.py          # everything
    python3 ref/quant_golden.py          # just tests/golden/quant/

THE FILES UNDER tests/golden/ ARE GENERATED. NEVER EDIT THEM BY HAND; change this script and rerun.

tests/golden/quant/quant.safetensors (written by ref/dsv4_common.write_safetensors):
  fp8.weight    F8_E4M3 [256, 384]   every one of the 256 byte values occurs (incl. NaN 0x7F / 0xFF,
                                     +-0, subnormals)
  fp8.scale     F8_E8M0 [2, 3]       one UE8M0 byte per 128x128 tile, bytes in 100..140
  fp4.weight    I8 [64, 64]          packed FP4 e2m1, logical [64, 128]; all 16 codes occur in both the
                                     low (even element) and the high (odd element) nibble
  fp4.scale     F8_E8M0 [64, 4]      one byte per (row, 32 logical elements), bytes in 100..140
  fp8_expected  F32 [256, 384]       e4m3(b) * 2^(S[o/128, k/128] - 127); NaN where b is 0x7F / 0xFF
  fp4_expected  F32 [64, 128]        fp4(code) * 2^(S[o, k/32] - 127)
Decoding rules (spec 6.4): e4m3fn normal (-1)^s 2^(e-7) (1 + m/8), subnormal (-1)^s 2^-6 m/8,
0x7F/0xFF NaN; UE8M0 2^(b-127); FP4 codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6, bit 3 = sign, low
nibble first. The numpy decoder is checked against torch's float8_e4m3fn / float8_e8m0fnu casts and
the FP4 table against a bit-formula decoder.

tests/golden/quant/qat_cases.json: hand-checkable cases of the spec 4.1 helpers, computed with
numpy float32 (ref/dsv4_common.py). Every float is given twice, as a float.hex() string (`*_hex`)
and as a decimal (the shortest repr of the float32 value widened to double), e.g. "x_hex" / "x".
  ue8m0     : amax -> exponent e, byte e + 127 and scale 2^e for FP8 (M 448, floor 1e-4) and FP4
              (M 6, floor 6*2^-126); e = ceil(log2(max(amax, floor) / M)) from the fp32 bits of the
              fp32 quotient (checked equal to the exact rational answer for every case)
  cast_e4m3 : x -> byte and value of e4m3(clamp(x, -448, 448)) (round to nearest even)
  cast_e2m1 : x -> 4-bit code and value of e2m1(clamp(x, -6, 6)) (round to nearest even)
  q8        : Q8(x, B) round trips, B = 64 and 128: x, per-block exponents, y
  q4        : Q4(x, 32) round trips: x, per-block exponents, y
  hadamard  : 128-point Walsh-Hadamard, Sylvester order (H_{2n} = [[H, H], [H, -H]], i.e. the
              standard in-place fast WHT): x, "unscaled" = H x (exact for the integer case), and
              "scaled" = H x / sqrt(128) correctly rounded to float32 from float64 (an fp32 FWHT
              followed by a multiply by fp32(128^-0.5) may differ by 1 ulp).
"""

import json
import math
import os
import sys
from fractions import Fraction

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsv4_common as C  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hexdec(arr):
    arr = np.asarray(arr, dtype=np.float32).reshape(-1)
    h, d = zip(*(C.fmt_f32(v) for v in arr)) if arr.size else ((), ())
    return list(h), [float(x) if x != "nan" else None for x in d]


def put(case, key, arr):
    h, d = hexdec(arr)
    case[key + "_hex"] = h
    case[key] = d


# ------------------------------------------------------------------------------------------
# quant.safetensors


def fp4_bits_decode(code):
    """Independent e2m1 decoder: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0."""
    code = np.asarray(code, np.int64)
    s = np.where(code & 8, -1.0, 1.0)
    e = (code >> 1) & 3
    m = code & 1
    v = np.where(e == 0, 0.5 * m, np.ldexp(1.0 + 0.5 * m, e - 1))
    return (s * v).astype(np.float32)


def build_quant_tensors():
    import torch
    o = np.arange(256)[:, None]
    k = np.arange(384)[None, :]
    b8 = ((o * 37 + k * 101 + ((o * k) >> 5)) & 0xFF).astype(np.uint8)
    assert len(np.unique(b8)) == 256
    for t in range(2):
        for u in range(3):
            assert len(np.unique(b8[t * 128:(t + 1) * 128, u * 128:(u + 1) * 128])) == 256
    s8 = np.array([[100, 113, 127], [140, 120, 134]], dtype=np.uint8)
    exp8 = C.dequant_fp8_weight(b8, s8)
    # torch cross-check of the decoders
    tv = torch.from_numpy(b8).view(torch.float8_e4m3fn).float().numpy()
    ts = torch.from_numpy(s8.copy()).view(torch.float8_e8m0fnu).float().numpy()
    assert np.array_equal(np.isnan(tv), np.isnan(C.e4m3_decode(b8)))
    assert np.array_equal(tv[~np.isnan(tv)], C.e4m3_decode(b8)[~np.isnan(tv)])
    assert np.array_equal(ts, C.ue8m0_decode(s8))
    ref8 = tv * np.repeat(np.repeat(ts, 128, 0), 128, 1)
    assert np.array_equal(np.isnan(ref8), np.isnan(exp8)) and np.array_equal(ref8[~np.isnan(ref8)], exp8[~np.isnan(exp8)])
    assert np.array_equal(np.isnan(exp8), (b8 & 0x7F) == 0x7F)  # exactly the 0x7F / 0xFF positions
    # every byte value, scalar decode by the written formula
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 15, b & 7
        want = float("nan") if (e, m) == (15, 7) else (s * 2.0 ** -6 * m / 8 if e == 0 else s * 2.0 ** (e - 7) * (1 + m / 8))
        got = float(C.E4M3_TABLE[b])
        assert (math.isnan(want) and math.isnan(got)) or want == got, b

    o = np.arange(64)[:, None]
    j = np.arange(64)[None, :]
    lo = ((o + j) % 16).astype(np.uint8)
    hi = ((3 * o + 5 * j + 7) % 16).astype(np.uint8)
    assert len(np.unique(lo)) == 16 and len(np.unique(hi)) == 16
    p4 = (lo | (hi << 4)).astype(np.uint8).view(np.int8)
    s4 = (100 + (np.arange(64)[:, None] * 7 + np.arange(4)[None, :] * 13) % 41).astype(np.uint8)
    assert s4.min() >= 100 and s4.max() <= 140
    exp4 = C.dequant_fp4_weight(p4, s4)
    codes = np.empty((64, 128), np.uint8)
    codes[:, 0::2], codes[:, 1::2] = lo, hi
    ref4 = fp4_bits_decode(codes) * np.repeat(C.ue8m0_decode(s4), 32, axis=1)
    assert np.array_equal(ref4, exp4)
    assert np.array_equal(fp4_bits_decode(np.arange(16)), C.E2M1_TABLE)
    return [
        ("fp8.weight", "F8_E4M3", b8.shape, b8),
        ("fp8.scale", "F8_E8M0", s8.shape, s8),
        ("fp4.weight", "I8", p4.shape, p4),
        ("fp4.scale", "F8_E8M0", s4.shape, s4),
        ("fp8_expected", "F32", exp8.shape, exp8.astype("<f4")),
        ("fp4_expected", "F32", exp4.shape, exp4.astype("<f4")),
    ]

# ------------------------------------------------------------------------------------------
# qat_cases.json


def exact_exponent(a, M, floor):
    q = Fraction(max(float(np.float32(a)), float(np.float32(floor)))) / Fraction(M)
    e = 0
    while Fraction(2) ** e < q:
        e += 1
    while Fraction(2) ** (e - 1) >= q:
        e -= 1
    return e


def ue8m0_cases():
    out = []
    f32 = np.float32
    up = lambda v: np.nextafter(f32(v), f32(np.inf))  # noqa: E731
    fp8 = [448, up(448), 896, up(896), 897, 449, 447, 224, up(224), 1.0, 0.5, 3.5, 1e-3, 1e-4,
           up(1e-4), 9.9e-5, 1e-6, 0.0, 448 * 2.0 ** -20, up(448 * 2.0 ** -20), 1e30, 3.0e38]
    fp4 = [6, up(6), 12, up(12), 7, 5.9, 3, 1.5, 0.75, 1.0, 6 * 2.0 ** -126, up(6 * 2.0 ** -126),
           2.0 ** -126, 0.0, 1e-30, 6 * 2.0 ** 100, up(6 * 2.0 ** 100)]
    for kind, M, floor, vals in (("fp8", 448.0, C.FP8_AMAX_FLOOR, fp8), ("fp4", 6.0, C.FP4_AMAX_FLOOR, fp4)):
        for a in vals:
            a = f32(a)
            e = int(C.ue8m0_exponent(np.array([a]), M, floor)[0])
            assert e == exact_exponent(a, M, floor), (kind, a)
            assert -127 <= e <= 127
            h, d = C.fmt_f32(a)
            sh, sd = C.fmt_f32(np.ldexp(f32(1), e))
            fh, fd = C.fmt_f32(floor)
            out.append({"format": kind, "fmt_max": M, "floor_hex": fh, "floor": float(fd),
                        "amax_hex": h, "amax": float(d), "exponent": e, "byte": e + 127,
                        "scale_hex": sh, "scale": float(sd)})
    return out


def cast_cases():
    e4 = np.array([0, -0.0, 1.0, 1.0625, 1.1875, 1.125, 17, 19, 272, 304, 432, 440, 448, 460, 464, 1000,
                   -1.0625, -19, -432, -1000, 2.0 ** -9, 0.5 * 2.0 ** -9, 1.5 * 2.0 ** -9, 2.5 * 2.0 ** -9,
                   -0.5 * 2.0 ** -9, 0.75 * 2.0 ** -9, 2.0 ** -6, 0.9375 * 2.0 ** -6, 0.96875 * 2.0 ** -6,
                   3.14159, -2.71828, 100.5, 0.1], dtype=np.float32)
    c = np.clip(e4, -448, 448)
    b = C.e4m3_encode(c)
    import torch
    tb = torch.from_numpy(c.copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(b, tb), (e4[b != tb], b[b != tb], tb[b != tb])
    ce4 = {}
    put(ce4, "x", e4)
    ce4["byte"] = [int(v) for v in b]
    put(ce4, "y", C.e4m3_decode(b))
    e2 = np.array([0, -0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5,
                   0.24, 0.26, 0.74, 2.49, 2.51, 4.99, 5.01, 5.5, 6, 6.5, 7, 100, -7, 0.5, 3], dtype=np.float32)
    c2 = np.clip(e2, -6, 6)
    code = C.e2m1_encode(c2)
    ce2 = {}
    put(ce2, "x", e2)
    ce2["code"] = [int(v) for v in code]
    put(ce2, "y", C.e2m1_decode(code))
    # the tie rule of spec 4.1: 0.25/1.25/2.5/5 down, 0.75/1.75/3.5 up
    assert list(C.e2m1_decode(code)[2:9]) == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    return ce4, ce2


def q8_cases():
    f32 = np.float32
    rng = np.random.default_rng(8)
    cases = []
    # B = 64: block 0 amax 28 = 448 * 2^-4 -> s = 2^-4, with RNE ties in the scaled domain
    s = 2.0 ** -4
    ties = [448, 1.0625, 1.1875, 17, 19, 272, 304, 432, -1.0625, -19, -304, 0.5 * 2.0 ** -9,
            1.5 * 2.0 ** -9, 2.5 * 2.0 ** -9, -1.5 * 2.0 ** -9, 0.0, -0.0, 2.0 ** -6, 0.9375 * 2.0 ** -6]
    b0 = np.concatenate([np.array(ties) * s, rng.uniform(-20, 20, 64 - len(ties))]).astype(f32)
    b1 = rng.standard_normal(64).astype(f32) * f32(0.37)          # non-power-of-two amax
    b2 = np.zeros(64, f32)                                          # all zero: floor 1e-4
    b3 = (rng.standard_normal(64) * 1e-6).astype(f32)               # below the floor
    b3[0] = f32(-3e-6)
    x64 = np.concatenate([b0, b1, b2, b3])
    # B = 128: two blocks
    c0 = rng.standard_normal(128).astype(f32) * f32(100.0)
    c0[5] = f32(-1000.0)                                            # amax 1000 -> s = 4
    c0[6] = f32(2 * 4 * 17.0)                                       # tie 17*s*2 = 34*s: exact
    c0[7] = f32(4 * 19.0)                                           # 19 -> 20 (tie, even)
    c1 = rng.uniform(-1.3, 1.3, 128).astype(f32)
    c1[0] = f32(1.3)
    x128 = np.concatenate([c0, c1])
    for B, x in ((64, x64), (128, x128)):
        y, e = C.q8_roundtrip(x, B)
        # independent check with torch's e4m3 cast
        import torch
        sc = np.ldexp(f32(1), np.repeat(e, B)).astype(f32)
        q = np.clip(x / sc, -448, 448).astype(f32)
        ty = torch.from_numpy(q).to(torch.float8_e4m3fn).float().numpy() * sc
        assert np.array_equal(ty, y)
        case = {"block": B}
        put(case, "x", x)
        case["exponents"] = [int(v) for v in e]
        put(case, "y", y)
        cases.append(case)
    return cases


def q4_cases():
    f32 = np.float32
    ties = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5,
            0.3, 0.74, 2.6, 4.9, 5.5, 5.9, -6, 0.0, -0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 0.1, -0.2]
    assert len(ties) == 32
    t = np.array(ties, f32)
    blk0 = t                              # amax 6 -> s = 1
    blk1 = t * f32(2.0 ** -6)             # amax 0.09375 -> s = 2^-6
    blk2 = t * f32(7.0 / 6.0)             # amax 7 -> s = 2: scaled values t * 7/12
    blk2[0] = f32(7.0)
    blk2[1:8] = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5], f32) * f32(2.0)  # ties at s = 2
    blk3 = np.zeros(32, f32)              # floor 6*2^-126
    x = np.concatenate([blk0, blk1, blk2, blk3])
    y, e = C.q4_roundtrip(x, 32)
    assert list(e) == [0, -6, 1, -126], e
    assert list(y[1:8]) == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert list(y[65:72]) == [0.0, 2.0, 2.0, 4.0, 4.0, 8.0, 8.0]
    case = {"block": 32}
    put(case, "x", x)
    case["exponents"] = [int(v) for v in e]
    put(case, "y", y)
    return [case]


def hadamard_cases():
    n = 128
    H = C.sylvester_hadamard(n)
    xs = [
        ("integer", np.array([((i * 37) % 17) - 8 for i in range(n)], np.float32)),
        ("impulse_1", np.eye(n, dtype=np.float32)[1]),
        ("gaussian", np.random.default_rng(128).standard_normal(n).astype(np.float32)),
    ]
    out = []
    for name, x in xs:
        u32 = C.fwht(x.astype(np.float32))
        u64 = H @ x.astype(np.float64)
        assert np.array_equal(C.fwht(x.astype(np.float64)), u64)
        if name != "gaussian":
            assert np.array_equal(u32.astype(np.float64), u64)  # exact in fp32
        scaled = (u64 / math.sqrt(n)).astype(np.float32)
        case = {"name": name, "n": n}
        put(case, "x", x)
        put(case, "unscaled", u64.astype(np.float32))
        put(case, "scaled", scaled)
        out.append(case)
    assert out[1]["unscaled"][:4] == [1.0, -1.0, 1.0, -1.0]  # Sylvester order: column 1 = (+,-,+,-,...)
    return out


def main(out_root=None):
    out_dir = os.path.join(out_root or os.path.join(ROOT, "tests", "golden"), "quant")
    os.makedirs(out_dir, exist_ok=True)
    ents = build_quant_tensors()
    C.write_safetensors(os.path.join(out_dir, "quant.safetensors"), ents, metadata={"format": "pt"})
    # read back through the independent `safetensors` parser
    from safetensors import safe_open
    with safe_open(os.path.join(out_dir, "quant.safetensors"), framework="pt") as f:
        got = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    assert got == {e[0]: e[1] for e in ents}, got
    ce4, ce2 = cast_cases()
    doc = {
        "generator": "python3 ref/make_goldens.py (python3 ref/quant_golden.py)",
        "note": "generated; never edit by hand. Each float appears as <key>_hex (float.hex) and <key> "
                "(decimal of the float32 value; null = NaN).",
        "ue8m0": ue8m0_cases(),
        "cast_e4m3": ce4,
        "cast_e2m1": ce2,
        "q8": q8_cases(),
        "q4": q4_cases(),
        "hadamard": hadamard_cases(),
    }
    with open(os.path.join(out_dir, "qat_cases.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"[quant] wrote {out_dir}/quant.safetensors and qat_cases.json")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
