/* models: the models directory ($XDG_DATA_HOME/kvchat/models) — `-m NAME` lookup, `kvchat models`, `kvchat themes`, and the message shown when no model is given. */
#ifndef KV_APP_MODELS_H
#define KV_APP_MODELS_H

#include <stddef.h>
#include <stdio.h>

/* $XDG_DATA_HOME/kvchat/models (XDG_DATA_HOME absolute), else ~/.local/share/kvchat/models.
 * Returns 0, or -1 when neither variable is set. */
int models_dir(char *buf, size_t cap);

/* Where `-m NAME` points: an existing file as it is; otherwise a bare name (no '/') is looked
 * up in the models directory as NAME, then NAME.gguf. Returns 1 (found in the directory; out
 * holds its path), 0 (use name as it is: an existing file, or a path whose error the loader
 * reports), or -1 (a bare name found nowhere; the message for it is in out). */
int models_resolve(const char *name, char *out, size_t cap);

/* The models directory's model names (its *.gguf files without .gguf), sorted, at most cap of
 * them into out (each malloc'd: free them). Returns how many (0 when there is no directory). */
int models_names(char **out, int cap);

/* The message shown when no model is given: how to get a GGUF model and where to put it. */
void models_print_no_model(FILE *out);

/* `kvchat models [--json]`: the models directory's GGUF files with size, parameters,
 * architecture, weight type and context length, read from their headers (no weights are
 * loaded). Returns an exit status. */
int models_main(int argc, char **argv);

/* `kvchat themes`: the theme names the chat finds, one a line: NAME TAB FILE (or "built in"). */
int themes_main(int argc, char **argv);

#endif
