/* fuzz_jinja_tmpl: libFuzzer harness for the Jinja chat-template interpreter (engine/jinja.c):
 * the input is the template text, parsed and rendered over a fixed conversation (system, user,
 * assistant, user; add_generation_prompt on) and over a fixed JSON context. */
#include "fuzz_util.h"

#include "engine/jinja.h"

static const jinja_chat_msg msgs[] = {
    {"system", "You are terse.", 14},
    {"user", "Hello there", 11},
    {"assistant", " Hi! <think>x</think>  ", 23},
    {"user", "Count: 1 2 3\n", 13},
};

static const char ctx[] =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":[1,2,{\"a\":null}]}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
    "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"x\":1.5e3,\"y\":false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 15) return 0;
    kv_error err = {0};
    jinja_template *t = NULL;
    if (jinja_parse((const char *)data, size, &t, &err) != KV_OK) return 0;
    char *out = NULL;
    size_t len = 0;
    unsigned char *mask = NULL;
    if (jinja_render_chat(t, msgs, sizeof msgs / sizeof msgs[0], 1, "<s>", "</s>", 1700000000, &out, &len, &mask,
                          &err) == KV_OK) {
        if (out[len] != 0) abort();
        free(out);
        free(mask);
    }
    out = NULL;
    mask = NULL;
    if (jinja_render(t, ctx, sizeof ctx - 1, -1, &out, &len, &mask, &err) == KV_OK) {
        free(out);
        free(mask);
    }
    jinja_free(t);
    return 0;
}
