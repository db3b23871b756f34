/* template_cmd: the `kvchat template-render` subcommand. */
#ifndef KV_TEMPLATE_CMD_H
#define KV_TEMPLATE_CMD_H

/* argv[0] is "template-render". Returns the process exit status (0 ok, 1 template error,
 * 2 usage, 3 model or file). */
int template_main(int argc, char **argv);

#endif
