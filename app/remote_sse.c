/* remote_sse: the pure part of the remote chat client — Server-Sent Events framing (text/event-stream), the OpenAI chat.completion.chunk JSON inside each event, error bodies, and the request body; no I/O, so unit tests and a fuzzer drive it. */
#include "app/remote_sse.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/gen_stats.h"

/* ---- SSE framing ---------------------------------------------------------------------------- */

static int grow(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    if (need > SSE_MAX_EVENT + 2) return -1;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *nb = realloc(*buf, c);
    if (!nb) return -1;
    *buf = nb;
    *cap = c;
    return 0;
}

/* One complete line (without its end): a field, a comment, or the blank line that dispatches. */
static int sse_line(sse_parser *p, sse_event_fn on_event, void *ud)
{
    const char *l = p->line ? p->line : "";
    size_t n = p->len;
    p->len = 0;
    if (n == 0) { /* dispatch */
        if (!p->have_data) return 0;
        int rc = 0;
        if (grow(&p->data, &p->dcap, p->dlen + 1)) return -1;
        p->data[p->dlen] = 0;
        if (p->dlen) rc = on_event(ud, p->data, p->dlen);
        p->dlen = 0;
        p->have_data = 0;
        return rc;
    }
    if (l[0] == ':') return 0; /* a comment (keep-alives) */
    const char *colon = memchr(l, ':', n);
    size_t fl = colon ? (size_t)(colon - l) : n;
    if (fl != 4 || memcmp(l, "data", 4)) return 0; /* event, id, retry, unknown fields */
    const char *v = colon ? colon + 1 : l + n;
    size_t vl = (size_t)(l + n - v);
    if (vl && *v == ' ') v++, vl--;
    size_t need = p->dlen + (p->have_data ? 1 : 0) + vl + 1;
    if (need > SSE_MAX_EVENT || grow(&p->data, &p->dcap, need)) return -1;
    if (p->have_data) p->data[p->dlen++] = '\n';
    memcpy(p->data + p->dlen, v, vl);
    p->dlen += vl;
    p->have_data = 1;
    return 0;
}

int sse_feed(sse_parser *p, const char *buf, size_t n, sse_event_fn on_event, void *ud)
{
    for (size_t i = 0; i < n; i++) {
        char ch = buf[i];
        if (ch == '\n' && p->last_cr) { /* the LF of a CRLF */
            p->last_cr = 0;
            continue;
        }
        p->last_cr = ch == '\r';
        if (ch == '\r' || ch == '\n') {
            int rc = sse_line(p, on_event, ud);
            if (rc) return rc;
            continue;
        }
        if (p->len >= SSE_MAX_EVENT || grow(&p->line, &p->cap, p->len + 1)) return -1;
        p->line[p->len++] = ch;
    }
    return 0;
}

int sse_finish(sse_parser *p, sse_event_fn on_event, void *ud)
{
    int rc = 0;
    if (p->len) rc = sse_line(p, on_event, ud); /* a last line without its end */
    if (!rc && p->have_data) rc = sse_line(p, on_event, ud); /* p->len is 0: dispatch */
    return rc;
}

void sse_free(sse_parser *p)
{
    free(p->line);
    free(p->data);
    memset(p, 0, sizeof *p);
}

/* ---- chunks ------------------------------------------------------------------------------------ */

static int num_field(const cJSON *o, const char *name, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > INT32_MAX) return 0;
    *out = (int)v->valuedouble;
    return 1;
}

static double dbl_field(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* The message of an "error" value: an object's message (type) or a string. 0, or -1. */
static int error_text(const cJSON *e, char *buf, size_t cap)
{
    if (cJSON_IsString(e)) {
        snprintf(buf, cap, "%s", e->valuestring);
        return 0;
    }
    if (!cJSON_IsObject(e)) return -1;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "type");
    const char *ms = cJSON_IsString(m) ? m->valuestring : "(no message)";
    if (cJSON_IsString(t) && *t->valuestring) snprintf(buf, cap, "%s (%s)", ms, t->valuestring);
    else snprintf(buf, cap, "%s", ms);
    return 0;
}

int remote_parse_chunk(const char *data, size_t len, remote_chunk *out, char *why, size_t why_cap)
{
    memset(out, 0, sizeof *out);
    size_t a = 0;
    while (a < len && (data[a] == ' ' || data[a] == '\t')) a++;
    if (len - a == 6 && !memcmp(data + a, "[DONE]", 6)) {
        out->done = 1;
        return 0;
    }
    cJSON *root = cJSON_ParseWithLength(data, len);
    if (!root || !cJSON_IsObject(root)) {
        char shown[64];
        size_t k = 0;
        for (size_t i = 0; i < len && k < sizeof shown - 4; i++)
            shown[k++] = (unsigned char)data[i] >= 0x20 && (unsigned char)data[i] < 0x7f ? data[i] : '?';
        if (len > k) shown[k++] = '.', shown[k++] = '.', shown[k++] = '.';
        shown[k] = 0;
        snprintf(why, why_cap, "an event's data is %s: '%s'", root ? "JSON but not an object" : "not JSON", shown);
        cJSON_Delete(root);
        return -1;
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(root, "error");
    if (err && !cJSON_IsNull(err) && error_text(err, out->error, sizeof out->error))
        snprintf(out->error, sizeof out->error, "the server sent an error it did not describe");
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (cJSON_IsString(mo)) snprintf(out->model, sizeof out->model, "%s", mo->valuestring);
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
    const cJSON *c0 = cJSON_IsArray(choices) ? cJSON_GetArrayItem(choices, 0) : NULL;
    if (cJSON_IsObject(c0)) {
        const cJSON *delta = cJSON_GetObjectItemCaseSensitive(c0, "delta");
        const cJSON *content = cJSON_IsObject(delta) ? cJSON_GetObjectItemCaseSensitive(delta, "content") : NULL;
        if (cJSON_IsString(content) && *content->valuestring) {
            out->len = strlen(content->valuestring);
            if (!(out->text = malloc(out->len + 1))) {
                cJSON_Delete(root);
                snprintf(why, why_cap, "out of memory");
                return -1;
            }
            memcpy(out->text, content->valuestring, out->len + 1);
        }
        const cJSON *fr = cJSON_GetObjectItemCaseSensitive(c0, "finish_reason");
        if (cJSON_IsString(fr)) out->finish = !strcmp(fr->valuestring, "length") ? GEN_FINISH_LENGTH : GEN_FINISH_EOG;
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(root, "usage");
    if (cJSON_IsObject(usage)) {
        out->have_usage = num_field(usage, "prompt_tokens", &out->prompt_tokens) |
                          num_field(usage, "completion_tokens", &out->completion_tokens);
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details");
        if (cJSON_IsObject(d)) num_field(d, "cached_tokens", &out->cached_tokens);
    }
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(root, "timings");
    if (cJSON_IsObject(tm)) {
        out->have_timings = 1;
        out->prompt_ms = dbl_field(tm, "prompt_ms");
        out->prompt_per_second = dbl_field(tm, "prompt_per_second");
        out->predicted_ms = dbl_field(tm, "predicted_ms");
        out->predicted_per_second = dbl_field(tm, "predicted_per_second");
        if (!out->cached_tokens) num_field(tm, "cache_n", &out->cached_tokens);
    }
    cJSON_Delete(root);
    return 0;
}

void remote_chunk_free(remote_chunk *c)
{
    free(c->text);
    c->text = NULL;
    c->len = 0;
}

int remote_error_message(const char *body, size_t len, char *buf, size_t cap)
{
    if (!cap) return -1;
    buf[0] = 0;
    cJSON *root = body && len ? cJSON_ParseWithLength(body, len) : NULL;
    int rc = -1;
    if (cJSON_IsObject(root)) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "message");
        if (e && !error_text(e, buf, cap)) rc = 0;
        else if (cJSON_IsString(m)) snprintf(buf, cap, "%s", m->valuestring), rc = 0;
        else if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(root, "detail"))) /* FastAPI's default */
            snprintf(buf, cap, "%s", cJSON_GetObjectItemCaseSensitive(root, "detail")->valuestring), rc = 0;
    }
    cJSON_Delete(root);
    if (rc) { /* the body's start, printable */
        size_t k = 0;
        for (size_t i = 0; body && i < len && k + 4 < cap && k < 200; i++) {
            unsigned char ch = (unsigned char)body[i];
            buf[k++] = ch == '\n' || ch == '\r' || ch == '\t' ? ' ' : ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
        }
        if (body && len > k && k + 4 <= cap) buf[k++] = '.', buf[k++] = '.', buf[k++] = '.';
        buf[k] = 0;
    }
    return rc;
}

/* ---- the request ---------------------------------------------------------------------------------- */

/* A float setting as the user set it (0.7, not 0.699999988): 4 decimals, as the sliders' finest step. */
static double r4(float v) { return round((double)v * 1e4) / 1e4; }

char *remote_request_json(const char *model_name, const prompt_msg *msgs, size_t n, const sampler_params *sp,
                          int max_tokens, const char *const *stops, int n_stops)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (model_name && *model_name) cJSON_AddStringToObject(o, "model", model_name);
    cJSON *arr = cJSON_AddArrayToObject(o, "messages");
    for (size_t i = 0; arr && i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        char *text = malloc(msgs[i].len + 1);
        if (!m || !text) {
            cJSON_Delete(m);
            free(text);
            cJSON_Delete(o);
            return NULL;
        }
        memcpy(text, msgs[i].text, msgs[i].len);
        text[msgs[i].len] = 0; /* a message never holds a NUL: the chat's text is C strings */
        cJSON_AddStringToObject(m, "role", msgs[i].role);
        cJSON_AddStringToObject(m, "content", text);
        free(text);
        cJSON_AddItemToArray(arr, m);
    }
    cJSON_AddBoolToObject(o, "stream", 1);
    cJSON *so = cJSON_AddObjectToObject(o, "stream_options");
    if (so) cJSON_AddBoolToObject(so, "include_usage", 1);
    cJSON_AddNumberToObject(o, "temperature", r4(sp->temperature));
    cJSON_AddNumberToObject(o, "top_p", r4(sp->top_p));
    if (sp->top_k > 0) cJSON_AddNumberToObject(o, "top_k", sp->top_k);
    if (sp->min_p > 0) cJSON_AddNumberToObject(o, "min_p", r4(sp->min_p));
    if (sp->repeat_penalty != 1.0f) {
        cJSON_AddNumberToObject(o, "repeat_penalty", r4(sp->repeat_penalty));
        cJSON_AddNumberToObject(o, "repeat_last_n", sp->repeat_last_n);
    }
    if (sp->presence_penalty != 0) cJSON_AddNumberToObject(o, "presence_penalty", r4(sp->presence_penalty));
    if (sp->frequency_penalty != 0) cJSON_AddNumberToObject(o, "frequency_penalty", r4(sp->frequency_penalty));
    if (sp->seed != SAMPLER_SEED_RANDOM) { /* exact: a double holds only 53 bits */
        char seed[32];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)sp->seed);
        cJSON_AddRawToObject(o, "seed", seed);
    }
    if (max_tokens > 0) cJSON_AddNumberToObject(o, "max_tokens", max_tokens);
    if (n_stops > 0) {
        cJSON *st = cJSON_AddArrayToObject(o, "stop");
        for (int i = 0; st && i < n_stops; i++) cJSON_AddItemToArray(st, cJSON_CreateString(stops[i]));
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
