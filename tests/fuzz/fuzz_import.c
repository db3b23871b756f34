/* fuzz_import: libFuzzer harness for `kvchat import` (app/store_cli.c's cmd_import: the NUL
 * marking, cJSON parsing, every field's checks, storage's store_conv_import) over a database in
 * a temporary directory; each imported conversation is exported again as JSON and Markdown.
 * store_cli.c is included (its import is static), so the link leaves out its object. */
#include "fuzz_util.h"

#include "../../app/store_cli.c"

static store *db;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char dir[] = "/tmp/kvchat-fuzz-import-XXXXXX";
    if (!mkdtemp(dir)) exit(1);
    char path[128];
    snprintf(path, sizeof path, "%s/chats.db", dir);
    store_error err = {0};
    if (store_open(path, STORE_OPEN_SYNC_NORMAL, &db, &err)) {
        fprintf(stderr, "fuzz_import: %s\n", err.msg);
        exit(1);
    }
    unlink(path); /* gone when the process ends (SQLite keeps its descriptors) */
    if (!freopen("/dev/null", "w", stdout)) exit(1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 18) return 0;
    char path[64];
    if (fuzz_as_file(data, size, path, sizeof path)) return 0;
    int rc = cmd_import(db, path);
    if (rc == SC_OK) {
        /* each import is deleted after its export, so the database holds just this one */
        store_conv *rows = NULL;
        size_t n = 0;
        store_error err = {0};
        if (store_conv_list(db, NULL, &rows, &n, &err) == STORE_OK && n) {
            long long id = rows[0].id;
            char why[700];
            char *j = store_cli_export_json(db, id, why, sizeof why);
            if (!j) {
                fprintf(stderr, "fuzz_import: imported but cannot export: %s\n", why);
                abort();
            }
            free(j);
            char *md = store_cli_export_md(db, id, why, sizeof why);
            free(md);
            store_conv_delete(db, id, &err);
        }
        store_conv_list_free(rows, n);
    }
    return 0;
}
