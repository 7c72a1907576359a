/* grammar.h - structured outputs: regex, JSON Schema and EBNF constraints as per-step token
 * masks (spec/techniques.md section 5; docs/grammar.md has the user-facing description).
 *
 * Pipeline
 *   source text --dsi_grammar_parse--> struct dsi_grammar (rules over code-point classes and
 *   literals; tokenizer independent; printable as EBNF with dsi_grammar_print)
 *   + struct dsi_grammar_vocab (token byte strings + token trie, once per tokenizer)
 *   --dsi_grammar_compile--> struct dsi_grammar_compiled: one byte-level DFA per rule, an Earley
 *   parser over those DFAs, and the adaptive token-mask cache (per automaton position, the
 *   tokens accepted whatever the context, and the few context-dependent tokens)
 *   --dsi_grammar_matcher_new--> struct dsi_grammar_matcher: per-request parser state.
 *
 * The contract (section 5.1): the mask holds token t iff committed_bytes + bytes(t) is a prefix of
 * some string of the language; EOS iff the committed bytes are a whole member. Tokens flagged
 * special in the vocabulary (control tokens such as <think>) are never allowed; EOS is allowed
 * only where the grammar may end.
 *
 * EBNF dialect (GBNF / XGrammar style; the same text compiles in XGrammar):
 *     # comment to end of line
 *     root    ::= "{" ws pair ("," ws pair)* "}"       rule: NAME ::= expression
 *     pair    ::= string ws ":" ws value
 *     digit   ::= [0-9]                               class: ranges, [^...] negation
 *     string  ::= "\"" ([^"\\] | "\\" ["\\nt])* "\""  literal "..." (UTF-8)
 *     ws      ::= [ \t\n]{0,8}                        x? x* x+ x{m} x{m,} x{m,n} ( ... ) a | b
 *   Rule names: [A-Za-z_][A-Za-z0-9_-]*; a rule ends where the next NAME ::= starts; the start
 *   rule is `root`. Escapes in literals and classes: \n \r \t \f \v \0 \\ \" \' \[ \] \- \^ \/
 *   \xHH \uHHHH \UHHHHHHHH. Literals and classes are Unicode code points matched as UTF-8 bytes
 *   (classes never match surrogates or invalid UTF-8). `""` is the empty string, `.` any code
 *   point, `{m,-1}` (XGrammar's spelling) `{m,}`. An XGrammar lookahead assertion `(= ...)` after
 *   a rule body is accepted and ignored (masks are exact without it; a correct assertion never
 *   changes the language). Left recursion, ambiguity and empty rules are fine (Earley).
 *
 * Regex dialect (ECMAScript subset, always a full match): literals, `.` (any code point but \n
 * and \r), classes with ranges/negation/escapes, \d \w \s \D \W \S (ASCII meaning), \xHH \uHHHH
 * \u{H..}, groups ( ) (?: ), named groups (?<n> ), alternation, quantifiers ? * + {m} {m,}
 * {m,n} and their lazy forms, ^ at the start and $ at the end. Backreferences, lookaround,
 * \b and flags are rejected with an error naming the construct and its offset.
 *
 * JSON Schema: see schema.c's header comment (keywords, whitespace policy, what is rejected).
 *
 * Limits: every compile is bounded. Repetition counts above opts.max_repeat, automata above
 * opts.max_states DFA states (a pathological regex such as (a|b)*a(a|b){40}) and NFAs above
 * 8 x max_states are rejected with DSI_ERR_UNSUPPORTED and a message naming the rule.
 *
 * Thread safety: dsi_grammar, dsi_grammar_vocab and dsi_grammar_compiled are immutable once
 * built and may be shared by any number of threads; a matcher belongs to one thread at a time.
 * Ownership: every _new/_parse/_compile has one _free; freeing NULL is a no-op. */
#ifndef DSI_GRAMMAR_H
#define DSI_GRAMMAR_H

#include "core/core.h"

enum dsi_grammar_kind {
    DSI_GRAMMAR_EBNF = 0,        /* EBNF text as above, start rule `root` */
    DSI_GRAMMAR_REGEX = 1,       /* a regex that the whole output must match */
    DSI_GRAMMAR_JSON_SCHEMA = 2, /* JSON Schema text (schema.c) */
    DSI_GRAMMAR_JSON_OBJECT = 3, /* any JSON object (OpenAI's response_format json_object) */
    DSI_GRAMMAR_JSON_VALUE = 4,  /* any JSON value */
};

/* Whitespace between JSON tokens (JSON Schema, json_object): */
enum dsi_grammar_ws {
    /* [ \t\n\r]{0,max_ws} wherever JSON allows whitespace (unbounded when max_ws == 0), none
     * before or after the top-level value: XGrammar's any_whitespace=True (max_whitespace_cnt) */
    DSI_GRAMMAR_WS_FLEXIBLE = 0,
    /* no whitespace at all, separators "," and ":": json.dumps(separators=(",", ":")) and
     * XGrammar's any_whitespace=False, separators=(",", ":") */
    DSI_GRAMMAR_WS_COMPACT = 1,
};

struct dsi_grammar_opts {
    enum dsi_grammar_ws ws; /* default DSI_GRAMMAR_WS_FLEXIBLE */
    int max_ws;             /* flexible: longest whitespace run; 0 = unbounded. Default 0 */
    int max_repeat;         /* largest m or n in x{m,n} (default 10000) */
    int max_states;         /* DFA states over all rules (default 200000) */
};
void dsi_grammar_opts_default(struct dsi_grammar_opts *o);

/* ---------------------------------------------------------------------------------------- */
/* Grammar (tokenizer independent). */
struct dsi_grammar;

/* Parse src[0..len) of the given kind (DSI_GRAMMAR_JSON_OBJECT/VALUE ignore src). opts may be
 * NULL (defaults). On error *out is NULL and err names the position or the schema keyword. */
int dsi_grammar_parse(struct dsi_grammar **out,
                      enum dsi_grammar_kind kind,
                      const char *src,
                      size_t len,
                      const struct dsi_grammar_opts *opts,
                      struct dsi_err *err);
void dsi_grammar_free(struct dsi_grammar *g);

/* The grammar as EBNF text in the dialect above (root first). Returns a malloc'd,
 * NUL-terminated string (caller frees) or NULL when out of memory. */
char *dsi_grammar_print(const struct dsi_grammar *g);

/* ---------------------------------------------------------------------------------------- */
/* Vocabulary: the byte string of every token id, built once per tokenizer. */
struct dsi_grammar_vocab;

enum dsi_grammar_token_flags {
    DSI_GRAMMAR_TOKEN_SPECIAL = 1 << 0, /* control token: never allowed (EOS aside) */
};

/* tokens[i] (i < n_vocab): bytes and length of token id i (len 0 = no text: never allowed);
 * flags[i] (may be NULL): enum dsi_grammar_token_flags. eos_id in [0, n_vocab) is the token
 * allowed where the grammar may end. Bytes are copied; nothing is kept. */
int dsi_grammar_vocab_new(struct dsi_grammar_vocab **out,
                          const char *const *tokens,
                          const uint32_t *lens,
                          const uint8_t *flags,
                          int32_t n_vocab,
                          int32_t eos_id,
                          struct dsi_err *err);
void dsi_grammar_vocab_free(struct dsi_grammar_vocab *v);
int32_t dsi_grammar_vocab_size(const struct dsi_grammar_vocab *v);
int32_t dsi_grammar_vocab_eos(const struct dsi_grammar_vocab *v);
/* Bytes of a token (borrowed, valid until dsi_grammar_vocab_free). */
const char *dsi_grammar_vocab_token(const struct dsi_grammar_vocab *v, int32_t id, uint32_t *len);

/* Words of a mask over the vocabulary: (n_vocab + 31) / 32; bit (id & 31) of word id >> 5. */
static inline size_t dsi_grammar_mask_words(int32_t n_vocab) { return ((size_t)n_vocab + 31) / 32; }

/* ---------------------------------------------------------------------------------------- */
/* Compiled grammar: automata + mask cache for one vocabulary. Keeps a reference to vocab until
 * dsi_grammar_compiled_free (vocab must outlive it); g is not kept and may be freed at once.
 * opts (NULL: those given to dsi_grammar_parse) supply max_states. Cost: one walk of the token
 * trie per distinct automaton position (milliseconds to a few hundred for typical schemas);
 * cache compiled grammars per (source, options, tokenizer). */
struct dsi_grammar_compiled;

int dsi_grammar_compile(struct dsi_grammar_compiled **out,
                        const struct dsi_grammar *g,
                        const struct dsi_grammar_vocab *vocab,
                        const struct dsi_grammar_opts *opts,
                        struct dsi_err *err);
void dsi_grammar_compiled_free(struct dsi_grammar_compiled *cg);

struct dsi_grammar_stats {
    int n_rules;       /* rules after trimming */
    int n_states;      /* DFA states over all rules */
    int n_mask_sets;   /* distinct precomputed positions (after sharing equivalent states) */
    int64_t n_unc;     /* context-dependent tokens summed over those positions */
    size_t mask_bytes; /* memory of the mask cache */
    double compile_s;  /* wall time of dsi_grammar_compile */
};
void dsi_grammar_compiled_stats(const struct dsi_grammar_compiled *cg, struct dsi_grammar_stats *s);

/* ---------------------------------------------------------------------------------------- */
/* Matcher: one request's parse state. Keeps a reference to cg (must outlive it). */
struct dsi_grammar_matcher;

int dsi_grammar_matcher_new(struct dsi_grammar_matcher **out,
                            const struct dsi_grammar_compiled *cg,
                            struct dsi_err *err);
void dsi_grammar_matcher_free(struct dsi_grammar_matcher *m);
void dsi_grammar_matcher_reset(struct dsi_grammar_matcher *m); /* back to the empty output */

/* Write the allowed-token bitset into mask[dsi_grammar_mask_words(n_vocab)]. After
 * termination the mask is empty. Returns DSI_OK, or DSI_ERR_INVALID when no token at all is
 * allowed although the output is unfinished (a vocabulary that cannot spell the next byte):
 * fail the request. No allocation after the first calls (scratch grows to its high-water mark). */
int dsi_grammar_matcher_fill_mask(struct dsi_grammar_matcher *m, uint32_t *mask);

/* Advance on a sampled token. A token outside the mask is refused with DSI_ERR_INVALID and the
 * state is unchanged. EOS is accepted only where the grammar may end; it terminates. */
int dsi_grammar_matcher_accept_token(struct dsi_grammar_matcher *m,
                                     int32_t id,
                                     struct dsi_err *err);

/* Advance on raw bytes (a forced prefix; tests). All or nothing, like accept_token. Counts as one
 * token for rollback. */
int dsi_grammar_matcher_accept_bytes(struct dsi_grammar_matcher *m,
                                     const char *bytes,
                                     size_t len,
                                     struct dsi_err *err);

/* Undo the last k accepted tokens (EOS included). k > number of accepted tokens is an error. */
int dsi_grammar_matcher_rollback(struct dsi_grammar_matcher *m, int k, struct dsi_err *err);

int dsi_grammar_matcher_n_tokens(const struct dsi_grammar_matcher *m); /* accepted so far */
/* The committed bytes form a whole member of the language (EOS is in the mask). */
bool dsi_grammar_matcher_is_complete(const struct dsi_grammar_matcher *m);
/* No byte can follow: EOS is the only allowed token. */
bool dsi_grammar_matcher_is_final(const struct dsi_grammar_matcher *m);
/* EOS has been accepted. */
bool dsi_grammar_matcher_is_terminated(const struct dsi_grammar_matcher *m);

/* Fewest bytes that make the output complete (0 when it is; -1 when terminated or out of
 * memory). An estimate on huge automata. Costs a pass over the chart and allocates: for tools
 * that steer random walks to an end, not for the decode loop. */
int64_t dsi_grammar_matcher_bytes_to_end(const struct dsi_grammar_matcher *m);

#endif
