/* test_chat_template: chat template detection, names, byte-exact rendering against golden/chat-templates.json, prefix stability. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat_template.h"
#include "tests/support/testutil.h"

/* ---- helpers ------------------------------------------------------------------------- */

typedef struct golden {
    char *text;   /* file contents (owned) */
    cJSON *root;
    chat_msg msgs[16];
    size_t n_msgs;
} golden;

static int golden_setup(void **state)
{
    static golden g;
    char path[1024];
    snprintf(path, sizeof path, "%s/golden/chat-templates.json", tu_shared());
    g.text = tu_read_file(path, NULL);
    if (!g.text) {
        fprintf(stderr, "%s: cannot read (set KVCHAT_SHARED)\n", path);
        return -1;
    }
    g.root = cJSON_Parse(g.text);
    if (!g.root) {
        fprintf(stderr, "%s: not valid JSON\n", path);
        return -1;
    }
    const cJSON *conv = cJSON_GetObjectItemCaseSensitive(g.root, "conversation");
    const cJSON *m;
    g.n_msgs = 0;
    cJSON_ArrayForEach(m, conv) {
        if (g.n_msgs >= sizeof g.msgs / sizeof g.msgs[0])
            return -1;
        g.msgs[g.n_msgs].role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
        g.msgs[g.n_msgs].content = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "content"));
        g.n_msgs++;
    }
    if (g.n_msgs < 2 || strcmp(g.msgs[0].role, "system") != 0) {
        fprintf(stderr, "%s: expected a conversation opening with a system message\n", path);
        return -1;
    }
    *state = &g;
    return 0;
}

static int golden_teardown(void **state)
{
    golden *g = *state;
    if (g) {
        cJSON_Delete(g->root);
        free(g->text);
    }
    return 0;
}

/* Family for a golden "template" field: "builtin:NAME" by name, "file:PATH" by detecting
 * the file's text; *from_file tells which. -2 when the file cannot be read. */
static int golden_family(const char *tmpl_field, int *from_file)
{
    *from_file = 0;
    if (strncmp(tmpl_field, "builtin:", 8) == 0)
        return chat_template_from_name(tmpl_field + 8);
    if (strncmp(tmpl_field, "file:", 5) == 0) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", tu_shared(), tmpl_field + 5);
        char *text = tu_read_file(path, NULL);
        if (!text) {
            fprintf(stderr, "%s: cannot read\n", path);
            return -2;
        }
        *from_file = 1;
        int t = chat_template_detect(text);
        free(text);
        return t;
    }
    return -2;
}

/* Up to 48 bytes of s, C-escaped, for failure messages. */
static const char *excerpt(const char *s, char *buf, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; s[i] && i < 48 && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') { buf[o++] = '\\'; buf[o++] = 'n'; }
        else if (c == '\t') { buf[o++] = '\\'; buf[o++] = 't'; }
        else if (c == '"' || c == '\\') { buf[o++] = '\\'; buf[o++] = (char)c; }
        else if (c < 0x20) o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    buf[o] = '\0';
    return buf;
}

static size_t first_diff(const char *a, const char *b)
{
    size_t i = 0;
    while (a[i] && a[i] == b[i])
        i++;
    return i;
}

/* ---- golden renderings --------------------------------------------------------------- */

/* Every supported rendering byte for byte; per-template pass counts; the first differing
 * offset of every mismatch. */
static void test_golden_renderings(void **state)
{
    golden *g = *state;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(g->root, "renderings");
    assert_non_null(rs);

    int total = 0, passed = 0, unsupported_ok = 0, unsupported_total = 0;
    const char *cur = NULL;
    int cur_pass = 0, cur_total = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, rs) {
        const char *tname = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "template"));
        int with_system = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "with_system"));
        int add_assistant = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "add_assistant"));
        int supported = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "supported"));
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "text"));
        assert_non_null(tname);

        if (!cur || strcmp(cur, tname) != 0) {
            if (cur)
                printf("  %-70s %d/%d\n", cur, cur_pass, cur_total);
            cur = tname;
            cur_pass = cur_total = 0;
        }

        int from_file;
        int t = golden_family(tname, &from_file);
        if (!supported) {
            unsupported_total++;
            if (t == CHAT_TMPL_UNKNOWN || t == -1)
                unsupported_ok++;
            else
                printf("  FAIL %s: llama.cpp refuses it, detected as '%s'\n", tname,
                       chat_template_name(t));
            continue;
        }
        total++;
        cur_total++;
        assert_non_null(want);

        const chat_msg *msgs = with_system ? g->msgs : g->msgs + 1;
        size_t n = with_system ? g->n_msgs : g->n_msgs - 1;
        char *got = NULL;
        kv_error err = { 0 };
        int rc = (t > 0) ? chat_template_render(t, msgs, n, add_assistant, &got, &err)
                         : KV_ERR_UNSUPPORTED;
        if (rc != KV_OK) {
            printf("  FAIL %s (with_system=%d): family '%s', render: %s\n", tname, with_system,
                   t >= 0 ? chat_template_name(t) : "(none)", err.msg);
        } else if (strcmp(got, want) != 0) {
            size_t off = first_diff(got, want);
            char ew[256], eg[256];
            printf("  FAIL %s (with_system=%d, family '%s'): first difference at byte %zu\n"
                   "    want: \"%s\"\n    got:  \"%s\"\n",
                   tname, with_system, chat_template_name(t), off,
                   excerpt(want + off, ew, sizeof ew), excerpt(got + off, eg, sizeof eg));
        } else {
            passed++;
            cur_pass++;
        }
        free(got);
    }
    if (cur)
        printf("  %-70s %d/%d\n", cur, cur_pass, cur_total);
    printf("golden chat templates: %d of %d supported renderings match byte for byte; "
           "%d of %d unsupported templates detected as unknown\n",
           passed, total, unsupported_ok, unsupported_total);
    assert_true(total > 0);
    assert_int_equal(passed, total);
    assert_int_equal(unsupported_ok, unsupported_total);
}

/* Every file: template is recognised (supported) or refused (unsupported); every builtin:
 * name is known, and the name itself as template text detects to that family. */
static void test_golden_detection(void **state)
{
    golden *g = *state;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(g->root, "renderings");
    const cJSON *r;
    int files = 0, names = 0;
    cJSON_ArrayForEach(r, rs) {
        const char *tname = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "template"));
        int supported = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "supported"));
        int from_file;
        int t = golden_family(tname, &from_file);
        assert_int_not_equal(t, -2);
        if (from_file) {
            files++;
            if (supported) {
                if (t == CHAT_TMPL_UNKNOWN || t == CHAT_TMPL_NONE)
                    fail_msg("%s: not recognised", tname);
            } else {
                assert_int_equal(t, CHAT_TMPL_UNKNOWN);
            }
        } else {
            names++;
            const char *name = tname + 8;
            if (supported) {
                if (t <= CHAT_TMPL_NONE)
                    fail_msg("%s: chat_template_from_name(\"%s\") = %d", tname, name, t);
                assert_string_equal(chat_template_name(t), name);
                assert_int_equal(chat_template_detect(name), t);
            } else {
                assert_int_equal(t, -1);
            }
        }
    }
    assert_true(files > 0);
    assert_true(names > 0);
}

/* ---- names --------------------------------------------------------------------------- */

static void test_names(void **state)
{
    (void)state;
    /* every family round-trips, and chat_template_names() lists them in enum order */
    char joined[2048] = "";
    for (int t = CHAT_TMPL_NONE + 1; t < CHAT_TMPL_UNKNOWN; t++) {
        const char *name = chat_template_name(t);
        assert_string_not_equal(name, "unknown");
        assert_int_equal(chat_template_from_name(name), t);
        if (t > CHAT_TMPL_NONE + 1)
            strcat(joined, ", ");
        strcat(joined, name);
    }
    assert_string_equal(chat_template_names(), joined);

    assert_int_equal(chat_template_from_name("none"), CHAT_TMPL_NONE);
    assert_string_equal(chat_template_name(CHAT_TMPL_NONE), "none");
    assert_string_equal(chat_template_name(CHAT_TMPL_UNKNOWN), "unknown");
    assert_string_equal(chat_template_name(-3), "unknown");
    assert_string_equal(chat_template_name(CHAT_TMPL_UNKNOWN + 5), "unknown");

    static const char *bad[] = { "", "ChatML", "llama-2", "llama", "mistral", "unknown",
                                 "chatml ", "gpt-oss", "llama4", "jinja" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (chat_template_from_name(bad[i]) != -1)
            fail_msg("chat_template_from_name(\"%s\") should be -1", bad[i]);
    assert_int_equal(chat_template_from_name(NULL), -1);
}

/* ---- detection of representative template texts ------------------------------------- */

/* Short excerpts in the style of the models' tokenizer.chat_template, one per family the
 * golden files do not already cover (and a few they do), so every rule is exercised. */
static void test_detect_snippets(void **state)
{
    (void)state;
    static const struct { const char *text; int want; } cases[] = {
        { "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}",
          CHAT_TMPL_CHATML },
        { "{% for m in messages %}{{'<|im_start|>' + m['role'] + '<|im_sep|>' + m['content'] + '<|im_end|>'}}{% endfor %}",
          CHAT_TMPL_PHI4 },
        { "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}",
          CHAT_TMPL_LLAMA2 },
        { "{% if m['role'] == 'system' %}{{ '[INST] <<SYS>>\\n' + m['content'] + '\\n<</SYS>>\\n\\n' }}{% endif %}[INST]",
          CHAT_TMPL_LLAMA2_SYS },
        { "{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}{{- '[INST] <<SYS>>\\n' -}}",
          CHAT_TMPL_LLAMA2_SYS_BOS },
        { "{{ '[INST] ' + content.strip() + ' [/INST]' }}{{ '<<SYS>>\\n' }}",
          CHAT_TMPL_LLAMA2_SYS_STRIP },
        { "{%- if loop.first and system_message is defined %}{{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}",
          CHAT_TMPL_MISTRAL_V1 },
        { "{{- \"[AVAILABLE_TOOLS] [\" }}{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}",
          CHAT_TMPL_MISTRAL_V3 },
        { "{{- \"[AVAILABLE_TOOLS][\" }}{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}",
          CHAT_TMPL_MISTRAL_V3_TEKKEN },
        { "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}",
          CHAT_TMPL_MISTRAL_V7 },
        { "{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}",
          CHAT_TMPL_PHI3 },
        { "{{ '<|user|>\\n' + message['content'] + '\\n' }}{{ '<|assistant|>\\n' + message['content'] + '</s>' }}",
          CHAT_TMPL_FALCON3 },
        { "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + message['content'] + eos_token }}\n{% endif %}{% endfor %}<|endoftext|>",
          CHAT_TMPL_ZEPHYR },
        { "{% for message in messages %}{{bos_token + message['role'] + '\\n' + message['content'] + eos_token + '\\n'}}{% endfor %}",
          CHAT_TMPL_MONARCH },
        { "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}",
          CHAT_TMPL_GEMMA },
        { "{% if message['role'] == 'user' %}{{ 'Human: ' + message['content'] + '\\n\\nAssistant: ' + eos_token }}{% endif %}",
          CHAT_TMPL_ORION },
        { "{{ 'GPT4 Correct ' + message['role'].title() + ': ' + message['content'] + '<|end_of_turn|>'}}",
          CHAT_TMPL_OPENCHAT },
        { "{{-'USER: ' + message['content'] + '\\n'-}}{{-'ASSISTANT: ' + message['content'] + '</s>\\n' -}}",
          CHAT_TMPL_VICUNA },
        { "{{-'SYSTEM: ' + message['content'] + '\\n' -}}{{-'USER: ' + message['content'] + '\\n'-}}{{-'ASSISTANT: ' + message['content'] + '</s>\\n' -}}",
          CHAT_TMPL_VICUNA_ORCA },
        { "{{'### Instruction:\\n' + message['content'] + '\\n'}}{{'### Response:\\n' + message['content'] + '\\n<|EOT|>\\n'}}",
          CHAT_TMPL_DEEPSEEK },
        { "{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}",
          CHAT_TMPL_DEEPSEEK2 },
        { "{{'<｜User｜>' + message['content']}}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}",
          CHAT_TMPL_DEEPSEEK3 },
        { "{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() + '<|END_OF_TURN_TOKEN|>' }}",
          CHAT_TMPL_COMMAND_R },
        { "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}",
          CHAT_TMPL_LLAMA3 },
        { "{% for message in messages %}{% if loop.first %}[gMASK]sop<|{{ message['role'] }}|>\\n {{ message['content'] }}{% endif %}{% endfor %}<|assistant|>",
          CHAT_TMPL_CHATGLM3 },
        { "[gMASK]<sop>{% for item in messages %}<|{{ item['role'] }}|>\\n{{ item['content'] }}{% endfor %}<|user|><|assistant|>",
          CHAT_TMPL_CHATGLM4 },
        { "{% for item in messages %}{% if item['role'] == 'user' %}<|user|>\\n{{ item['content'] }}{% endif %}{% endfor %}<|assistant|>",
          CHAT_TMPL_GLMEDGE },
        { "{% if message['role'] == 'user' %}{{'<用户>' + message['content'].strip() + '<AI>'}}{% endif %}",
          CHAT_TMPL_MINICPM },
        { "{{ '[|system|]' + message['content'] + '[|endofturn|]\\n' }}{{ '[|assistant|]' + message['content'] + '[|endofturn|]\\n' }}",
          CHAT_TMPL_EXAONE3 },
        { "{# rwkv-world #}{{ 'User: ' + message['content'] + '\\n\\nAssistant:' }}",
          CHAT_TMPL_RWKV_WORLD },
        { "{{- '<|start_of_role|>user<|end_of_role|>' + message['content'] + '<|end_of_text|>\\n' }}",
          CHAT_TMPL_GRANITE },
        { "{{ message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1] -}}",
          CHAT_TMPL_GIGACHAT },
        { "{{ '<|role_start|>' + message['role'] + '<|role_end|>' + message['content'] + '<|turn_end|>' }}",
          CHAT_TMPL_MEGREZ },
        /* names as template text (llama.cpp accepts them there too) */
        { "chatml", CHAT_TMPL_CHATML },
        { "mistral-v7", CHAT_TMPL_MISTRAL_V7 },
        /* nothing we know */
        { "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}", CHAT_TMPL_UNKNOWN },
        { "INVALID TEMPLATE", CHAT_TMPL_UNKNOWN },
        { " ", CHAT_TMPL_UNKNOWN },
        { "", CHAT_TMPL_NONE },
    };
    int seen[CHAT_TMPL_UNKNOWN + 1] = { 0 };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = chat_template_detect(cases[i].text);
        if (got != cases[i].want)
            fail_msg("detect case %zu: want %s, got %s\n  text: %s", i,
                     chat_template_name(cases[i].want), chat_template_name(got), cases[i].text);
        seen[got] = 1;
    }
    assert_int_equal(chat_template_detect(NULL), CHAT_TMPL_NONE);
    /* every family is reachable from some template text */
    for (int t = CHAT_TMPL_NONE + 1; t < CHAT_TMPL_UNKNOWN; t++)
        if (!seen[t])
            fail_msg("no detection case reaches family '%s'", chat_template_name(t));
}

/* ---- rendering details and errors ---------------------------------------------------- */

static char *render_ok(int tmpl, const chat_msg *m, size_t n, int add)
{
    char *out = NULL;
    kv_error err = { 0 };
    int rc = chat_template_render(tmpl, m, n, add, &out, &err);
    if (rc != KV_OK)
        fail_msg("render %s: %s", chat_template_name(tmpl), err.msg);
    assert_non_null(out);
    return out;
}

static void test_render_details(void **state)
{
    (void)state;
    const chat_msg ws[] = { { "user", "  Hi \n" }, { "assistant", "\t yo  " }, { "user", "x" } };
    char *s;

    /* trimming families trim, the others keep the text as given */
    s = render_ok(CHAT_TMPL_LLAMA3, ws, 3, 1);
    assert_string_equal(s, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>"
                           "<|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(s);
    s = render_ok(CHAT_TMPL_CHATML, ws, 3, 0);
    assert_string_equal(s, "<|im_start|>user\n  Hi \n<|im_end|>\n<|im_start|>assistant\n\t yo  "
                           "<|im_end|>\n<|im_start|>user\nx<|im_end|>\n");
    free(s);
    s = render_ok(CHAT_TMPL_MISTRAL_V3, ws, 3, 1); /* v3 trims assistant turns only */
    assert_string_equal(s, "[INST]   Hi \n[/INST] yo</s>[INST] x[/INST]");
    free(s);

    /* gemma/orion: a system text waits for the next user turn */
    const chat_msg late_sys[] = { { "user", "a" }, { "assistant", "b" }, { "system", " S " },
                                  { "user", "c" } };
    s = render_ok(CHAT_TMPL_GEMMA, late_sys, 4, 1);
    assert_string_equal(s, "<start_of_turn>user\na<end_of_turn>\n<start_of_turn>model\nb<end_of_turn>\n"
                           "<start_of_turn>user\nS\n\nc<end_of_turn>\n<start_of_turn>model\n");
    free(s);
    s = render_ok(CHAT_TMPL_ORION, late_sys, 4, 1);
    assert_string_equal(s, "Human: a\n\nAssistant: </s>b</s>Human:  S \n\nc\n\nAssistant: </s>");
    free(s);

    /* gigachat keeps only a leading system message */
    s = render_ok(CHAT_TMPL_GIGACHAT, late_sys, 4, 0);
    assert_string_equal(s, "<s>user<|role_sep|>a<|message_sep|>available functions<|role_sep|>[]"
                           "<|message_sep|>assistant<|role_sep|>b<|message_sep|>user<|role_sep|>c"
                           "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>");
    free(s);

    /* NULL content renders as empty */
    const chat_msg nullc[] = { { "user", NULL } };
    s = render_ok(CHAT_TMPL_CHATML, nullc, 1, 1);
    assert_string_equal(s, "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n");
    free(s);

    /* an empty conversation is just the family's fixed text */
    for (int t = CHAT_TMPL_NONE + 1; t < CHAT_TMPL_UNKNOWN; t++) {
        s = render_ok(t, NULL, 0, 0);
        free(s);
    }
    s = render_ok(CHAT_TMPL_CHATML, NULL, 0, 0);
    assert_string_equal(s, "");
    free(s);
    s = render_ok(CHAT_TMPL_CHATGLM4, NULL, 0, 1);
    assert_string_equal(s, "[gMASK]<sop><|assistant|>");
    free(s);
}

static void test_render_errors(void **state)
{
    (void)state;
    const chat_msg one[] = { { "user", "hi" } };
    char *out = (char *)1;
    kv_error err = { 0 };

    assert_int_equal(chat_template_render(CHAT_TMPL_UNKNOWN, one, 1, 1, &out, &err), KV_ERR_UNSUPPORTED);
    assert_int_equal(err.code, KV_ERR_UNSUPPORTED);
    assert_null(out);
    assert_non_null(strstr(err.msg, "unknown"));
    assert_non_null(strstr(err.msg, "chatml")); /* offers the names */

    out = (char *)1;
    assert_int_equal(chat_template_render(CHAT_TMPL_NONE, one, 1, 1, &out, &err), KV_ERR_UNSUPPORTED);
    assert_null(out);
    assert_non_null(strstr(err.msg, "none"));

    assert_int_equal(chat_template_render(CHAT_TMPL_UNKNOWN + 1, one, 1, 1, &out, &err), KV_ERR_INVALID);
    assert_int_equal(chat_template_render(-1, one, 1, 1, &out, &err), KV_ERR_INVALID);
    assert_int_equal(chat_template_render(CHAT_TMPL_CHATML, NULL, 2, 1, &out, &err), KV_ERR_INVALID);
    assert_int_equal(chat_template_render(CHAT_TMPL_CHATML, one, 1, 1, NULL, &err), KV_ERR_INVALID);

    const chat_msg badrole[] = { { "user", "hi" }, { "tool", "{}" } };
    assert_int_equal(chat_template_render(CHAT_TMPL_LLAMA3, badrole, 2, 1, &out, &err), KV_ERR_INVALID);
    assert_null(out);
    assert_non_null(strstr(err.msg, "llama3"));
    assert_non_null(strstr(err.msg, "message 1"));
    assert_non_null(strstr(err.msg, "'tool'"));

    const chat_msg nullrole[] = { { NULL, "hi" } };
    assert_int_equal(chat_template_render(CHAT_TMPL_CHATML, nullrole, 1, 1, &out, &err), KV_ERR_INVALID);

    /* err may be NULL */
    assert_int_equal(chat_template_render(CHAT_TMPL_UNKNOWN, one, 1, 1, &out, NULL), KV_ERR_UNSUPPORTED);
}

/* ---- prefix stability ---------------------------------------------------------------- */

/* Does render(conv, gen) + reply prefix render(conv + reply + next user, gen)? */
static int extends(int tmpl, const chat_msg *conv, size_t n, const char *reply)
{
    chat_msg longer[8];
    assert_true(n + 2 <= sizeof longer / sizeof longer[0]);
    memcpy(longer, conv, n * sizeof *conv);
    longer[n] = (chat_msg){ "assistant", reply };
    longer[n + 1] = (chat_msg){ "user", "And one about dogs?" };

    char *a = render_ok(tmpl, conv, n, 1);
    char *b = render_ok(tmpl, longer, n + 2, 1);
    size_t la = strlen(a), lr = strlen(reply);
    int ok = strlen(b) >= la + lr && memcmp(b, a, la) == 0 && memcmp(b + la, reply, lr) == 0;
    free(a);
    free(b);
    return ok;
}

static void test_prefix_stability(void **state)
{
    golden *g = *state;
    static const char *replies[] = { "Why did the cat sit on the keyboard?", " Leading space.",
                                     "Trailing newline.\n", "  both  \n" };
    /* conversations ending with a user turn: with and without system, one and two rounds */
    struct { const chat_msg *m; size_t n; } convs[] = {
        { g->msgs + 1, 1 },        /* user */
        { g->msgs, 2 },            /* system, user */
        { g->msgs, g->n_msgs },    /* system, user, assistant, user */
        { g->msgs + 1, g->n_msgs - 1 },
    };
    int stable_count = 0;
    for (int t = CHAT_TMPL_NONE + 1; t < CHAT_TMPL_UNKNOWN; t++) {
        int holds = 1, holds_trimmed = 1;
        for (size_t c = 0; c < sizeof convs / sizeof convs[0]; c++)
            for (size_t r = 0; r < sizeof replies / sizeof replies[0]; r++) {
                int ok = extends(t, convs[c].m, convs[c].n, replies[r]);
                holds &= ok;
                if (r == 0)
                    holds_trimmed &= ok;
            }
        int declared = chat_template_is_prefix_stable(t);
        if (declared != holds)
            fail_msg("%s: declared prefix-stable=%d, observed %d", chat_template_name(t),
                     declared, holds);
        /* a stable family is stable for the plain reply too */
        if (holds)
            assert_true(holds_trimmed);
        stable_count += holds;
    }
    printf("prefix-stable families: %d of %d\n", stable_count, CHAT_TMPL_UNKNOWN - 1);
    assert_int_equal(chat_template_is_prefix_stable(CHAT_TMPL_NONE), 0);
    assert_int_equal(chat_template_is_prefix_stable(CHAT_TMPL_UNKNOWN), 0);
    assert_int_equal(chat_template_is_prefix_stable(-1), 0);
    /* the common ones the app relies on */
    assert_true(chat_template_is_prefix_stable(CHAT_TMPL_CHATML));
    assert_true(chat_template_is_prefix_stable(CHAT_TMPL_PHI3));
    assert_false(chat_template_is_prefix_stable(CHAT_TMPL_LLAMA3));
    assert_false(chat_template_is_prefix_stable(CHAT_TMPL_GEMMA));
}

/* Families that are unstable only because they trim: stable for replies without
 * surrounding whitespace (documented in the header). */
static void test_prefix_stability_trimmed_replies(void **state)
{
    golden *g = *state;
    static const int trim_only[] = { CHAT_TMPL_LLAMA2_SYS_STRIP, CHAT_TMPL_GEMMA, CHAT_TMPL_COMMAND_R,
                                     CHAT_TMPL_LLAMA3, CHAT_TMPL_MINICPM, CHAT_TMPL_EXAONE3 };
    for (size_t i = 0; i < sizeof trim_only / sizeof trim_only[0]; i++) {
        int t = trim_only[i];
        if (!extends(t, g->msgs, 2, "A clean reply.") ||
            !extends(t, g->msgs + 1, g->n_msgs - 1, "A clean reply."))
            fail_msg("%s: should be stable for trimmed replies", chat_template_name(t));
        assert_false(extends(t, g->msgs, 2, "A reply with a newline.\n"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_renderings),
        cmocka_unit_test(test_golden_detection),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_detect_snippets),
        cmocka_unit_test(test_render_details),
        cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_prefix_stability),
        cmocka_unit_test(test_prefix_stability_trimmed_replies),
    };
    return cmocka_run_group_tests(tests, golden_setup, golden_teardown);
}
