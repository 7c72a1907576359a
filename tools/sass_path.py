#!/usr/bin/env python3
"""sass_path.py - instructions a warp runs along one path of a kernel's longest loop (its K loop),
read from a SASS text (tools/sass.sh FILE.cu > F.sass), for the first function whose name matches
FUNC_REGEX. Static counts (tests/ops/sass_hist.sh) count both sides of every branch; this walks the
loop once from its head to its backward branch, taking at each conditional branch the side a
typical warp of wgr.cu's K loop takes:
  - a scale test (ISETP.GE.U32 .. 0x81, then @!P BRA): taken (the short decode path);
  - the width dispatch (ISETP.GT .. R, 0xNN): taken where the block's rows W > 0xNN;
  - after an mbarrier TRYWAIT: taken (the tile was there at the first try);
  - thread 0's TMA issue (ISETP.LE.U32.OR): skipped (the other 7 warps' path);
  - anything else: not taken (BRA.U.ANY loops: once).
Two steps of wgr.cu's loop (WR_PF = 2 unrolled) are one walk. Step 51 counted wgr.cu's trims with
it (docs/cuda.md). Usage:
  sh tools/sass.sh src/backend/cuda/wgr.cu > /tmp/wgr.sass
  python3 tools/sass_path.py /tmp/wgr.sass 'k_wgrILi1ELi4ELi224ELb1ELb1ELb0E' 224 [-v]
"""
import re
import sys

if len(sys.argv) < 3 or sys.argv[1] in ('-h', '--help'):
    print(__doc__.strip())
    sys.exit(0 if len(sys.argv) > 1 else 1)
path, fre = sys.argv[1], sys.argv[2]
W = int(sys.argv[3]) if len(sys.argv) > 3 else 224
verbose = '-v' in sys.argv[4:]
text, keep, found = [], False, False
for l in open(path).read().split('\n'):
    if 'Function :' in l:
        if found and keep:
            break
        keep = re.search(fre, l) is not None
        found = found or keep
        continue
    if keep:
        text.append(l)
if not found:
    sys.exit('sass_path.py: no function matches %s' % fre)
lines = text

ins=[];lab={};pend=[]
for l in lines:
    m=re.match(r'^\.(L_x_\d+):',l.strip())
    if m: pend.append(m.group(1)); continue
    m=re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);',l)
    if m:
        a=int(m.group(1),16)
        for p in pend: lab[p]=len(ins)
        pend=[]; ins.append((a,m.group(2).strip()))
# the loop: the longest backward branch
best=None
for i,(a,t) in enumerate(ins):
    m=re.search(r'BRA[^`]*`\(\.(L_x_\d+)\)',t)
    if m and lab.get(m.group(1)) is not None and lab[m.group(1)]<=i:
        if best is None or i-lab[m.group(1)]>best[1]-best[0]: best=(lab[m.group(1)],i)
h,e=best
i=h;n=0;cnt={};last={};trace=[]
while i<=e:
    a,t=ins[i]; n+=1
    op=re.sub(r'^@!?U?P\w+\s+','',t).split()[0].split('.')[0]
    cnt[op]=cnt.get(op,0)+1
    mm=re.match(r'^(?:@!?U?P\w+\s+)?(?:ISETP|LOP3|PLOP3|FSETP)\S* (U?P\d),',t)
    if mm: last[mm.group(1)]=t
    if op=='SYNCS' and 'TRYWAIT' in t: last['TW']=True
    m=re.search(r'BRA[^`]*`\(\.(L_x_\d+)\)',t)
    if m and i!=e:
        tgt=lab[m.group(1)]; cond=re.match(r'^@(!?)(U?P\w+)',t)
        take=None
        if not cond: take=True
        elif 'U.ANY' in t: take=False
        else:
            neg,p=cond.group(1),cond.group(2); c=last.get(p,'')
            if '0x81' in c: take=(neg=='!')
            elif 'ISETP.LE.U32.OR' in c: take=(neg=='')
            elif re.search(r'ISETP.GT.AND \w+, PT, R\d+, 0x[0-9a-f]+',c):
                v=int(re.search(r'0x([0-9a-f]+)',c).group(1),16); take=(W>v) if neg=='' else not (W>v)
            elif last.get('TW') and tgt>i: take=(neg==''); last['TW']=False
            elif tgt<i: take=False
            else: take=False
        trace.append('%x %s -> %s'%(a,t[:60],'T' if take else 'N'))
        if take: i=tgt; continue
    i+=1
print('path instructions (2 steps):',n)
for k,v in sorted(cnt.items(),key=lambda x:-x[1])[:25]: print('%6d %s'%(v,k))
if verbose: print('\n'.join(trace))
