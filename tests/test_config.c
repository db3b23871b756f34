/* test_config: settings precedence (default < file < environment < command line), INI warnings naming file and line, value checks, and the models directory lookup. */
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

#include "app/config.h"
#include "app/models.h"
#include "engine/kernels/quant.h"
#include "tests/support/testutil.h"

static const char *write_file(const char *name, const char *text)
{
    const char *path = tu_tmp_path(name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static int setup(void **st)
{
    (void)st;
    if (tu_tmpdir_make("test-config")) return -1;
    unsetenv("KVCHAT_MODEL");
    unsetenv("KVCHAT_DB");
    return 0;
}

/* [persona NAME] sections: system and [sampling] keys, checked by the one table; other keys,
 * bad values and a section named only "persona" are warnings naming the line. */
static void test_personas(void **st)
{
    (void)st;
    const char *path = write_file("personas.ini", "[sampling]\n"
                                                  "temp = 0.5\n"
                                                  "[persona coder]\n"           /* 3 */
                                                  "system = You write C.\n"
                                                  "temp = 0.2\n"
                                                  "top-k = 10\n"
                                                  "n_ctx = 512\n"               /* 7: not a persona key */
                                                  "temp = 5\n"                  /* 8: out of range */
                                                  "[persona  poet ]\n"          /* 9: trimmed */
                                                  "seed = 42\n"
                                                  "n_predict = 64\n"
                                                  "[persona]\n"                 /* 12: no name */
                                                  "temp = 1\n"                  /* 13 */
                                                  "[persona coder]\n"           /* 14: the same one again */
                                                  "min_p = 0.1\n");
    kv_config c;
    config_init(&c);
    tu_warnings w = {0};
    assert_int_equal(config_load_file(&c, path, tu_collect_warning, &w), 0);
    assert_string_equal(config_get(&c, CFG_TEMP), "0.5"); /* [sampling] is not touched by personas */
    assert_int_equal(c.n_personas, 2);
    const cfg_persona *p = config_persona_find(&c, "coder");
    assert_non_null(p);
    assert_string_equal(p->v[CFG_SYSTEM], "You write C.");
    assert_string_equal(p->v[CFG_TEMP], "0.2");
    assert_string_equal(p->v[CFG_TOP_K], "10");
    assert_string_equal(p->v[CFG_MIN_P], "0.1");
    assert_null(p->v[CFG_N_CTX]);
    assert_null(p->v[CFG_TOP_P]);
    const cfg_persona *q = config_persona_find(&c, "poet");
    assert_non_null(q);
    assert_string_equal(q->v[CFG_SEED], "42");
    assert_string_equal(q->v[CFG_N_PREDICT], "64");
    assert_null(config_persona_find(&c, "Coder"));
    assert_int_equal(w.n, 3);
    char want[700];
    snprintf(want, sizeof want, "%s:7: key 'n_ctx' in [persona coder]: a persona sets system and the [sampling] keys", path);
    assert_non_null(strstr(w.msg[0], want));
    snprintf(want, sizeof want, "%s:8: temp: ", path);
    assert_non_null(strstr(w.msg[1], want));
    snprintf(want, sizeof want, "%s:13: unknown section '[persona]'", path);
    assert_non_null(strstr(w.msg[2], want));
    /* a persona's values apply as the sampling section's would */
    sampler_params sp;
    sampler_params_default(&sp);
    int n_predict = -1;
    for (int k = 0; k < CFG_COUNT; k++)
        if (q->v[k]) config_apply_key(k, q->v[k], NULL, &sp, &n_predict);
    assert_int_equal(n_predict, 64);
    assert_true(sp.seed == 42);
    assert_true(config_persona_key(CFG_TEMP) && config_persona_key(CFG_SYSTEM) && !config_persona_key(CFG_DB));
    config_free(&c);
    assert_int_equal(c.n_personas, 0);
}

static void test_defaults(void **st)
{
    (void)st;
    kv_config c;
    config_init(&c);
    assert_string_equal(config_get(&c, CFG_TEMP), "0.8");
    assert_string_equal(config_get(&c, CFG_TOP_K), "40");
    assert_string_equal(config_get(&c, CFG_SEED), "random");
    assert_string_equal(config_get(&c, CFG_KV_TYPE), "f16");
    assert_null(config_get(&c, CFG_MODEL));
    assert_int_equal(c.v[CFG_TEMP].source, CFG_SRC_DEFAULT);
    engine_params ep;
    sampler_params sp, want;
    engine_params_default(&ep);
    sampler_params_default(&sp);
    sampler_params_default(&want);
    int n_predict = 7;
    config_apply(&c, &ep, &sp, &n_predict);
    assert_memory_equal(&sp, &want, sizeof sp);
    assert_int_equal(n_predict, -1);
    config_free(&c);
}

static void test_file_values_and_warnings(void **st)
{
    (void)st;
    const char *path = write_file("config.ini",
                                  "# comment\n"
                                  "model = ~/models/x.gguf\n"          /* 2: top level is fine */
                                  "[sampling]\n"
                                  "temp = 0.25   ; inline comment\n"    /* 4 */
                                  "top-k = 12\n"                        /* 5: '-' = '_' */
                                  "top_p = 1.5\n"                       /* 6: out of range */
                                  "nonsense\n"                          /* 7: no '=' */
                                  "colour = red\n"                      /* 8: unknown key */
                                  "[model]\n"
                                  "kv_type = Q8_0\n"                    /* 10 */
                                  "threads = auto\n"                    /* 11 */
                                  "seed = 42\n"                         /* 12: wrong section */
                                  "[nope]\n"
                                  "x = 1\n"                             /* 14 */
                                  "[chat]\n"
                                  "mouse = off\n"                       /* 16 */
                                  "[storage]\n"
                                  "cache_size = 2GiB\n"                /* 18 */
                                  "db = \n"                             /* 19: empty */
                                  "[chat]\n"
                                  "system = You are terse: one line, no lists.\n"); /* 21 */
    setenv("HOME", "/home/someone", 1);
    kv_config c;
    config_init(&c);
    tu_warnings w = {0};
    assert_int_equal(config_load_file(&c, path, tu_collect_warning, &w), 0);
    assert_int_equal(c.file_found, 1);
    assert_string_equal(config_get(&c, CFG_MODEL), "/home/someone/models/x.gguf");
    assert_string_equal(config_get(&c, CFG_TEMP), "0.25");
    assert_string_equal(config_get(&c, CFG_TOP_K), "12");
    assert_string_equal(config_get(&c, CFG_TOP_P), "0.95");
    assert_string_equal(config_get(&c, CFG_KV_TYPE), "q8_0");
    assert_string_equal(config_get(&c, CFG_THREADS), "auto");
    assert_string_equal(config_get(&c, CFG_SEED), "random");
    assert_string_equal(config_get(&c, CFG_MOUSE), "false");
    assert_string_equal(config_get(&c, CFG_CACHE_SIZE), "2GiB");
    assert_null(config_get(&c, CFG_DB));
    assert_string_equal(config_get(&c, CFG_SYSTEM), "You are terse: one line, no lists.");
    assert_int_equal(c.v[CFG_TEMP].source, CFG_SRC_FILE);
    char where[600];
    snprintf(where, sizeof where, "%s:4", path);
    assert_string_equal(c.v[CFG_TEMP].where, where);
    const int bad_lines[] = {6, 7, 8, 12, 14, 19};
    assert_int_equal(w.n, 6);
    for (int i = 0; i < 6; i++) {
        char prefix[600];
        snprintf(prefix, sizeof prefix, "%s:%d: ", path, bad_lines[i]);
        assert_true(strncmp(w.msg[i], prefix, strlen(prefix)) == 0);
    }
    assert_non_null(strstr(w.msg[0], "top_p"));
    assert_non_null(strstr(w.msg[3], "belongs in [sampling]"));
    engine_params ep;
    sampler_params sp;
    engine_params_default(&ep);
    sampler_params_default(&sp);
    config_apply(&c, &ep, &sp, NULL);
    assert_true(sp.temperature == 0.25f);
    assert_int_equal(sp.top_k, 12);
    assert_int_equal(ep.kv_type, GGML_TYPE_Q8_0);
    assert_int_equal(ep.n_threads, 0);
    config_free(&c);
}

static void test_long_line(void **st)
{
    (void)st;
    char text[2000];
    snprintf(text, sizeof text, "[model]\nmodel = /%0*d\nthreads = 3\n", 1500, 0);
    const char *path = write_file("long.ini", text);
    kv_config c;
    config_init(&c);
    tu_warnings w = {0};
    config_load_file(&c, path, tu_collect_warning, &w);
    assert_int_equal(w.n, 1);
    assert_non_null(strstr(w.msg[0], ":2: line longer than"));
    assert_null(config_get(&c, CFG_MODEL));
    assert_string_equal(config_get(&c, CFG_THREADS), "3");
    config_free(&c);
}

static void test_precedence(void **st)
{
    (void)st;
    const char *path = write_file("p.ini", "model = from-file\ndb = /file.db\n[sampling]\ntemp = 0.1\n");
    kv_config c;
    config_init(&c);
    config_load_file(&c, path, tu_collect_warning, &(tu_warnings){0});
    assert_string_equal(config_get(&c, CFG_MODEL), "from-file");
    setenv("KVCHAT_MODEL", "from-env", 1);
    setenv("KVCHAT_DB", "", 1); /* empty: ignored */
    config_load_env(&c, tu_collect_warning, &(tu_warnings){0});
    assert_string_equal(config_get(&c, CFG_MODEL), "from-env");
    assert_int_equal(c.v[CFG_MODEL].source, CFG_SRC_ENV);
    assert_string_equal(c.v[CFG_MODEL].where, "KVCHAT_MODEL");
    assert_string_equal(config_get(&c, CFG_DB), "/file.db");
    assert_int_equal(config_note_option(&c, "model", "from-cli"), CFG_MODEL);
    assert_string_equal(config_get(&c, CFG_MODEL), "from-cli");
    assert_int_equal(c.v[CFG_MODEL].source, CFG_SRC_CLI);
    assert_int_equal(config_note_option(&c, "no-mouse", NULL), CFG_MOUSE);
    assert_string_equal(config_get(&c, CFG_MOUSE), "false");
    assert_int_equal(config_note_option(&c, "stats", NULL), -1);
    assert_string_equal(config_get(&c, CFG_TEMP), "0.1");
    /* --print-config names each source */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_print(&c, f, "/models/from-cli.gguf");
    fclose(f);
    assert_non_null(strstr(buf, "command line --model -> /models/from-cli.gguf"));
    assert_non_null(strstr(buf, "; config file "));
    assert_non_null(strstr(buf, "p.ini:4"));
    assert_non_null(strstr(buf, "top_k              = 40"));
    free(buf);
    unsetenv("KVCHAT_MODEL");
    unsetenv("KVCHAT_DB");
    config_free(&c);
}

/* [remote]: its own "model" (not [model]'s), the API key from the environment, never printed. */
static void test_remote_section(void **st)
{
    (void)st;
    const char *path = write_file("r.ini", "model = local.gguf\n[remote]\nurl = http://gpu-box:8000/v1\n"
                                           "model = Qwen/Qwen2.5-7B-Instruct\ntimeout = 30\napi_key = from-file\n"
                                           "[model]\nurl = http://wrong\n");
    kv_config c;
    config_init(&c);
    tu_warnings w = {0};
    config_load_file(&c, path, tu_collect_warning, &w);
    assert_string_equal(config_get(&c, CFG_MODEL), "local.gguf");
    assert_string_equal(config_get(&c, CFG_REMOTE_MODEL), "Qwen/Qwen2.5-7B-Instruct");
    assert_string_equal(config_get(&c, CFG_REMOTE_URL), "http://gpu-box:8000/v1");
    assert_string_equal(config_get(&c, CFG_REMOTE_TIMEOUT), "30");
    assert_int_equal(w.n, 1); /* url in [model] */
    assert_non_null(strstr(w.msg[0], "'url' belongs in [remote], not [model]"));
    setenv("KVCHAT_REMOTE_API_KEY", "sk-secret-from-env", 1);
    config_load_env(&c, tu_collect_warning, &w);
    unsetenv("KVCHAT_REMOTE_API_KEY");
    assert_string_equal(config_get(&c, CFG_REMOTE_API_KEY), "sk-secret-from-env");
    assert_int_equal(config_note_option(&c, "remote", "http://127.0.0.1:8080"), CFG_REMOTE_URL);
    assert_int_equal(c.v[CFG_REMOTE_URL].source, CFG_SRC_CLI);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_print(&c, f, NULL);
    fclose(f);
    assert_null(strstr(buf, "sk-secret"));
    assert_non_null(strstr(buf, "api_key            = (set, not shown)"));
    assert_non_null(strstr(buf, "[remote]"));
    free(buf);
    char out[64], why[200];
    assert_int_equal(config_check(CFG_REMOTE_TIMEOUT, "0", out, sizeof out, why, sizeof why), -1);
    config_free(&c);
}

static void test_parsers(void **st)
{
    (void)st;
    assert_int_equal(config_parse_bool("Yes"), 1);
    assert_int_equal(config_parse_bool("off"), 0);
    assert_int_equal(config_parse_bool("maybe"), -1);
    kv_config c;
    config_init(&c);
    char why[300];
    assert_int_equal(config_set(&c, CFG_N_CTX, "4", CFG_SRC_CLI, "-c", why, sizeof why), -1);
    assert_non_null(strstr(why, "from 8"));
    assert_int_equal(config_set(&c, CFG_SEED, "18446744073709551615", CFG_SRC_CLI, "", why, sizeof why), -1);
    assert_int_equal(config_set(&c, CFG_CHAT_TEMPLATE, "chatml", CFG_SRC_FILE, "", why, sizeof why), 0);
    assert_int_equal(config_set(&c, CFG_CHAT_TEMPLATE, "nope", CFG_SRC_FILE, "", why, sizeof why), -1);
    assert_int_equal(config_key_from_name("Repeat-Penalty"), CFG_REPEAT_PENALTY);
    assert_int_equal(config_key_from_name("nope"), -1);
    config_free(&c);
}

static void test_models_resolve(void **st)
{
    (void)st;
    char data[400], dir[500], out[1024];
    snprintf(data, sizeof data, "%s/data", tu_tmpdir());
    snprintf(dir, sizeof dir, "%s/kvchat/models", data);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && : > '%s/tiny.gguf'", dir, dir);
    assert_int_equal(system(cmd), 0);
    setenv("XDG_DATA_HOME", data, 1);
    assert_int_equal(models_dir(out, sizeof out), 0);
    assert_string_equal(out, dir);
    assert_int_equal(models_resolve("tiny", out, sizeof out), 1);
    assert_non_null(strstr(out, "/kvchat/models/tiny.gguf"));
    assert_int_equal(models_resolve("tiny.gguf", out, sizeof out), 1);
    assert_int_equal(models_resolve("./no/such.gguf", out, sizeof out), 0);
    assert_string_equal(out, "./no/such.gguf");
    assert_int_equal(models_resolve("absent", out, sizeof out), -1);
    assert_non_null(strstr(out, "no model 'absent'"));
    unsetenv("XDG_DATA_HOME");
}

/* One table of ranges (issue 16 #8): what the command line, config.ini and /set accept, and how
 * the sliders show it, all come from config_key_range / config_check. */
static void test_range_table(void **state)
{
    (void)state;
    char out[64], why[200];
    assert_int_equal(config_check(CFG_TEMP, "5", out, sizeof out, why, sizeof why), -1);
    assert_string_equal(why, "'5' is not a number from 0 to 2");
    assert_int_equal(config_check(CFG_TEMP, " 0.70 ", out, sizeof out, why, sizeof why), 0);
    assert_string_equal(out, "0.7");
    assert_int_equal(config_check(CFG_REPEAT_LAST_N, "-1", out, sizeof out, why, sizeof why), 0);
    assert_string_equal(out, "-1");
    assert_int_equal(config_check(CFG_REPEAT_LAST_N, "-2", out, sizeof out, why, sizeof why), -1);
    assert_int_equal(config_check(CFG_TOP_K, "1.5", out, sizeof out, why, sizeof why), -1);
    assert_int_equal(config_check(CFG_N_CTX, "auto", out, sizeof out, why, sizeof why), 0);
    assert_int_equal(config_check(-1, "1", out, sizeof out, why, sizeof why), -1);
    cfg_range r;
    assert_int_equal(config_key_range(CFG_TEMP, &r), 0);
    assert_true(r.lo == 0 && r.hi == 2 && r.ui_lo == 0 && r.ui_hi == 2 && !r.integer);
    assert_int_equal(config_key_range(CFG_N_PREDICT, &r), 0);
    assert_true(r.log && r.off_value == -1 && r.integer);
    assert_string_equal(r.off_label, "∞");
    assert_int_equal(config_key_range(CFG_SEED, &r), -1);
    assert_int_equal(config_key_range(CFG_MODEL, &r), -1);
    config_range_text(CFG_TOP_K, out, sizeof out);
    assert_string_equal(out, "0-1000000, 0 off");
    config_range_text(CFG_N_PREDICT, out, sizeof out);
    assert_string_equal(out, "-1-N, -1 no limit");
    /* config_apply_key is config_apply for one key */
    sampler_params sp;
    sampler_params_default(&sp);
    int n_predict = 0;
    config_apply_key(CFG_TEMP, "1.25", NULL, &sp, &n_predict);
    config_apply_key(CFG_N_PREDICT, "300", NULL, &sp, &n_predict);
    assert_true(sp.temperature == 1.25f);
    assert_int_equal(n_predict, 300);
    assert_string_equal(config_key_option(CFG_N_CTX), "ctx-size");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_file_values_and_warnings),
        cmocka_unit_test(test_long_line),
        cmocka_unit_test(test_remote_section),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_parsers),
        cmocka_unit_test(test_models_resolve),
        cmocka_unit_test(test_range_table),
        cmocka_unit_test(test_personas),
    };
    return cmocka_run_group_tests(tests, setup, tu_tmpdir_teardown);
}
