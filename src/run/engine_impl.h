/* engine_impl.h - the engine object behind include/dsinfer.h, shared by the files of src/run.
 * The engine owns the backend, the model, the cache pool and the forward scratch. */
#ifndef DSI_ENGINE_IMPL_H
#define DSI_ENGINE_IMPL_H

#include "dsinfer.h"

#include "cache/kv.h"
#include "model/forward.h"

struct dsi_bpe;

struct dsi_engine {
    struct dsi_bpe *tok; /* NULL when the model directory has no tokenizer.json */
    struct dsi_backend *be;
    struct dsi_model *m;
    struct dsi_kv *kv;
    struct dsi_fwd *fwd;
    int max_rows;
    int64_t max_ctx;
    enum dsi_numerics numerics;
    /* serving state (src/run/batch.c): set by dsi_batch_open, freed by dsi_batch_close */
    struct dsi_serve *serve;
};

#endif
