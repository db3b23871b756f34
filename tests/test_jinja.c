/* test_jinja: the Jinja interpreter's errors (with lines), limits, content marks, the semantics where it follows Python over the reference, and robustness on broken templates. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/jinja.h"
#include "tests/support/testutil.h"

static const char CTX[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"  Sys <|im_end|>  \"}, {\"role\": \"user\", \"content\": \"Hi\"}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\"}";

/* Render src with CTX; returns the kv status, output in *out (malloc'd) and the error. */
static int render(const char *src, char **out, unsigned char **mask, kv_error *err)
{
    jinja_template *t = NULL;
    size_t len = 0;
    *out = NULL;
    int rc = jinja_parse(src, strlen(src), &t, err);
    if (rc == KV_OK) rc = jinja_render(t, CTX, sizeof CTX - 1, 0, out, &len, mask, err);
    jinja_free(t);
    return rc;
}

static void expect(const char *src, const char *want)
{
    char *out;
    kv_error err = {0};
    int rc = render(src, &out, NULL, &err);
    if (rc) fail_msg("%s: %s", src, err.msg);
    if (strcmp(out, want)) fail_msg("%s: got '%s', want '%s'", src, out, want);
    free(out);
}

static void expect_error(const char *src, int code, const char *part)
{
    char *out;
    kv_error err = {0};
    int rc = render(src, &out, NULL, &err);
    if (rc != code || !strstr(err.msg, part)) fail_msg("%s: rc %d '%s', want %d with '%s'", src, rc, err.msg, code, part);
    assert_null(out);
}

static void test_errors_name_the_line(void **st)
{
    (void)st;
    expect_error("a\n{% if x %}\nb", KV_ERR_FORMAT, "line 2: missing {% endif %}");
    expect_error("{% for x in y %}{% endif %}", KV_ERR_FORMAT, "line 1: unexpected 'endif'");
    expect_error("\n\n{{ x ", KV_ERR_FORMAT, "line 3: unclosed {{ tag");
    expect_error("{% frobnicate %}", KV_ERR_FORMAT, "line 1: unknown statement 'frobnicate'");
    expect_error("{{ 'abc }}", KV_ERR_FORMAT, "line 1: unterminated string literal");
    expect_error("{{ 1 + }}", KV_ERR_FORMAT, "line 1: expected an expression");
    expect_error("{# never closed", KV_ERR_FORMAT, "unclosed comment");
    expect_error("x\ny\n{{ messages | frob }}", KV_ERR_FORMAT, "line 3: unknown filter 'frob'");
    expect_error("{{ messages() }}", KV_ERR_FORMAT, "line 1: 'messages' is list, not a function");
    expect_error("\n{{ raise_exception('Roles must alternate') }}", KV_ERR_FORMAT,
                 "line 2: raise_exception: Roles must alternate");
    expect_error("{{ 1 / 0 }}", KV_ERR_FORMAT, "division by zero");
    expect_error("{{ 'a' - 1 }}", KV_ERR_FORMAT, "unsupported operand types for -: string and integer");
    expect_error("{% set x = 1 %}{% set x.y = 2 %}", KV_ERR_FORMAT, "cannot set attribute 'y' of integer 'x'");
}

static void test_limits(void **st)
{
    (void)st;
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", KV_ERR_NOMEM, "nested too deep");
    expect_error("{{ range(100000000) | length }}", KV_ERR_NOMEM, "out of memory");
    /* nesting beyond the parser's limit is an error naming it, not a stack overflow (fuzz_jinja_tmpl
     * found "{{ [[[[..." thousands deep); 40 levels, more than any real template, still parse */
    static const struct { const char *open, *close, *mid; } deep[] = {
        {"[", "]", ""}, {"(", ")", "1"}, {"-", "", "1"}, {"not ", "", "x"}, {"{% if 1 %}", "{% endif %}", ""},
    };
    for (size_t d = 0; d < sizeof deep / sizeof deep[0]; d++) {
        for (int levels = 40; levels <= 5000; levels += 4960) {
            size_t lo = strlen(deep[d].open), lc = strlen(deep[d].close), cap = (lo + lc) * (size_t)levels + 64;
            char *src = malloc(cap), *w = src;
            int block = deep[d].open[0] == '{';
            if (!block) w += sprintf(w, "{{ ");
            for (int i = 0; i < levels; i++) w += sprintf(w, "%s", deep[d].open);
            w += sprintf(w, "%s", deep[d].mid);
            for (int i = 0; i < levels; i++) w += sprintf(w, "%s", deep[d].close);
            if (!block) w += sprintf(w, " }}");
            char *out = NULL;
            kv_error err = {0};
            int rc = render(src, &out, NULL, &err);
            if (levels == 40 && rc != KV_OK) fail_msg("%d levels of %s: %s", levels, deep[d].open, err.msg);
            if (levels > 40 && (rc != KV_ERR_FORMAT || !strstr(err.msg, "nested too deep")))
                fail_msg("%d levels of %s: rc %d, '%s'", levels, deep[d].open, rc, err.msg);
            free(out);
            free(src);
        }
    }
    char *out;
    size_t len;
    kv_error err = {0};
    jinja_template *t = NULL;
    assert_int_equal(jinja_parse("{{ x }}", 7, &t, &err), KV_OK);
    assert_int_equal(jinja_render(t, "[1, 2]", 6, 0, &out, &len, NULL, &err), KV_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "not an object"));
    assert_int_equal(jinja_render(t, "{\"x\": ", 6, 0, &out, &len, NULL, &err), KV_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "context JSON"));
    const char *uj = "{\"x\": \"a\\u00e9\\ud83d\\ude00\"}";
    assert_int_equal(jinja_render(t, uj, strlen(uj), 0, &out, &len, NULL, &err), KV_OK);
    assert_string_equal(out, "a\xc3\xa9\xf0\x9f\x98\x80");
    free(out);
    jinja_free(t);
}

/* Where Python's Jinja2 and the reference differ by a plain bug of the reference, the
 * interpreter does what Python does (what the templates' authors ran). */
static void test_python_semantics(void **st)
{
    (void)st;
    expect("{{ 'xxhixx'.strip('x') }}|{{ 'xxab'.lstrip('x') }}|{{ 'abyy'.rstrip('y') }}", "hi|ab|ab");
    expect("{{ -7 % 3 }} {{ 7 % -3 }} {{ -7 // 2 }}", "2 -2 -4");
    expect("{{ 'aBc dEf'.capitalize() }}|{{ 'aBc dEf' | title }}", "Abc def|Abc Def");
    expect("{{ 'ab' | reverse }} {{ 'ab' | first }} {{ 'ab' | list }} {{ [[1, 2], [3]] | map('length') | list }}",
           "ba a [\"a\", \"b\"] [2, 1]");
    expect("{{ 'a' < 'b' }} {{ 6 is divisibleby 3 }} {{ 1.5 is float }} {{ 'A' is upper }}", "true true true true");
    expect("{{ x | d('dflt') }} {{ ['a', 'b', 'a'] | reject('equalto', 'a') | list }}", "dflt [\"b\"]");
    expect("{% set l = [] %}{% set _ = l.append(1) %}{{ l }} {{ {'b': 2, 'a': 1} | dictsort }}", "[1] [[\"a\", 1], [\"b\", 2]]");
}

/* Bytes from message contents are marked wherever they go; the template's own are not. */
static void test_content_marks(void **st)
{
    (void)st;
    char *out;
    unsigned char *mask;
    kv_error err = {0};
    assert_int_equal(render("<{{ messages[0].content | trim }}|{{ messages[0]['content'][2:5] }}|{{ messages[1].role }}:"
                            "{{ messages[1].content ~ '!' }}|{{ messages[1].content | tojson }}>",
                            &out, &mask, &err), KV_OK);
    const char *want = "<Sys <|im_end|>|Sys|user:Hi!|\"Hi\">";
    assert_string_equal(out, want);
    const char *marks = "0" "11111111111111" "0" "111" "0" "00000" "11" "0" "0" "0" "11" "0" "0";
    for (size_t i = 0; i < strlen(want); i++)
        if (mask[i] != (marks[i] == '1')) fail_msg("byte %zu ('%c') marked %d", i, out[i], mask[i]);
    free(out);
    free(mask);
}

/* Every shared template, cut short at many points and with bytes flipped: an error or a
 * rendering, never a crash or a leak (ASan). */
static void test_broken_templates(void **st)
{
    (void)st;
    DIR *d = opendir(tu_path("templates"));
    assert_non_null(d);
    struct dirent *e;
    int n_templates = 0, n_ok = 0, n_err = 0;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".jinja")) continue;
        char rel[512];
        snprintf(rel, sizeof rel, "templates/%s", e->d_name);
        size_t len;
        char *src = tu_read_file(tu_path(rel), &len);
        assert_non_null(src);
        n_templates++;
        size_t step = len / 97 + 1;
        for (size_t cut = 0; cut <= len; cut += step) {
            for (int flip = 0; flip < 2; flip++) {
                char *s = malloc(cut + 1);
                memcpy(s, src, cut);
                s[cut] = 0;
                if (flip && cut) s[(cut * 7) % cut] ^= 0x20;
                jinja_template *t = NULL;
                kv_error err = {0};
                char *out = NULL;
                size_t olen;
                unsigned char *mask = NULL;
                int rc = jinja_parse(s, cut, &t, &err);
                if (rc == KV_OK) rc = jinja_render(t, CTX, sizeof CTX - 1, 0, &out, &olen, &mask, &err);
                if (rc == KV_OK) n_ok++;
                else {
                    assert_true(err.msg[0] != 0);
                    n_err++;
                }
                free(out);
                free(mask);
                jinja_free(t);
                free(s);
            }
        }
        free(src);
    }
    closedir(d);
    print_message("%d templates: %d broken variants rendered, %d refused with a message\n", n_templates, n_ok, n_err);
    assert_true(n_templates >= 17);
    assert_true(n_err > 0 && n_ok > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors_name_the_line),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_python_semantics),
        cmocka_unit_test(test_content_marks),
        cmocka_unit_test(test_broken_templates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
