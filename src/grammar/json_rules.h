/* json_rules.h - JSON's lexical pieces as grammar IR (json_rules.c), for schema.c and
 * json_object. Rules are created on first use and shared. */
#ifndef DSI_GRAMMAR_JSON_RULES_H
#define DSI_GRAMMAR_JSON_RULES_H

#include "grammar/internal.h"

#include <jansson.h>

#define JR_NEG_INF INT64_MIN
#define JR_POS_INF INT64_MAX

struct jr {
    struct dsi_grammar *g;
    uint32_t r_string, r_number, r_integer, r_value, r_object, r_array; /* UINT32_MAX: not yet */
};

void jr_init(struct jr *j, struct dsi_grammar *g);
struct gx *jr_ws(struct jr *j);                    /* whitespace per the grammar's policy */
struct gx *jr_punct(struct jr *j, const char *c);  /* ws c ws */
struct gx *jr_char(struct jr *j, bool surrogates); /* one string character (raw or escape) */
/* Rules (UINT32_MAX when out of memory). */
uint32_t jr_string(struct jr *j);
uint32_t jr_number(struct jr *j);
uint32_t jr_integer(struct jr *j);
uint32_t jr_value(struct jr *j);
uint32_t jr_object(struct jr *j);
uint32_t jr_array(struct jr *j);
/* A key: a JSON string (quotes included) different from each of names[0..n). */
uint32_t jr_other_key(struct jr *j, const char *const *names, size_t n);
/* Canonical integers in [lo, hi]; JR_NEG_INF / JR_POS_INF for open ends. */
struct gx *jr_int_range(struct jr *j, int64_t lo, int64_t hi);
/* String content (quotes excluded) of a format: date, time, date-time, email, uuid. */
int jr_format(struct jr *j, const char *name, struct gx **out, struct dsi_err *err);
/* A JSON value as a compact literal. */
struct gx *jr_literal(struct jr *j, json_t *v);

#endif
