#!/usr/bin/env python3
"""Exhaustive check of the CUDA backend's short FP8/FP4 dequantisation (src/backend/cuda/gemm.cuh:
e4m3x4, e2m1x8): for every e4m3 code (256) and every e2m1 code (16) times every UE8M0 scale
byte (256), the float bits equal those of the reference decode times the scale (numpy float32,
subnormals kept, as the CUDA build keeps them). Run: python3 ref/decode_check.py"""
import numpy as np
def f(bits): return np.array([bits], dtype=np.uint32).view(np.float32)[0]
def e8m0(b):
    if b == 0xff: return f(0x7fc00000)
    if b == 0: return f(0x00400000)
    return f(b << 23)
def e4m3(c):
    s=(c>>7)&1; e=(c>>3)&0xf; m=c&7
    if e==15 and m==7: return f(0x7fc00000)
    v = np.float32(m)*np.float32(0.001953125) if e==0 else f(((e+120)<<23)|(m<<20))
    return -v if s else v
def fp4(c):
    e=(c>>1)&3; m=c&1
    v = f(((e+126)<<23)|(m<<22)) if e else (np.float32(0.5) if m else np.float32(0.0))
    return -v if (c&8) else v
def pow2f(k): return f((k+127)<<23)
bad=0
with np.errstate(all='ignore'):
  for sb in range(256):
    sc=e8m0(sb)
    one = sb!=0xff and sb<=134
    mul = (pow2f(-7) if sb==0 else pow2f(sb-7)) if one else pow2f(120)
    for c in range(256):
        ref = np.float32(e4m3(c)*sc)
        r = f(((c&0x80)<<24)|((c&0x7f)<<20))
        v = np.float32(r*mul) if one else np.float32(np.float32(r*mul)*sc)
        if (c&0x7f)==0x7f: v = np.float32(f(0x7fc00000)*sc)
        if not (np.isnan(ref) and np.isnan(v)) and np.array([ref]).view(np.uint32)[0]!=np.array([v]).view(np.uint32)[0]:
            bad+=1
    one = sb!=0xff and sb<=128
    mul = (pow2f(-1) if sb==0 else pow2f(sb-1)) if one else pow2f(126)
    for c in range(16):
        ref = np.float32(fp4(c)*sc)
        r = f(((c&8)<<28)|((c&7)<<22))
        v = np.float32(r*mul) if one else np.float32(np.float32(r*mul)*sc)
        if not (np.isnan(ref) and np.isnan(v)) and np.array([ref]).view(np.uint32)[0]!=np.array([v]).view(np.uint32)[0]:
            bad+=1
print("mismatches", bad)
