/* dsinfer.c - main(): subcommand dispatch. The only place that turns statuses into exit codes. */
#include "cmds.h"

#include <stdio.h>
#include <string.h>

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
};

static const struct command g_cmds[] = {
    {"generate", cmd_generate, "generate a continuation of a prompt"},
    {"run", cmd_run, "offline batch: JSONL requests in, JSONL results out (progress on stderr)"},
    {"logits", cmd_logits, "write the logits of every prompt position to a file"},
    {"inspect", cmd_inspect, "print and validate a checkpoint's config and tensors"},
    {"bench", cmd_bench, "benchmarks (prefill/decode tokens/s, tokenizer)"},
    {"eval", cmd_eval, "evaluation: eval ppl FILE (perplexity, MTP accuracy)"},
    {"grammar", cmd_grammar, "structured outputs: check/print/sample/masks for a grammar"},
    {"tokenize", cmd_tokenize, "text on stdin -> token ids"},
    {"detokenize", cmd_detokenize, "token ids on stdin -> text"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: dsinfer COMMAND [options]   (dsinfer COMMAND --help for details)\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof(g_cmds) / sizeof(g_cmds[0]); i++)
        fprintf(f, "  %-12s %s\n", g_cmds[i].name, g_cmds[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof(g_cmds) / sizeof(g_cmds[0]); i++)
        if (!strcmp(argv[1], g_cmds[i].name)) return g_cmds[i].fn(argc - 1, argv + 1);
    /* `dsinfer "The jury said"`-style use is not a command: say what is expected. */
    fprintf(stderr, "dsinfer: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
