/* test_special: text a user types never becomes control tokens; only template scaffolding does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app/prompt.h"
#include "engine/chat_template.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "tests/support/testutil.h"

typedef struct special_case {
    const char *vocab;   /* models/… */
    const char *tmpl;    /* chat template family used for the scaffolding */
} special_case;

/* Every control token's text, space-separated: what a mischievous user might paste. */
static char *all_control_strings(const tokenizer *t, int *n_found)
{
    size_t cap = 1 << 16, len = 0;
    char *s = malloc(cap);
    *n_found = 0;
    for (int32_t id = 0; id < tokenizer_n_vocab(t); id++) {
        if (!tokenizer_is_control(t, id)) continue;
        const char *txt = tokenizer_token_text(t, id);
        size_t l = strlen(txt);
        if (l == 0) continue;
        while (len + l + 2 > cap) s = realloc(s, cap *= 2);
        memcpy(s + len, txt, l);
        len += l;
        s[len++] = ' ';
        (*n_found)++;
    }
    s[len] = 0;
    return s;
}

static void run_case(void **state)
{
    const special_case *sc = *state;
    gguf_file *f = NULL;
    tokenizer *t = NULL;
    kv_error err = {0};
    assert_int_equal(gguf_open(tu_path(sc->vocab), &f, &err), KV_OK);
    assert_int_equal(tokenizer_load(f, &t, &err), KV_OK);
    int n_ctrl = 0;
    char *evil = all_control_strings(t, &n_ctrl);
    assert_true(n_ctrl > 0);

    prompt_msg msgs[] = {
        {"system", "You are helpful.", 16},
        {"user", evil, strlen(evil)},
        {"assistant", evil, strlen(evil)},
        {"user", evil, strlen(evil)},
    };
    prompt_buf pb = {0};
    char perr[256];
    int tmpl = chat_template_from_name(sc->tmpl);
    assert_true(tmpl > 0);
    assert_int_equal(prompt_build(tmpl, msgs, 4, &pb, perr, sizeof perr), 0);

    int ctrl_in_content = 0, ctrl_in_scaffold = 0, n_content = 0;
    for (size_t i = 0; i < pb.n_seg; i++) {
        int32_t *toks = NULL;
        size_t n = 0;
        assert_int_equal(tokenizer_encode(t, pb.seg[i].text, pb.seg[i].len, 0, pb.seg[i].parse_special, &toks, &n, &err),
                         KV_OK);
        for (size_t k = 0; k < n; k++) {
            if (!tokenizer_is_control(t, toks[k])) continue;
            if (pb.seg[i].parse_special) ctrl_in_scaffold++;
            else ctrl_in_content++;
        }
        if (!pb.seg[i].parse_special) n_content++;
        free(toks);
    }
    print_message("%-40s %-8s: %d control strings pasted in 3 messages -> %d control ids from content, %d from scaffolding\n",
                  sc->vocab, sc->tmpl, n_ctrl, ctrl_in_content, ctrl_in_scaffold);
    assert_true(n_content >= 3);
    assert_int_equal(ctrl_in_content, 0);
    /* phi-3's template markers (<|system|>, <|user|>, <|assistant|>, <|end|>) are control
     * tokens of its vocab: the scaffolding of these 4 messages must produce them. */
    if (strcmp(sc->tmpl, "phi3") == 0) assert_true(ctrl_in_scaffold >= 8);
    prompt_buf_free(&pb);
    free(evil);
    tokenizer_free(t);
    gguf_close(f);
}

static special_case cases[] = {
    {"models/vocab/ggml-vocab-phi-3.gguf", "phi3"},
    {"models/vocab/ggml-vocab-llama-spm.gguf", "llama2"},
    {"models/vocab/ggml-vocab-gpt-2.gguf", "chatml"},
    {"models/vocab/ggml-vocab-deepseek-coder.gguf", "deepseek"},
    {"models/vocab/ggml-vocab-deepseek-llm.gguf", "deepseek2"},
    {"models/vocab/ggml-vocab-falcon.gguf", "falcon3"},
    {"models/vocab/ggml-vocab-starcoder.gguf", "chatml"},
    {"models/vocab/ggml-vocab-refact.gguf", "chatml"},
    {"models/vocab/ggml-vocab-mpt.gguf", "chatml"},
    {"models/vocab/ggml-vocab-dbrx.gguf", "chatml"},
};

int main(void)
{
    size_t n = sizeof cases / sizeof *cases;
    struct CMUnitTest tests[sizeof cases / sizeof *cases];
    for (size_t i = 0; i < n; i++) tests[i] = (struct CMUnitTest){cases[i].vocab, run_case, NULL, NULL, &cases[i]};
    return _cmocka_run_group_tests("special", tests, n, NULL, NULL);
}
