/* test_reasoning: the reasoning block of a reply (ui/reasoning.c) — markers, a block still open while streaming, empty blocks, text that only mentions a marker, and a prompt that opens the block itself. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "ui/reasoning.h"

static void split(const char *s, ui_reasoning *r) { ui_reasoning_split(s, strlen(s), r); }

static void check(const char *s, int found, int closed, const char *body, const char *answer)
{
    ui_reasoning r;
    split(s, &r);
    assert_int_equal(r.found, found);
    assert_int_equal(r.closed, closed);
    if (!found) {
        assert_int_equal(r.answer, 0);
        return;
    }
    assert_true(r.body <= r.body_end && r.body_end <= strlen(s));
    assert_int_equal(r.body_end - r.body, strlen(body));
    assert_memory_equal(s + r.body, body, strlen(body));
    assert_string_equal(s + r.answer, answer);
}

static void test_split(void **st)
{
    (void)st;
    /* Qwen3 / DeepSeek-R1 as they write it */
    check("<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!", 1, 1, "The user greets me.\nI greet back.", "Hello!");
    /* leading whitespace before the marker */
    check("\n  <think>x</think>answer", 1, 1, "x", "answer");
    /* still streaming: everything after the marker is reasoning, no answer yet */
    check("<think>\nLet me count: 1, 2", 1, 0, "Let me count: 1, 2", "");
    check("<think>", 1, 0, "", "");
    /* Qwen3's non-thinking mode writes an empty block */
    check("<think>\n\n</think>\n\nJust the answer.", 1, 1, "", "Just the answer.");
    /* Magistral's markers, and the thought markers */
    check("[THINK]hmm[/THINK]Yes.", 1, 1, "hmm", "Yes.");
    check("<|begin_of_thought|>a b<|end_of_thought|>\nc", 1, 1, "a b", "c");
    /* not at the start: the model talks about the marker; a partial marker is not one */
    check("Use <think> tags like <think>this</think>.", 0, 0, "", "");
    check("<thi", 0, 0, "", "");
    check("", 0, 0, "", "");
    /* a close marker of another pair does not close the block */
    check("<think>a[/THINK]b", 1, 0, "a[/THINK]b", "");
    /* UTF-8 in the reasoning is kept whole (byte offsets) */
    check("<think>日本語 🙂</think>答え", 1, 1, "日本語 🙂", "答え");
}

static void test_open_at_end(void **st)
{
    (void)st;
    const char *p = "<｜User｜>hi<｜Assistant｜><think>\n";
    assert_string_equal(ui_reasoning_open_at_end(p, strlen(p)), "<think>");
    p = "<|im_start|>assistant\n";
    assert_null(ui_reasoning_open_at_end(p, strlen(p)));
    p = "<|im_start|>assistant\n<think>\n\n</think>\n\n"; /* enable_thinking=false: closed */
    assert_null(ui_reasoning_open_at_end(p, strlen(p)));
    assert_null(ui_reasoning_open_at_end("", 0));
    p = "[THINK]";
    assert_string_equal(ui_reasoning_open_at_end(p, strlen(p)), "[THINK]");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_open_at_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
