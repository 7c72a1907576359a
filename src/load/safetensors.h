/* safetensors.h - read-only access to a checkpoint's safetensors shards.
 *
 * A shard file is: u64 little-endian header length N, N bytes of UTF-8 JSON
 * ({"__metadata__": {...}, "name": {"dtype", "shape", "data_offsets": [b, e]}, ...}), then raw
 * row-major little-endian data; offsets are relative to the first byte after the header.
 * dsi_st_open mmaps every shard named by model.safetensors.index.json (or the single
 * model.safetensors) and checks every tensor: known dtype, rank <= 4, end - begin equal to
 * elements x element size, range inside the file, no overlaps. Tensor data pointers point into
 * the mmaps and are valid until dsi_st_close. Data may be unaligned. */
#ifndef DSI_SAFETENSORS_H
#define DSI_SAFETENSORS_H

#include "core/core.h"

enum dsi_dtype {
    DSI_DT_BF16 = 0,
    DSI_DT_F32,
    DSI_DT_F16,
    DSI_DT_F8_E4M3,
    DSI_DT_F8_E8M0,
    DSI_DT_I8,
    DSI_DT_U8,
    DSI_DT_I32,
    DSI_DT_I64,
    DSI_DT_COUNT
};

const char *dsi_dtype_name(enum dsi_dtype t);
size_t dsi_dtype_size(enum dsi_dtype t);

struct dsi_st_tensor {
    char *name; /* owned by the dsi_st */
    enum dsi_dtype dtype;
    int n_dims;
    int64_t shape[4]; /* outermost first, as in the file */
    int64_t n_elem;
    const void *data; /* into the shard's mmap */
    size_t n_bytes;
    int shard; /* index into dsi_st.shards */
};

struct dsi_st_shard {
    char *path;
    void *map;
    size_t size;
};

struct dsi_st {
    struct dsi_st_shard *shards;
    int n_shards;
    struct dsi_st_tensor *tensors; /* sorted by name */
    int n_tensors;
};

/* Open a model directory (index + shards, or model.safetensors). */
int dsi_st_open(struct dsi_st **out, const char *dir, struct dsi_err *err);
/* Parse one shard file and append its tensors (used by dsi_st_open and the fuzzer). */
int dsi_st_parse_header(
    struct dsi_st *st, int shard, const uint8_t *buf, size_t size, struct dsi_err *err);
void dsi_st_close(struct dsi_st *st);
/* Binary search by name; NULL if absent. Call dsi_st_sort first if tensors were appended. */
const struct dsi_st_tensor *dsi_st_find(const struct dsi_st *st, const char *name);
void dsi_st_sort(struct dsi_st *st);
/* Total bytes of tensor data. */
size_t dsi_st_total_bytes(const struct dsi_st *st);

#endif
