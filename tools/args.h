/* args.h - small helpers shared by the subcommands (argument parsing, id lists). */
#ifndef DSI_ARGS_H
#define DSI_ARGS_H

#include <stdint.h>

/* The model used when -m is not given: models/dsv4-tiny under the current directory, else
 * next to the binary (build/../models/dsv4-tiny). Returns a static string. */
const char *args_default_model(void);
#define DSI_DEFAULT_MODEL args_default_model()

/* Parse "1,2,3" into a malloc'd array; returns count or -1 with a message on stderr. */
int args_parse_ids(const char *s, int32_t **out);
/* Parse an integer/float option value or print "dsinfer CMD: OPT: want ..." and return -1. */
int args_int(
    const char *cmd, const char *opt, const char *v, long long lo, long long hi, long long *out);
int args_float(const char *cmd, const char *opt, const char *v, double *out);
/* "plain" | "reference" | "fast" -> enum dsi_numerics_opt, or a message and -1. */
int args_numerics(const char *cmd, const char *v, int *out);
/* --kv-cache auto|f32|fp8 -> enum dsi_kv_cache_opt; a message and -1 on anything else. */
int args_kv_cache(const char *cmd, const char *v, int *out);

#endif
