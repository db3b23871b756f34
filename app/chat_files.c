/* chat_files: the files the chats read and write — /read FILE's checks and /export's file — shared by the full screen (app/chat.c) and the line mode (app/linechat.c). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/chat.h"
#include "app/chatstore.h"
#include "app/store_cli.h"
#include "ui/text.h"

#define READ_MAX_BYTES (1 << 20) /* /read: the largest file attached */

static void user_path(const char *arg, char *path, size_t cap)
{
    const char *home = getenv("HOME");
    if (arg[0] == '~' && arg[1] == '/' && home) snprintf(path, cap, "%s%s", home, arg + 1);
    else snprintf(path, cap, "%s", arg);
}

/* The length of the longest valid UTF-8 prefix of s[0..n) (n when all of it is). */
static size_t utf8_valid_prefix(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = ui_utf8_decode(s + i, n - i, &cp);
        if (cp == 0xFFFD && !(k == 3 && !memcmp(s + i, "\xEF\xBF\xBD", 3))) return i;
        i += k;
    }
    return n;
}
char *chat_read_text(const char *arg, size_t *len, char *path, size_t path_cap, int *unreadable, char *why_out,
                     size_t why_cap)
{
    *unreadable = 0;
    const char *home = getenv("HOME");
    if (arg[0] == '~' && arg[1] == '/' && home) snprintf(path, path_cap, "%s%s", home, arg + 1);
    else snprintf(path, path_cap, "%s", arg);
    FILE *f = fopen(path, "rb");
    if (!f) {
        *unreadable = 1;
        snprintf(why_out, why_cap, "%s", strerror(errno));
        return NULL;
    }
    char *buf = malloc(READ_MAX_BYTES + 1);
    size_t n = buf ? fread(buf, 1, READ_MAX_BYTES + 1, f) : 0;
    int err = ferror(f);
    fclose(f);
    const char *why = !buf ? "out of memory" : err ? "read error" : n > READ_MAX_BYTES ? "larger than 1 MiB" : NULL;
    char what[160] = "";
    if (!why) {
        const char *nul = memchr(buf, 0, n);
        size_t bad = utf8_valid_prefix(buf, n);
        if (nul) snprintf(what, sizeof what, "a binary file (a NUL byte at offset %zu)", (size_t)(nul - buf));
        else if (bad < n) snprintf(what, sizeof what, "a binary file (not UTF-8 text at offset %zu)", bad);
        if (what[0]) why = what;
    }
    if (why) {
        snprintf(why_out, why_cap, "%s", why);
        free(buf);
        return NULL;
    }
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
    buf[n] = 0;
    *len = n;
    return buf;
}

int chat_export_conv(chatstore *cs, const char *args_in, char *msg, size_t cap)
{
    const char *format = "md", *args = args_in;
    size_t wl = strcspn(args, " ");
    if ((wl == 2 && !strncmp(args, "md", 2)) || (wl == 4 && !strncmp(args, "json", 4))) {
        format = wl == 2 ? "md" : "json";
        args += wl;
        while (*args == ' ') args++;
    }
    int64_t id = chatstore_current(cs);
    if (!cs || !id) {
        snprintf(msg, cap, "/export: %s", !cs ? "conversations are not being saved (see the notice at start)"
                                              : "nothing to export yet: send a message first");
        return -1;
    }
    char path[4096], why[800];
    if (*args) user_path(args, path, sizeof path);
    else snprintf(path, sizeof path, "kvchat-%lld.%s", (long long)id, format);
    char *text = !strcmp(format, "json") ? store_cli_export_json(chatstore_db(cs), id, why, sizeof why)
                                         : store_cli_export_md(chatstore_db(cs), id, why, sizeof why);
    if (!text) {
        snprintf(msg, cap, "/export: %s", why);
        return -1;
    }
    FILE *f = fopen(path, "wb");
    size_t tl = strlen(text);
    int bad = !f || fwrite(text, 1, tl, f) != tl || (tl && text[tl - 1] != '\n' && fputc('\n', f) == EOF);
    int e = errno;
    if (f && fclose(f)) bad = 1, e = errno;
    free(text);
    if (bad) snprintf(msg, cap, "/export %s: %s", path, strerror(e));
    else snprintf(msg, cap, "exported conversation %lld (%s, %zu bytes) to %s", (long long)id, format, tl, path);
    return bad ? -1 : 0;
}
