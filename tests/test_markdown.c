/* test_markdown: a reply's Markdown as display text with styles (ui/markdown.c over md4c) — markers dropped, code kept byte for byte, code blocks numbered. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ui/markdown.h"

/* The style of the first occurrence of needle in the rendering. */
static int style_at(const ui_md *m, const char *needle)
{
    const char *p = strstr(m->text, needle);
    assert_non_null(p);
    return m->style[p - m->text];
}

static void test_inline_and_blocks(void **state)
{
    (void)state;
    const char *src = "# Title\n\nSome **bold**, *it* and `x = 1`.\n\n- one\n- two\n\n1. first\n2. second\n\n> quoted\n\n"
                      "[docs](https://example.org)\n";
    ui_md m = {0};
    assert_int_equal(ui_md_render(src, strlen(src), 0, &m), 0);
    assert_string_equal(m.text, "Title\n\nSome bold, it and x = 1.\n\n• one\n• two\n\n1. first\n2. second\n\n│ quoted\n\n"
                                "docs <https://example.org>");
    assert_true(style_at(&m, "Title") & UI_MD_HEADING);
    assert_true(style_at(&m, "bold") & UI_MD_BOLD);
    assert_true(style_at(&m, "it and") & UI_MD_ITALIC);
    assert_true(style_at(&m, "x = 1") & UI_MD_CODE);
    assert_int_equal(style_at(&m, "Some"), UI_MD_PLAIN);
    assert_true(style_at(&m, "│") & UI_MD_QUOTE);
    assert_true(style_at(&m, "docs") & UI_MD_LINK);
    assert_int_equal(m.n_code, 0);
    ui_md_free(&m);
}

static void test_code_blocks_exact_and_numbered(void **state)
{
    (void)state;
    const char *src = "Look:\n\n```c\nint  main(void) { return *p; }  \n\tindented\n```\n\nand\n\n```\nsecond **not bold**\n```\n";
    ui_md m = {0};
    assert_int_equal(ui_md_render(src, strlen(src), 3, &m), 0);
    assert_string_equal(m.text, "Look:\n\n┌─ code 4 · c\nint  main(void) { return *p; }  \n\tindented\n└─\n\nand\n\n"
                                "┌─ code 5\nsecond **not bold**\n└─");
    assert_int_equal(m.n_code, 2);
    assert_true(style_at(&m, "int  main") & UI_MD_CODE);
    assert_true(style_at(&m, "┌─ code 4") & UI_MD_LABEL);
    char *b = NULL;
    size_t n = 0;
    assert_int_equal(ui_md_code_block(src, strlen(src), 1, &b, &n), 2);
    assert_int_equal(n, strlen("int  main(void) { return *p; }  \n\tindented"));
    assert_memory_equal(b, "int  main(void) { return *p; }  \n\tindented", n);
    free(b);
    assert_int_equal(ui_md_code_block(src, strlen(src), 2, &b, &n), 2);
    assert_memory_equal(b, "second **not bold**", n);
    free(b);
    b = NULL;
    assert_int_equal(ui_md_code_block(src, strlen(src), 3, &b, &n), 2);
    assert_null(b);
    ui_md_free(&m);
}

/* A reply still streaming: an unclosed fence renders what came so far, as code. */
static void test_unfinished(void **state)
{
    (void)state;
    const char *src = "Here:\n\n```py\nprint(1)\nprin";
    ui_md m = {0};
    assert_int_equal(ui_md_render(src, strlen(src), 0, &m), 0);
    assert_non_null(strstr(m.text, "┌─ code 1 · py\nprint(1)\nprin"));
    assert_int_equal(m.n_code, 1);
    /* a table: cells with bars between them, the header bold */
    const char *tab = "| a | b |\n|---|---|\n| 1 | 2 |\n";
    assert_int_equal(ui_md_render(tab, strlen(tab), 0, &m), 0);
    assert_string_equal(m.text, "a │ b\n1 │ 2");
    assert_true(style_at(&m, "a") & UI_MD_BOLD);
    assert_false(style_at(&m, "1") & UI_MD_BOLD);
    /* empty input */
    assert_int_equal(ui_md_render("", 0, 0, &m), 0);
    assert_int_equal(m.len, 0);
    ui_md_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inline_and_blocks),
        cmocka_unit_test(test_code_blocks_exact_and_numbered),
        cmocka_unit_test(test_unfinished),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
