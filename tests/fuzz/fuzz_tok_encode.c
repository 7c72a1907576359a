/* fuzz_tok_encode.c - libFuzzer target: encode/decode with DeepSeek-V4's real tokenizer.
 * Input: byte 0 = flags (bit 0 parse special tokens, bit 1 lossy), the rest = text.
 * Checks: no crash; valid UTF-8 round-trips byte for byte; the stream decoder always emits
 * valid UTF-8 and agrees with the whole lossy decode. Run from the repository root (the
 * tokenizer is unpacked from tests/golden/tok/v4/tokenizer.json.gz at start-up). */
#define _POSIX_C_SOURCE 200809L
#include "tok/bpe.h"
#include "tok/utf8.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct dsi_bpe *g_bpe;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char dir[] = "/tmp/dsinfer-fuzz-tok-XXXXXX", cmd[512];
    if (!mkdtemp(dir)) abort();
    snprintf(cmd, sizeof(cmd), "gzip -dc tests/golden/tok/v4/tokenizer.json.gz > %s/tokenizer.json",
             dir);
    struct dsi_err err;
    if (system(cmd) != 0 || dsi_bpe_open(&g_bpe, dir, &err)) {
        fprintf(stderr, "fuzz_tok_encode: cannot load the tokenizer (run from the repository "
                        "root)\n");
        abort();
    }
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "fuzz_tok_encode: could not remove %s\n", dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    bool special = data[0] & 1, lossy = data[0] & 2;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids;
    size_t n;
    struct dsi_err err;
    int rc = lossy ? dsi_bpe_encode_lossy(g_bpe, text, len, special, &ids, &n, &err)
                   : dsi_bpe_encode(g_bpe, text, len, special, &ids, &n, &err);
    bool valid = dsi_utf8_valid_len(text, len) == len;
    if (rc) {
        if (valid || lossy) __builtin_trap(); /* only invalid UTF-8 in strict mode may fail */
        return 0;
    }
    size_t need;
    if (dsi_bpe_decode(g_bpe, ids, n, 0, NULL, 0, &need, &err)) __builtin_trap();
    char *out = malloc(need + 1);
    if (dsi_bpe_decode(g_bpe, ids, n, 0, out, need + 1, &need, &err)) __builtin_trap();
    if (valid && (need != len || memcmp(out, text, len))) __builtin_trap();
    /* stream decode == lossy whole decode */
    size_t ln;
    if (dsi_bpe_decode(g_bpe, ids, n, DSI_DECODE_LOSSY, NULL, 0, &ln, &err)) __builtin_trap();
    char *lossy_out = malloc(ln + 1);
    dsi_bpe_decode(g_bpe, ids, n, DSI_DECODE_LOSSY, lossy_out, ln + 1, &ln, &err);
    struct dsi_bpe_stream *st;
    if (dsi_bpe_stream_new(&st, g_bpe, 0, &err)) __builtin_trap();
    size_t k = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t pl;
        if (i < n) {
            if (dsi_bpe_stream_feed(st, ids[i], &p, &pl, &err)) __builtin_trap();
        } else {
            dsi_bpe_stream_flush(st, &p, &pl);
        }
        if (dsi_utf8_valid_len(p, pl) != pl || k + pl > ln || memcmp(lossy_out + k, p, pl))
            __builtin_trap();
        k += pl;
    }
    if (k != ln) __builtin_trap();
    dsi_bpe_stream_free(st);
    free(lossy_out);
    free(out);
    free(ids);
    return 0;
}
