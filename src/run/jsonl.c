/* jsonl.c - JSON request objects with OpenAI / vLLM parameter names -> struct dsi_request, and
 * results -> JSON output lines (include/dsinfer.h). Parsing is strict: an unknown field, a
 * wrong type or an out-of-range value is an error naming the field; the engine checks the
 * values again at dsi_submit (one source of truth for ranges lives there).
 *
 * Ownership: struct dsi_jsonl_req owns the parsed JSON and every array the request points
 * to; the strings of the request point into the JSON. */
#include "dsinfer.h"

#include "core/core.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

struct dsi_jsonl_req {
    json_t *root;
    struct dsi_request req;
    int32_t *ids;
    int32_t *stop_ids;
    const char **stop;
    char *messages;
    char *response_format; /* the object re-serialised (compact) */
};

const struct dsi_request *dsi_jsonl_request(const struct dsi_jsonl_req *r) { return &r->req; }

void dsi_jsonl_req_free(struct dsi_jsonl_req *r) {
    if (!r) return;
    json_decref(r->root);
    free(r->ids);
    free(r->stop_ids);
    free(r->stop);
    free(r->messages);
    free(r->response_format);
    free(r);
}

/* ---- field readers ----------------------------------------------------------------------------
 */

static int want_int(
    const char *k, json_t *v, long long lo, long long hi, long long *out, struct dsi_err *err) {
    if (json_is_real(v)) { /* 16.0 is an integer too */
        double d = json_real_value(v);
        if (d == floor(d) && d >= (double)lo && d <= (double)hi) {
            *out = (long long)d;
            return DSI_OK;
        }
    }
    if (!json_is_integer(v))
        return dsi_errf(err, DSI_ERR_INVALID, "field \"%s\": want an integer", k);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return dsi_errf(err, DSI_ERR_INVALID, "field \"%s\": %lld is out of range %lld..%lld", k, x,
                        lo, hi);
    *out = x;
    return DSI_OK;
}

static int
want_num(const char *k, json_t *v, double lo, double hi, float *out, struct dsi_err *err) {
    if (!json_is_number(v)) return dsi_errf(err, DSI_ERR_INVALID, "field \"%s\": want a number", k);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return dsi_errf(err, DSI_ERR_INVALID, "field \"%s\": %g is out of range %g..%g", k, x, lo,
                        hi);
    *out = (float)x;
    return DSI_OK;
}

static int
want_ids(const char *k, json_t *v, bool nonempty, int32_t **out, int *n, struct dsi_err *err) {
    if (!json_is_array(v))
        return dsi_errf(err, DSI_ERR_INVALID, "field \"%s\": want a list of token ids", k);
    size_t m = json_array_size(v);
    if (nonempty && !m) return dsi_errf(err, DSI_ERR_INVALID, "field \"%s\": empty", k);
    if (m > (1u << 24)) return dsi_errf(err, DSI_ERR_INVALID, "field \"%s\": too long", k);
    int32_t *a = dsi_malloc(sizeof(int32_t) * (m ? m : 1));
    if (!a) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < m; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
            free(a);
            return dsi_errf(err, DSI_ERR_INVALID,
                            "field \"%s\": element %zu is not a non-negative token id", k, i);
        }
        a[i] = (int32_t)json_integer_value(x);
    }
    free(*out);
    *out = a;
    *n = (int)m;
    return DSI_OK;
}

static int want_stop(struct dsi_jsonl_req *r, json_t *v, struct dsi_err *err) {
    size_t m = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_string(v) && !json_is_array(v))
        return dsi_errf(err, DSI_ERR_INVALID, "field \"stop\": want a string or a list of strings");
    r->stop = dsi_calloc(m ? m : 1, sizeof(char *));
    if (!r->stop) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < m; i++) {
        json_t *x = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(x) || !json_string_length(x))
            return dsi_errf(err, DSI_ERR_INVALID,
                            "field \"stop\": element %zu is not a "
                            "non-empty string",
                            i);
        if (strlen(json_string_value(x)) != json_string_length(x))
            return dsi_errf(err, DSI_ERR_INVALID, "field \"stop\": element %zu contains NUL", i);
        r->stop[i] = json_string_value(x);
    }
    r->req.stop = r->stop;
    r->req.n_stop = (int)m;
    return DSI_OK;
}

static int field(struct dsi_jsonl_req *r, const char *k, json_t *v, struct dsi_err *err) {
    struct dsi_request *q = &r->req;
    long long x = 0;
    int rc = DSI_OK;
    if (!strcmp(k, "id") || !strcmp(k, "custom_id") || !strcmp(k, "model")) return DSI_OK;
    if (json_is_null(v)) return DSI_OK; /* null = default, as the OpenAI API */
    if (!strcmp(k, "prompt")) {
        if (json_is_string(v)) {
            q->prompt = json_string_value(v);
            q->prompt_len = json_string_length(v);
            if (!q->prompt_len) return dsi_errf(err, DSI_ERR_INVALID, "field \"prompt\": empty");
            return DSI_OK;
        }
        if (json_is_array(v) && json_array_size(v) && json_is_string(json_array_get(v, 0)))
            return dsi_errf(err, DSI_ERR_INVALID,
                            "field \"prompt\": one prompt per line (got a list of strings)");
        rc = want_ids(k, v, true, &r->ids, &q->n_prompt_ids, err);
        q->prompt_ids = r->ids;
    } else if (!strcmp(k, "prompt_token_ids")) {
        rc = want_ids(k, v, true, &r->ids, &q->n_prompt_ids, err);
        q->prompt_ids = r->ids;
    } else if (!strcmp(k, "messages")) {
        if (!json_is_array(v) || !json_array_size(v))
            return dsi_errf(err, DSI_ERR_INVALID, "field \"messages\": want a non-empty list");
        r->messages = json_dumps(v, JSON_COMPACT);
        if (!r->messages) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
        q->messages_json = r->messages;
    } else if (!strcmp(k, "max_tokens") || !strcmp(k, "max_completion_tokens")) {
        rc = want_int(k, v, 1, 1 << 30, &x, err);
        q->max_tokens = (int)x;
    } else if (!strcmp(k, "temperature")) {
        rc = want_num(k, v, 0.0, 100.0, &q->temperature, err);
    } else if (!strcmp(k, "top_p")) {
        rc = want_num(k, v, 1e-9, 1.0, &q->top_p, err);
    } else if (!strcmp(k, "top_k")) {
        rc = want_int(k, v, -1, 1 << 30, &x, err);
        q->top_k = x < 0 ? 0 : (int)x;
    } else if (!strcmp(k, "min_p")) {
        rc = want_num(k, v, 0.0, 1.0, &q->min_p, err);
    } else if (!strcmp(k, "presence_penalty")) {
        rc = want_num(k, v, -2.0, 2.0, &q->presence_penalty, err);
    } else if (!strcmp(k, "frequency_penalty")) {
        rc = want_num(k, v, -2.0, 2.0, &q->frequency_penalty, err);
    } else if (!strcmp(k, "repetition_penalty")) {
        rc = want_num(k, v, 1e-6, 100.0, &q->repetition_penalty, err);
    } else if (!strcmp(k, "stop")) {
        rc = want_stop(r, v, err);
    } else if (!strcmp(k, "stop_token_ids")) {
        rc = want_ids(k, v, false, &r->stop_ids, &q->n_stop_token_ids, err);
        q->stop_token_ids = r->stop_ids;
    } else if (!strcmp(k, "seed")) {
        rc = want_int(k, v, 0, INT64_MAX, &x, err);
        q->has_seed = true;
        q->seed = (uint64_t)x;
    } else if (!strcmp(k, "n")) {
        rc = want_int(k, v, 1, 256, &x, err);
        q->n = (int)x;
    } else if (!strcmp(k, "logprobs")) {
        if (json_is_boolean(v)) {
            q->logprobs = json_is_true(v);
        } else {
            rc = want_int(k, v, 0, 20, &x, err); /* completions API: N alternatives */
            q->logprobs = true;
            if (!q->top_logprobs) q->top_logprobs = (int)x;
        }
    } else if (!strcmp(k, "top_logprobs")) {
        rc = want_int(k, v, 0, 20, &x, err);
        q->top_logprobs = (int)x;
    } else if (!strcmp(k, "response_format")) {
        if (!json_is_object(v))
            return dsi_errf(err, DSI_ERR_INVALID,
                            "field \"response_format\": want an object such as "
                            "{\"type\": \"json_object\"}");
        r->response_format = json_dumps(v, JSON_COMPACT);
        if (!r->response_format) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
        q->response_format = r->response_format; /* checked and compiled by dsi_submit */
    } else if (!strcmp(k, "ignore_eos")) {
        if (!json_is_boolean(v))
            return dsi_errf(err, DSI_ERR_INVALID, "field \"ignore_eos\": want true or false");
        q->ignore_eos = json_is_true(v);
    } else {
        return dsi_errf(err, DSI_ERR_INVALID, "unknown field \"%.100s\"", k);
    }
    return rc;
}

int dsi_jsonl_parse(struct dsi_jsonl_req **out, const char *line, size_t len, struct dsi_err *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!root && json_error_code(&je) == json_error_invalid_utf8)
        return dsi_errf(err, DSI_ERR_INVALID, "invalid UTF-8: %s (column %d)", je.text, je.column);
    if (!root)
        return dsi_errf(err, DSI_ERR_INVALID, "malformed JSON: %s (column %d)", je.text, je.column);
    if (!json_is_object(root)) {
        json_decref(root);
        return dsi_errf(err, DSI_ERR_INVALID, "want a JSON object per line");
    }
    struct dsi_jsonl_req *r = dsi_calloc(1, sizeof(*r));
    if (!r) {
        json_decref(root);
        return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    }
    r->root = root;
    dsi_request_init(&r->req);
    *out = r;
    const char *k;
    json_t *v;
    int kinds = 0;
    json_object_foreach(root, k, v) {
        int rc = field(r, k, v, err);
        if (rc) return rc;
        kinds +=
            (!strcmp(k, "prompt") || !strcmp(k, "prompt_token_ids") || !strcmp(k, "messages")) &&
            !json_is_null(v);
    }
    if (kinds != 1)
        return dsi_errf(err, DSI_ERR_INVALID,
                        kinds ? "give only one of \"prompt\", \"prompt_token_ids\", \"messages\""
                              : "no prompt: give \"prompt\", \"prompt_token_ids\" or \"messages\"");
    return DSI_OK;
}

/* ---- output lines ------------------------------------------------------------------------------
 */

static const char *code_name(int status) {
    switch (status) {
    case DSI_ERR_INVALID:
    case DSI_ERR_FORMAT:
        return "invalid_request";
    case DSI_ERR_CONTEXT_FULL:
        return "context_length_exceeded";
    case DSI_ERR_UNSUPPORTED:
        return "unsupported";
    case DSI_ERR_NOMEM:
        return "out_of_memory";
    case DSI_ERR_CANCELLED:
        return "cancelled";
    default:
        return "engine_error";
    }
}

static json_t *head(const struct dsi_jsonl_req *r, long line_no) {
    json_t *o = json_object();
    json_object_set_new(o, "line", json_integer(line_no));
    if (r) {
        json_t *v = json_object_get(r->root, "id");
        if (v) json_object_set(o, "id", v);
        v = json_object_get(r->root, "custom_id");
        if (v) json_object_set(o, "custom_id", v);
    }
    return o;
}

static char *dump(json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9) | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

char *dsi_jsonl_error(const struct dsi_jsonl_req *r, long line_no, int status, const char *msg) {
    json_t *o = head(r, line_no);
    json_t *e = json_object();
    json_object_set_new(e, "code", json_string(code_name(status)));
    json_object_set_new(e, "message", json_string(msg ? msg : dsi_status_str(status)));
    if (!json_object_get(e, "message")) /* not valid UTF-8 (cannot happen with our messages) */
        json_object_set_new(e, "message", json_string(dsi_status_str(status)));
    json_object_set_new(o, "error", e);
    return dump(o);
}

static json_t *ids_array(const int32_t *p, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer(p[i]));
    return a;
}

/* A logprob as JSON: -INFINITY (an id masked by a response_format) as -9999.0, the value
 * OpenAI and vLLM use (JSON has no infinity). */
static json_t *lp_real(float x) { return json_real(isfinite(x) ? (double)x : -9999.0); }

static json_t *logprobs_obj(const struct dsi_completion *c) {
    json_t *o = json_object(), *lp = json_array();
    for (int i = 0; i < c->n_tokens; i++)
        json_array_append_new(lp, lp_real(c->logprobs[i]));
    json_object_set_new(o, "token_ids", ids_array(c->tokens, c->n_tokens));
    json_object_set_new(o, "token_logprobs", lp);
    if (c->n_top) {
        json_t *top = json_array();
        for (int i = 0; i < c->n_tokens; i++) {
            json_t *alt = json_array();
            for (int k = 0; k < c->n_top; k++) {
                json_t *x = json_object();
                json_object_set_new(x, "id", json_integer(c->top_ids[i * c->n_top + k]));
                json_object_set_new(x, "logprob", lp_real(c->top_logprobs[i * c->n_top + k]));
                json_array_append_new(alt, x);
            }
            json_array_append_new(top, alt);
        }
        json_object_set_new(o, "top_logprobs", top);
    }
    return o;
}

char *dsi_jsonl_result(const struct dsi_jsonl_req *r, long line_no, const struct dsi_result *res) {
    if (res->status) return dsi_jsonl_error(r, line_no, res->status, res->error);
    json_t *o = head(r, line_no);
    json_t *ch = json_array();
    double tpot = 0.0;
    int n_tpot = 0, n_pre = 0;
    for (int i = 0; i < res->n; i++) {
        const struct dsi_completion *c = &res->c[i];
        json_t *x = json_object();
        json_object_set_new(x, "index", json_integer(i));
        if (c->text) {
            json_t *t = json_stringn(c->text, c->text_len);
            json_object_set_new(x, "text",
                                t ? t : json_string("")); /* stream text is valid UTF-8 */
        }
        json_object_set_new(x, "token_ids", ids_array(c->tokens, c->n_tokens));
        json_object_set_new(x, "finish_reason", json_string(dsi_finish_str(c->finish)));
        json_object_set_new(x, "stop_reason",
                            c->stop_str          ? json_string(c->stop_str)
                            : c->stop_token >= 0 ? json_integer(c->stop_token)
                                                 : json_null());
        if (c->logprobs) json_object_set_new(x, "logprobs", logprobs_obj(c));
        json_array_append_new(ch, x);
        if (c->n_tokens > 1) {
            tpot += (c->t_last - c->t_first) / (c->n_tokens - 1);
            n_tpot++;
        }
        n_pre += c->n_preemptions;
    }
    json_object_set_new(o, "seed", json_integer((json_int_t)res->seed));
    json_object_set_new(o, "choices", ch);
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(res->n_prompt_tokens));
    json_object_set_new(u, "completion_tokens", json_integer(res->n_completion_tokens));
    json_object_set_new(u, "total_tokens",
                        json_integer(res->n_prompt_tokens + res->n_completion_tokens));
    json_object_set_new(o, "usage", u);
    json_t *tm = json_object();
    json_object_set_new(tm, "queue_s", json_real(res->t_queue));
    json_object_set_new(tm, "ttft_s", json_real(res->t_first_token));
    json_object_set_new(tm, "tpot_s", json_real(n_tpot ? tpot / n_tpot : 0.0));
    json_object_set_new(tm, "total_s", json_real(res->t_total));
    json_object_set_new(tm, "preemptions", json_integer(n_pre));
    json_object_set_new(o, "timings", tm);
    return dump(o);
}
