/* fuzz_chat_template: libFuzzer harness for the shape-table renderer (engine/chat_template.c):
 * family detection over the input as a template text, and rendering: byte 0 picks the family
 * (every value, NONE/UNKNOWN/JINJA/out of range included), byte 1 add_assistant, the rest is
 * split at 0x00 into messages whose role comes from their first byte. */
#include "fuzz_util.h"

#include "engine/chat_template.h"

static const char *const roles[] = {"user", "assistant", "system", "tool"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 15) return 0;
    char *all = fuzz_strndup(data, size);
    if (!all) return 0;
    int fam = chat_template_detect(all);
    (void)chat_template_name(fam);
    (void)chat_template_from_name(all);
    free(all);
    if (size < 2) return 0;
    int tmpl = (int)(signed char)data[0] % (CHAT_TMPL_JINJA + 3);
    int add = data[1] & 1;
    char *buf = fuzz_strndup(data + 2, size - 2);
    if (!buf) return 0;
    chat_msg m[32];
    size_t n = 0, i = 0, len = size - 2;
    while (i < len && n < 32) {
        size_t a = i;
        while (i < len && buf[i]) i++;
        m[n].role = roles[(unsigned char)buf[a] % 4];
        m[n].content = buf + a + (a < len); /* the role byte is not content */
        n++;
        i++;
    }
    kv_error err = {0};
    char *out = NULL;
    if (chat_template_render(tmpl, m, n, add, &out, &err) == KV_OK) {
        if (!out) abort();
        free(out);
    } else if (out) {
        abort();
    }
    (void)chat_template_is_prefix_stable(tmpl);
    free(buf);
    return 0;
}
