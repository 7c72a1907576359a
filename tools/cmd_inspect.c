/* cmd_inspect.c - `dsinfer inspect`: print and validate a checkpoint. */
#include "args.h"
#include "cmds.h"
#include "core/core.h"
#include "dsinfer.h"

#include <string.h>

int cmd_inspect(int argc, char **argv) {
    const char *dir = DSI_DEFAULT_MODEL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: dsinfer inspect [-m DIR]\n"
                   "Prints the config, the layer table, tensor counts and bytes by dtype, and\n"
                   "validates every tensor's name, dtype and shape.\n");
            return 0;
        }
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            dir = argv[++i];
        else {
            fprintf(stderr, "dsinfer inspect: unknown or incomplete option '%s'\n", argv[i]);
            return 2;
        }
    }
    struct dsi_err err = {0};
    if (dsi_inspect(dir, stdout, &err)) {
        printf("validation: FAILED\n");
        fprintf(stderr, "dsinfer inspect: %s\n", err.msg);
        return 1;
    }
    return 0;
}
