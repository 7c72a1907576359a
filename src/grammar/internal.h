/* internal.h - shared internals of src/grammar: the grammar IR (ir.c), the front ends (ebnf.c,
 * regex.c, schema*.c), the automata (fsm.c), the Earley chart (earley.c), the vocabulary trie
 * (vocab.c) and the mask cache (mask.c). Nothing outside src/grammar includes this. */
#ifndef DSI_GRAMMAR_INTERNAL_H
#define DSI_GRAMMAR_INTERNAL_H

#include "grammar/grammar.h"

#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* IR: rules whose bodies are expression trees over UTF-8 literals and code-point classes.   */

enum gx_kind {
    GX_EMPTY = 0, /* "" */
    GX_BYTES,     /* literal: u.bytes[0..n) (UTF-8) */
    GX_CLASS,     /* code points: n ranges u.ranges[2i]..u.ranges[2i+1], sorted, disjoint */
    GX_SEQ,       /* u.kids[0..n) in sequence */
    GX_ALT,       /* one of u.kids[0..n) */
    GX_REP,       /* u.kid repeated min..max times (max == GX_INF: unbounded) */
    GX_REF,       /* rule number n */
};
#define GX_INF    UINT32_MAX
#define GX_MAX_CP 0x10FFFFu

struct gx {
    uint8_t kind;
    uint32_t n;
    uint32_t min, max;
    union {
        uint8_t *bytes;
        uint32_t *ranges;
        struct gx **kids;
        struct gx *kid;
    } u;
};

struct gx_rule {
    char *name;
    struct gx *body;  /* NULL until defined */
    uint32_t src_pos; /* byte offset of the first use/definition (messages) */
};

struct gx_chunk;

struct dsi_grammar {
    struct gx_rule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t root;
    struct gx_chunk *arena; /* every node, name and array: freed together */
    bool oom;               /* sticky: an allocation failed (builders then return a dummy) */
    struct dsi_grammar_opts opts;
};

struct dsi_grammar *gx_new(const struct dsi_grammar_opts *opts);
void *gx_alloc(struct dsi_grammar *g, size_t n); /* zeroed; NULL + g->oom on failure */
char *gx_strdup(struct dsi_grammar *g, const char *s, size_t n);
/* Rule by name: existing index, or a new undefined rule. Returns UINT32_MAX when out of memory. */
uint32_t gx_rule_get(struct dsi_grammar *g, const char *name, size_t n, uint32_t src_pos);
/* A new rule named prefix, prefix_1, ... (first free). */
uint32_t gx_rule_new(struct dsi_grammar *g, const char *prefix);
int32_t gx_rule_find(const struct dsi_grammar *g, const char *name);

/* Builders. They never return NULL: on allocation failure they set g->oom and return a shared
 * dummy node (callers check g->oom once at the end). */
struct gx *gx_empty(struct dsi_grammar *g);
struct gx *gx_bytes(struct dsi_grammar *g, const void *s, size_t n);
struct gx *gx_str(struct dsi_grammar *g, const char *s); /* NUL-terminated literal */
struct gx *gx_cp(struct dsi_grammar *g, uint32_t cp);    /* one code point */
/* Class from n (lo, hi) pairs in any order (overlaps merged); negate: complement in
 * [0, 0x10FFFF]. */
struct gx *gx_class(struct dsi_grammar *g, const uint32_t *pairs, size_t n, bool negate);
struct gx *gx_range(struct dsi_grammar *g, uint32_t lo, uint32_t hi);
struct gx *gx_seq(struct dsi_grammar *g, struct gx *const *k, size_t n);
struct gx *gx_alt(struct dsi_grammar *g, struct gx *const *k, size_t n);
struct gx *gx_seq2(struct dsi_grammar *g, struct gx *a, struct gx *b);
struct gx *gx_seq3(struct dsi_grammar *g, struct gx *a, struct gx *b, struct gx *c);
struct gx *gx_alt2(struct dsi_grammar *g, struct gx *a, struct gx *b);
struct gx *gx_rep(struct dsi_grammar *g, struct gx *x, uint32_t min, uint32_t max);
struct gx *gx_ref(struct dsi_grammar *g, uint32_t rule);

/* Growable list of nodes used while building SEQ/ALT (heap, freed by gx_list_take/free). */
struct gx_list {
    struct gx **v;
    size_t n, cap;
};
void gx_list_push(struct dsi_grammar *g, struct gx_list *l, struct gx *x);
struct gx *gx_list_seq(struct dsi_grammar *g, struct gx_list *l); /* frees l */
struct gx *gx_list_alt(struct dsi_grammar *g, struct gx_list *l); /* frees l */

/* UTF-8: encode cp into out (4 bytes room), returns length. Decode at s[0..n): returns length
 * (0 = invalid) and the code point. */
int gx_utf8_enc(uint32_t cp, uint8_t *out);
int gx_utf8_dec(const uint8_t *s, size_t n, uint32_t *cp);

/* Front ends. */
int gx_parse_ebnf(struct dsi_grammar *g, const char *src, size_t len, struct dsi_err *err);
/* Regex -> expression. json_string: the regex constrains the decoded value of a JSON string,
 * and the expression matches its JSON-encoded content (quotes excluded). */
int gx_parse_regex(struct dsi_grammar *g,
                   const char *re,
                   size_t len,
                   bool json_string,
                   struct gx **out,
                   struct dsi_err *err);
int gx_parse_schema(struct dsi_grammar *g, const char *src, size_t len, struct dsi_err *err);
/* Builtin any-JSON rules (schema.c): returns the rule for a value / an object. */
uint32_t gx_json_value_rule(struct dsi_grammar *g);
uint32_t gx_json_object_rule(struct dsi_grammar *g);

/* ---------------------------------------------------------------------------------------- */
/* Automata (fsm.c): one DFA per rule over byte classes and rule symbols.                    */

struct gm_redge {
    uint32_t rule;   /* nonterminal on the edge */
    uint32_t target; /* global state id */
};

struct gm_state {
    uint32_t rule;
    uint32_t redge_off; /* rule edges: m->redges[redge_off .. redge_off + n_redge) */
    uint32_t n_redge;
    uint8_t accept;
    uint8_t has_bytes;   /* some byte edge leaves */
    uint32_t mask_set;   /* mask-cache set for long tokens, or UINT32_MAX (no edges) */
    uint32_t mask_short; /* mask-cache set for short tokens, or UINT32_MAX */
};

struct gm_rule {
    char *name;
    uint32_t start; /* global state id */
    uint32_t first_state, n_states;
    bool nullable;
};

struct gm {
    struct gm_rule *rules;
    uint32_t n_rules, root;
    struct gm_state *states;
    uint32_t n_states;
    struct gm_redge *redges;
    uint32_t n_redges;
    uint8_t bclass[256]; /* byte -> class */
    uint32_t n_bclass;
    uint32_t *trans;   /* [n_states * n_bclass]: target + 1, 0 = none */
    uint32_t *eqclass; /* [n_states]: walk-equivalence class (same class => same mask sets) */
    uint32_t n_eqclass;
    uint32_t *eqshort; /* [n_states]: the same for short tokens only (VT_SHORT + 2 rounds) */
    uint32_t n_eqshort;
    uint32_t *dist;       /* [n_states]: fewest bytes to reach acceptance in the rule (estimate) */
    uint64_t (*bytes)[4]; /* [n_states]: the bytes each state can scan (256-bit set) */
    /* Continuation points of each rule: targets of every edge on it, anywhere in the grammar:
     * cont[cont_off[r] .. cont_off[r + 1]) (the mask precompute's "any context"). */
    uint32_t *cont_off, *cont;
};

/* Build from a grammar; opts give the limits; max_token_len bounds the equivalence depth
 * (eqclass: max_token_len + 2 rounds of refinement; eqshort: VT_SHORT + 2 rounds). */
int gm_build(struct gm *m,
             const struct dsi_grammar *g,
             const struct dsi_grammar_opts *opts,
             uint32_t max_token_len,
             struct dsi_err *err);
void gm_free(struct gm *m);

static inline uint32_t gm_step(const struct gm *m, uint32_t state, uint8_t byte) {
    return m->trans[(size_t)state * m->n_bclass + m->bclass[byte]];
}

/* ---------------------------------------------------------------------------------------- */
/* Earley chart (earley.c): a stack of columns of items (state, origin).                     */

/* Origins. A matcher's items have column numbers. A mask precompute starts from one item with
 * origin EY_TOP (its rule in an unknown context). When that item completes inside a token, the
 * walk goes on in an over-approximated context: items with origin EY_CTX stand for "any place
 * the rule is used" (every continuation point of the rule), and items derived from them carry
 * EY_CTXBIT in their origin, so the two worlds never mix. A token that only survives in the
 * EY_CTX world depends on the context; one that dies in both is rejected in every context. */
#define EY_TOP    UINT32_MAX
#define EY_CTX    (UINT32_MAX - 1)
#define EY_CTXBIT 0x80000000u

struct ey_item {
    uint32_t state;
    uint32_t origin;
};

struct ey_chart {
    struct ey_item *items;
    uint32_t n_items, cap_items;
    uint32_t *col; /* col[k] = first item of column k; col[n_cols] = n_items */
    uint8_t *done; /* done[k]: an EY_TOP item completed in column k */
    uint8_t *own;  /* own[k]: column k holds an item outside the EY_CTX world */
    uint32_t n_cols, cap_cols;
    uint32_t *hash; /* dedup table for the column being built: item index + 1 */
    uint32_t *hgen; /* generation stamp per slot */
    uint32_t hcap, gen;
    bool oom;
};

void ey_init(struct ey_chart *c);
void ey_free(struct ey_chart *c);
/* Reset to one column holding `state` with `origin` (0 for a matcher root, EY_TOP for a
 * precompute) and its closure. Returns 0 or DSI_ERR_NOMEM. */
int ey_start(const struct gm *m, struct ey_chart *c, uint32_t state, uint32_t origin);
/* Push the column after scanning `byte`. Returns 1 if it is non-empty, 0 if the byte is
 * rejected (nothing pushed), DSI_ERR_NOMEM on allocation failure. */
int ey_scan(const struct gm *m, struct ey_chart *c, uint8_t byte);
static inline void ey_pop_to(struct ey_chart *c, uint32_t n_cols) {
    c->n_cols = n_cols;
    c->n_items = c->col[n_cols];
}
/* The root rule has completed over the whole input in the last column. */
bool ey_root_done(const struct gm *m, const struct ey_chart *c);
/* Some item of the last column can still scan a byte. */
bool ey_can_scan(const struct gm *m, const struct ey_chart *c);

/* ---------------------------------------------------------------------------------------- */
/* Vocabulary + token trie (vocab.c).                                                        */

struct vt_node {
    uint32_t next;       /* preorder index of the first node after this subtree */
    uint32_t rank_begin; /* first token rank in the subtree (tokens ending here come first) */
    uint32_t rank_end;   /* one past the last rank in the subtree */
    uint16_t n_here;     /* tokens ending exactly at this node */
    uint16_t depth;      /* bytes from the root (root = 0) */
    uint16_t max_below;  /* longest token in the subtree (bytes) */
    uint8_t byte;        /* last byte of the prefix */
};

/* Tokens up to VT_SHORT bytes ("short") and longer ones are walked separately by the mask
 * cache: the short part is shared by all states that agree on VT_SHORT + 2 symbols. */
#define VT_SHORT 12

struct dsi_grammar_vocab {
    int32_t n_vocab, eos;
    char *bytes;    /* token bytes, id i at off[i] .. off[i + 1] */
    uint64_t *off;  /* [n_vocab + 1] */
    uint8_t *flags; /* [n_vocab] */
    /* Text tokens (non-special, non-empty, not EOS) sorted by bytes: rank order. */
    uint32_t n_text;
    int32_t *rank_id;      /* [n_text] */
    int32_t *id_rank;      /* [n_vocab], -1 if not text */
    struct vt_node *nodes; /* preorder, nodes[0] = root */
    uint32_t n_nodes;
    uint32_t *path;     /* node at depth d (1..len) of rank r: path[path_off[r] + d - 1] */
    uint64_t *path_off; /* [n_text] */
    uint32_t max_len;
    uint32_t *part_mask[2]; /* [mask words]: bits of the short (0) and long (1) text tokens */
    uint32_t *text_mask;    /* [mask words]: both */
    uint32_t n_part[2];
};

/* ---------------------------------------------------------------------------------------- */
/* Mask cache (mask.c).                                                                      */

enum ms_kind {
    MS_NONE = 0, /* nothing accepted */
    MS_LIST,     /* accepted ids: ids[0..n) */
    MS_NOTLIST,  /* all text tokens of the set's part except ids[0..n) */
    MS_BITS,     /* accepted bitset: bits[mask words] */
};

struct ms_set {
    uint8_t kind;
    uint8_t part;   /* 0: short tokens, 1: long tokens (MS_NOTLIST complements within it) */
    uint32_t n;     /* ids */
    uint32_t *ids;  /* or the bitset */
    uint32_t n_unc; /* context-dependent tokens, as ranks in trie order */
    uint32_t *unc;
};

struct dsi_grammar_compiled {
    const struct dsi_grammar_vocab *vocab;
    struct gm m;
    struct ms_set *sets; /* [n_sets] */
    uint32_t n_sets;
    struct dsi_grammar_stats stats;
};

int ms_build(struct dsi_grammar_compiled *cg, struct dsi_err *err);
void ms_free(struct dsi_grammar_compiled *cg);

/* Runtime scratch of one matcher (owned by matcher.c, used by mask.c). */
struct ms_scratch {
    uint32_t *tmp;   /* one mask */
    uint32_t *merge; /* merged uncertain ranks */
    uint32_t cap_merge;
    const struct ms_set **act; /* the sets of the current column */
    uint32_t cap_act;
    uint8_t *path; /* [max token length]: bytes on the current check path */
    /* Memo of the last check of uncertain tokens: the last column's items then, and the
     * uncertain tokens found allowed. The same items (earlier columns unchanged: cleared on
     * rollback/reset) give the same answer, e.g. at every step inside a JSON string. */
    struct ey_item *memo_items;
    uint32_t memo_n, cap_memo_items;
    uint32_t *memo_ids;
    uint32_t memo_n_ids, cap_memo_ids;
    bool memo_valid;
};
int ms_fill(const struct dsi_grammar_compiled *cg,
            struct ey_chart *c,
            struct ms_scratch *s,
            uint32_t *mask);

#endif
