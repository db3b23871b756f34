/* test_wrap: display-width word wrapping and safe display text (ui/text.c): CJK, emoji, combining marks, long words, invalid UTF-8. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ui/text.h"

/* Wrap s at width and return the lines joined with '|' (static buffer). */
static const char *wrap_str(const char *s, int width, int mode)
{
    static char buf[4096];
    ui_lines l = {0};
    size_t len = strlen(s);
    assert_int_equal(ui_wrap(s, len, 0, width, mode, &l), 0);
    size_t o = 0;
    for (size_t i = 0; i < l.n; i++) {
        if (i) buf[o++] = '|';
        memcpy(buf + o, s + l.v[i].start, l.v[i].end - l.v[i].start);
        o += l.v[i].end - l.v[i].start;
    }
    buf[o] = 0;
    ui_lines_free(&l);
    return buf;
}

/* Every line of s wrapped at width is at most width cells (unless it holds one character). */
static void assert_fits(const char *s, size_t len, int width, int mode)
{
    ui_lines l = {0};
    assert_int_equal(ui_wrap(s, len, 0, width, mode, &l), 0);
    assert_true(l.n >= 1);
    for (size_t i = 0; i < l.n; i++) {
        const char *p = s + l.v[i].start;
        size_t n = l.v[i].end - l.v[i].start;
        int w = ui_text_width(p, n);
        if (w > width) {
            uint32_t cp;
            assert_int_equal(ui_utf8_decode(p, n, &cp), n); /* only a lone wide character may overflow */
        }
        assert_true(l.v[i].start <= l.v[i].end);
        if (i) assert_true(l.v[i].start >= l.v[i - 1].end);
    }
    ui_lines_free(&l);
}

static void test_ascii_words(void **st)
{
    (void)st;
    assert_string_equal(wrap_str("the quick brown fox", 10, UI_WRAP_WORD), "the quick|brown fox");
    assert_string_equal(wrap_str("the quick brown fox", 9, UI_WRAP_WORD), "the quick|brown fox");
    assert_string_equal(wrap_str("the quick brown fox", 8, UI_WRAP_WORD), "the|quick|brown|fox");
    /* the space that overflows hangs: no line starts with it */
    assert_string_equal(wrap_str("abcd efgh", 4, UI_WRAP_WORD), "abcd|efgh");
    assert_string_equal(wrap_str("ab    cd", 4, UI_WRAP_WORD), "ab|cd");
    assert_string_equal(wrap_str("short", 80, UI_WRAP_WORD), "short");
}

static void test_long_word(void **st)
{
    (void)st;
    assert_string_equal(wrap_str("abcdefghijkl", 5, UI_WRAP_WORD), "abcde|fghij|kl");
    assert_string_equal(wrap_str("a abcdefghijkl b", 5, UI_WRAP_WORD), "a|abcde|fghij|kl b");
    /* a 10,000-byte word at width 7 */
    char *w = malloc(10001);
    memset(w, 'x', 10000);
    w[10000] = 0;
    ui_lines l = {0};
    assert_int_equal(ui_wrap(w, 10000, 0, 7, UI_WRAP_WORD, &l), 0);
    assert_int_equal(l.n, (10000 + 6) / 7);
    ui_lines_free(&l);
    free(w);
}

static void test_newlines_and_empty(void **st)
{
    (void)st;
    assert_string_equal(wrap_str("a\n\nb", 10, UI_WRAP_WORD), "a||b");
    assert_string_equal(wrap_str("a\n", 10, UI_WRAP_WORD), "a|");
    ui_lines l = {0};
    assert_int_equal(ui_wrap("", 0, 0, 10, UI_WRAP_WORD, &l), 0);
    assert_int_equal(l.n, 1);
    assert_int_equal(l.v[0].start, 0);
    assert_int_equal(l.v[0].end, 0);
    ui_lines_free(&l);
    /* width < 1 is taken as 1 */
    assert_string_equal(wrap_str("abc", 0, UI_WRAP_WORD), "a|b|c");
}

static void test_cjk(void **st)
{
    (void)st;
    const char *s = "日本語のテキスト"; /* 8 wide characters, 16 cells */
    assert_int_equal(ui_text_width(s, strlen(s)), 16);
    /* width 5 holds two (4 cells); a character is never split over two lines */
    assert_string_equal(wrap_str(s, 5, UI_WRAP_WORD), "日本|語の|テキ|スト");
    assert_string_equal(wrap_str(s, 6, UI_WRAP_WORD), "日本語|のテキ|スト");
    /* ideographs break anywhere, so a Latin word before them is not cut */
    assert_string_equal(wrap_str("hello世界", 6, UI_WRAP_WORD), "hello|世界");
    assert_string_equal(wrap_str("世界hello", 6, UI_WRAP_WORD), "世界|hello");
    /* a wide character on a 1-cell line gets a line of its own */
    assert_string_equal(wrap_str("日本", 1, UI_WRAP_WORD), "日|本");
    assert_fits(s, strlen(s), 3, UI_WRAP_WORD);
    assert_fits(s, strlen(s), 3, UI_WRAP_CHAR);
}

static void test_emoji(void **st)
{
    (void)st;
    const char *s = "😀😀😀";
    assert_int_equal(ui_text_width(s, strlen(s)), 6);
    assert_string_equal(wrap_str(s, 4, UI_WRAP_WORD), "😀😀|😀");
    assert_string_equal(wrap_str(s, 5, UI_WRAP_CHAR), "😀😀|😀");
    /* with a variation selector (zero width) it stays with its base */
    const char *h = "a\xe2\x9d\xa4\xef\xb8\x8f" "b"; /* a ❤️ b */
    assert_int_equal(ui_utf8_decode("\xef\xb8\x8f", 3, &(uint32_t){0}), 3);
    ui_lines l = {0};
    assert_int_equal(ui_wrap(h, strlen(h), 0, 2, UI_WRAP_CHAR, &l), 0);
    for (size_t i = 0; i < l.n; i++) assert_true(h[l.v[i].start] != '\xef' || l.v[i].start == 0);
    ui_lines_free(&l);
}

static void test_combining(void **st)
{
    (void)st;
    const char *s = "e\xcc\x81" "e\xcc\x81" "e\xcc\x81" "e\xcc\x81"; /* é é é é, decomposed */
    assert_int_equal(ui_text_width(s, strlen(s)), 4);
    /* two per line, each mark with its base */
    assert_string_equal(wrap_str(s, 2, UI_WRAP_WORD), "e\xcc\x81" "e\xcc\x81|e\xcc\x81" "e\xcc\x81");
    assert_string_equal(wrap_str(s, 3, UI_WRAP_CHAR), "e\xcc\x81" "e\xcc\x81" "e\xcc\x81|e\xcc\x81");
    /* several marks on one base */
    const char *m = "a\xcc\x81\xcc\xa3" "b";
    assert_int_equal(ui_text_width(m, strlen(m)), 2);
    assert_string_equal(wrap_str(m, 1, UI_WRAP_WORD), "a\xcc\x81\xcc\xa3|b");
    /* a mark with no base takes a cell of its own: no zero-width line */
    assert_string_equal(wrap_str("\xcc\x81" "ab", 1, UI_WRAP_WORD), "\xcc\x81|a|b");
    /* a Hangul jamo sequence / a word with accents in a sentence */
    assert_string_equal(wrap_str("cafe\xcc\x81 au lait", 5, UI_WRAP_WORD), "cafe\xcc\x81|au|lait");
}

static void test_invalid_utf8(void **st)
{
    (void)st;
    const char bad[] = "\xff\xfe ab \xc3 \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 \xc0\xaf";
    size_t len = sizeof bad - 1;
    /* each invalid byte decodes alone as U+FFFD, one cell */
    uint32_t cp;
    assert_int_equal(ui_utf8_decode("\xff", 1, &cp), 1);
    assert_int_equal(cp, 0xFFFD);
    assert_int_equal(ui_utf8_decode("\xe2\x82", 2, &cp), 1); /* truncated */
    assert_int_equal(cp, 0xFFFD);
    assert_int_equal(ui_utf8_decode("\xed\xa0\x80", 3, &cp), 1); /* surrogate */
    assert_int_equal(cp, 0xFFFD);
    assert_int_equal(ui_utf8_decode("\xc0\xaf", 2, &cp), 1); /* overlong */
    assert_int_equal(cp, 0xFFFD);
    for (int w = 1; w < 12; w++) {
        assert_fits(bad, len, w, UI_WRAP_WORD);
        assert_fits(bad, len, w, UI_WRAP_CHAR);
    }
    char out[256];
    size_t n = ui_sanitize(bad, len, out, sizeof out);
    assert_true(n <= 3 * len);
    /* the result is valid UTF-8 */
    for (size_t i = 0; i < n;) {
        size_t k = ui_utf8_decode(out + i, n - i, &cp);
        if (cp == 0xFFFD) assert_memory_equal(out + i, "\xef\xbf\xbd", 3);
        i += k;
    }
}

static void test_sanitize_controls(void **st)
{
    (void)st;
    const char in[] = "a\x1b[31mred\x1b]0;title\x07\tb\r\nc\x7f" "d\xc2\x9b" "2J\x00z";
    size_t len = sizeof in - 1;
    char out[256];
    size_t n = ui_sanitize(in, len, out, sizeof out);
    assert_true(n < sizeof out);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)out[i];
        assert_true(c >= 0x20 || c == '\n'); /* no control byte but the line break */
        assert_true(c != 0x7F);
    }
    out[n] = 0;
    assert_non_null(strstr(out, "a\xe2\x90\x9b[31mred")); /* ESC → ␛ */
    assert_non_null(strstr(out, "\xe2\x90\x87    b\nc"));  /* BEL → ␇, tab → 4 spaces, CR dropped */
    assert_non_null(strstr(out, "c\xe2\x90\xa1" "d"));      /* DEL → ␡ */
    assert_non_null(strstr(out, "d\xef\xbf\xbd" "2J"));     /* C1 CSI → U+FFFD */
    assert_non_null(strstr(out, "\xe2\x90\x80z"));          /* NUL → ␀ */
    /* a short buffer is not overrun and the full size is reported */
    char small[4] = {'#', '#', '#', '#'};
    size_t need = ui_sanitize("ab\x1b" "cd", 5, small, 3);
    assert_int_equal(need, 7);
    assert_memory_equal(small, "ab", 2);
    assert_int_equal(small[3], '#');
}

/* Wrapping a text as it grows, re-wrapping only from the last line's start, gives the same
 * lines as wrapping the whole text (what the chat pane does while a reply streams). */
static void test_incremental_equals_full(void **st)
{
    (void)st;
    static const char *pieces[] = {" ", "the", " cat", "日本", "😀", "e\xcc\x81", "\n", "  ", "supercalifragilistic",
                                   ",", "\xff", "x", "語", " sat"};
    unsigned seed = 12345;
    for (int round = 0; round < 300; round++) {
        char text[2048];
        size_t len = 0;
        int width = 1 + round % 23;
        ui_lines inc = {0};
        assert_int_equal(ui_wrap(text, 0, 0, width, UI_WRAP_WORD, &inc), 0);
        for (int k = 0; k < 60; k++) {
            seed = seed * 1103515245u + 12345u;
            const char *p = pieces[(seed >> 16) % (sizeof pieces / sizeof *pieces)];
            size_t pl = strlen(p);
            memcpy(text + len, p, pl);
            len += pl;
            size_t from = inc.v[inc.n - 1].start;
            inc.n--;
            assert_int_equal(ui_wrap(text, len, from, width, UI_WRAP_WORD, &inc), 0);
            ui_lines full = {0};
            assert_int_equal(ui_wrap(text, len, 0, width, UI_WRAP_WORD, &full), 0);
            assert_int_equal(inc.n, full.n);
            assert_memory_equal(inc.v, full.v, full.n * sizeof *full.v);
            ui_lines_free(&full);
            if (inc.n == 0) break;
        }
        assert_fits(text, len, width, UI_WRAP_WORD);
        ui_lines_free(&inc);
    }
}

/* Character mode covers every byte exactly once (except the '\n' between lines). */
static void test_char_mode_covers(void **st)
{
    (void)st;
    const char *s = "ab 日本 c\xcc\x81\nxyz   \n\n😀 tail";
    size_t len = strlen(s);
    for (int w = 1; w < 10; w++) {
        ui_lines l = {0};
        assert_int_equal(ui_wrap(s, len, 0, w, UI_WRAP_CHAR, &l), 0);
        size_t expect = 0;
        for (size_t i = 0; i < l.n; i++) {
            if (l.v[i].start != expect) {
                assert_int_equal(s[expect], '\n');
                expect++;
            }
            assert_int_equal(l.v[i].start, expect);
            expect = l.v[i].end;
        }
        assert_int_equal(expect, len);
        ui_lines_free(&l);
    }
}

int main(void)
{
    if (!setlocale(LC_CTYPE, "C.UTF-8")) {
        fprintf(stderr, "test_wrap: the C.UTF-8 locale is missing\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ascii_words),       cmocka_unit_test(test_long_word),
        cmocka_unit_test(test_newlines_and_empty), cmocka_unit_test(test_cjk),
        cmocka_unit_test(test_emoji),             cmocka_unit_test(test_combining),
        cmocka_unit_test(test_invalid_utf8),      cmocka_unit_test(test_sanitize_controls),
        cmocka_unit_test(test_incremental_equals_full), cmocka_unit_test(test_char_mode_covers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
