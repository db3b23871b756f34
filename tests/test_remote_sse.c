/* test_remote_sse: the remote client's pure parts (app/remote_sse.c) — SSE framing split at every byte, chunk JSON as kvchat serve / llama-server / OpenAI send it, error bodies, and the request body read back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "app/remote_sse.h"
#include "engine/gen_stats.h"

typedef struct events {
    char buf[8][256];
    int n;
    int stop_at; /* return 1 from this event on (-1: never) */
} events;

static int on_ev(void *ud, const char *data, size_t len)
{
    events *e = ud;
    assert_int_equal(data[len], 0);
    assert_int_equal(strlen(data), len);
    if (e->n < 8) snprintf(e->buf[e->n], sizeof e->buf[0], "%s", data);
    e->n++;
    return e->stop_at >= 0 && e->n > e->stop_at;
}

/* Feeds text in pieces of step bytes (0: all at once), then finishes. */
static int feed(const char *text, size_t step, events *e)
{
    sse_parser p = {0};
    size_t n = strlen(text);
    int rc = 0;
    if (!step) step = n ? n : 1;
    for (size_t i = 0; i < n && !rc; i += step) rc = sse_feed(&p, text + i, n - i < step ? n - i : step, on_ev, e);
    if (!rc) rc = sse_finish(&p, on_ev, e);
    sse_free(&p);
    return rc;
}

static void test_sse_framing_any_split(void **state)
{
    (void)state;
    /* LF, CRLF and CR line ends; a comment; id/event fields; a two-line data; "data:" without a
     * space; an event with no data; a last event without its blank line */
    const char *s = ": keep-alive\n\n"
                    "data: {\"a\":1}\n\n"
                    "id: 7\r\nevent: message\r\ndata: line one\r\ndata:line two\r\n\r\n"
                    "retry: 10\r\r"
                    "data: [DONE]";
    for (size_t step = 0; step <= 9; step++) {
        events e = {.stop_at = -1};
        assert_int_equal(feed(s, step, &e), 0);
        assert_int_equal(e.n, 3);
        assert_string_equal(e.buf[0], "{\"a\":1}");
        assert_string_equal(e.buf[1], "line one\nline two");
        assert_string_equal(e.buf[2], "[DONE]");
    }
}

static void test_sse_stop_and_limits(void **state)
{
    (void)state;
    events e = {.stop_at = 1};
    assert_int_equal(feed("data: 1\n\ndata: 2\n\ndata: 3\n\n", 1, &e), 1); /* the callback's value, at once */
    assert_int_equal(e.n, 2);
    /* a line longer than SSE_MAX_EVENT is refused, not buffered without end */
    size_t big = SSE_MAX_EVENT + 16;
    char *s = malloc(big + 1);
    assert_non_null(s);
    memcpy(s, "data: ", 6);
    memset(s + 6, 'x', big - 6);
    s[big] = 0;
    events e2 = {.stop_at = -1};
    assert_int_equal(feed(s, 65536, &e2), -1);
    assert_int_equal(e2.n, 0);
    free(s);
    /* an empty data field dispatches nothing (the standard: empty data, no event) */
    events e3 = {.stop_at = -1};
    assert_int_equal(feed("data:\n\n\n\n", 0, &e3), 0);
    assert_int_equal(e3.n, 0);
}

static void test_chunk_content_finish_usage(void **state)
{
    (void)state;
    char why[300];
    remote_chunk c;
    const char *d = "{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"model\":\"stories260K\","
                    "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Once \\u00e9\"},\"finish_reason\":null}]}";
    assert_int_equal(remote_parse_chunk(d, strlen(d), &c, why, sizeof why), 0);
    assert_string_equal(c.text, "Once \xc3\xa9");
    assert_int_equal(c.len, 7);
    assert_int_equal(c.finish, GEN_FINISH_NONE);
    assert_string_equal(c.model, "stories260K");
    assert_int_equal(c.have_usage, 0);
    remote_chunk_free(&c);

    d = "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}";
    assert_int_equal(remote_parse_chunk(d, strlen(d), &c, why, sizeof why), 0);
    assert_null(c.text);
    assert_int_equal(c.finish, GEN_FINISH_LENGTH);
    d = "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}";
    assert_int_equal(remote_parse_chunk(d, strlen(d), &c, why, sizeof why), 0);
    assert_int_equal(c.finish, GEN_FINISH_EOG);

    /* the usage chunk: choices [] (OpenAI), cached tokens in prompt_tokens_details */
    d = "{\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":30,\"total_tokens\":42,"
        "\"prompt_tokens_details\":{\"cached_tokens\":8}}}";
    assert_int_equal(remote_parse_chunk(d, strlen(d), &c, why, sizeof why), 0);
    assert_int_equal(c.have_usage, 1);
    assert_int_equal(c.prompt_tokens, 12);
    assert_int_equal(c.completion_tokens, 30);
    assert_int_equal(c.cached_tokens, 8);

    /* llama-server's timings (and its cache_n when usage has no details) */
    d = "{\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"delta\":{}}],\"usage\":{\"completion_tokens\":5,"
        "\"prompt_tokens\":9,\"total_tokens\":14},\"timings\":{\"cache_n\":3,\"prompt_n\":6,\"prompt_ms\":1.5,"
        "\"prompt_per_second\":4000.0,\"predicted_n\":5,\"predicted_ms\":2.0,\"predicted_per_second\":2500.0}}";
    assert_int_equal(remote_parse_chunk(d, strlen(d), &c, why, sizeof why), 0);
    assert_int_equal(c.have_timings, 1);
    assert_int_equal(c.cached_tokens, 3);
    assert_true(c.prompt_per_second == 4000.0 && c.predicted_per_second == 2500.0 && c.prompt_ms == 1.5);
    assert_int_equal(c.finish, GEN_FINISH_EOG);

    assert_int_equal(remote_parse_chunk("[DONE]", 6, &c, why, sizeof why), 0);
    assert_int_equal(c.done, 1);
}

static void test_chunk_errors(void **state)
{
    (void)state;
    char why[300];
    remote_chunk c;
    const char *d = "{\"error\":{\"message\":\"the prompt is too long\",\"type\":\"invalid_request_error\"}}";
    assert_int_equal(remote_parse_chunk(d, strlen(d), &c, why, sizeof why), 0);
    assert_string_equal(c.error, "the prompt is too long (invalid_request_error)");
    assert_int_equal(remote_parse_chunk("{\"choices\": [", 13, &c, why, sizeof why), -1);
    assert_non_null(strstr(why, "not JSON"));
    assert_non_null(strstr(why, "{\"choices\": ["));
    assert_int_equal(remote_parse_chunk("[1,2]", 5, &c, why, sizeof why), -1);
    assert_non_null(strstr(why, "not an object"));
    /* wrong types are ignored, never trusted: content a number, usage a string */
    d = "{\"choices\":[{\"delta\":{\"content\":5},\"finish_reason\":7}],\"usage\":\"x\"}";
    assert_int_equal(remote_parse_chunk(d, strlen(d), &c, why, sizeof why), 0);
    assert_null(c.text);
    assert_int_equal(c.finish, GEN_FINISH_NONE);
    assert_int_equal(c.have_usage, 0);
}

static void test_error_bodies(void **state)
{
    (void)state;
    char m[300];
    const char *b = "{\"error\":{\"message\":\"Invalid API Key\",\"type\":\"authentication_error\",\"code\":401}}";
    assert_int_equal(remote_error_message(b, strlen(b), m, sizeof m), 0);
    assert_string_equal(m, "Invalid API Key (authentication_error)");
    b = "{\"object\":\"error\",\"message\":\"The model `x` does not exist.\",\"type\":\"NotFoundError\",\"code\":404}";
    assert_int_equal(remote_error_message(b, strlen(b), m, sizeof m), 0);
    assert_string_equal(m, "The model `x` does not exist.");
    b = "{\"error\":\"model 'llama9' not found\"}"; /* ollama */
    assert_int_equal(remote_error_message(b, strlen(b), m, sizeof m), 0);
    assert_string_equal(m, "model 'llama9' not found");
    b = "<html>\n<b>502 Bad Gateway</b>\x1b[31m</html>";
    assert_int_equal(remote_error_message(b, strlen(b), m, sizeof m), -1);
    assert_string_equal(m, "<html> <b>502 Bad Gateway</b>?[31m</html>");
    assert_int_equal(remote_error_message(NULL, 0, m, sizeof m), -1);
    assert_string_equal(m, "");
}

static void test_request_body(void **state)
{
    (void)state;
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0.7f;
    sp.top_k = 0;         /* off: not sent */
    sp.min_p = 0.05f;
    sp.repeat_penalty = 1.0f;
    sp.seed = 18446744073709551614ull; /* exact, beyond a double's 53 bits */
    prompt_msg msgs[] = {{"system", "be brief", 8}, {"user", "hi \"there\"\n", 11}};
    const char *stops[] = {"User:", "\n\n"};
    char *s = remote_request_json("qwen", msgs, 2, &sp, 64, stops, 2);
    assert_non_null(s);
    assert_non_null(strstr(s, "\"seed\":18446744073709551614"));
    cJSON *o = cJSON_Parse(s);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "model")->valuestring, "qwen");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "stream")));
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "stream_options"), "include_usage")));
    assert_true(cJSON_GetObjectItem(o, "temperature")->valuedouble == 0.7);
    assert_true(cJSON_GetObjectItem(o, "min_p")->valuedouble == 0.05);
    assert_null(cJSON_GetObjectItem(o, "top_k"));
    assert_null(cJSON_GetObjectItem(o, "repeat_penalty"));
    assert_null(cJSON_GetObjectItem(o, "presence_penalty"));
    assert_int_equal(cJSON_GetObjectItem(o, "max_tokens")->valueint, 64);
    cJSON *m = cJSON_GetObjectItem(o, "messages");
    assert_int_equal(cJSON_GetArraySize(m), 2);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 1), "content")->valuestring, "hi \"there\"\n");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "stop"), 1)->valuestring, "\n\n");
    cJSON_Delete(o);
    cJSON_free(s);
    /* no model, random seed, no limit, penalties on: model/seed/max_tokens absent, penalties present */
    sp.seed = SAMPLER_SEED_RANDOM;
    sp.top_k = 40;
    sp.repeat_penalty = 1.1f;
    sp.presence_penalty = -0.5f;
    s = remote_request_json(NULL, msgs, 1, &sp, -1, NULL, 0);
    o = cJSON_Parse(s);
    assert_null(cJSON_GetObjectItem(o, "model"));
    assert_null(cJSON_GetObjectItem(o, "seed"));
    assert_null(cJSON_GetObjectItem(o, "max_tokens"));
    assert_null(cJSON_GetObjectItem(o, "stop"));
    assert_int_equal(cJSON_GetObjectItem(o, "top_k")->valueint, 40);
    assert_true(cJSON_GetObjectItem(o, "repeat_penalty")->valuedouble == 1.1);
    assert_true(cJSON_GetObjectItem(o, "presence_penalty")->valuedouble == -0.5);
    cJSON_Delete(o);
    cJSON_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_framing_any_split), cmocka_unit_test(test_sse_stop_and_limits),
        cmocka_unit_test(test_chunk_content_finish_usage), cmocka_unit_test(test_chunk_errors),
        cmocka_unit_test(test_error_bodies), cmocka_unit_test(test_request_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
