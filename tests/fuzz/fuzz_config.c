/* fuzz_config.c - libFuzzer target for the config.json parser and validator. */
#include "load/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct dsi_config cfg;
    struct dsi_err err;
    if (dsi_config_parse(&cfg, (const char *)data, size, "fuzz", &err) == 0) {
        if (cfg.n_layers_total < 1 || cfg.n_layers_total > DSI_MAX_LAYERS) __builtin_trap();
    }
    return 0;
}
