/* cmd_tok_stub.c - placeholder entry points until tools/cmd_tok.c lands (tokenizer issue). */
#include "cmds.h"

#include <stdio.h>

int cmd_tokenize(int argc, char **argv) {
    fprintf(stderr, "dsinfer tokenize: not built yet\n");
    return 1;
}
int cmd_detokenize(int argc, char **argv) {
    fprintf(stderr, "dsinfer detokenize: not built yet\n");
    return 1;
}
int cmd_bench_tokenize(int argc, char **argv) {
    fprintf(stderr, "dsinfer bench tokenize: not built yet\n");
    return 1;
}
