/* test_stop: stop strings are never shown partly, whatever the token boundaries. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/stop.h"

/* Streams `text` in chunks of `step` bytes; returns what was shown and whether it stopped. */
static int run(const char *const *stops, int n, const char *text, size_t step, char *shown, size_t *shown_len)
{
    stop_matcher m;
    assert_int_equal(stop_init(&m, stops, n), 0);
    size_t len = strlen(text), total = 0;
    char out[1024];
    for (size_t i = 0; i < len; i += step) {
        size_t c = len - i < step ? len - i : step, ol;
        int hit = stop_push(&m, text + i, c, out, &ol);
        memcpy(shown + total, out, ol);
        total += ol;
        if (hit) {
            *shown_len = total;
            return 1;
        }
    }
    total += stop_flush(&m, shown + total);
    *shown_len = total;
    return 0;
}

static void test_split_stop_never_shown(void **state)
{
    (void)state;
    const char *stops[] = {"User:", "\n\n###"};
    for (size_t step = 1; step <= 12; step++) {
        char shown[256];
        size_t n;
        int hit = run(stops, 2, "Sure, here it is.\nUser: next", step, shown, &n);
        assert_int_equal(hit, 1);
        assert_int_equal(n, strlen("Sure, here it is.\n"));
        assert_memory_equal(shown, "Sure, here it is.\n", n);
    }
}

static void test_partial_prefix_released_at_end(void **state)
{
    (void)state;
    const char *stops[] = {"User:"};
    for (size_t step = 1; step <= 6; step++) {
        char shown[256];
        size_t n;
        assert_int_equal(run(stops, 1, "ends with Use", step, shown, &n), 0);
        assert_int_equal(n, strlen("ends with Use"));
        assert_memory_equal(shown, "ends with Use", n);
    }
}

static void test_false_start_then_match(void **state)
{
    (void)state;
    const char *stops[] = {"abcab"};
    char shown[256];
    size_t n;
    /* "abcabcab": the earliest occurrence starts at 0 */
    assert_int_equal(run(stops, 1, "xxabcabcab", 1, shown, &n), 1);
    assert_int_equal(n, 2);
    assert_int_equal(run(stops, 1, "abcaXabcab!", 3, shown, &n), 1);
    assert_int_equal(n, 5);
    assert_memory_equal(shown, "abcaX", 5);
}

static void test_earliest_of_several(void **state)
{
    (void)state;
    const char *stops[] = {"END", "STOP"};
    char shown[256];
    size_t n;
    assert_int_equal(run(stops, 2, "go STOP then END", 100, shown, &n), 1);
    assert_int_equal(n, 3);
}

static void test_no_stops_passthrough_and_limits(void **state)
{
    (void)state;
    char shown[256];
    size_t n;
    assert_int_equal(run(NULL, 0, "plain text", 4, shown, &n), 0);
    assert_int_equal(n, 10);
    stop_matcher m;
    char big[STOP_MAX_LEN + 1];
    memset(big, 'a', sizeof big - 1);
    big[STOP_MAX_LEN] = 0;
    const char *bad[] = {big};
    assert_int_equal(stop_init(&m, bad, 1), -1);
    const char *empty[] = {""};
    assert_int_equal(stop_init(&m, empty, 1), 0);
    assert_int_equal(m.n_stops, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_stop_never_shown),
        cmocka_unit_test(test_partial_prefix_released_at_end),
        cmocka_unit_test(test_false_start_then_match),
        cmocka_unit_test(test_earliest_of_several),
        cmocka_unit_test(test_no_stops_passthrough_and_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
