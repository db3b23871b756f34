/* tokenize_cmd: the `kvchat tokenize` subcommand. */
#ifndef KV_TOKENIZE_CMD_H
#define KV_TOKENIZE_CMD_H

/* argv[0] is "tokenize". Returns the process exit status (0 ok, 1 runtime, 2 usage, 3 model). */
int tokenize_main(int argc, char **argv);

#endif
