/* tensor.h - a view of typed memory that never owns it. Shapes: ne[0] is the innermost
 * (contiguous) extent, as in ggml; comments write shapes outermost first, [rows, cols].
 * Quantised weights carry their block scales: FP8 e4m3 with one UE8M0 scale per
 * scale_block[0] x scale_block[1] tile (128 x 128 in V4), FP4 e2m1 (two codes per byte, low
 * nibble first; ne[0] counts logical elements) with one UE8M0 scale per 1 x 32. */
#ifndef DSI_TENSOR_H
#define DSI_TENSOR_H

#include <stdint.h>

enum dsi_type {
    DSI_TYPE_F32 = 0,
    DSI_TYPE_BF16,
    DSI_TYPE_F16,
    DSI_TYPE_F8_E4M3,
    DSI_TYPE_FP4_E2M1,
    DSI_TYPE_E8M0,
    DSI_TYPE_I32,
    DSI_TYPE_I64,
};

struct dsi_tensor {
    enum dsi_type type;
    int64_t ne[4];                  /* extents, ne[0] innermost */
    const void *data;               /* host or device address; may be unaligned on the host */
    const struct dsi_tensor *scale; /* UE8M0 block scales for F8/FP4, else NULL */
    int32_t scale_block[2];         /* rows x cols covered by one scale */
    int64_t scale_row_stride;       /* scale entries per row of scales */
};

/* Row r of a 2-D weight has ne[0] logical elements; bytes per row by type. */
static inline int64_t dsi_tensor_row_bytes(const struct dsi_tensor *t) {
    switch (t->type) {
    case DSI_TYPE_F32:
    case DSI_TYPE_I32:
        return t->ne[0] * 4;
    case DSI_TYPE_BF16:
    case DSI_TYPE_F16:
        return t->ne[0] * 2;
    case DSI_TYPE_FP4_E2M1:
        return t->ne[0] / 2;
    case DSI_TYPE_I64:
        return t->ne[0] * 8;
    default:
        return t->ne[0];
    }
}

#endif
