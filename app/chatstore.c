/* chatstore: the chat's conversations in the SQLite store — autosave, resume, the sessions list, /show cache, and the KV prefix store wired to the generator thread (restore before a prefill, save after a reply). */
#include "chatstore.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "app/util.h"
#include "engine/kv_cache.h"
#include "engine/kernels/quant.h"

#define N_NOTES 4

typedef struct kv_stats_session {
    uint64_t lookups, hits, restored_tokens, saves, saved_bytes, skipped, evicted, failures;
    uint64_t deltas, rebased;   /* saved as deltas over a shared prefix; others re-stored so */
    double restore_ms;
} kv_stats_session;

#define N_CONV_UNKNOWN ((size_t)-1)

struct chatstore {
    engine *e;
    store *db;          /* UI thread */
    store *kvdb;        /* generator thread (opened by the first hook call) */
    int kv_open_failed;
    char path[4096];
    uint64_t budget;
    char fp[33];
    int64_t model_id;
    char kv_type[16];
    /* the current conversation (UI thread) */
    int64_t conv;
    size_t last_n_conv;      /* conversation tokens after the previous reply; N_CONV_UNKNOWN
                                after the head moved (a branch): the next user message's token
                                count is then not known (stored as 0) */
    int64_t last_reply;      /* that reply's id and tokens (a continued reply adds to them) */
    int last_reply_tokens;
    /* shared with the generator thread */
    pthread_mutex_t mu;
    kv_stats_session st;
    char notes[N_NOTES][640];
    int n_notes;
    int announce;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- paths, sizes, fingerprint ----------------------------------------------------------------- */

static int mkdir_p(const char *dir, char *why, size_t why_cap)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0700) && errno != EEXIST) {
            util_set_why(why, why_cap, "cannot create %s: %s", tmp, strerror(errno));
            return -1;
        }
        *p = '/';
    }
    if (mkdir(tmp, 0700) && errno != EEXIST) {
        util_set_why(why, why_cap, "cannot create %s: %s", tmp, strerror(errno));
        return -1;
    }
    return 0;
}

int chatstore_db_path(const char *opt, int create_dir, char *buf, size_t cap, char *why, size_t why_cap)
{
    if (!opt || !*opt) opt = getenv("KVCHAT_DB");
    if (opt && *opt) {
        if (strlen(opt) >= cap) {
            util_set_why(why, why_cap, "the database path is too long");
            return -1;
        }
        snprintf(buf, cap, "%s", opt);
        return 0;
    }
    const char *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
    char dir[4096];
    if (xdg && *xdg == '/') snprintf(dir, sizeof dir, "%s/kvchat", xdg);
    else if (home && *home) snprintf(dir, sizeof dir, "%s/.local/share/kvchat", home);
    else {
        util_set_why(why, why_cap, "no place for the database: set HOME, XDG_DATA_HOME or KVCHAT_DB, or give --db PATH");
        return -1;
    }
    if (create_dir && mkdir_p(dir, why, why_cap)) return -1;
    if ((size_t)snprintf(buf, cap, "%s/kvchat.db", dir) >= cap) {
        util_set_why(why, why_cap, "the database path is too long");
        return -1;
    }
    return 0;
}

int chatstore_parse_cache_size(const char *s, uint64_t *bytes)
{
    if (!s || !isdigit((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return -1;
    while (*end == ' ') end++;
    unsigned long long mul = 1ull << 20; /* a bare number is MiB */
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'B': mul = 1; end++; break;
    case 'K': mul = 1ull << 10; end++; break;
    case 'M': mul = 1ull << 20; end++; break;
    case 'G': mul = 1ull << 30; end++; break;
    case 'T': mul = 1ull << 40; end++; break;
    default: return -1;
    }
    if (mul > 1 && *end && (!strcasecmp(end, "iB") || !strcasecmp(end, "B"))) end += strlen(end);
    if (*end || v > UINT64_MAX / mul) return -1;
    *bytes = v * mul;
    return 0;
}

void chatstore_fingerprint(const engine *e, char out[33])
{
    const gguf_file *g = engine_model(e)->gguf;
    uint64_t sums[64] = {0};
    uint64_t start = g->data_offset < g->size ? g->data_offset : g->size, len = g->size - start;
    size_t piece = len < 4096 ? (size_t)len : 4096;
    for (int i = 0; i < 64 && piece; i++) {
        uint64_t off = start + (len - piece) * (uint64_t)i / 63;
        sums[i] = kv_checksum64(g->map + off, piece);
    }
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)engine_model_fingerprint(e),
             (unsigned long long)kv_checksum64(sums, sizeof sums));
}

/* ---- open / close ---------------------------------------------------------------------------------- */

/* A chatstore on the database at db_path, opened (NULL with why: out of memory, or SQLite's
 * reason); the caller fills in the model it serves. */
static chatstore *store_for(const char *db_path, char *why, size_t why_cap)
{
    chatstore *cs = calloc(1, sizeof *cs);
    if (!cs) {
        util_set_why(why, why_cap, "out of memory");
        return NULL;
    }
    snprintf(cs->path, sizeof cs->path, "%s", db_path);
    pthread_mutex_init(&cs->mu, NULL);
    store_error err = {0};
    if (store_open(db_path, 0, &cs->db, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        chatstore_close(cs);
        return NULL;
    }
    return cs;
}

chatstore *chatstore_open(engine *e, const char *db_path, uint64_t cache_bytes, char *why, size_t why_cap)
{
    chatstore *cs = store_for(db_path, why, why_cap);
    if (!cs) return NULL;
    cs->e = e;
    cs->budget = cache_bytes;
    store_error err = {0};
    chatstore_fingerprint(e, cs->fp);
    const model *m = engine_model(e);
    const quant_traits *wt = quant_traits_of(m->weight_type);
    if (store_model_register(cs->db, cs->fp, m->gguf->path, m->name, m->arch_name, wt ? wt->name : "", (int64_t)m->gguf->size,
                             &cs->model_id, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        chatstore_close(cs);
        return NULL;
    }
    const quant_traits *kt = quant_traits_of(kv_cache_type(engine_kv(e)));
    snprintf(cs->kv_type, sizeof cs->kv_type, "%s", kt ? kt->name : "?");
    return cs;
}

int chatstore_switch_engine(chatstore *cs, engine *e, char *why, size_t why_cap)
{
    char fp[33];
    chatstore_fingerprint(e, fp);
    const model *m = engine_model(e);
    const quant_traits *wt = quant_traits_of(m->weight_type);
    store_error err = {0};
    int64_t model_id;
    if (store_model_register(cs->db, fp, m->gguf->path, m->name, m->arch_name, wt ? wt->name : "", (int64_t)m->gguf->size,
                             &model_id, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        return -1;
    }
    /* the generator thread's handle belongs to the old worker (gone): the new one opens its own */
    store_close(cs->kvdb);
    cs->kvdb = NULL;
    cs->kv_open_failed = 0;
    cs->e = e;
    memcpy(cs->fp, fp, sizeof fp);
    cs->model_id = model_id;
    const quant_traits *kt = quant_traits_of(kv_cache_type(engine_kv(e)));
    snprintf(cs->kv_type, sizeof cs->kv_type, "%s", kt ? kt->name : "?");
    cs->last_n_conv = N_CONV_UNKNOWN; /* the next prompt's token count is the new model's */
    cs->last_reply = 0;
    if (cs->conv && store_conv_set_model(cs->db, cs->conv, model_id, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        return -1;
    }
    return 0;
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a, 64-bit offset basis and prime (Fowler, Noll, Vo) */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

chatstore *chatstore_open_remote(const char *url, const char *model_name, const char *db_path, char *why,
                                 size_t why_cap)
{
    chatstore *cs = store_for(db_path, why, why_cap);
    if (!cs) return NULL;
    store_error err = {0};
    /* 32 hex digits like a model's; "remote" in front so no GGUF fingerprint can equal it */
    snprintf(cs->fp, sizeof cs->fp, "remote%010llx%016llx", (unsigned long long)(fnv1a64(url) & 0xffffffffffull),
             (unsigned long long)fnv1a64(model_name));
    if (store_model_register(cs->db, cs->fp, url, model_name, "remote", "", 0, &cs->model_id, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        chatstore_close(cs);
        return NULL;
    }
    snprintf(cs->kv_type, sizeof cs->kv_type, "none");
    return cs;
}

void chatstore_close(chatstore *cs)
{
    if (!cs) return;
    store_close(cs->db);
    store_close(cs->kvdb);
    pthread_mutex_destroy(&cs->mu);
    free(cs);
}

const char *chatstore_path(const chatstore *cs) { return cs->path; }
int64_t chatstore_current(const chatstore *cs) { return cs->conv; }
store *chatstore_db(chatstore *cs) { return cs ? cs->db : NULL; }

static void note(chatstore *cs, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(chatstore *cs, const char *fmt, ...)
{
    pthread_mutex_lock(&cs->mu);
    if (cs->n_notes < N_NOTES) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(cs->notes[cs->n_notes++], sizeof cs->notes[0], fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&cs->mu);
}

int chatstore_take_note(chatstore *cs, char *buf, size_t cap)
{
    pthread_mutex_lock(&cs->mu);
    int have = cs->n_notes > 0;
    if (have) {
        snprintf(buf, cap, "%s", cs->notes[0]);
        memmove(cs->notes[0], cs->notes[1], sizeof cs->notes[0] * (size_t)(cs->n_notes - 1));
        cs->n_notes--;
    }
    pthread_mutex_unlock(&cs->mu);
    return have;
}

void chatstore_announce_restore(chatstore *cs)
{
    pthread_mutex_lock(&cs->mu);
    cs->announce = 1;
    pthread_mutex_unlock(&cs->mu);
}

/* ---- KV hooks (generator thread) ----------------------------------------------------------------- */

typedef struct kv_key_buf {
    store_kv_key k;
    uint64_t *hashes;
} kv_key_buf;

/* The store key of toks[0..n): the engine's chained block hashes, the whole-key hash. */
static int make_key(chatstore *cs, const int32_t *toks, size_t n, kv_key_buf *kb)
{
    size_t nb = n / KV_BLOCK_SIZE;
    kb->hashes = malloc((nb ? nb : 1) * sizeof *kb->hashes);
    if (!kb->hashes) return -1;
    kv_block_hashes(toks, (int)n, kb->hashes);
    uint64_t h = nb ? kb->hashes[nb - 1] : KV_HASH_ROOT;
    size_t tail = n - nb * KV_BLOCK_SIZE;
    kb->k = (store_kv_key){
        .model_id = cs->model_id, .kv_type = cs->kv_type, .tokens = toks, .n_tokens = n,
        .block_size = KV_BLOCK_SIZE, .block_hashes = kb->hashes, .n_blocks = nb,
        .key_hash = tail ? kv_hash_block(h, toks + nb * KV_BLOCK_SIZE, (int)tail) : h,
    };
    return 0;
}

/* The generator thread's own connection (a cache: synchronous = NORMAL); NULL when the KV
 * store is off or cannot be opened (said once). */
static store *kv_handle(chatstore *cs)
{
    if (!cs->budget || cs->kv_open_failed) return NULL;
    if (cs->kvdb) return cs->kvdb;
    store_error err = {0};
    if (store_open(cs->path, STORE_OPEN_SYNC_NORMAL, &cs->kvdb, &err)) {
        cs->kv_open_failed = 1;
        note(cs, "KV prefix store off: %s", err.msg);
        return NULL;
    }
    const char *delay = getenv("KVCHAT_TEST_KV_WRITE_DELAY_MS"); /* test knob: widen the write window */
    if (delay && atoi(delay) > 0) {
        store_set_kv_write_delay(cs->kvdb, atoi(delay));
        store_set_kv_chunk_size(cs->kvdb, 4096);
    }
    store_kv_cleanup(cs->kvdb, NULL, NULL);
    return cs->kvdb;
}

static void count_failure(chatstore *cs)
{
    pthread_mutex_lock(&cs->mu);
    cs->st.failures++;
    pthread_mutex_unlock(&cs->mu);
}

static void hook_restore(void *ud, engine *e, const int32_t *toks, size_t n)
{
    chatstore *cs = ud;
    pthread_mutex_lock(&cs->mu);
    int announce = cs->announce;
    cs->announce = 0;
    pthread_mutex_unlock(&cs->mu);
    if (n < KV_BLOCK_SIZE) return;
    int n_have = 0;
    const int32_t *have = engine_history(e, &n_have);
    size_t common = 0;
    while (common < (size_t)n_have && common < n && have[common] == toks[common]) common++;
    if (common + KV_BLOCK_SIZE > n) return; /* the cache already holds all but a partial block */
    store *db = kv_handle(cs);
    if (!db) return;
    kv_key_buf kb;
    if (make_key(cs, toks, n, &kb)) return;
    double t0 = now_ms();
    store_kv_hit hit;
    store_error err = {0};
    int rc = store_kv_find(db, &kb.k, &hit, &err);
    free(kb.hashes);
    pthread_mutex_lock(&cs->mu);
    cs->st.lookups++;
    pthread_mutex_unlock(&cs->mu);
    if (rc) {
        if (rc != STORE_ERR_NOTFOUND) note(cs, "KV prefix store: %s", err.msg);
        else if (announce) note(cs, "no KV cache stored for this chat: the next reply prefills its history");
        return;
    }
    if (hit.n_common <= common) return;
    /* the blobs to restore, root first: a whole one, then the deltas resting on it */
    store_kv_link links[STORE_KV_MAX_CHAIN];
    int n_links = 1;
    links[0] = (store_kv_link){.id = hit.id, .n_tokens = hit.n_tokens, .n_base = 0, .size = hit.size};
    if (hit.base_id && (rc = store_kv_chain(db, hit.id, links, STORE_KV_MAX_CHAIN, &n_links, &err))) {
        if (rc == STORE_ERR_CORRUPT) {
            store_kv_drop(db, hit.id, NULL);
            note(cs, "%s — not used, dropped; the chat prefills instead", err.msg);
        } else if (rc != STORE_ERR_NOTFOUND) {
            note(cs, "KV prefix store: %s", err.msg);
        }
        count_failure(cs);
        return;
    }
    /* bases the sequence already holds (the shared system prompt of the chat before) are not
     * read again: the first delta goes on top of them */
    int first = 0;
    while (first + 1 < n_links && links[first].n_tokens <= common) first++;
    size_t bytes = 0;
    for (int i = first; i < n_links; i++) {
        void *blob = NULL;
        size_t len = 0;
        if ((rc = store_kv_read(db, links[i].id, &blob, &len, &err))) {
            if (rc == STORE_ERR_CORRUPT) {
                store_kv_drop(db, links[i].id, NULL); /* its deltas go with it */
                note(cs, "%s — not used, dropped%s; the chat prefills instead", err.msg,
                     i + 1 < n_links ? " with the deltas resting on it" : "");
            } else if (rc != STORE_ERR_NOTFOUND) {
                note(cs, "KV prefix store: %s", err.msg);
            }
            count_failure(cs);
            return; /* what was restored so far is a valid prefix: the engine keeps what matches */
        }
        kv_error ke = {0};
        rc = engine_seq_restore(e, ENGINE_SEQ_DEFAULT, blob, len, &ke);
        free(blob);
        if (rc == KV_ERR_INVALID && i == first && first > 0) {
            /* the sequence's own copy of the base does not fit (e.g. after a context shift):
             * from the root */
            first = 0;
            i = -1;
            continue;
        }
        bytes += len;
        if (rc) {
            /* the engine's own checks: checksum, format version, model fingerprint, shape, base */
            if (rc == KV_ERR_FORMAT || rc == KV_ERR_UNSUPPORTED || rc == KV_ERR_INVALID) store_kv_drop(db, links[i].id, NULL);
            note(cs, "%s: KV prefix %lld not used: %s", cs->path, (long long)links[i].id, ke.msg);
            count_failure(cs);
            return;
        }
    }
    double ms = now_ms() - t0;
    pthread_mutex_lock(&cs->mu);
    cs->st.hits++;
    cs->st.restored_tokens += hit.n_common;
    cs->st.restore_ms += ms;
    pthread_mutex_unlock(&cs->mu);
    if (announce) {
        char how[160] = "";
        if (n_links > 1)
            snprintf(how, sizeof how, "; a shared prefix of %zu tokens%s + this chat's own %zu", links[n_links - 1].n_base,
                     first ? " (already in the cache)" : "", hit.n_tokens - links[n_links - 1].n_base);
        note(cs, "restored the KV cache of %zu tokens from the store in %.1f ms (%.1f MiB%s): the next reply prefills only "
                 "the new message",
             hit.n_common, ms, bytes / 1048576.0, how);
    }
}

/* Save positions [a, n) of the default sequence under the key of toks[0..n): a whole blob (a =
 * 0, base_id 0) or a delta over base_id, the shared row holding [0, a). Returns 0, the store's
 * error code (noted, except a base gone meanwhile: the caller saves a whole blob), or -1. */
static int save_prefix(chatstore *cs, store *db, engine *e, const int32_t *toks, size_t n, size_t a, int64_t base_id,
                       int kind, store_kv_put_result *res)
{
    kv_key_buf kb;
    if (make_key(cs, toks, n, &kb)) return -1;
    int rc = 0;
    store_error err = {0};
    if (store_kv_has(db, &kb.k)) { /* unchanged since the last save: put only touches it */
        rc = store_kv_put(db, &kb.k, kind, "", 1, cs->budget, res, &err) ? -1 : 0;
        free(kb.hashes);
        return rc;
    }
    void *blob = NULL;
    size_t len = 0;
    kv_error ke = {0};
    if (engine_seq_save_range(e, ENGINE_SEQ_DEFAULT, (int)a, (int)n, &blob, &len, &ke)) {
        note(cs, "KV cache not saved: %s", ke.msg);
        free(kb.hashes);
        return -1;
    }
    if ((rc = store_kv_put_delta(db, &kb.k, kind, base_id, blob, len, cs->budget, res, &err))) {
        if (!(rc == STORE_ERR_NOTFOUND && base_id)) note(cs, "KV cache not saved: %s", err.msg);
    } else {
        pthread_mutex_lock(&cs->mu);
        if (res->stored) cs->st.saves++, cs->st.saved_bytes += len, cs->st.deltas += base_id != 0;
        if (res->skipped) cs->st.skipped++;
        cs->st.evicted += (uint64_t)res->n_evicted;
        pthread_mutex_unlock(&cs->mu);
    }
    free(blob);
    free(kb.hashes);
    return rc;
}

static int rebase_blob(void *ud, const void *blob, size_t len, size_t n_base, void **out, size_t *out_len)
{
    (void)ud;
    return kv_blob_rebase(blob, len, (int)n_base, out, out_len, NULL) == KV_OK ? 0 : -1;
}

/* After a reply: the conversation's clean prefix goes to the store, every position once — the
 * part it shares with other stored prefixes (a system prompt, a branch point) as a shared row,
 * the rest as a delta over it. */
static void hook_saved(void *ud, engine *e, const int32_t *conv, size_t n_conv, int finish)
{
    chatstore *cs = ud;
    (void)conv;
    (void)n_conv;
    (void)finish;
    store *db = kv_handle(cs);
    if (!db) return;
    kv_cache *kv = engine_kv(e);
    /* only the clean part: K/V equal to what a fresh prefill computes (no context shift) */
    int n = kv_seq_n_clean(kv, ENGINE_SEQ_DEFAULT);
    const int32_t *toks = kv_seq_tokens(kv, ENGINE_SEQ_DEFAULT);
    if (n < KV_BLOCK_SIZE || !toks) return;
    /* after a context shift the sliding-window layers may no longer hold the clean prefix's
     * window: nothing of it can be restored then */
    if (!kv_seq_window_ok(kv, ENGINE_SEQ_DEFAULT, n)) return;
    kv_key_buf kb;
    if (make_key(cs, toks, (size_t)n, &kb)) return;
    store_kv_plan_result plan = {0};
    store_error err = {0};
    if (!store_kv_has(db, &kb.k) && store_kv_plan(db, &kb.k, &plan, &err)) memset(&plan, 0, sizeof plan);
    free(kb.hashes);
    int64_t base = plan.base_id;
    size_t a = plan.n_base;
    /* (sliding-window layers may have freed the window of the shared prefix: no shared row then) */
    if (plan.shared_len > a && plan.shared_len < (size_t)n &&
        kv_seq_window_ok(kv, ENGINE_SEQ_DEFAULT, (int)plan.shared_len)) {
        /* shared with another stored prefix and not stored on its own yet: store it once (over
         * the shared prefix below it, if any), for every chat that starts with it */
        store_kv_put_result r2 = {0};
        if (!save_prefix(cs, db, e, toks, plan.shared_len, a, base, STORE_KV_SHARED, &r2) && r2.id && !r2.skipped) {
            base = r2.id;
            a = plan.shared_len;
        }
    }
    store_kv_put_result res = {0};
    int rc = save_prefix(cs, db, e, toks, (size_t)n, a, base, STORE_KV_SNAPSHOT, &res);
    if (rc == STORE_ERR_NOTFOUND && base) { /* the base was evicted meanwhile: a whole blob then */
        memset(&res, 0, sizeof res);
        base = 0;
        rc = save_prefix(cs, db, e, toks, (size_t)n, 0, 0, STORE_KV_SNAPSHOT, &res);
    }
    if (!rc && base) {
        /* prefixes stored before the shared one existed (the chat this one diverged from) keep
         * their copy of it: re-store them as deltas over it */
        int n_rebased = 0;
        store_kv_rebase(db, base, 8, rebase_blob, NULL, &n_rebased, NULL);
        pthread_mutex_lock(&cs->mu);
        cs->st.rebased += (uint64_t)n_rebased;
        pthread_mutex_unlock(&cs->mu);
    }
}

void chatstore_worker_hooks(chatstore *cs, worker_hooks *h)
{
    memset(h, 0, sizeof *h);
    if (!cs || !cs->budget) return;
    h->restore = hook_restore;
    h->saved = hook_saved;
    h->ud = cs;
}

/* ---- conversions ------------------------------------------------------------------------------ */

void chatstore_params_from(store_params *out, const sampler_params *sp, int max_tokens)
{
    memset(out, 0, sizeof *out);
    out->set = 1;
    out->temperature = sp->temperature;
    out->top_k = sp->top_k;
    out->top_p = sp->top_p;
    out->min_p = sp->min_p;
    out->repeat_penalty = sp->repeat_penalty;
    out->repeat_last_n = sp->repeat_last_n;
    out->presence_penalty = sp->presence_penalty;
    out->frequency_penalty = sp->frequency_penalty;
    out->seed_set = sp->seed != SAMPLER_SEED_RANDOM;
    out->seed = out->seed_set ? sp->seed : 0;
    out->max_tokens = max_tokens;
}

void chatstore_params_to(const store_params *in, sampler_params *sp, int *max_tokens)
{
    sp->temperature = (float)in->temperature;
    sp->top_k = in->top_k;
    sp->top_p = (float)in->top_p;
    sp->min_p = (float)in->min_p;
    sp->repeat_penalty = (float)in->repeat_penalty;
    sp->repeat_last_n = in->repeat_last_n;
    sp->presence_penalty = (float)in->presence_penalty;
    sp->frequency_penalty = (float)in->frequency_penalty;
    sp->seed = in->seed_set ? in->seed : SAMPLER_SEED_RANDOM;
    if (max_tokens) *max_tokens = in->max_tokens;
}

int chatstore_finish_of(int gen_finish)
{
    switch (gen_finish) {
    case GEN_FINISH_EOG: return STORE_FINISH_EOG;
    case GEN_FINISH_LENGTH: return STORE_FINISH_LENGTH;
    case GEN_FINISH_CONTEXT: return STORE_FINISH_CONTEXT;
    case GEN_FINISH_CANCELLED: return STORE_FINISH_STOPPED;
    case GEN_FINISH_ERROR: return STORE_FINISH_ERROR;
    case GEN_FINISH_STOP: return STORE_FINISH_STOP;
    default: return STORE_FINISH_EOG;
    }
}

/* ---- the current conversation (UI thread) ------------------------------------------------------ */

void chatstore_new(chatstore *cs)
{
    cs->conv = 0;
    cs->last_n_conv = 0;
    cs->last_reply = 0;
    cs->last_reply_tokens = 0;
}

static int ensure_conv(chatstore *cs, const char *system, const sampler_params *sp, int max_tokens, char *why,
                       size_t why_cap)
{
    if (cs->conv) return 0;
    store_params p;
    chatstore_params_from(&p, sp, max_tokens);
    store_error err = {0};
    if (store_conv_create(cs->db, cs->model_id, system && *system ? system : NULL, &p, 0, &cs->conv, &err)) {
        util_set_why(why, why_cap, "not saved: %s", err.msg);
        cs->conv = 0;
        return -1;
    }
    return 0;
}

int chatstore_user_message(chatstore *cs, int64_t parent, const char *text, size_t len, const char *system,
                           const sampler_params *sp, int max_tokens, int64_t *id, char *why, size_t why_cap)
{
    *id = 0;
    if (ensure_conv(cs, system, sp, max_tokens, why, why_cap)) return -1;
    store_error err = {0};
    store_params p;
    chatstore_params_from(&p, sp, max_tokens);
    store_conv_set_params(cs->db, cs->conv, &p, NULL); /* the latest settings, for resuming */
    if (store_msg_add(cs->db, cs->conv, parent, STORE_ROLE_USER, text, len, 0, 0, NULL, id, &err)) {
        util_set_why(why, why_cap, "message not saved: %s", err.msg);
        return -1;
    }
    return 0;
}

int chatstore_reply(chatstore *cs, int64_t parent, int64_t existing, int64_t user_id, const char *text, size_t len,
                    int finish, const gen_stats *st, const sampler_params *sp, int max_tokens, uint64_t seed,
                    const int32_t *conv, size_t n_conv, int64_t *id, char *why, size_t why_cap)
{
    *id = existing;
    if (ensure_conv(cs, NULL, sp, max_tokens, why, why_cap)) return -1;
    store_gen g;
    memset(&g, 0, sizeof g);
    g.set = 1;
    chatstore_params_from(&g.params, sp, max_tokens);
    g.params.seed_set = 1;
    g.params.seed = seed;
    g.finish = chatstore_finish_of(finish);
    g.ttft_ms = st->ttft_ms;
    g.prefill_tps = st->prefill_tps;
    g.decode_tps = st->decode_tps;
    g.n_prompt = st->n_prompt;
    g.n_reused = st->n_reused;
    g.n_prefilled = st->n_prefilled;
    g.n_generated = st->n_generated;
    g.model_id = cs->model_id;
    store_error err = {0};
    int n_tokens = st->n_generated;
    if (existing > 0 && existing == cs->last_reply) n_tokens += cs->last_reply_tokens;
    int rc = existing > 0 ? store_msg_update(cs->db, existing, text, len, n_tokens, &g, &err)
                          : store_msg_add(cs->db, cs->conv, parent, STORE_ROLE_ASSISTANT, text, len, n_tokens, 0, &g, id,
                                          &err);
    if (rc) {
        util_set_why(why, why_cap, "reply not saved: %s", err.msg);
        return -1;
    }
    if (user_id > 0 && cs->last_n_conv != N_CONV_UNKNOWN) {
        int added = st->n_prompt - (int)cs->last_n_conv;
        store_msg_set_tokens(cs->db, user_id, added > 0 ? added : 0, NULL);
    }
    cs->last_reply = *id;
    cs->last_reply_tokens = n_tokens;
    cs->last_n_conv = n_conv;
    if (conv && n_conv && store_conv_set_context(cs->db, cs->conv, cs->model_id, *id, conv, n_conv, &err)) {
        util_set_why(why, why_cap, "token context not saved: %s", err.msg);
        return -1;
    }
    return 0;
}

int chatstore_set_head(chatstore *cs, int64_t head, char *why, size_t why_cap)
{
    if (!cs->conv) return 0;
    store_error err = {0};
    if (store_conv_set_head(cs->db, cs->conv, head, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        return -1;
    }
    cs->last_n_conv = N_CONV_UNKNOWN;
    cs->last_reply = 0;
    return 0;
}

int chatstore_set_system(chatstore *cs, const char *system, char *why, size_t why_cap)
{
    if (!cs->conv) return 0;
    store_error err = {0};
    if (store_conv_set_system(cs->db, cs->conv, system && *system ? system : NULL, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        return -1;
    }
    return 0;
}

int chatstore_resolve(chatstore *cs, const char *spec, int64_t *id, char *why, size_t why_cap)
{
    store_error err = {0};
    if (!spec || !*spec || !strcmp(spec, "last")) {
        if (store_conv_last(cs->db, id, &err)) {
            util_set_why(why, why_cap, "%s", err.msg);
            return -1;
        }
        return 0;
    }
    char *end;
    errno = 0;
    long long v = strtoll(spec, &end, 10);
    if (errno || *end || v <= 0) {
        util_set_why(why, why_cap, "'%s' is not a conversation ID (a number, or 'last')", spec);
        return -1;
    }
    store_conv c;
    if (store_conv_get(cs->db, v, &c, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        return -1;
    }
    store_conv_clear(&c);
    *id = v;
    return 0;
}

void chatstore_conv_free(chatstore_conv *c)
{
    for (size_t i = 0; i < c->n; i++) free(c->msgs[i].text);
    free(c->msgs);
    for (size_t i = 0; i < c->n_others; i++) free(c->others[i].text);
    free(c->others);
    free(c->title);
    free(c->system);
    free(c->ctx);
    memset(c, 0, sizeof *c);
}

/* A stored message as the chat shows it (its content moves to d). */
static void take_msg(chatstore_msg *d, store_msg *m)
{
    d->role = m->role;
    d->text = m->content;
    d->len = m->len;
    m->content = NULL;
    d->id = m->id;
    d->parent = m->parent_id;
    d->finish = m->gen.set ? m->gen.finish : 0;
    d->partial = m->partial;
    d->model_id = m->model_id;
    snprintf(d->problem, sizeof d->problem, "%s", m->problem);
}

void chatstore_label(const char *name, const char *arch, const char *path, char *buf, size_t cap)
{
    if (name && *name && (!arch || strcasecmp(name, arch))) {
        snprintf(buf, cap, "%s", name);
        return;
    }
    if (!path || !*path) {
        snprintf(buf, cap, "%s", name && *name ? name : "model");
        return;
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 5 && !strcasecmp(base + n - 5, ".gguf")) n -= 5;
    snprintf(buf, cap, "%.*s", (int)n, base);
}

/* Each reply's author: the label of the model that wrote it (messages.model_id), looked up once
 * per model; "" when unknown (the chat then names the conversation's model). */
static void set_authors(chatstore *cs, chatstore_msg *v, size_t n)
{
    int64_t ids[8] = {0};
    char names[8][128];
    int n_ids = 0;
    for (size_t i = 0; i < n; i++) {
        v[i].author[0] = 0;
        if (v[i].role != STORE_ROLE_ASSISTANT || v[i].model_id <= 0) continue;
        int k = 0;
        while (k < n_ids && ids[k] != v[i].model_id) k++;
        if (k == n_ids) {
            store_model sm = {0};
            if (store_model_get(cs->db, v[i].model_id, &sm, NULL) != STORE_OK) continue;
            char label[128];
            chatstore_label(sm.name, sm.arch, sm.path, label, sizeof label);
            store_model_clear(&sm);
            if (n_ids == 8) { /* more models than slots: no cache for this one */
                snprintf(v[i].author, sizeof v[i].author, "%s", label);
                continue;
            }
            ids[n_ids] = v[i].model_id;
            snprintf(names[n_ids++], sizeof names[0], "%s", label);
        }
        snprintf(v[i].author, sizeof v[i].author, "%s", names[k]);
    }
}

/* The messages of conversation id that are not on out's path (the other branches). */
static int load_others(chatstore *cs, int64_t id, chatstore_conv *out, store_error *err)
{
    store_msg *m = NULL;
    size_t n = 0;
    if (store_conv_messages(cs->db, id, &m, &n, err)) return -1;
    out->others = calloc(n ? n : 1, sizeof *out->others);
    if (!out->others) {
        store_msgs_free(m, n);
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == STORE_ROLE_SYSTEM) continue;
        /* a child's id is above its parent's, so the path is sorted by id */
        size_t lo = 0, hi = out->n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (out->msgs[mid].id < m[i].id) lo = mid + 1;
            else hi = mid;
        }
        if (lo < out->n && out->msgs[lo].id == m[i].id) continue;
        take_msg(&out->others[out->n_others++], &m[i]);
    }
    store_msgs_free(m, n);
    return 0;
}

int chatstore_load(chatstore *cs, int64_t id, chatstore_conv *out, char *why, size_t why_cap)
{
    memset(out, 0, sizeof *out);
    store_conv c;
    store_error err = {0};
    if (store_conv_get(cs->db, id, &c, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        return -1;
    }
    store_msg *m = NULL;
    size_t n = 0;
    int64_t cut = 0;
    if (store_conv_path_cut(cs->db, id, c.head_id, &m, &n, &cut, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        store_conv_clear(&c);
        return -1;
    }
    /* A damaged chain of parents (a loop, kvchat check names it): the chat shows the branch
     * back to where it breaks, and from its newest run of ascending ids only (the chat builds
     * its tree in id order, a parent before its children), so it can go on from the head. */
    size_t skip = 0;
    if (cut)
        for (size_t i = 1; i < n; i++)
            if (m[i].id < m[i - 1].id) skip = i;
    if (skip) {
        for (size_t i = 0; i < skip; i++) free(m[i].content); /* the rest moves to the front */
        memmove(m, m + skip, (n - skip) * sizeof *m);
        n -= skip;
    }
    out->id = id;
    out->title = c.title;
    c.title = NULL;
    /* another model's conversation: its name as the screen gives it (the file's name when
     * general.name says no more than "llama") */
    if (c.model_id && c.model_id != cs->model_id) {
        const char *path = c.model_path && *c.model_path ? c.model_path : NULL, *base = path ? strrchr(path, '/') : NULL;
        base = base ? base + 1 : path;
        size_t bl = base ? strlen(base) : 0;
        if (bl > 5 && !strcasecmp(base + bl - 5, ".gguf")) bl -= 5;
        store_model sm = {0};
        store_error me = {0};
        int generic = store_model_get(cs->db, c.model_id, &sm, &me) == STORE_OK && sm.arch && c.model_name &&
                      !strcasecmp(c.model_name, sm.arch);
        store_model_clear(&sm);
        if (c.model_name && *c.model_name && !generic)
            snprintf(out->model_name, sizeof out->model_name, "%s", c.model_name);
        else if (base)
            snprintf(out->model_name, sizeof out->model_name, "%.*s", (int)bl, base);
        else
            snprintf(out->model_name, sizeof out->model_name, "%s", c.model_name ? c.model_name : "another model");
    }
    out->system = c.system_prompt;
    c.system_prompt = NULL;
    out->have_params = c.params.set;
    if (c.params.set) chatstore_params_to(&c.params, &out->sp, &out->max_tokens);
    out->msgs = calloc(n ? n : 1, sizeof *out->msgs);
    size_t o = 0, bad = 0;
    char first_problem[200] = "";
    for (size_t i = 0; out->msgs && i < n; i++) {
        if (m[i].role == STORE_ROLE_SYSTEM) continue;
        take_msg(&out->msgs[o++], &m[i]);
        if (m[i].problem[0] && !bad++) snprintf(first_problem, sizeof first_problem, "%s", m[i].problem);
    }
    out->n = o;
    store_msgs_free(m, n);
    if (out->msgs && load_others(cs, id, out, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        store_conv_clear(&c);
        chatstore_conv_free(out);
        return -1;
    }
    if (!out->msgs) {
        store_conv_clear(&c);
        chatstore_conv_free(out);
        util_set_why(why, why_cap, "out of memory");
        return -1;
    }
    size_t nl = 0;
    if (c.model_id != cs->model_id && c.model_fingerprint[0])
        nl += (size_t)snprintf(out->note + nl, sizeof out->note - nl,
                               "this chat was with %s (%.16s…); it goes on with the model loaded now, whose KV cache "
                               "it cannot reuse: the next reply prefills the history. ",
                               c.model_name[0] ? c.model_name : "another model", c.model_fingerprint);
    if (bad && nl < sizeof out->note)
        nl += (size_t)snprintf(out->note + nl, sizeof out->note - nl, "%.300s: %zu message%s could not be read (%s); "
                               "shown as [unreadable], nothing was changed. ", cs->path, bad, bad > 1 ? "s" : "",
                               first_problem);
    if (cut && nl < sizeof out->note)
        nl += (size_t)snprintf(out->note + nl, sizeof out->note - nl, "%.300s: the parents of message %lld form a loop "
                               "or break (kvchat check lists it); this shows the branch from message %lld, and the chat "
                               "goes on from there. ", cs->path, (long long)cut, (long long)(n ? m[0].id : 0));
    /* the saved exact tokens, if any, must be tokens of this model: ids outside its vocabulary
     * (a damaged row, another model's context) would make every prefill fail */
    int32_t n_vocab = cs->e ? tokenizer_n_vocab(engine_tokenizer(cs->e)) : 0; /* a server: no exact tokens */
    size_t n_oov = 0;
    int32_t first_oov = 0;
    for (size_t i = 0; cs->e && c.ctx_tokens && i < c.n_ctx_tokens; i++)
        if (c.ctx_tokens[i] < 0 || c.ctx_tokens[i] >= n_vocab)
            if (!n_oov++) first_oov = c.ctx_tokens[i];
    if (n_oov && nl < sizeof out->note)
        nl += (size_t)snprintf(out->note + nl, sizeof out->note - nl, "%.300s: the saved context of conversation %lld "
                               "holds %zu token id%s outside the model's vocabulary of %d (e.g. %d); it is rebuilt from "
                               "the messages (the next reply prefills the history). ", cs->path, (long long)id, n_oov,
                               n_oov > 1 ? "s" : "", (int)n_vocab, (int)first_oov);
    if (cs->e && c.ctx_tokens && c.ctx_model_id == cs->model_id && c.ctx_head_id == c.head_id && c.head_id && !bad && !cut &&
        !n_oov) {
        out->ctx = c.ctx_tokens;
        out->n_ctx = c.n_ctx_tokens;
        c.ctx_tokens = NULL;
    }
    set_authors(cs, out->msgs, out->n);
    set_authors(cs, out->others, out->n_others);
    cs->conv = id;
    cs->last_n_conv = out->ctx ? out->n_ctx : out->n ? N_CONV_UNKNOWN : 0;
    cs->last_reply = 0;
    cs->last_reply_tokens = 0;
    store_conv_clear(&c);
    return 0;
}

/* ---- sessions ----------------------------------------------------------------------------------- */

int chatstore_list(chatstore *cs, const char *query, store_conv **rows, size_t *n, char *why, size_t why_cap)
{
    store_error err = {0};
    if (store_conv_list(cs->db, query, rows, n, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        return -1;
    }
    return 0;
}

int chatstore_rename(chatstore *cs, int64_t id, const char *title, char *why, size_t why_cap)
{
    store_error err = {0};
    if (store_conv_rename(cs->db, id, title, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        return -1;
    }
    return 0;
}

int chatstore_delete(chatstore *cs, int64_t id, char *why, size_t why_cap)
{
    store_error err = {0};
    if (store_conv_delete(cs->db, id, &err)) {
        util_set_why(why, why_cap, "%s", err.msg);
        return -1;
    }
    if (id == cs->conv) chatstore_new(cs);
    return 0;
}

void chatstore_report(chatstore *cs, char *buf, size_t cap)
{
    store_kv_stats ks;
    store_error err = {0};
    int have = store_kv_stats_get(cs->db, &ks, &err) == STORE_OK;
    pthread_mutex_lock(&cs->mu);
    kv_stats_session s = cs->st;
    pthread_mutex_unlock(&cs->mu);
    struct stat sb;
    double file_mib = stat(cs->path, &sb) == 0 ? sb.st_size / 1048576.0 : 0, wal_mib = 0;
    char wal[4200];
    snprintf(wal, sizeof wal, "%s-wal", cs->path);
    if (stat(wal, &sb) == 0) wal_mib = sb.st_size / 1048576.0; /* SQLite's write-ahead log holds the newest pages */
    size_t o = 0;
    if (!cs->budget)
        o += (size_t)snprintf(buf + o, cap - o, "KV prefix store: off (--cache-size 0)");
    else if (have)
        o += (size_t)snprintf(buf + o, cap - o,
                              "KV prefix store: %.1f MiB of %.0f MiB in %d prefixes (%d shared, %d stored as deltas over "
                              "a shared one, %d models)%s · lifetime hits %llu",
                              ks.bytes / 1048576.0, cs->budget / 1048576.0, ks.n_prefixes, ks.n_shared, ks.n_delta, ks.n_models,
                              ks.n_writing ? " + some being written" : "", (unsigned long long)ks.hits);
    else
        o += (size_t)snprintf(buf + o, cap - o, "KV prefix store: %s", err.msg);
    if (o < cap && cs->budget)
        o += (size_t)snprintf(buf + o, cap - o,
                              "\nthis session: %llu of %llu lookups hit (%.0f%%), %llu tokens restored in %.1f ms; %llu "
                              "saved (%.1f MiB; %llu as deltas, %llu older ones re-stored as deltas), %llu evicted%s%s",
                              (unsigned long long)s.hits, (unsigned long long)s.lookups,
                              s.lookups ? 100.0 * s.hits / s.lookups : 0.0, (unsigned long long)s.restored_tokens,
                              s.restore_ms, (unsigned long long)s.saves, s.saved_bytes / 1048576.0,
                              (unsigned long long)s.deltas, (unsigned long long)s.rebased,
                              (unsigned long long)s.evicted, s.skipped ? ", some larger than the budget not stored" : "",
                              s.failures ? ", some unusable prefixes dropped" : "");
    if (o < cap)
        snprintf(buf + o, cap - o, "\ndatabase: %s (%.1f MiB: %.1f MiB file + %.1f MiB write-ahead log) · model %.16s… · "
                 "KV type %s", cs->path, file_mib + wal_mib, file_mib, wal_mib, cs->fp, cs->kv_type);
}

int chatstore_open_reading(const char *path, store **s, store_error *err)
{
    int rc = store_open(path, STORE_OPEN_READONLY, s, err);
    if (rc == STORE_ERR_READONLY && access(path, W_OK) == 0) { /* an older schema: migrate, then read */
        store_error e2 = {0};
        rc = store_open(path, STORE_OPEN_NO_CREATE, s, &e2);
        if (rc) *err = e2;
    }
    return rc;
}

int chatstore_resume_model(const char *db_path, const char *spec, char *path, size_t cap, char *why, size_t why_cap)
{
    store *s = NULL;
    store_error err = {0};
    if (chatstore_open_reading(db_path, &s, &err)) {
        util_set_why(why, why_cap, "%s", err.code == STORE_ERR_IO ? "no saved conversations yet" : err.msg);
        return -1;
    }
    int64_t id = 0;
    int rc = -1;
    char *end;
    if (!spec || !strcmp(spec, "last")) {
        if (store_conv_last(s, &id, &err)) util_set_why(why, why_cap, "%s", err.msg);
    } else if ((id = strtoll(spec, &end, 10)) <= 0 || *end) {
        util_set_why(why, why_cap, "'%s' is not a conversation ID (a number, or 'last')", spec);
        id = 0;
    }
    store_conv c;
    if (id && store_conv_get(s, id, &c, &err) == STORE_OK) {
        if (!c.model_path[0])
            util_set_why(why, why_cap, "conversation %lld has no model on record: give one with -m", (long long)id);
        else if (access(c.model_path, R_OK) != 0)
            util_set_why(why, why_cap, "conversation %lld was with %s, which is gone (%s): give a model with -m",
                         (long long)id, c.model_path, strerror(errno));
        else if (strlen(c.model_path) >= cap) util_set_why(why, why_cap, "the model path is too long");
        else {
            snprintf(path, cap, "%s", c.model_path);
            rc = 0;
        }
        store_conv_clear(&c);
    } else if (id) {
        util_set_why(why, why_cap, "%s", err.msg);
    }
    store_close(s);
    return rc;
}
