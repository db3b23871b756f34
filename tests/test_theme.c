/* test_theme: theme colour specs, the shipped theme files, and warnings naming file and line for bad lines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ui/theme.h"
#include "tests/support/testutil.h"

static void test_parse_style(void **st)
{
    (void)st;
    ui_style s;
    char why[200];
    assert_int_equal(ui_theme_parse_style("bold white on blue", &s, why, sizeof why), 0);
    assert_int_equal(s.fg, 7);
    assert_int_equal(s.bg, 4);
    assert_int_equal(s.attrs, UI_ATTR_BOLD);
    assert_int_equal(ui_theme_parse_style("default", &s, why, sizeof why), 0);
    assert_int_equal(s.fg, UI_COLOR_DEFAULT);
    assert_int_equal(s.bg, UI_COLOR_DEFAULT);
    assert_int_equal(ui_theme_parse_style("244 on 234", &s, why, sizeof why), 0);
    assert_int_equal(s.fg, 244);
    assert_int_equal(s.bg, 234);
    assert_int_equal(ui_theme_parse_style("bright-red", &s, why, sizeof why), 0);
    assert_int_equal(s.fg, 9);
    assert_int_equal(ui_theme_parse_style("reverse underline", &s, why, sizeof why), 0);
    assert_int_equal(s.attrs, UI_ATTR_REVERSE | UI_ATTR_UNDERLINE);
    /* #rrggbb → the nearest xterm colour: solarized base03 #002b36 is 234 (#1c1c1c) or 235 */
    assert_int_equal(ui_theme_parse_style("#ff0000", &s, why, sizeof why), 0);
    assert_int_equal(s.fg, 196);
    assert_int_equal(ui_theme_parse_style("#005f87", &s, why, sizeof why), 0);
    assert_int_equal(s.fg, 24);
    /* errors */
    assert_int_equal(ui_theme_parse_style("purplish", &s, why, sizeof why), -1);
    assert_non_null(strstr(why, "purplish"));
    assert_int_equal(ui_theme_parse_style("red on", &s, why, sizeof why), -1);
    assert_int_equal(ui_theme_parse_style("red blue", &s, why, sizeof why), -1);
    assert_int_equal(ui_theme_parse_style("256", &s, why, sizeof why), -1);
    assert_int_equal(ui_theme_parse_style("#12345g", &s, why, sizeof why), -1);
}

static void test_palette(void **st)
{
    (void)st;
    int r, g, b;
    ui_theme_xterm_rgb(196, &r, &g, &b);
    assert_int_equal(r, 255);
    assert_int_equal(g, 0);
    ui_theme_xterm_rgb(244, &r, &g, &b);
    assert_int_equal(r, 128);
    /* 8-colour terminals: bright colours fold onto their base, others to the nearest */
    assert_int_equal(ui_theme_nearest_basic(9, 8), 1);
    assert_int_equal(ui_theme_nearest_basic(196, 8), 1);
    assert_int_equal(ui_theme_nearest_basic(46, 8), 2);
    assert_int_equal(ui_theme_nearest_basic(231, 8), 7);
    assert_int_equal(ui_theme_nearest_basic(16, 8), 0);
    assert_int_equal(ui_theme_nearest_basic(UI_COLOR_DEFAULT, 8), UI_COLOR_DEFAULT);
    assert_int_equal(ui_theme_nearest_basic(12, 16), 12);
}

/* Every shipped theme loads without a single warning. */
static void test_shipped_themes(void **st)
{
    (void)st;
    const char *names[] = {"default", "light", "solarized-dark", "high-contrast", "mono"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[256], why[300];
        snprintf(path, sizeof path, "themes/%s.theme", names[i]);
        tu_warnings w = {0};
        ui_theme t;
        assert_int_equal(ui_theme_load_file(path, &t, tu_collect_warning, &w, why, sizeof why), 0);
        if (w.n) fail_msg("%s", w.msg[0]);
        assert_string_equal(t.name, names[i]);
        assert_true(t.gauge_mid_pct < t.gauge_high_pct);
    }
    /* the built-in default equals default.theme */
    ui_theme a, b;
    char why[300];
    ui_theme_builtin_default(&a);
    assert_int_equal(ui_theme_load_file("themes/default.theme", &b, NULL, NULL, why, sizeof why), 0);
    assert_memory_equal(a.el, b.el, sizeof a.el);
    /* mono has no colour at all */
    assert_int_equal(ui_theme_load_file("themes/mono.theme", &b, NULL, NULL, why, sizeof why), 0);
    for (int i = 0; i < UI_EL_COUNT; i++) {
        assert_int_equal(b.el[i].fg, UI_COLOR_DEFAULT);
        assert_int_equal(b.el[i].bg, UI_COLOR_DEFAULT);
    }
}

/* A bad line gives a warning naming the file and line; that key keeps its default and the
 * rest of the file still applies. */
static void test_bad_lines(void **st)
{
    (void)st;
    char path[] = "/tmp/kvchat-test-theme-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "# a theme with mistakes\n"           /* 1 */
                       "[theme]\n"                           /* 2 */
                       "border = ascii\n"                    /* 3 */
                       "gauge_mid = 150\n"                   /* 4 */
                       "[colors]\n"                          /* 5 */
                       "user = purplish on blue\n"           /* 6 */
                       "this line has no equals sign\n"      /* 7 */
                       "assistant = bold magenta\n"          /* 8 */
                       "sparkles = red\n"                    /* 9 */
                       "[extra\n"                            /* 10 */
                       "error = red on\n";                   /* 11 */
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    tu_warnings w = {0};
    ui_theme t, def;
    char why[300];
    ui_theme_builtin_default(&def);
    assert_int_equal(ui_theme_load_file(path, &t, tu_collect_warning, &w, why, sizeof why), 0);
    unlink(path);
    assert_int_equal(w.n, 6);
    const int lines[] = {4, 6, 7, 9, 10, 11};
    for (int i = 0; i < 6; i++) {
        char want[600];
        snprintf(want, sizeof want, "%s:%d: ", path, lines[i]);
        if (strncmp(w.msg[i], want, strlen(want))) fail_msg("warning %d: '%s', want prefix '%s'", i, w.msg[i], want);
    }
    assert_non_null(strstr(w.msg[1], "purplish"));
    assert_int_equal(t.border_ascii, 1);                       /* line 3 applied */
    assert_int_equal(t.gauge_mid_pct, def.gauge_mid_pct);      /* line 4 rejected */
    assert_memory_equal(&t.el[UI_EL_USER], &def.el[UI_EL_USER], sizeof(ui_style)); /* default kept */
    assert_int_equal(t.el[UI_EL_ASSISTANT].fg, 5);             /* line 8 applied */
    assert_int_equal(t.el[UI_EL_ASSISTANT].attrs, UI_ATTR_BOLD);
    assert_memory_equal(&t.el[UI_EL_ERROR], &def.el[UI_EL_ERROR], sizeof(ui_style));
}

/* Search order: $XDG_CONFIG_HOME/kvchat/themes first; a missing theme names the choices. */
static void test_search(void **st)
{
    (void)st;
    assert_int_equal(tu_tmpdir_make("test-xdg"), 0);
    const char *dir = tu_tmpdir();
    char p[600];
    snprintf(p, sizeof p, "%s/kvchat", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/kvchat/themes", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/kvchat/themes/mine.theme", dir);
    FILE *f = fopen(p, "w");
    fputs("[colors]\nuser = red\n", f);
    fclose(f);
    setenv("XDG_CONFIG_HOME", dir, 1);
    char dirs[4][512];
    int n = ui_theme_dirs(dirs, 4);
    assert_true(n >= 2);
    snprintf(p, sizeof p, "%s/kvchat/themes", dir);
    assert_string_equal(dirs[0], p);
    ui_theme t;
    char why[1200];
    assert_int_equal(ui_theme_load("mine", &t, NULL, NULL, why, sizeof why), 0);
    assert_int_equal(t.el[UI_EL_USER].fg, 1);
    assert_int_equal(ui_theme_load("nosuchtheme", &t, NULL, NULL, why, sizeof why), -1);
    assert_non_null(strstr(why, "nosuchtheme"));
    assert_non_null(strstr(why, "mine"));
    assert_int_equal(ui_theme_load("../etc", &t, NULL, NULL, why, sizeof why), -1);
    /* built-ins always exist */
    assert_int_equal(ui_theme_load("default", &t, NULL, NULL, why, sizeof why), 0);
    assert_int_equal(ui_theme_load("mono", &t, NULL, NULL, why, sizeof why), 0);
    assert_int_equal(tu_tmpdir_remove(), 0);
    unsetenv("XDG_CONFIG_HOME");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_style), cmocka_unit_test(test_palette), cmocka_unit_test(test_shipped_themes),
        cmocka_unit_test(test_bad_lines),   cmocka_unit_test(test_search),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
