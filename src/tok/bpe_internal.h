/* bpe_internal.h - the layout of struct dsi_bpe, shared by bpe_load.c (builds it), bpe.c
 * (encodes/decodes with it) and the unit tests. Not part of the public API.
 *
 * Id space: every id in [0, n_ids) has a flags byte; TOKF_PRESENT marks ids that exist. The
 * bytes of id i are tok_bytes[tok_off[i] .. tok_off[i+1]) (added tokens: their content as HF's
 * ByteLevel decoder turns it into bytes; BPE entries: the inverse GPT-2 byte map).
 *
 * Tables are open-addressed with linear probing, sized to powers of two at most half full. */
#ifndef DSI_TOK_BPE_INTERNAL_H
#define DSI_TOK_BPE_INTERNAL_H

#include "tok/bpe.h"
#include "tok/pretok.h"

enum {
    TOKF_PRESENT = 1 << 0,
    TOKF_SPECIAL = 1 << 1, /* added token flagged special */
    TOKF_ADDED = 1 << 2,   /* added token */
};

/* (left id, right id) -> (rank, merged id) */
struct bpe_pairs {
    uint64_t *keys; /* (uint64_t)left << 32 | right; UINT64_MAX = empty */
    uint64_t *vals; /* (uint64_t)rank << 32 | merged id */
    size_t mask;
};

/* byte string -> id, for the whole-piece shortcut (only ids that BPE itself produces for
 * their own bytes are entered, so a hit is exactly what the merge loop would return) */
struct bpe_bytes_map {
    int32_t *slots; /* -1 = empty */
    size_t mask;
    const uint32_t *off; /* key of id i: blob[off[i] .. off[i+1]) */
    const char *blob;
};

/* Byte trie over added-token contents for leftmost-longest matching. */
struct bpe_trie {
    int32_t *node_tok;   /* [n_nodes] token id ending here or -1 */
    uint8_t *node_cls;   /* [n_nodes] pass (0: normalized false, 1: true) of that token */
    uint64_t *edge_keys; /* node << 8 | byte; UINT64_MAX = empty */
    int32_t *edge_vals;  /* child node */
    size_t edge_mask;
    int32_t n_nodes;
    uint8_t first[256]; /* bit c set: some token of pass c starts with this byte */
};

struct dsi_bpe {
    int32_t n_ids;
    int64_t vocab_limit;
    uint8_t *tok_flags;
    uint32_t *tok_off;
    char *tok_bytes;

    int32_t byte_id[256]; /* id of each single-byte symbol, -1 if the vocab lacks it */
    struct bpe_pairs pairs;
    struct bpe_bytes_map whole;
    bool ignore_merges;         /* HF "ignore_merges": a piece that is a vocab entry maps to it */
    struct bpe_bytes_map vocab; /* all BPE entries by bytes (used when ignore_merges) */

    struct bpe_trie trie;
    struct dsi_pretok pretok;

    /* name lookup: added-token contents and vocab strings as in tokenizer.json */
    uint32_t *name_off; /* [n_ids + 1] */
    char *name_blob;
    struct bpe_bytes_map by_name;

    int32_t bos_id, eos_id, pad_id;
    int64_t n_model, n_merges, n_added, n_special;
};

uint64_t dsi_bpe_hash(const void *p, size_t n);

static inline uint64_t bpe_pair_key(int32_t a, int32_t b) {
    return (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
}

static inline uint64_t bpe_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Look up a pair; returns false if there is no merge for it. */
static inline bool
bpe_pair_get(const struct bpe_pairs *t, int32_t a, int32_t b, uint32_t *rank, int32_t *merged) {
    uint64_t k = bpe_pair_key(a, b);
    for (size_t i = bpe_mix64(k) & t->mask;; i = (i + 1) & t->mask) {
        if (t->keys[i] == k) {
            *rank = (uint32_t)(t->vals[i] >> 32);
            *merged = (int32_t)(uint32_t)t->vals[i];
            return true;
        }
        if (t->keys[i] == UINT64_MAX) return false;
    }
}

/* Find the id whose key equals s[0..n) in map m, or -1. */
int32_t dsi_bpe_map_find(const struct bpe_bytes_map *m, const char *s, size_t n);

/* BPE-merge one piece (bytes s[0..n)), appending ids to out (room for n ids needed).
 * method: 0 = choose, 1 = rank scan (small pieces), 2 = priority queue (HF's algorithm).
 * scratch must hold DSI_BPE_SCRATCH(n) int32. Returns the number of ids written. */
#define DSI_BPE_SCRATCH(n) (11 * (size_t)(n) + 16)
size_t dsi_bpe_merge_piece(
    const struct dsi_bpe *bpe, const char *s, size_t n, int method, int32_t *out, int32_t *scratch);

#endif
