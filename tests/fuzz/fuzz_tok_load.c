/* fuzz_tok_load.c - libFuzzer target for the tokenizer.json loader (src/tok/bpe_load.c and the
 * pre-tokenizer builder). A file that loads is then used: a few encodes and decodes. */
#include "tok/bpe.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct dsi_bpe *b = NULL;
    struct dsi_err err;
    if (dsi_bpe_load(&b, (const char *)data, size, NULL, 0, 0, &err)) {
        if (b || !err.msg[0]) __builtin_trap(); /* failure: no object, a message */
        return 0;
    }
    static const char *const texts[] = {"", "a", "ab ba 12345 <s> x", "中文 😀\n\n\t  end",
                                        "<｜User｜>hi<think>"};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        int32_t *ids;
        size_t n;
        if (dsi_bpe_encode(b, texts[i], strlen(texts[i]), i & 1, &ids, &n, &err)) continue;
        size_t len;
        char buf[256];
        /* every id that encode produces must decode */
        if (dsi_bpe_decode(b, ids, n, DSI_DECODE_LOSSY, buf, sizeof(buf), &len, &err))
            __builtin_trap();
        free(ids);
    }
    (void)dsi_bpe_token_id(b, "a", NULL);
    dsi_bpe_free(b);
    return 0;
}
