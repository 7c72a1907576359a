/* pretok.c - PCRE2 pre-tokenizer (sequence of Isolated Split steps + ByteLevel). See pretok.h.
 *
 * Recursion: step k splits a piece into matches and gaps and hands each to step k+1; the last
 * step hands pieces to the caller. Each regex is matched with the piece itself as the subject,
 * so a lookahead such as (?!\S) cannot see past the end of the piece, as in HF. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tok/pretok.h"

#include <pcre2.h>
#include <string.h>

/* The GPT-2 split pattern HF's ByteLevel step applies when "use_regex" is true. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* DeepSeek-V3/V4's split sequence (spec/deepseek-v4.md 8.2), as stored in tokenizer.json. */
static const char *const DS_PATTERNS[3] = {
    "\\p{N}{1,3}",
    "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
    "[!\"#$%&'()*+,\\-./"
    ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
};

/* Oniguruma's \s: White_Space = Zs, Zl, Zp, U+0009..U+000D, U+0085. */
#define ONIG_SPACE     "[\\p{Z}\\x{09}-\\x{0D}\\x{85}]"
#define ONIG_NON_SPACE "[^\\p{Z}\\x{09}-\\x{0D}\\x{85}]"

char *dsi_pretok_rewrite_space(const char *pat, size_t len, size_t *out_len) {
    size_t cap = len * 14 + 1, k = 0; /* a 2-byte \S becomes 27 bytes */
    char *o = malloc(cap);
    if (!o) return NULL;
    int in_class = 0;
    for (size_t i = 0; i < len; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char d = pat[i + 1];
            if (!in_class && (d == 's' || d == 'S')) {
                const char *r = d == 's' ? ONIG_SPACE : ONIG_NON_SPACE;
                size_t rl = strlen(r);
                memcpy(o + k, r, rl);
                k += rl;
            } else {
                o[k++] = c;
                o[k++] = d;
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            o[k++] = c;
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < len && pat[i + 1] == '^') o[k++] = pat[++i];
            if (i + 1 < len && pat[i + 1] == ']') o[k++] = pat[++i];
            continue;
        }
        if (in_class && c == ']') in_class = 0;
        o[k++] = c;
    }
    o[k] = 0;
    if (out_len) *out_len = k;
    return o;
}

static int
add_step(struct dsi_pretok *p, const char *pat, size_t len, bool literal, struct dsi_err *err) {
    if (p->n_steps >= DSI_PRETOK_MAX_STEPS)
        return dsi_errf(err, DSI_ERR_UNSUPPORTED, "pre_tokenizer: more than %d split steps",
                        DSI_PRETOK_MAX_STEPS);
    char *rw = NULL;
    if (!literal) {
        rw = dsi_pretok_rewrite_space(pat, len, &len);
        if (!rw) return dsi_errf(err, DSI_ERR_NOMEM, "pre_tokenizer: out of memory");
        pat = rw;
    }
    int ecode;
    PCRE2_SIZE eoff;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &ecode, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ecode, msg, sizeof(msg));
        dsi_errf(err, DSI_ERR_FORMAT, "pre_tokenizer: regex '%.80s' does not compile at %zu: %s",
                 pat, (size_t)eoff, (const char *)msg);
        free(rw);
        return DSI_ERR_FORMAT;
    }
    free(rw);
    p->jit[p->n_steps] = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    p->re[p->n_steps++] = re;
    return DSI_OK;
}

static int add_split(struct dsi_pretok *p, const json_t *st, struct dsi_err *err) {
    const char *beh = json_string_value(json_object_get(st, "behavior"));
    if (!beh || strcmp(beh, "Isolated"))
        return dsi_errf(err, DSI_ERR_UNSUPPORTED,
                        "pre_tokenizer: Split behavior '%s' (only "
                        "Isolated is supported)",
                        beh ? beh : "?");
    if (json_is_true(json_object_get(st, "invert")))
        return dsi_errf(err, DSI_ERR_UNSUPPORTED, "pre_tokenizer: inverted Split");
    const json_t *pat = json_object_get(st, "pattern");
    const json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    if (json_is_string(rx))
        return add_step(p, json_string_value(rx), json_string_length(rx), false, err);
    if (json_is_string(lit))
        return add_step(p, json_string_value(lit), json_string_length(lit), true, err);
    return dsi_errf(err, DSI_ERR_FORMAT, "pre_tokenizer: Split without a Regex/String pattern");
}

static int add_bytelevel(struct dsi_pretok *p, const json_t *st, struct dsi_err *err) {
    if (json_is_true(json_object_get(st, "add_prefix_space")))
        return dsi_errf(err, DSI_ERR_UNSUPPORTED, "pre_tokenizer: ByteLevel add_prefix_space");
    const json_t *ur = json_object_get(st, "use_regex");
    if (!ur || json_is_true(ur)) return add_step(p, GPT2_PATTERN, strlen(GPT2_PATTERN), 0, err);
    return DSI_OK;
}

int dsi_pretok_init(struct dsi_pretok *p, const json_t *pre, struct dsi_err *err) {
    memset(p, 0, sizeof(*p));
    if (!json_is_object(pre))
        return dsi_errf(err, DSI_ERR_FORMAT, "pre_tokenizer: missing (byte-level BPE needs one)");
    const char *type = json_string_value(json_object_get(pre, "type"));
    const json_t *steps = json_object_get(pre, "pretokenizers");
    size_t n = 1;
    if (type && !strcmp(type, "Sequence")) {
        if (!json_is_array(steps))
            return dsi_errf(err, DSI_ERR_FORMAT, "pre_tokenizer: Sequence without a list");
        n = json_array_size(steps);
    }
    int rc = DSI_OK, saw_bytelevel = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const json_t *st = (type && !strcmp(type, "Sequence")) ? json_array_get(steps, i) : pre;
        const char *t = json_string_value(json_object_get(st, "type"));
        if (saw_bytelevel)
            rc = dsi_errf(err, DSI_ERR_UNSUPPORTED, "pre_tokenizer: steps after ByteLevel");
        else if (t && !strcmp(t, "Split"))
            rc = add_split(p, st, err);
        else if (t && !strcmp(t, "ByteLevel")) {
            saw_bytelevel = 1;
            rc = add_bytelevel(p, st, err);
        } else
            rc = dsi_errf(err, DSI_ERR_UNSUPPORTED, "pre_tokenizer: step type '%s'", t ? t : "?");
    }
    if (!rc && !saw_bytelevel)
        rc = dsi_errf(err, DSI_ERR_UNSUPPORTED, "pre_tokenizer: no ByteLevel step");
    if (rc) {
        dsi_pretok_free(p);
        return rc;
    }
    /* Recognise DeepSeek's exact patterns (allows the ASCII shortcut in dsi_pretok_split). */
    if (p->n_steps == 3 && json_is_array(steps)) {
        p->ds_fast = true;
        for (int i = 0; i < 3; i++) {
            const json_t *rx = json_object_get(
                json_object_get(json_array_get(steps, (size_t)i), "pattern"), "Regex");
            if (!json_is_string(rx) || strcmp(json_string_value(rx), DS_PATTERNS[i]))
                p->ds_fast = false;
        }
    }
    return DSI_OK;
}

void dsi_pretok_free(struct dsi_pretok *p) {
    for (int i = 0; i < p->n_steps; i++)
        pcre2_code_free(p->re[i]);
    memset(p, 0, sizeof(*p));
}

int dsi_pretok_scratch_init(const struct dsi_pretok *p,
                            struct dsi_pretok_scratch *s,
                            struct dsi_err *err) {
    memset(s, 0, sizeof(*s));
    for (int i = 0; i < p->n_steps; i++) {
        s->md[i] = pcre2_match_data_create(1, NULL);
        if (!s->md[i]) {
            dsi_pretok_scratch_free(s);
            return dsi_errf(err, DSI_ERR_NOMEM, "pre_tokenizer: out of memory");
        }
    }
    return DSI_OK;
}

void dsi_pretok_scratch_free(struct dsi_pretok_scratch *s) {
    for (int i = 0; i < DSI_PRETOK_MAX_STEPS; i++)
        pcre2_match_data_free(s->md[i]);
    memset(s, 0, sizeof(*s));
}

struct split_ctx {
    const struct dsi_pretok *p;
    struct dsi_pretok_scratch *s;
    dsi_pretok_fn fn;
    void *user;
    struct dsi_err *err;
};

/* Find the next match of step k in [from, n): 1 found (*ms, *me), 0 none, <0 error. */
static int next_match(
    struct split_ctx *c, int k, const char *s, size_t n, size_t from, size_t *ms, size_t *me) {
    const pcre2_code *re = c->p->re[k];
    pcre2_match_data *md = c->s->md[k];
    int rc;
    if (c->p->jit[k]) {
        rc = pcre2_jit_match(re, (PCRE2_SPTR)s, n, from, 0, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                             NULL);
    } else {
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        return dsi_errf(c->err, DSI_ERR_INVALID, "pre-tokenizer: regex match failed: %s",
                        (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

static int split_level(struct split_ctx *c, int k, const char *s, size_t n);

/* ASCII-only piece under DeepSeek's patterns: step 0 (\p{N}{1,3}) only matches [0-9] and
 * step 1 (kana/CJK) never matches, so both are done here without the regex engine. */
static int split_ascii_ds(struct split_ctx *c, const char *s, size_t n) {
    size_t gap = 0, i = 0;
    while (i < n) {
        if (s[i] < '0' || s[i] > '9') {
            i++;
            continue;
        }
        int rc;
        if (i > gap && (rc = split_level(c, 2, s + gap, i - gap))) return rc;
        size_t j = i;
        while (j < n && j - i < 3 && s[j] >= '0' && s[j] <= '9')
            j++;
        if ((rc = split_level(c, 2, s + i, j - i))) return rc;
        gap = i = j;
    }
    return n > gap ? split_level(c, 2, s + gap, n - gap) : 0;
}

static int is_ascii(const char *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ull) return 0;
    }
    for (; i < n; i++)
        if ((unsigned char)s[i] & 0x80) return 0;
    return 1;
}

static int split_level(struct split_ctx *c, int k, const char *s, size_t n) {
    if (k == c->p->n_steps) return c->fn(c->user, s, n);
    if (k == 0 && c->p->ds_fast && is_ascii(s, n)) return split_ascii_ds(c, s, n);
    size_t pos = 0, gap = 0, ms, me;
    int rc;
    while (pos <= n) {
        rc = next_match(c, k, s, n, pos, &ms, &me);
        if (rc < 0) return rc;
        if (rc == 0) break;
        if (me == ms) { /* empty match: no piece; retry one character further */
            if (ms >= n) break;
            pos = ms + 1;
            while (pos < n && ((unsigned char)s[pos] & 0xc0) == 0x80)
                pos++;
            continue;
        }
        if (ms > gap && (rc = split_level(c, k + 1, s + gap, ms - gap))) return rc;
        if ((rc = split_level(c, k + 1, s + ms, me - ms))) return rc;
        gap = pos = me;
    }
    if (n > gap) return split_level(c, k + 1, s + gap, n - gap);
    return 0;
}

int dsi_pretok_split(const struct dsi_pretok *p,
                     struct dsi_pretok_scratch *s,
                     const char *text,
                     size_t len,
                     dsi_pretok_fn fn,
                     void *user,
                     struct dsi_err *err) {
    struct split_ctx c = {p, s, fn, user, err};
    if (len == 0) return 0;
    return split_level(&c, 0, text, len);
}
