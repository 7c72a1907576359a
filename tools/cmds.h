/* cmds.h - subcommand entry points of build/dsinfer. Each returns a process exit code and
 * prints its own errors (one line naming the object and the expectation). */
#ifndef DSI_CMDS_H
#define DSI_CMDS_H

int cmd_generate(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_bench_layer(int argc, char **argv);   /* tools/cmd_bench_layer.c */
int cmd_run(int argc, char **argv);           /* tools/cmd_run.c */
int cmd_bench_sweep(int argc, char **argv);   /* tools/cmd_sweep.c */
int cmd_grammar(int argc, char **argv);       /* tools/cmd_grammar.c */
int dsi_bench_grammar(int argc, char **argv); /* tools/cmd_grammar.c */
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int dsi_bench_tokenize(int argc, char **argv); /* tools/cmd_tok.c */

#endif
