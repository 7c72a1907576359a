"""Shared helpers for the dsinfer Python reference scripts (ref/).

Written from /work/shared/spec/deepseek-v4.md (sections 4.1, 6.2, 6.4). Nothing here is copied
from another project. Everything is numpy; torch is used only by the scripts that need HF.

Contents
  * number formats: e4m3fn, UE8M0, FP4 e2m1 (encode with round-to-nearest-even, decode), bf16
  * the [QAT] helpers of spec 4.1 (UE8M0 block scale, Q8, Q4, Walsh-Hadamard) in float32
  * a streaming safetensors writer (8-byte LE header length + JSON header + raw data) and reader
  * the released-format dequantiser (FP8 128x128 blocks, FP4 (row, 32) blocks)
"""

import json
import math
import os
import struct
import zlib

import numpy as np

# --------------------------------------------------------------------------------------------
# dtypes as written in safetensors headers

ST_ITEMSIZE = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "I64": 8}
ST_NUMPY = {"BF16": np.uint16, "F32": np.float32, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8,
            "I8": np.int8, "I64": np.int64}

# --------------------------------------------------------------------------------------------
# FP8 e4m3fn: sign 1, exponent 4 (bias 7), mantissa 3; no infinities; 0x7F / 0xFF are NaN.


def _e4m3_value(b):
    s = -1.0 if b & 0x80 else 1.0
    e = (b >> 3) & 0xF
    m = b & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return s * 2.0 ** -6 * (m / 8.0)
    return s * 2.0 ** (e - 7) * (1.0 + m / 8.0)


E4M3_TABLE = np.array([_e4m3_value(b) for b in range(256)], dtype=np.float32)
E4M3_MAX = 448.0
# Non-negative finite values in code order 0x00..0x7E; they are increasing with the code.
_E4M3_POS = E4M3_TABLE[:0x7F].astype(np.float64)
assert np.all(np.diff(_E4M3_POS) > 0)

# FP4 e2m1: bit 3 = sign, codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6.
E2M1_POS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)
E2M1_TABLE = np.concatenate([E2M1_POS, -E2M1_POS]).astype(np.float32)  # code 8 = -0
E2M1_MAX = 6.0


def _rne_encode(x, pos_values):
    """Index into the increasing table pos_values of the nearest value to |x|, ties to the even
    index (= even code = even mantissa, which is round-to-nearest-even for these formats).
    |x| must not exceed the last table value (callers clamp first)."""
    ax = np.abs(np.asarray(x, dtype=np.float64))
    if np.any(ax > pos_values[-1]) or np.any(np.isnan(ax)):
        raise ValueError("value out of range or NaN in encode")
    hi = np.searchsorted(pos_values, ax, side="left")  # first index with value >= ax
    hi = np.minimum(hi, len(pos_values) - 1)
    lo = np.maximum(hi - 1, 0)
    dlo = ax - pos_values[lo]
    dhi = pos_values[hi] - ax
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    return np.where(pick_hi, hi, lo).astype(np.uint8)


def e4m3_encode(x):
    """float -> e4m3fn byte, round to nearest even; |x| <= 448 required. Keeps the sign of zero."""
    x = np.asarray(x, dtype=np.float32)
    code = _rne_encode(x, _E4M3_POS)
    return (code | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)).astype(np.uint8)


def e4m3_decode(b):
    return E4M3_TABLE[np.asarray(b, dtype=np.uint8)]


def e2m1_encode(x):
    """float -> 4-bit e2m1 code (0..15), round to nearest even; |x| <= 6 required."""
    x = np.asarray(x, dtype=np.float32)
    code = _rne_encode(x, E2M1_POS)
    return (code | np.where(np.signbit(x), 8, 0).astype(np.uint8)).astype(np.uint8)


def e2m1_decode(code):
    return E2M1_TABLE[np.asarray(code, dtype=np.uint8) & 0xF]


def ue8m0_decode(b):
    """UE8M0 byte -> 2^(b-127) as float32 (0xFF -> NaN)."""
    b = np.asarray(b, dtype=np.int32)
    v = np.ldexp(np.float32(1.0), b - 127).astype(np.float32)
    return np.where(b == 255, np.float32(np.nan), v).astype(np.float32)


def ue8m0_exponent(amax, fmt_max, floor):
    """Spec 4.1: s = 2^ceil(log2(a / M)) from the fp32 bit pattern of a/M (exponent field - 127,
    plus 1 if any mantissa bit is set), with a = max(amax, floor). Returns the integer exponent."""
    a = np.maximum(np.asarray(amax, dtype=np.float32), np.float32(floor))
    r = (a / np.float32(fmt_max)).astype(np.float32)
    bits = np.atleast_1d(r).view(np.uint32)
    e = ((bits >> 23) & 0xFF).astype(np.int32) - 127 + ((bits & 0x7FFFFF) != 0).astype(np.int32)
    return e.reshape(np.shape(r))


FP8_AMAX_FLOOR = 1e-4
FP4_AMAX_FLOOR = 6.0 * 2.0 ** -126

# --------------------------------------------------------------------------------------------
# bf16


def f32_to_bf16_bits(x):
    """float32 -> bf16 bits (uint16), round to nearest even (no NaN inputs expected)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b):
    b = np.ascontiguousarray(b, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def bf16_round(x):
    return bf16_bits_to_f32(f32_to_bf16_bits(x))

# --------------------------------------------------------------------------------------------
# [QAT] helpers of spec 4.1 (numpy float32)


def q8_roundtrip(x, block):
    """Q8(x, B): per block of B along the last dim, s = UE8M0(amax, 448, floor 1e-4),
    y = e4m3(clamp(x/s, -448, 448)) * s."""
    x = np.asarray(x, dtype=np.float32)
    shp = x.shape
    xb = x.reshape(*shp[:-1], shp[-1] // block, block)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    e = ue8m0_exponent(amax, E4M3_MAX, FP8_AMAX_FLOOR)
    s = np.ldexp(np.float32(1.0), e).astype(np.float32)
    q = np.clip(xb / s, -E4M3_MAX, E4M3_MAX).astype(np.float32)
    y = (e4m3_decode(e4m3_encode(q)) * s).astype(np.float32)
    return y.reshape(shp), e.reshape(*shp[:-1], shp[-1] // block)


def q4_roundtrip(x, block):
    """Q4(x, B): as Q8 with M = 6, floor 6*2^-126, e2m1 round to nearest even."""
    x = np.asarray(x, dtype=np.float32)
    shp = x.shape
    xb = x.reshape(*shp[:-1], shp[-1] // block, block)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    e = ue8m0_exponent(amax, E2M1_MAX, FP4_AMAX_FLOOR)
    s = np.ldexp(np.float32(1.0), e).astype(np.float32)
    q = np.clip(xb / s, -E2M1_MAX, E2M1_MAX).astype(np.float32)
    y = (e2m1_decode(e2m1_encode(q)) * s).astype(np.float32)
    return y.reshape(shp), e.reshape(*shp[:-1], shp[-1] // block)


def fwht(x):
    """Unnormalised fast Walsh-Hadamard transform along the last dim (Sylvester order: H_{2n} =
    [[H, H], [H, -H]]), in the dtype of x."""
    x = np.array(x, copy=True)
    n = x.shape[-1]
    assert n & (n - 1) == 0
    h = 1
    while h < n:
        y = x.reshape(*x.shape[:-1], n // (2 * h), 2, h)
        a = y[..., 0, :].copy()
        b = y[..., 1, :].copy()
        y[..., 0, :] = a + b
        y[..., 1, :] = a - b
        x = y.reshape(*x.shape[:-1], n)
        h *= 2
    return x


def sylvester_hadamard(n):
    h = np.array([[1]], dtype=np.int64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h

# --------------------------------------------------------------------------------------------
# Released-format weight quantisation (spec 6.4, 7)


def quant_fp8_weight(w):
    """w float32 [out, in] -> (e4m3 bytes [out, in], UE8M0 bytes [ceil(out/128), ceil(in/128)]).
    One scale per 128x128 tile: s = 2^ceil(log2(amax/448)), codes = RNE e4m3 of w/s."""
    w = np.asarray(w, dtype=np.float32)
    o, i = w.shape
    so, si = -(-o // 128), -(-i // 128)
    pad = np.zeros((so * 128, si * 128), np.float32)
    pad[:o, :i] = w
    tiles = pad.reshape(so, 128, si, 128)
    amax = np.abs(tiles).max(axis=(1, 3))
    e = ue8m0_exponent(amax, E4M3_MAX, FP8_AMAX_FLOOR)
    s = np.ldexp(np.float32(1.0), e).astype(np.float32)
    sfull = np.repeat(np.repeat(s, 128, 0), 128, 1)[:o, :i]
    q = np.clip(w / sfull, -E4M3_MAX, E4M3_MAX)
    return e4m3_encode(q), (e + 127).astype(np.uint8)


def dequant_fp8_weight(codes, scale):
    codes = np.asarray(codes, np.uint8)
    o, i = codes.shape
    s = ue8m0_decode(scale)
    sfull = np.repeat(np.repeat(s, 128, 0), 128, 1)[:o, :i]
    return (e4m3_decode(codes) * sfull).astype(np.float32)


def quant_fp4_weight(w):
    """w float32 [out, in] -> (packed int8 [out, in/2] (low nibble = even element),
    UE8M0 bytes [out, in/32]); one scale per (row, 32): s = 2^ceil(log2(amax/6))."""
    w = np.asarray(w, dtype=np.float32)
    o, i = w.shape
    assert i % 32 == 0
    blk = w.reshape(o, i // 32, 32)
    amax = np.abs(blk).max(axis=-1)
    e = ue8m0_exponent(amax, E2M1_MAX, FP4_AMAX_FLOOR)
    s = np.ldexp(np.float32(1.0), e).astype(np.float32)
    q = np.clip(blk / s[..., None], -E2M1_MAX, E2M1_MAX).reshape(o, i)
    codes = e2m1_encode(q)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed.view(np.int8), (e + 127).astype(np.uint8)


def unpack_fp4(packed):
    p = np.asarray(packed).view(np.uint8)
    o, h = p.shape
    codes = np.empty((o, 2 * h), np.uint8)
    codes[:, 0::2] = p & 0xF
    codes[:, 1::2] = p >> 4
    return codes


def dequant_fp4_weight(packed, scale):
    codes = unpack_fp4(packed)
    o, i = codes.shape
    s = np.repeat(ue8m0_decode(scale), 32, axis=1)
    return (e2m1_decode(codes) * s).astype(np.float32)

# --------------------------------------------------------------------------------------------
# safetensors, by hand


def tensor_nbytes(dtype, shape):
    return int(np.prod(shape, dtype=np.int64)) * ST_ITEMSIZE[dtype] if len(shape) else ST_ITEMSIZE[dtype]


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype, shape, data) in file order; data is a numpy array whose
    bytes are the little-endian storage, or a callable returning an iterable of numpy arrays
    (chunks, concatenated in order). The header is padded with spaces to a multiple of 8."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    for name, dtype, shape, _ in tensors:
        n = tensor_nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": [int(s) for s in shape], "data_offsets": [off, off + n]}
        off += n
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name, dtype, shape, data in tensors:
            n = tensor_nbytes(dtype, shape)
            written = 0
            chunks = data() if callable(data) else [data]
            for c in chunks:
                c = np.ascontiguousarray(c)
                if c.dtype.byteorder == ">":
                    raise ValueError("big-endian data")
                f.write(c.tobytes() if c.nbytes < (1 << 26) else memoryview(c).cast("B"))
                written += c.nbytes
            if written != n:
                raise ValueError(f"{name}: wrote {written} bytes, expected {n}")
    os.replace(tmp, path)
    return off


def read_safetensors_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return header, 8 + n


def read_safetensors(path):
    """Returns {name: (dtype, np array in storage form)}; validates offsets (spec 6.2)."""
    header, base = read_safetensors_header(path)
    size = os.path.getsize(path)
    out = {}
    spans = []
    with open(path, "rb") as f:
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dt, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
            assert e - b == tensor_nbytes(dt, shape), name
            assert base + e <= size, name
            spans.append((b, e))
            f.seek(base + b)
            arr = np.frombuffer(f.read(e - b), dtype=ST_NUMPY[dt]).reshape(shape)
            out[name] = (dt, arr)
    spans.sort()
    for (b0, e0), (b1, e1) in zip(spans, spans[1:]):
        assert e0 <= b1, "overlapping tensors"
    return out


def read_checkpoint(model_dir):
    """Loads a released-format checkpoint through model.safetensors.index.json."""
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values()))
    out = {}
    total = 0
    for fn in files:
        part = read_safetensors(os.path.join(model_dir, fn))
        for k, v in part.items():
            assert index["weight_map"][k] == fn, k
            out[k] = v
            total += v[1].nbytes
    assert set(out) == set(index["weight_map"]), "index / shard mismatch"
    assert index["metadata"]["total_size"] == total, (index["metadata"]["total_size"], total)
    return out


def dequantise_checkpoint(raw):
    """{name: (dtype, storage)} -> {name: float32 array (I64 kept int64)}, applying the
    sibling `.scale` tensors; `.scale` entries are consumed."""
    out = {}
    for name, (dt, arr) in raw.items():
        if name.endswith(".scale"):
            base = name[: -len(".scale")] + ".weight"
            assert base in raw, name
            continue
        sname = name[: -len(".weight")] + ".scale" if name.endswith(".weight") else None
        if dt == "F8_E4M3":
            sdt, sarr = raw[sname]
            assert sdt == "F8_E8M0"
            assert sarr.shape == (-(-arr.shape[0] // 128), -(-arr.shape[1] // 128)), name
            out[name] = dequant_fp8_weight(arr, sarr)
        elif dt == "I8":
            sdt, sarr = raw[sname]
            assert sdt == "F8_E8M0"
            assert sarr.shape == (arr.shape[0], arr.shape[1] * 2 // 32), name
            out[name] = dequant_fp4_weight(arr, sarr)
        elif dt == "BF16":
            assert sname is None or sname not in raw
            out[name] = bf16_bits_to_f32(arr)
        elif dt == "F32":
            out[name] = np.array(arr, dtype=np.float32)
        elif dt == "I64":
            out[name] = np.array(arr, dtype=np.int64)
        else:
            raise ValueError(f"{name}: unexpected dtype {dt}")
    return out


def name_seed(seed, name):
    """Per-tensor RNG so values do not depend on file order or sharding."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), zlib.crc32(name.encode())])))


def fmt_f32(v):
    """(hex, decimal) strings of a float32 value; decimal is repr of the exact double."""
    v = float(np.float32(v))
    if math.isnan(v):
        return "nan", "nan"
    return v.hex(), repr(v)
