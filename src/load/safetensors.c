/* safetensors.c - mmap shards, parse and check headers, resolve the index. See safetensors.h. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
    const char *name;
    size_t size;
} g_dtypes[DSI_DT_COUNT] = {
    [DSI_DT_BF16] = {"BF16", 2},       [DSI_DT_F32] = {"F32", 4},         [DSI_DT_F16] = {"F16", 2},
    [DSI_DT_F8_E4M3] = {"F8_E4M3", 1}, [DSI_DT_F8_E8M0] = {"F8_E8M0", 1}, [DSI_DT_I8] = {"I8", 1},
    [DSI_DT_U8] = {"U8", 1},           [DSI_DT_I32] = {"I32", 4},         [DSI_DT_I64] = {"I64", 8},
};

const char *dsi_dtype_name(enum dsi_dtype t) {
    return (unsigned)t < DSI_DT_COUNT ? g_dtypes[t].name : "?";
}
size_t dsi_dtype_size(enum dsi_dtype t) {
    return (unsigned)t < DSI_DT_COUNT ? g_dtypes[t].size : 0;
}

static int dtype_parse(const char *s) {
    for (int i = 0; i < DSI_DT_COUNT; i++)
        if (!strcmp(s, g_dtypes[i].name)) return i;
    return -1;
}

static const char *shard_name(const struct dsi_st *st, int shard) {
    return st->shards && shard < st->n_shards && st->shards[shard].path ? st->shards[shard].path
                                                                        : "<buffer>";
}

static int parse_one(struct dsi_st *st,
                     int shard,
                     const char *name,
                     json_t *v,
                     const uint8_t *data,
                     size_t data_size,
                     struct dsi_err *err) {
    const char *file = shard_name(st, shard);
    if (!json_is_object(v))
        return dsi_errf(err, DSI_ERR_FORMAT, "%s: tensor %s: header entry is not an object", file,
                        name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2)
        return dsi_errf(err, DSI_ERR_FORMAT,
                        "%s: tensor %s: want dtype string, shape array, data_offsets [begin, end]",
                        file, name);
    int dt = dtype_parse(json_string_value(jd));
    if (dt < 0)
        return dsi_errf(err, DSI_ERR_FORMAT, "%s: tensor %s: unknown dtype %s", file, name,
                        json_string_value(jd));
    size_t nd = json_array_size(js);
    if (nd > 4)
        return dsi_errf(err, DSI_ERR_FORMAT, "%s: tensor %s: rank %zu, at most 4 supported", file,
                        name, nd);
    struct dsi_st_tensor t = {0};
    t.dtype = (enum dsi_dtype)dt;
    t.n_dims = (int)nd;
    t.n_elem = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0 ||
            json_integer_value(d) > ((int64_t)1 << 40))
            return dsi_errf(err, DSI_ERR_FORMAT, "%s: tensor %s: bad shape entry %zu", file, name,
                            i);
        t.shape[i] = json_integer_value(d);
        if (t.shape[i] && t.n_elem > ((int64_t)1 << 50) / t.shape[i])
            return dsi_errf(err, DSI_ERR_FORMAT, "%s: tensor %s: shape too large", file, name);
        t.n_elem *= t.shape[i];
    }
    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
        json_integer_value(je) < json_integer_value(jb))
        return dsi_errf(err, DSI_ERR_FORMAT, "%s: tensor %s: bad data_offsets", file, name);
    uint64_t b = (uint64_t)json_integer_value(jb), e = (uint64_t)json_integer_value(je);
    uint64_t want = (uint64_t)t.n_elem * g_dtypes[dt].size;
    if (e - b != want)
        return dsi_errf(
            err, DSI_ERR_FORMAT, "%s: tensor %s: data is %llu bytes, shape and dtype %s need %llu",
            file, name, (unsigned long long)(e - b), g_dtypes[dt].name, (unsigned long long)want);
    if (e > data_size)
        return dsi_errf(err, DSI_ERR_FORMAT,
                        "%s: tensor %s: data ends at byte %llu, past the end of the file's data "
                        "(%zu bytes; truncated shard?)",
                        file, name, (unsigned long long)e, data_size);
    t.data = data + b;
    t.n_bytes = (size_t)want;
    t.shard = shard;
    t.name = strdup(name);
    if (!t.name) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    if (st->n_tensors % 256 == 0) {
        void *nt = realloc(st->tensors, sizeof(*st->tensors) * ((size_t)st->n_tensors + 256));
        if (!nt) {
            free(t.name);
            return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
        }
        st->tensors = nt;
    }
    st->tensors[st->n_tensors++] = t;
    return DSI_OK;
}

static int cmp_range(const void *a, const void *b) {
    const struct dsi_st_tensor *x = *(const struct dsi_st_tensor *const *)a,
                               *y = *(const struct dsi_st_tensor *const *)b;
    const uint8_t *px = x->data, *py = y->data;
    return px < py ? -1 : px > py;
}

int dsi_st_parse_header(
    struct dsi_st *st, int shard, const uint8_t *buf, size_t size, struct dsi_err *err) {
    const char *file = shard_name(st, shard);
    if (size < 8)
        return dsi_errf(err, DSI_ERR_FORMAT, "%s: %zu bytes, too short for a safetensors header",
                        file, size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | buf[i];
    if (hl > size - 8 || hl > ((uint64_t)100 << 20))
        return dsi_errf(err, DSI_ERR_FORMAT,
                        "%s: header length %llu exceeds the file (%zu bytes; truncated shard?)",
                        file, (unsigned long long)hl, size);
    json_error_t je;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hl, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return dsi_errf(err, DSI_ERR_FORMAT, "%s: header JSON: %s (line %d column %d)", file,
                        je.text, je.line, je.column);
    int rc = DSI_OK;
    if (!json_is_object(root)) {
        rc = dsi_errf(err, DSI_ERR_FORMAT, "%s: header is not a JSON object", file);
        goto out_root;
    }
    int first = st->n_tensors;
    const char *key;
    json_t *v;
    const uint8_t *data = buf + 8 + hl;
    size_t data_size = size - 8 - (size_t)hl;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) continue;
        rc = parse_one(st, shard, key, v, data, data_size, err);
        if (rc) goto out_root;
    }
    /* Overlap check within this shard. */
    int n = st->n_tensors - first;
    if (n > 1) {
        const struct dsi_st_tensor **v2 = malloc(sizeof(*v2) * (size_t)n);
        if (!v2) {
            rc = dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
            goto out_root;
        }
        for (int i = 0; i < n; i++)
            v2[i] = &st->tensors[first + i];
        qsort(v2, (size_t)n, sizeof(*v2), cmp_range);
        for (int i = 1; i < n && !rc; i++) {
            const uint8_t *end_prev = (const uint8_t *)v2[i - 1]->data + v2[i - 1]->n_bytes;
            if ((const uint8_t *)v2[i]->data < end_prev)
                rc = dsi_errf(err, DSI_ERR_FORMAT, "%s: tensors %s and %s overlap", file,
                              v2[i - 1]->name, v2[i]->name);
        }
        free(v2);
    }
out_root:
    json_decref(root);
    return rc;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const struct dsi_st_tensor *)a)->name, ((const struct dsi_st_tensor *)b)->name);
}

void dsi_st_sort(struct dsi_st *st) {
    qsort(st->tensors, (size_t)st->n_tensors, sizeof(*st->tensors), cmp_name);
}

const struct dsi_st_tensor *dsi_st_find(const struct dsi_st *st, const char *name) {
    int lo = 0, hi = st->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (!c) return &st->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

size_t dsi_st_total_bytes(const struct dsi_st *st) {
    size_t s = 0;
    for (int i = 0; i < st->n_tensors; i++)
        s += st->tensors[i].n_bytes;
    return s;
}

static int map_shard(struct dsi_st *st, const char *path, struct dsi_err *err) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return dsi_errf(err, DSI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    int rc = DSI_OK;
    if (fstat(fd, &sb) != 0) {
        rc = dsi_errf(err, DSI_ERR_IO, "%s: stat: %s", path, strerror(errno));
        goto out_close;
    }
    struct dsi_st_shard *sh = &st->shards[st->n_shards];
    sh->path = strdup(path);
    sh->size = (size_t)sb.st_size;
    if (!sh->path) {
        rc = dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
        goto out_close;
    }
    sh->map = sh->size ? mmap(NULL, sh->size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    if (sh->size && sh->map == MAP_FAILED) {
        sh->map = NULL;
        rc = dsi_errf(err, DSI_ERR_IO, "%s: mmap: %s", path, strerror(errno));
        free(sh->path);
        sh->path = NULL;
        goto out_close;
    }
    st->n_shards++;
    rc = dsi_st_parse_header(st, st->n_shards - 1, sh->map, sh->size, err);
out_close:
    close(fd);
    return rc;
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

int dsi_st_open(struct dsi_st **out, const char *dir, struct dsi_err *err) {
    *out = NULL;
    struct dsi_st *st = dsi_calloc(1, sizeof(*st));
    if (!st) return dsi_errf(err, DSI_ERR_NOMEM, "out of memory");
    char path[4096];
    int rc = DSI_OK;
    json_t *index = NULL;
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    if (file_exists(path)) {
        json_error_t je;
        index = json_load_file(path, 0, &je);
        if (!index) {
            rc = dsi_errf(err, DSI_ERR_FORMAT, "%s: %s (line %d column %d)", path, je.text, je.line,
                          je.column);
            goto fail;
        }
        json_t *wm = json_object_get(index, "weight_map");
        if (!json_is_object(wm)) {
            rc = dsi_errf(err, DSI_ERR_FORMAT, "%s: want an object \"weight_map\"", path);
            goto fail;
        }
        /* Distinct shard file names, in first-seen order. */
        size_t n_names = json_object_size(wm);
        const char **files = calloc(n_names ? n_names : 1, sizeof(*files));
        int n_files = 0;
        const char *key;
        json_t *v;
        json_object_foreach(wm, key, v) {
            if (!json_is_string(v)) {
                free(files);
                rc = dsi_errf(err, DSI_ERR_FORMAT, "%s: weight_map[%s] is not a string", path, key);
                goto fail;
            }
            const char *f = json_string_value(v);
            int seen = 0;
            for (int i = 0; i < n_files && !seen; i++)
                seen = !strcmp(files[i], f);
            if (!seen) files[n_files++] = f;
        }
        st->shards = dsi_calloc((size_t)n_files, sizeof(*st->shards));
        for (int i = 0; i < n_files && !rc; i++) {
            if (strchr(files[i], '/')) {
                rc = dsi_errf(err, DSI_ERR_FORMAT, "%s: shard name %s must be a plain file name",
                              path, files[i]);
                break;
            }
            char sp[4096];
            snprintf(sp, sizeof(sp), "%s/%s", dir, files[i]);
            rc = map_shard(st, sp, err);
        }
        free(files);
        if (rc) goto fail;
        dsi_st_sort(st);
        /* Every name in the index must exist in its shard. */
        json_object_foreach(wm, key, v) {
            const struct dsi_st_tensor *t = dsi_st_find(st, key);
            if (!t) {
                rc = dsi_errf(err, DSI_ERR_FORMAT, "%s: tensor %s listed in the index is not in %s",
                              path, key, json_string_value(v));
                goto fail;
            }
        }
    } else {
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        if (!file_exists(path)) {
            rc = dsi_errf(err, DSI_ERR_IO,
                          "%s: no model.safetensors.index.json or model.safetensors found", dir);
            goto fail;
        }
        st->shards = dsi_calloc(1, sizeof(*st->shards));
        rc = map_shard(st, path, err);
        if (rc) goto fail;
        dsi_st_sort(st);
    }
    for (int i = 1; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i - 1].name, st->tensors[i].name)) {
            rc = dsi_errf(err, DSI_ERR_FORMAT, "%s: tensor %s appears in two shards", dir,
                          st->tensors[i].name);
            goto fail;
        }
    json_decref(index);
    *out = st;
    return DSI_OK;
fail:
    json_decref(index);
    dsi_st_close(st);
    return rc;
}

void dsi_st_close(struct dsi_st *st) {
    if (!st) return;
    for (int i = 0; i < st->n_tensors; i++)
        free(st->tensors[i].name);
    free(st->tensors);
    for (int i = 0; i < st->n_shards; i++) {
        if (st->shards[i].map) munmap(st->shards[i].map, st->shards[i].size);
        free(st->shards[i].path);
    }
    free(st->shards);
    free(st);
}
