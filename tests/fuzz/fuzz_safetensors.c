/* fuzz_safetensors.c - libFuzzer target for the safetensors header parser. */
#include "load/safetensors.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct dsi_st *st = calloc(1, sizeof(*st));
    struct dsi_err err;
    if (!st) return 0;
    if (dsi_st_parse_header(st, 0, data, size, &err) == 0) {
        dsi_st_sort(st);
        for (int i = 0; i < st->n_tensors; i++) {
            const struct dsi_st_tensor *t = dsi_st_find(st, st->tensors[i].name);
            if (!t || (const uint8_t *)t->data + t->n_bytes > data + size) abort();
        }
    }
    dsi_st_close(st);
    return 0;
}
