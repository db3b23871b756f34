/* serve_store: `kvchat serve --store [DB]` — each finished request saved as a conversation in the chat's SQLite database (app/chatstore.h), so `kvchat list`, export and the chat's F3 show it. */
#include "app/serve_store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/chatstore.h"

struct serve_store {
    chatstore *cs;
    pthread_mutex_t mu; /* chatstore's handle is one thread's at a time */
};

serve_store *serve_store_open(engine *e, const char *db_path, char *why, size_t why_cap)
{
    serve_store *ss = calloc(1, sizeof *ss);
    if (!ss) {
        snprintf(why, why_cap, "out of memory");
        return NULL;
    }
    if (!(ss->cs = chatstore_open(e, db_path, 0, why, why_cap))) {
        free(ss);
        return NULL;
    }
    pthread_mutex_init(&ss->mu, NULL);
    return ss;
}

void serve_store_close(serve_store *ss)
{
    if (!ss) return;
    chatstore_close(ss->cs);
    pthread_mutex_destroy(&ss->mu);
    free(ss);
}

const char *serve_store_path(const serve_store *ss) { return chatstore_path(ss->cs); }

char *serve_store_capture(const cJSON *root, int chat)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, chat ? "messages" : "prompt");
    if (!chat && cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, 0);
    if (chat ? !cJSON_IsArray(v) : !cJSON_IsString(v)) return NULL;
    return cJSON_PrintUnformatted(v);
}

/* A message's content: a string, or the text parts of a list joined (as kvchat serve reads them). */
static char *content_text(const cJSON *c)
{
    if (cJSON_IsString(c)) return strdup(c->valuestring);
    if (!cJSON_IsArray(c)) return NULL;
    size_t n = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (cJSON_IsString(t)) n += strlen(t->valuestring);
    }
    char *s = malloc(n + 1);
    if (!s) return NULL;
    size_t o = 0;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (cJSON_IsString(t)) {
            size_t l = strlen(t->valuestring);
            memcpy(s + o, t->valuestring, l);
            o += l;
        }
    }
    s[o] = 0;
    return s;
}

int serve_store_save(serve_store *ss, const char *captured, const char *reply, size_t len, int finish,
                     const gen_stats *st, const sampler_params *sp, int n_predict, long long *conv_id, char *why,
                     size_t why_cap)
{
    *conv_id = 0;
    cJSON *v = captured ? cJSON_Parse(captured) : NULL;
    if (!v) {
        snprintf(why, why_cap, "nothing to store (no messages)");
        return -1;
    }
    /* the conversation: a completion's prompt is its one user message */
    cJSON *msgs = v;
    if (cJSON_IsString(v)) {
        msgs = cJSON_CreateArray();
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", v->valuestring);
        cJSON_AddItemToArray(msgs, m);
        cJSON_Delete(v);
        v = msgs;
    }
    char *system = NULL;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) { /* the system messages, joined: the conversation's system prompt */
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role) || (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "developer"))) continue;
        char *t = content_text(cJSON_GetObjectItemCaseSensitive(m, "content"));
        if (!t) continue;
        if (!system) system = t;
        else {
            char *j = malloc(strlen(system) + strlen(t) + 2);
            if (j) sprintf(j, "%s\n%s", system, t), free(system), system = j;
            free(t);
        }
    }
    pthread_mutex_lock(&ss->mu);
    chatstore_new(ss->cs);
    int64_t parent = 0, id = 0, last_user = 0;
    int rc = 0;
    gen_stats none;
    memset(&none, 0, sizeof none);
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) continue;
        int user = !strcmp(role->valuestring, "user"), asst = !strcmp(role->valuestring, "assistant");
        if (!user && !asst) continue;
        char *t = content_text(cJSON_GetObjectItemCaseSensitive(m, "content"));
        if (!t) continue;
        rc = user ? chatstore_user_message(ss->cs, parent, t, strlen(t), system, sp, n_predict, &id, why, why_cap)
                  : chatstore_reply(ss->cs, parent, 0, 0, t, strlen(t), GEN_FINISH_EOG, &none, sp, n_predict, sp->seed,
                                    NULL, 0, &id, why, why_cap);
        free(t);
        if (rc) break;
        parent = id;
        last_user = user ? id : 0;
    }
    if (!rc && !parent) {
        snprintf(why, why_cap, "nothing to store (no user or assistant message)");
        rc = -1;
    }
    if (!rc)
        rc = chatstore_reply(ss->cs, parent, 0, last_user, reply ? reply : "", reply ? len : 0, finish, st, sp, n_predict,
                             sp->seed, NULL, 0, &id, why, why_cap);
    if (!rc) *conv_id = (long long)chatstore_current(ss->cs);
    chatstore_new(ss->cs);
    pthread_mutex_unlock(&ss->mu);
    free(system);
    cJSON_Delete(v);
    return rc;
}
