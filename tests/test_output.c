/* test_output: the one-shot output — JSON string escaping (controls, invalid UTF-8 → \ufffd), JSON lines per token with characters split across tokens, and plain text without control bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "app/output.h"
#include "ui/text.h"

typedef struct capture {
    FILE *f;
    char *buf;
    size_t len;
} capture;

static void cap_open(capture *c)
{
    c->buf = NULL;
    c->len = 0;
    c->f = open_memstream(&c->buf, &c->len);
    assert_non_null(c->f);
}

static char *cap_close(capture *c)
{
    fclose(c->f);
    return c->buf;
}

static char *escaped(const char *s, size_t len)
{
    capture c;
    cap_open(&c);
    json_write_string(c.f, s, len);
    return cap_close(&c);
}

#define ESC_EQ(in, want)                                   \
    do {                                                   \
        char *got_ = escaped(in, sizeof(in) - 1);          \
        assert_string_equal(got_, want);                   \
        free(got_);                                        \
    } while (0)

static void test_escape_ascii_and_controls(void **st)
{
    (void)st;
    ESC_EQ("plain", "\"plain\"");
    ESC_EQ("a\"b\\c", "\"a\\\"b\\\\c\"");
    ESC_EQ("l1\nl2\r\t", "\"l1\\nl2\\r\\t\"");
    ESC_EQ("\x1b[31mred\x7f", "\"\\u001b[31mred\\u007f\"");
    ESC_EQ("\x01\b\f", "\"\\u0001\\b\\f\"");
    ESC_EQ("nul\0in", "\"nul\\u0000in\"");
}

static void test_escape_utf8(void **st)
{
    (void)st;
    ESC_EQ("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
    ESC_EQ("\xff", "\"\\ufffd\"");                                  /* never valid */
    ESC_EQ("\xc0\x80", "\"\\ufffd\\ufffd\"");                        /* overlong NUL */
    ESC_EQ("\xe0\x80\xaf", "\"\\ufffd\\ufffd\\ufffd\"");             /* overlong '/' */
    ESC_EQ("\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\"");             /* a surrogate */
    ESC_EQ("\xf4\x90\x80\x80", "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");  /* above U+10FFFF */
    ESC_EQ("a\xe2\x82", "\"a\\ufffd\\ufffd\"");                      /* cut short */
    ESC_EQ("\x80x", "\"\\ufffdx\"");                                 /* stray continuation */
    /* every escaped string is valid JSON */
    unsigned char all[256];
    for (int i = 0; i < 256; i++) all[i] = (unsigned char)i;
    char *js = escaped((const char *)all, sizeof all);
    cJSON *j = cJSON_Parse(js);
    assert_non_null(j);
    assert_true(cJSON_IsString(j));
    cJSON_Delete(j);
    free(js);
}

static void test_json_lines_split_character(void **st)
{
    (void)st;
    capture c;
    cap_open(&c);
    json_out jo;
    json_out_init(&jo, c.f);
    json_out_token(&jo, 1, "a\xe2\x82", 3);  /* "€" split over two tokens */
    json_out_token(&jo, 2, "\xac" "b", 2);
    json_out_token(&jo, 3, "\xe2", 1);       /* starts a character that never completes */
    json_out_token(&jo, 4, "x", 1);
    json_out_token(&jo, 5, "\xf0\x9f", 2);   /* still open at the end */
    gen_stats gs = {.n_prompt = 3, .n_generated = 5, .ttft_ms = 1.5, .decode_tps = 100};
    json_out_done(&jo, &gs, GEN_FINISH_LENGTH, NULL);
    char *out = cap_close(&c);
    const char *want_text[] = {"a", "\xe2\x82\xac" "b", "", "\xef\xbf\xbdx", "", "\xef\xbf\xbd\xef\xbf\xbd"};
    const int want_tok[] = {1, 2, 3, 4, 5, -1};
    char *save = NULL;
    int i = 0;
    for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save), i++) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        if (i < 6) {
            assert_int_equal(cJSON_GetObjectItem(j, "token")->valueint, want_tok[i]);
            assert_string_equal(cJSON_GetObjectItem(j, "text")->valuestring, want_text[i]);
        } else {
            assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "done")));
            assert_string_equal(cJSON_GetObjectItem(j, "finish")->valuestring, "length");
            assert_int_equal(cJSON_GetObjectItem(j, "n_generated")->valueint, 5);
            assert_true(cJSON_GetObjectItem(j, "decode_tps")->valuedouble > 99.0);
        }
        cJSON_Delete(j);
    }
    assert_int_equal(i, 7);
    free(out);
}

static void test_json_done_error(void **st)
{
    (void)st;
    capture c;
    cap_open(&c);
    json_out jo;
    json_out_init(&jo, c.f);
    json_out_done(&jo, NULL, GEN_FINISH_ERROR, "m.gguf: \"bad\"\n");
    char *out = cap_close(&c);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "finish")->valuestring, "error");
    assert_string_equal(cJSON_GetObjectItem(j, "error")->valuestring, "m.gguf: \"bad\"\n");
    cJSON_Delete(j);
    free(out);
}

static void test_plain_no_control_bytes(void **st)
{
    (void)st;
    capture c;
    cap_open(&c);
    const char in[] = "a\x1b[2Jb\tc\nd\re\x07\x7f\xc3\xa9";
    out_plain(c.f, in, sizeof in - 1);
    char *out = cap_close(&c);
    /* a lone CR is ␍ (it would move the cursor back over the line) */
    assert_string_equal(out, "a\xe2\x90\x9b[2Jb\tc\nd\xe2\x90\x8d" "e\xe2\x90\x87\xe2\x90\xa1\xc3\xa9");
    for (const char *p = out; *p; p++) assert_false(*p == 0x1b || *p == 0x07 || *p == 0x7f || *p == '\r');
    free(out);
}

/* C1 controls (U+009B is the 8-bit CSI), a raw 0x9B byte, NUL, CR LF; and the same rule as the
 * chat screen's (ui_sanitize) for every control character. */
static void test_plain_c1_nul_crlf(void **st)
{
    (void)st;
    capture c;
    cap_open(&c);
    const char in[] = "x\xc2\x9b" "2Jy\x9b" "2Jz\x00w\r\nv\xc2\x85u\xc2\xa0t";
    out_plain(c.f, in, sizeof in - 1);
    char *out = cap_close(&c);
    assert_string_equal(out, "x\xef\xbf\xbd" "2Jy\xef\xbf\xbd" "2Jz\xe2\x90\x80w\nv\xef\xbf\xbdu\xc2\xa0t");
    free(out);
    /* every control, one by one, shows as the screen shows it */
    for (unsigned b = 0; b < 0xA0; b++) {
        if (b == '\t' || b == '\n' || (b >= 0x20 && b < 0x7F)) continue;
        char one[3];
        size_t n = 0;
        if (b >= 0x80) one[n++] = (char)0xC2;
        one[n++] = (char)b;
        cap_open(&c);
        out_plain(c.f, one, n);
        char *plain = cap_close(&c);
        char scr[16];
        size_t k = ui_sanitize(one, n, scr, sizeof scr);
        scr[k] = 0;
        if (strcmp(plain, scr)) fail_msg("control %#x: one-shot '%s', screen '%s'", b, plain, scr);
        uint32_t cp;
        ui_utf8_decode(plain, strlen(plain), &cp);
        assert_true(cp == ui_control_picture(b));
        assert_true(cp >= 0x2400 || cp == 0xFFFD);
        free(plain);
    }
    /* long text: pieces are never cut inside a character or a CR LF */
    size_t len = 5000;
    char *big = malloc(len);
    for (size_t i = 0; i < len; i += 2) {
        big[i] = (char)0xC3;
        big[i + 1] = (char)0xA9; /* é */
    }
    big[1023] = '\r';
    big[1024] = '\n';
    big[1022] = 'a';
    big[1025] = 'b';
    cap_open(&c);
    out_plain(c.f, big, len);
    out = cap_close(&c);
    assert_int_equal(strlen(out), len - 1);        /* the CR of the CR LF only */
    assert_null(strstr(out, "\xef\xbf\xbd"));     /* no character was split */
    free(out);
    free(big);
}

/* Token by token: a CR LF split between two pieces is one line break, a lone CR is ␍. */
static void test_plain_stream_crlf(void **st)
{
    (void)st;
    capture c;
    cap_open(&c);
    plain_out po = {.f = c.f};
    plain_out_write(&po, "a\r", 2);
    plain_out_write(&po, "\nb\r", 3);
    plain_out_write(&po, "c\r", 2);
    plain_out_flush(&po);
    char *out = cap_close(&c);
    assert_string_equal(out, "a\nb\xe2\x90\x8d" "c\xe2\x90\x8d");
    free(out);
}

/* JSON strings: C1 controls escaped too, a NUL kept as \u0000 with the text after it. */
static void test_json_c1_nul(void **st)
{
    (void)st;
    capture c;
    cap_open(&c);
    json_write_string(c.f, "a\x00" "b\xc2\x9b" "c\xc2\xa9", 8);
    char *out = cap_close(&c);
    assert_string_equal(out, "\"a\\u0000b\\u009bc\xc2\xa9\"");
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape_ascii_and_controls),
        cmocka_unit_test(test_escape_utf8),
        cmocka_unit_test(test_json_lines_split_character),
        cmocka_unit_test(test_json_done_error),
        cmocka_unit_test(test_plain_no_control_bytes),
        cmocka_unit_test(test_plain_c1_nul_crlf),
        cmocka_unit_test(test_json_c1_nul),
        cmocka_unit_test(test_plain_stream_crlf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
