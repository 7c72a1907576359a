/* vocab.c - the token vocabulary of the grammar engine: byte strings per id and the token trie.
 *
 * Text tokens (non-empty, not special, not EOS) are sorted by their bytes; a token's position in
 * that order is its rank. The trie is stored in preorder (nodes[0] is the empty prefix); every
 * node records the rank range of its subtree, so a walk that rejects a byte skips the subtree
 * (llguidance's toktrie layout), and path[] gives, for each rank, the node of each prefix so a
 * check that fails at byte d can jump past every token sharing those d + 1 bytes. */
#include "grammar/internal.h"

struct sort_key {
    const char *p;
    uint32_t len;
    int32_t id;
};

static int cmp_key(const void *a, const void *b) {
    const struct sort_key *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int build_trie(struct dsi_grammar_vocab *v) {
    uint32_t n = v->n_text;
    uint64_t total = 0;
    for (uint32_t r = 0; r < n; r++) {
        int32_t id = v->rank_id[r];
        total += v->off[id + 1] - v->off[id];
    }
    v->nodes = malloc(((size_t)total + 1) * sizeof(*v->nodes));
    v->path = malloc(((size_t)total + 1) * sizeof(uint32_t));
    v->path_off = malloc(((size_t)n + 1) * sizeof(uint64_t));
    uint32_t *stack = malloc(((size_t)v->max_len + 2) * sizeof(uint32_t));
    if (!v->nodes || !v->path || !v->path_off || !stack) {
        free(stack);
        return DSI_ERR_NOMEM;
    }
    /* stack[d] = node at depth d on the current path */
    uint32_t nn = 1, depth = 0;
    memset(&v->nodes[0], 0, sizeof(v->nodes[0])); /* max_below of the root grows as nodes close */
    stack[0] = 0;
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0;
    uint64_t po = 0;
    for (uint32_t r = 0; r < n; r++) {
        int32_t id = v->rank_id[r];
        const uint8_t *b = (const uint8_t *)v->bytes + v->off[id];
        uint32_t len = (uint32_t)(v->off[id + 1] - v->off[id]);
        uint32_t lcp = 0;
        while (prev && lcp < len && lcp < prev_len && b[lcp] == prev[lcp])
            lcp++;
        /* close nodes deeper than lcp */
        while (depth > lcp) {
            struct vt_node *x = &v->nodes[stack[depth]];
            x->next = nn;
            x->rank_end = r;
            struct vt_node *up = &v->nodes[stack[depth - 1]];
            if (x->max_below > up->max_below) up->max_below = x->max_below;
            depth--;
        }
        for (uint32_t d = lcp; d < len; d++) {
            struct vt_node *x = &v->nodes[nn];
            x->byte = b[d];
            x->depth = (uint16_t)(d + 1);
            x->rank_begin = r;
            x->n_here = 0;
            x->max_below = 0;
            stack[++depth] = nn++;
        }
        v->nodes[stack[len]].n_here++;
        if (v->nodes[stack[len]].max_below < len) v->nodes[stack[len]].max_below = (uint16_t)len;
        v->path_off[r] = po;
        for (uint32_t d = 1; d <= len; d++)
            v->path[po++] = stack[d];
        prev = b;
        prev_len = len;
    }
    while (depth > 0) {
        struct vt_node *x = &v->nodes[stack[depth]];
        x->next = nn;
        x->rank_end = n;
        struct vt_node *up = &v->nodes[stack[depth - 1]];
        if (x->max_below > up->max_below) up->max_below = x->max_below;
        depth--;
    }
    v->nodes[0].next = nn;
    v->nodes[0].rank_begin = 0;
    v->nodes[0].rank_end = n;
    v->n_nodes = nn;
    free(stack);
    return 0;
}

int dsi_grammar_vocab_new(struct dsi_grammar_vocab **out,
                          const char *const *tokens,
                          const uint32_t *lens,
                          const uint8_t *flags,
                          int32_t n_vocab,
                          int32_t eos_id,
                          struct dsi_err *err) {
    *out = NULL;
    if (n_vocab <= 0 || eos_id < 0 || eos_id >= n_vocab)
        return dsi_errf(err, DSI_ERR_INVALID, "grammar vocab: eos id %d outside [0, %d)", eos_id,
                        n_vocab);
    struct dsi_grammar_vocab *v = calloc(1, sizeof(*v));
    if (!v) return dsi_errf(err, DSI_ERR_NOMEM, "grammar vocab: out of memory");
    v->n_vocab = n_vocab;
    v->eos = eos_id;
    v->off = malloc(((size_t)n_vocab + 1) * sizeof(uint64_t));
    v->flags = calloc((size_t)n_vocab, 1);
    v->id_rank = malloc((size_t)n_vocab * sizeof(int32_t));
    v->rank_id = malloc((size_t)n_vocab * sizeof(int32_t));
    v->part_mask[0] = calloc(dsi_grammar_mask_words(n_vocab), sizeof(uint32_t));
    v->part_mask[1] = calloc(dsi_grammar_mask_words(n_vocab), sizeof(uint32_t));
    v->text_mask = calloc(dsi_grammar_mask_words(n_vocab), sizeof(uint32_t));
    if (!v->off || !v->flags || !v->id_rank || !v->rank_id || !v->part_mask[0] ||
        !v->part_mask[1] || !v->text_mask)
        goto nomem;
    uint64_t total = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        v->off[i] = total;
        uint32_t l = tokens[i] ? lens[i] : 0;
        if (l > 65535) {
            dsi_grammar_vocab_free(v);
            return dsi_errf(err, DSI_ERR_INVALID, "grammar vocab: token %d is %u bytes (max 65535)",
                            i, l);
        }
        total += l;
    }
    v->off[n_vocab] = total;
    v->bytes = malloc((size_t)total + 1);
    if (!v->bytes) goto nomem;
    for (int32_t i = 0; i < n_vocab; i++) {
        uint32_t l = tokens[i] ? lens[i] : 0;
        if (l) memcpy(v->bytes + v->off[i], tokens[i], l);
        if (flags) v->flags[i] = flags[i];
        v->id_rank[i] = -1;
        if (l && i != eos_id && !(v->flags[i] & DSI_GRAMMAR_TOKEN_SPECIAL)) {
            v->rank_id[v->n_text++] = i;
            if (l > v->max_len) v->max_len = l;
        }
    }
    struct sort_key *keys = malloc(((size_t)v->n_text + 1) * sizeof(*keys));
    if (!keys) goto nomem;
    for (uint32_t r = 0; r < v->n_text; r++) {
        int32_t id = v->rank_id[r];
        keys[r].p = v->bytes + v->off[id];
        keys[r].len = (uint32_t)(v->off[id + 1] - v->off[id]);
        keys[r].id = id;
    }
    qsort(keys, v->n_text, sizeof(*keys), cmp_key);
    for (uint32_t r = 0; r < v->n_text; r++)
        v->rank_id[r] = keys[r].id;
    free(keys);
    for (uint32_t r = 0; r < v->n_text; r++) {
        int32_t id = v->rank_id[r];
        v->id_rank[id] = (int32_t)r;
        int part = v->off[id + 1] - v->off[id] > VT_SHORT;
        v->part_mask[part][id >> 5] |= 1u << (id & 31);
        v->text_mask[id >> 5] |= 1u << (id & 31);
        v->n_part[part]++;
    }
    if (build_trie(v)) goto nomem;
    *out = v;
    return 0;
nomem:
    dsi_grammar_vocab_free(v);
    return dsi_errf(err, DSI_ERR_NOMEM, "grammar vocab: out of memory");
}

void dsi_grammar_vocab_free(struct dsi_grammar_vocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->off);
    free(v->flags);
    free(v->rank_id);
    free(v->id_rank);
    free(v->nodes);
    free(v->path);
    free(v->path_off);
    free(v->part_mask[0]);
    free(v->part_mask[1]);
    free(v->text_mask);
    free(v);
}

int32_t dsi_grammar_vocab_size(const struct dsi_grammar_vocab *v) { return v->n_vocab; }
int32_t dsi_grammar_vocab_eos(const struct dsi_grammar_vocab *v) { return v->eos; }

const char *dsi_grammar_vocab_token(const struct dsi_grammar_vocab *v, int32_t id, uint32_t *len) {
    if (id < 0 || id >= v->n_vocab) {
        *len = 0;
        return "";
    }
    *len = (uint32_t)(v->off[id + 1] - v->off[id]);
    return v->bytes + v->off[id];
}
