/* test_conv_tree: the conversation tree — branches, the shown path, sibling ranks, lookup by store id. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app/conv_tree.h"

enum { U = 0, A = 1 };

static void test_append_builds_path(void **state)
{
    (void)state;
    conv_tree t = {0};
    assert_non_null(conv_append(&t, U, "hi", 2));
    assert_non_null(conv_append(&t, A, "hello there", 11));
    assert_int_equal(t.n, 2);
    assert_int_equal(t.n_path, 2);
    assert_int_equal(conv_at(&t, 0)->parent, -1);
    assert_int_equal(conv_at(&t, 1)->parent, 0);
    assert_string_equal(conv_at(&t, 1)->text, "hello there");
    assert_int_equal(conv_at(&t, 1)->len, 11);
    /* text grows in place with a NUL after it, whatever its bytes (a NUL inside too) */
    conv_node *r = conv_at(&t, 1);
    assert_int_equal(conv_text_append(&r->text, &r->len, &r->cap, "\0x", 2), 0);
    assert_int_equal(r->len, 13);
    assert_memory_equal(r->text, "hello there\0x", 14);
    conv_free(&t);
    assert_null(t.node);
}

static void test_add_rejects_unknown_parent(void **state)
{
    (void)state;
    conv_tree t = {0};
    assert_int_equal(conv_add(&t, 0, U, "x", 1), -1); /* no node 0 yet */
    assert_int_equal(conv_add(&t, -1, U, "x", 1), 0);
    assert_int_equal(conv_add(&t, 5, U, "x", 1), -1);
    assert_int_equal(conv_add(&t, -2, U, "x", 1), -1);
    conv_free(&t);
}

/* u0 → a1; regenerate: a2 is a sibling of a1; edit u0: u3 a sibling of u0, answered by a4. */
static void build_branches(conv_tree *t)
{
    assert_non_null(conv_append(t, U, "u0", 2));
    assert_non_null(conv_append(t, A, "a1", 2));
    assert_int_equal(conv_path_pop(t), 1);
    assert_non_null(conv_append(t, A, "a2", 2));
    assert_int_equal(conv_path_pop(t), 2);
    assert_int_equal(conv_path_pop(t), 0);
    assert_int_equal(conv_path_pop(t), -1);
    assert_non_null(conv_append(t, U, "u3", 2));
    assert_non_null(conv_append(t, A, "a4", 2));
}

static void test_sibling_ranks(void **state)
{
    (void)state;
    conv_tree t = {0};
    build_branches(&t);
    size_t *count, *rank = conv_sibling_ranks(&t, &count);
    assert_non_null(rank);
    /* first messages u0, u3: slot n; replies to u0: a1, a2; reply to u3: a4 */
    assert_int_equal(conv_slot_of(&t, 0), t.n);
    assert_int_equal(conv_slot_of(&t, 2), 0);
    assert_int_equal(count[t.n], 2);
    assert_int_equal(count[0], 2);
    assert_int_equal(count[3], 1);
    size_t want[] = {1, 1, 2, 2, 1};
    for (size_t i = 0; i < 5; i++) assert_int_equal(rank[i], want[i]);
    assert_int_equal(conv_sibling(&t, 3, 1), 0);
    assert_int_equal(conv_sibling(&t, 1, 2), 2);
    assert_int_equal(conv_sibling(&t, 1, 3), -1);
    free(rank);
    free(count);
    conv_free(&t);
}

static void test_show_branch_follows_newest(void **state)
{
    (void)state;
    conv_tree t = {0};
    build_branches(&t);
    /* back to branch 1 of the first message: u0, then its newest reply a2 */
    assert_int_equal(conv_show_branch(&t, 0, 0), 0);
    assert_int_equal(t.n_path, 2);
    assert_int_equal(t.path[0], 0);
    assert_int_equal(t.path[1], 2);
    /* the older reply a1 in place of position 1 */
    assert_int_equal(conv_show_branch(&t, 1, 1), 0);
    assert_int_equal(t.path[1], 1);
    /* a node that does not follow path[p - 1] is refused and the path is unchanged */
    assert_int_equal(conv_show_branch(&t, 1, 4), -1);
    assert_int_equal(t.n_path, 2);
    assert_int_equal(t.path[1], 1);
    assert_int_equal(conv_show_branch(&t, 0, 99), -1);
    conv_free(&t);
}

static void test_role_positions(void **state)
{
    (void)state;
    conv_tree t = {0};
    for (int i = 0; i < 6; i++) assert_non_null(conv_append(&t, i % 2 ? A : U, "m", 1));
    assert_int_equal(conv_role_before(&t, U, t.n_path), 4);
    assert_int_equal(conv_role_before(&t, U, 4), 2);
    assert_int_equal(conv_role_before(&t, U, 0), -1);
    assert_int_equal(conv_role_after(&t, U, 0), 2);
    assert_int_equal(conv_role_after(&t, U, 4), -1);
    assert_int_equal(conv_role_before(&t, U, 1000), 4); /* clamped to the path */
    conv_free(&t);
}

static void test_find_id_and_drop_newest(void **state)
{
    (void)state;
    conv_tree t = {0};
    int64_t ids[] = {3, 7, 8, 20, 41};
    for (int i = 0; i < 5; i++) {
        long k = conv_add(&t, i ? i - 1 : -1, U, "m", 1);
        assert_int_equal(k, i);
        t.node[k].id = ids[i];
    }
    for (int i = 0; i < 5; i++) assert_int_equal(conv_find_id(&t, ids[i]), i);
    assert_int_equal(conv_find_id(&t, 0), -1);
    assert_int_equal(conv_find_id(&t, 9), -1);
    assert_int_equal(conv_find_id(&t, 100), -1);
    /* only the newest, unsaved node off the path can be dropped */
    assert_int_equal(conv_drop_newest(&t, 4), 0); /* saved */
    long k = conv_add(&t, 4, A, "", 0);
    assert_int_equal(conv_path_push(&t, k), 0);
    assert_int_equal(conv_drop_newest(&t, k), 0); /* on the path */
    assert_int_equal(conv_path_pop(&t), k);
    assert_int_equal(conv_drop_newest(&t, 3), 0); /* not the newest */
    assert_int_equal(conv_drop_newest(&t, k), 1);
    assert_int_equal(t.n, 5);
    conv_clear(&t);
    assert_int_equal(t.n, 0);
    assert_int_equal(t.n_path, 0);
    conv_free(&t);
}

static void test_many_nodes(void **state)
{
    (void)state;
    conv_tree t = {0};
    for (int i = 0; i < 1000; i++) assert_non_null(conv_append(&t, i % 2, "xyz", 3));
    assert_int_equal(t.n_path, 1000);
    for (size_t i = 1; i < 1000; i++) assert_int_equal(conv_at(&t, i)->parent, (long)i - 1);
    conv_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_builds_path),    cmocka_unit_test(test_add_rejects_unknown_parent),
        cmocka_unit_test(test_sibling_ranks),         cmocka_unit_test(test_show_branch_follows_newest),
        cmocka_unit_test(test_role_positions),        cmocka_unit_test(test_find_id_and_drop_newest),
        cmocka_unit_test(test_many_nodes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
