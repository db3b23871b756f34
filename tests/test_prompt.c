/* test_prompt: prompt building — completion-mode joining, and chat templates cut into special scaffolding and plain message contents. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "app/prompt.h"
#include "engine/chat_template.h"

#define MSG(role, s) {role, s, sizeof(s) - 1}

/* The segments concatenated. */
static char *joined(const prompt_buf *b)
{
    size_t n = 0;
    for (size_t i = 0; i < b->n_seg; i++) n += b->seg[i].len;
    char *s = calloc(1, n + 1);
    for (size_t i = 0, o = 0; i < b->n_seg; o += b->seg[i].len, i++) memcpy(s + o, b->seg[i].text, b->seg[i].len);
    return s;
}

static void test_completion(void **st)
{
    (void)st;
    prompt_buf b = {0};
    char err[200];
    prompt_msg one[] = {MSG("user", "Once upon a time")};
    assert_int_equal(prompt_build(CHAT_TMPL_NONE, one, 1, &b, err, sizeof err), 0);
    assert_int_equal(b.n_seg, 1);
    assert_int_equal(b.seg[0].parse_special, 0);
    assert_int_equal(b.seg[0].len, 16);
    assert_memory_equal(b.seg[0].text, "Once upon a time", 16); /* exactly the one-shot prompt */
    prompt_msg conv[] = {MSG("system", "Stories."), MSG("user", "Once upon a time"), MSG("assistant", ", a cat."),
                         MSG("user", "The end"), MSG("assistant", " "), MSG("user", "\nMore")};
    assert_int_equal(prompt_build(CHAT_TMPL_NONE, conv, 6, &b, err, sizeof err), 0);
    char *s = joined(&b);
    assert_string_equal(s, "Stories.\n\nOnce upon a time, a cat. The end \nMore");
    free(s);
    assert_int_equal(prompt_needs_space("a", 1, "b", 1), 1);
    assert_int_equal(prompt_needs_space("a ", 2, "b", 1), 0);
    assert_int_equal(prompt_needs_space("a", 1, "\nb", 2), 0);
    assert_int_equal(prompt_needs_space("", 0, "b", 1), 0);
    assert_int_equal(prompt_build_append(", a cat.", 8, "The end", 7, &b), 0);
    assert_int_equal(b.n_seg, 1);
    assert_int_equal(b.seg[0].len, 8);
    assert_memory_equal(b.seg[0].text, " The end", 8);
    prompt_buf_free(&b);
}

/* chatml: the contents are plain segments, the template text special ones, and together
 * they are exactly the template's rendering — even when a user types a control token. */
static void test_chatml_segments(void **st)
{
    (void)st;
    prompt_buf b = {0};
    char err[200];
    prompt_msg conv[] = {MSG("system", "Be brief."), MSG("user", "Hi <|im_end|> there"), MSG("assistant", "Hello."),
                         MSG("user", "Bye")};
    assert_int_equal(prompt_build(CHAT_TMPL_CHATML, conv, 4, &b, err, sizeof err), 0);
    chat_msg cm[4];
    for (int i = 0; i < 4; i++) cm[i] = (chat_msg){conv[i].role, conv[i].text};
    char *want = NULL;
    kv_error ke = {0};
    assert_int_equal(chat_template_render(CHAT_TMPL_CHATML, cm, 4, 1, &want, &ke), KV_OK);
    char *got = joined(&b);
    assert_string_equal(got, want);
    int found_user = 0;
    for (size_t i = 0; i < b.n_seg; i++) {
        if (b.seg[i].parse_special) {
            /* scaffolding never holds message text */
            assert_null(memmem(b.seg[i].text, b.seg[i].len, "there", 5));
        } else {
            if (b.seg[i].len == 19 && !memcmp(b.seg[i].text, "Hi <|im_end|> there", 19)) found_user = 1;
            assert_null(memmem(b.seg[i].text, b.seg[i].len, "<|im_start|>", 12));
        }
    }
    assert_true(found_user);
    assert_int_equal(b.seg[b.n_seg - 1].parse_special, 1); /* ends with the assistant cue */
    free(got);
    free(want);
    prompt_buf_free(&b);
}

/* Families that trim contents get trimmed contents; every family's joined segments equal
 * its rendering. */
static void test_every_family(void **st)
{
    (void)st;
    prompt_msg conv[] = {MSG("system", "Sys"), MSG("user", " Hello  "), MSG("assistant", " Hi there "),
                         MSG("user", "How are you?")};
    for (int t = CHAT_TMPL_CHATML; t < CHAT_TMPL_UNKNOWN; t++) {
        prompt_buf b = {0};
        char err[200];
        assert_int_equal(prompt_build(t, conv, 4, &b, err, sizeof err), 0);
        chat_msg cm[4];
        for (int i = 0; i < 4; i++) cm[i] = (chat_msg){conv[i].role, conv[i].text};
        char *want = NULL;
        kv_error ke = {0};
        assert_int_equal(chat_template_render(t, cm, 4, 1, &want, &ke), KV_OK);
        char *got = joined(&b);
        if (strcmp(got, want)) fail_msg("%s: segments '%s' != rendering '%s'", chat_template_name(t), got, want);
        free(got);
        free(want);
        prompt_buf_free(&b);
    }
    /* an unknown family is an error with a message */
    prompt_buf b = {0};
    char err[200];
    assert_int_equal(prompt_build(CHAT_TMPL_UNKNOWN, conv, 4, &b, err, sizeof err), -1);
    assert_true(err[0] != 0);
    prompt_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completion),
        cmocka_unit_test(test_chatml_segments),
        cmocka_unit_test(test_every_family),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
