/* store_cli: the conversation subcommands — `kvchat list`, `export`, `import`, `rm` and `check` — over the SQLite store. */
#ifndef APP_STORE_CLI_H
#define APP_STORE_CLI_H

#include <stddef.h>

/* 1 if argv[1] names one of these subcommands. */
int store_cli_is_command(const char *name);

/* Run the subcommand argv[0] ("list", "export", "import", "rm", "check"):
 *   kvchat list [--json] [--ids] [--db PATH]
 *   kvchat export ID|last [--format md|json] [-o FILE] [--db PATH]
 *   kvchat import FILE|- [--db PATH]          (a JSON export; prints the new ID)
 *   kvchat rm ID... [--db PATH]
 *   kvchat check [--db PATH]                   (integrity, foreign keys, search index, rows, KV checksums)
 * The database: --db, else the config file's [storage] db / KVCHAT_DB, else the default
 * ($XDG_DATA_HOME/kvchat/kvchat.db). Returns an exit status: 0 ok, 1 no such conversation or
 * a file that cannot be read or is not a kvchat export, 2 usage, 4 database error. */
int store_cli_main(int argc, char **argv);

/* The JSON export of conversation id (kvchat export --format json): a malloc'd string, or NULL
 * with the reason in why. Byte-exact under import → export. */
struct store;
char *store_cli_export_json(struct store *s, long long id, char *why, size_t why_cap);
/* The Markdown export (kvchat export --format md): the current branch, stored text made safe for a
 * terminal (out_plain). A malloc'd string, or NULL with the reason in why. */
char *store_cli_export_md(struct store *s, long long id, char *why, size_t why_cap);

#endif
