#!/usr/bin/env python3
"""Regenerate everything under tests/golden/ with one command:

    python3 ref/make_goldens.py            # from the repository root (about a minute on a CPU)

THE FILES UNDER tests/golden/ ARE GENERATED. NEVER EDIT THEM BY HAND; change the scripts in ref/
and rerun this command, then commit the scripts and the regenerated data together.

Steps:
  1. ref/make_checkpoint.py --check-inventory: the full V4-Flash inventory this code would write
     reproduces the release (69,187 tensors, 159,609,485,896 bytes, dtype histogram).
  2. ref/quant_golden.py -> tests/golden/quant/ (quant.safetensors, qat_cases.json).
  3. ref/hf_golden.py for tiny-a and tiny-b -> tests/golden/<case>/ (model/, golden.json,
     logits_plain.f32, mtp_logits.f32): released-format checkpoint, HF transformers fp32 logits,
     MTP logits (ref/mtp_ref.py), margin checks.
  4. ref/spec_ref.py: an independent fp32 implementation written from the spec recomputes both
     logits files from the released-format checkpoint; must agree to < 1e-4 relative.
  5. Size report (the whole of tests/golden/).

Requirements: python3 with torch (CPU), transformers 5.x (DeepseekV4ForCausalLM), safetensors, numpy.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_golden  # noqa: E402
import make_checkpoint  # noqa: E402
import quant_golden  # noqa: E402
import spec_ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden"),
                    help="output root (default tests/golden); only quant/, tiny-a/, tiny-b/ are written")
    out = ap.parse_args().out
    make_checkpoint.check_flash_inventory()
    quant_golden.main(out)
    for case in sorted(hf_golden.CASES):
        hf_golden.run_case(case, out)
        worst = spec_ref.compare(os.path.join(out, case))
        assert worst < 1e-4, f"{case}: spec reference and HF disagree ({worst:.2e} relative)"
    total = 0
    for sub in ["quant"] + sorted(hf_golden.CASES):
        n = 0
        for d, _, files in os.walk(os.path.join(out, sub)):
            n += sum(os.path.getsize(os.path.join(d, fn)) for fn in files)
        print(f"  {sub}: {n} bytes")
        total += n
    print(f"written by these scripts: {total} bytes ({total / 2**20:.2f} MiB)")


if __name__ == "__main__":
    main()
