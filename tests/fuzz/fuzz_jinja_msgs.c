/* fuzz_jinja_msgs: libFuzzer harness for the Jinja interpreter (engine/jinja.c) over real chat
 * templates (every *.jinja of ../shared/templates plus tests/templates, read at start-up) with
 * fuzzed messages: byte 0 picks the template, byte 1 add_generation_prompt, the rest is split at
 * 0x00 bytes into role, content, role, content ... (roles from a small table by their first byte,
 * or the raw bytes when they start with '!'). Also the same messages as a raw JSON context. */
#include <dirent.h>

#include "fuzz_util.h"

#include "engine/jinja.h"

#define MAX_T 64
static jinja_template *tmpls[MAX_T];
static int n_tmpls;

static void load_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) && n_tmpls < MAX_T) {
        size_t l = strlen(e->d_name);
        if (l < 7 || strcmp(e->d_name + l - 6, ".jinja")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        size_t len;
        char *src = fuzz_read_file(p, &len);
        kv_error err = {0};
        if (src && jinja_parse(src, len, &tmpls[n_tmpls], &err) == KV_OK) n_tmpls++;
        free(src);
    }
    closedir(d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/templates", fuzz_shared());
    load_dir(p);
    load_dir("tests/templates");
    if (!n_tmpls) {
        fprintf(stderr, "fuzz_jinja_msgs: no templates in %s (set KVCHAT_SHARED)\n", p);
        exit(1);
    }
    return 0;
}

static const char *const roles[] = {"user", "assistant", "system", "tool", "ipython", "developer"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 1 << 15) return 0;
    const jinja_template *t = tmpls[data[0] % n_tmpls];
    int agp = data[1] & 1;
    char *buf = fuzz_strndup(data + 2, size - 2);
    if (!buf) return 0;
    jinja_chat_msg m[32];
    size_t n = 0, i = 0, len = size - 2;
    while (i <= len && n < 32) {
        size_t a = i;
        while (i < len && buf[i]) i++;
        const char *role = buf + a;
        if (!(role[0] == '!')) role = roles[(unsigned char)role[0] % 6];
        i++;
        if (i > len) {
            m[n++] = (jinja_chat_msg){role, "", 0};
            break;
        }
        size_t c = i;
        while (i < len && buf[i]) i++;
        m[n++] = (jinja_chat_msg){role, buf + c, i - c};
        i++;
    }
    kv_error err = {0};
    char *out = NULL;
    size_t olen = 0;
    unsigned char *mask = NULL;
    if (jinja_render_chat(t, m, n, agp, agp ? "<s>" : NULL, "</s>", 1700000000, &out, &olen, &mask, &err) == KV_OK) {
        free(out);
        free(mask);
    }
    /* the bytes as a JSON context of their own */
    out = NULL;
    mask = NULL;
    if (jinja_render(t, (const char *)data + 2, size - 2, 0, &out, &olen, &mask, &err) == KV_OK) {
        free(out);
        free(mask);
    }
    free(buf);
    return 0;
}
