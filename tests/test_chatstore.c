/* test_chatstore: the KV prefix store with the real engine on stories260K — restored KV gives bitwise the logits of a fresh prefill, a resumed chat continues exactly as the uninterrupted one, a changed model never reuses KV, a shared prefix is stored once and reused — every chat's snapshot a delta over it, resumed bitwise, evicted with it — and a corrupt blob (whole, base or delta) is dropped and the chat goes on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "app/chatstore.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "engine/kernels/quant.h"
#include "engine/worker.h"
#include "storage/store.h"
#include "tests/support/testcheck.h"
#include "tests/support/testutil.h"

static int setup_dir(void **state) { return tu_tmpdir_make("test-chatstore"); }

static engine *open_engine(const char *path, int kv_type)
{
    engine_params ep;
    engine_params_default(&ep);
    ep.model_path = path ? path : tu_path("models/stories260K.gguf");
    ep.n_ctx = 1024;
    ep.n_threads = 1;
    ep.kv_type = kv_type;
    engine *e = NULL;
    kv_error err = {0};
    if (engine_open(&ep, &e, &err)) fail_msg("engine_open: %s", err.msg);
    return e;
}

static int32_t *tokens_of(engine *e, const char *text, size_t *n)
{
    int32_t *t = NULL;
    kv_error err = {0};
    if (engine_tokenize(e, text, strlen(text), 0, 0, &t, n, &err)) fail_msg("tokenize: %s", err.msg);
    return t;
}

static const char *story =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. "
    "One day, she saw a big red ball under a tree. She ran to the ball and kicked it very hard. The ball flew over "
    "the fence and into the garden of an old man. Lily was scared, but she knocked on the door and said sorry.";

/* ---- bitwise: restore through SQLite vs a fresh prefill --------------------------------------------- */

static void check_bitwise(int kv_type)
{
    engine *a = open_engine(NULL, kv_type);
    size_t n;
    int32_t *t = tokens_of(a, story, &n);
    assert_true(n > 40);
    int32_t *tx = malloc((n + 1) * sizeof *tx);
    memcpy(tx, t, n * sizeof *t);
    tx[n] = 300; /* the next token, whatever it is */
    kv_error ke = {0};
    gen_stats st;
    assert_int_equal(engine_prefill_seq(a, ENGINE_SEQ_DEFAULT, t, n, NULL, &st, &ke), KV_OK);
    /* the blob, through the store in small chunks */
    void *blob;
    size_t len;
    assert_int_equal(engine_seq_save(a, ENGINE_SEQ_DEFAULT, -1, &blob, &len, &ke), KV_OK);
    store *s = NULL;
    store_error err = {0};
    char name[32];
    snprintf(name, sizeof name, "bitwise-%d.db", kv_type);
    assert_int_equal(store_open(tu_tmp_path(name), 0, &s, &err), STORE_OK);
    store_set_kv_chunk_size(s, 3000);
    int64_t model_id;
    char fp[33];
    chatstore_fingerprint(a, fp);
    assert_int_equal(store_model_register(s, fp, "", "m", "", "", 0, &model_id, &err), STORE_OK);
    uint64_t h[128];
    int nb = kv_block_hashes(t, (int)n, h);
    store_kv_key k = {.model_id = model_id, .kv_type = quant_traits_of(kv_type)->name, .tokens = t, .n_tokens = n,
                      .block_size = KV_BLOCK_SIZE, .block_hashes = h, .n_blocks = (size_t)nb,
                      .key_hash = n % KV_BLOCK_SIZE ? kv_hash_block(h[nb - 1], t + nb * KV_BLOCK_SIZE, (int)(n % KV_BLOCK_SIZE)) : h[nb - 1]};
    store_kv_put_result r;
    if (store_kv_put(s, &k, STORE_KV_SNAPSHOT, blob, len, 0, &r, &err)) fail_msg("put: %s", err.msg);
    assert_true(r.stored);
    free(blob);
    /* the fresh path: feed the next token on top of the prefilled conversation */
    if (engine_prefill_seq(a, ENGINE_SEQ_DEFAULT, tx, n + 1, NULL, &st, &ke)) fail_msg("prefill: %s", ke.msg);
    assert_int_equal(st.n_prefilled, 1);
    int n_vocab = engine_model(a)->hp.n_vocab;
    float *la = malloc(sizeof(float) * (size_t)n_vocab);
    memcpy(la, engine_logits(a), sizeof(float) * (size_t)n_vocab);
    /* the resumed path: another engine, its KV from the store */
    engine *b = open_engine(NULL, kv_type);
    uint64_t hq[128];
    int nbq = kv_block_hashes(tx, (int)n + 1, hq);
    store_kv_key q = k;
    q.tokens = tx;
    q.n_tokens = n + 1;
    q.block_hashes = hq;
    q.n_blocks = (size_t)nbq;
    store_kv_hit hit;
    assert_int_equal(store_kv_find(s, &q, &hit, &err), STORE_OK);
    assert_int_equal(hit.n_common, n);
    assert_int_equal(store_kv_read(s, hit.id, &blob, &len, &err), STORE_OK);
    assert_int_equal(engine_seq_restore(b, ENGINE_SEQ_DEFAULT, blob, len, &ke), KV_OK);
    free(blob);
    assert_int_equal(engine_prefill_seq(b, ENGINE_SEQ_DEFAULT, tx, n + 1, NULL, &st, &ke), KV_OK);
    assert_int_equal(st.n_reused, n);
    assert_int_equal(st.n_prefilled, 1);
    assert_memory_equal(la, engine_logits(b), sizeof(float) * (size_t)n_vocab); /* bitwise */
    /* and greedy decoding goes on identically for 48 tokens, logits bitwise at every step */
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    sampler *sa = sampler_create(n_vocab, &sp, &ke), *sb = sampler_create(n_vocab, &sp, &ke);
    for (int i = 0; i < 48; i++) {
        int32_t ta, tb;
        assert_int_equal(sampler_sample(sa, engine_logits(a), &ta, &ke), KV_OK);
        assert_int_equal(sampler_sample(sb, engine_logits(b), &tb, &ke), KV_OK);
        assert_int_equal(ta, tb);
        int na = 0, nbb = 0;
        const int32_t *ha = engine_seq_tokens(a, ENGINE_SEQ_DEFAULT, &na);
        int32_t *next = malloc(sizeof(int32_t) * (size_t)(na + 1));
        memcpy(next, ha, sizeof(int32_t) * (size_t)na);
        next[na] = ta;
        assert_int_equal(engine_prefill_seq(a, ENGINE_SEQ_DEFAULT, next, (size_t)na + 1, NULL, NULL, &ke), KV_OK);
        engine_seq_tokens(b, ENGINE_SEQ_DEFAULT, &nbb);
        assert_int_equal(na, nbb);
        assert_int_equal(engine_prefill_seq(b, ENGINE_SEQ_DEFAULT, next, (size_t)na + 1, NULL, NULL, &ke), KV_OK);
        free(next);
        assert_memory_equal(engine_logits(a), engine_logits(b), sizeof(float) * (size_t)n_vocab);
    }
    sampler_free(sa);
    sampler_free(sb);
    free(la);
    free(t);
    free(tx);
    store_close(s);
    engine_close(a);
    engine_close(b);
}

static void test_restore_bitwise_f16(void **state)
{
    (void)state;
    check_bitwise(GGML_TYPE_F16);
}

static void test_restore_bitwise_f32(void **state)
{
    (void)state;
    check_bitwise(GGML_TYPE_F32);
}

/* ---- a chat through the worker, as app/chat.c drives it ------------------------------------------- */

typedef struct session {
    engine *e;
    sampler *s;
    worker *w;
    chatstore *cs;
    int64_t last_id;        /* the head */
    char reply[8192];
    size_t len;
    gen_stats st;
    int finish, status;
} session;

static void session_open(session *x, const char *model_path, const char *db)
{
    memset(x, 0, sizeof *x);
    x->e = open_engine(model_path, GGML_TYPE_F16);
    sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    kv_error ke = {0};
    x->s = sampler_create(engine_model(x->e)->hp.n_vocab, &sp, &ke);
    assert_non_null(x->s);
    assert_int_equal(worker_create(x->e, x->s, &x->w, &ke), KV_OK);
    char why[700];
    x->cs = chatstore_open(x->e, db, 64u << 20, why, sizeof why);
    if (!x->cs) fail_msg("chatstore_open: %s", why);
    worker_hooks h;
    chatstore_worker_hooks(x->cs, &h);
    worker_set_hooks(x->w, &h);
}

static void session_close(session *x)
{
    worker_destroy(x->w);
    chatstore_close(x->cs);
    sampler_free(x->s);
    engine_close(x->e);
}

/* Run a request to DONE; on a reply, save it as chat.c does. */
static void run(session *x, const worker_request *rq, int64_t user_id)
{
    kv_error ke = {0};
    assert_int_equal(worker_submit(x->w, rq, &ke), KV_OK);
    x->len = 0;
    double end = tu_now_ms() + 60000;
    while (tu_now_ms() < end) {
        struct pollfd p = {.fd = worker_fd(x->w), .events = POLLIN};
        poll(&p, 1, 50);
        worker_event ev;
        while (worker_next_event(x->w, &ev)) {
            if (ev.kind == WORKER_EV_TEXT) {
                assert_true(x->len + ev.len < sizeof x->reply);
                memcpy(x->reply + x->len, ev.text, ev.len);
                x->len += ev.len;
                x->reply[x->len] = 0;
            } else if (ev.kind == WORKER_EV_DONE) {
                x->st = ev.stats.gen;
                x->finish = ev.finish;
                x->status = ev.status;
                if (rq->n_seg || rq->append) {
                    sampler_params sp = *sampler_get_params(x->s);
                    int64_t id;
                    char why[700];
                    if (chatstore_reply(x->cs, x->last_id, 0, user_id, x->reply, x->len, ev.finish, &ev.stats.gen, &sp, 40,
                                        ev.seed, ev.conv, ev.n_conv, &id, why, sizeof why))
                        fail_msg("chatstore_reply: %s", why);
                    x->last_id = id;
                }
                return;
            }
        }
    }
    fail_msg("no DONE within 60 s");
}

/* Send a user message in completion mode (append when the conversation is synced). */
static void say(session *x, const char *text, int append)
{
    sampler_params sp = *sampler_get_params(x->s);
    int64_t uid;
    char why[700];
    if (chatstore_user_message(x->cs, x->last_id, text, strlen(text), NULL, &sp, 40, &uid, why, sizeof why))
        fail_msg("chatstore_user_message: %s", why);
    x->last_id = uid;
    worker_segment seg = {text, strlen(text), 0};
    worker_request rq = {.seg = &seg, .n_seg = 1, .n_predict = 40, .append = append};
    run(x, &rq, uid);
}

static void test_resume_continues_exactly(void **state)
{
    (void)state;
    /* uninterrupted */
    session a;
    session_open(&a, NULL, tu_tmp_path("straight.db"));
    say(&a, "Once upon a time, there was a dragon", 0);
    char first[8192];
    snprintf(first, sizeof first, "%s", a.reply);
    say(&a, " The dragon was sad because", 1);
    char want[8192];
    snprintf(want, sizeof want, "%s", a.reply);
    assert_true(strlen(want) > 20);
    session_close(&a);

    /* the same chat, quit after the first reply, resumed in a new process (new engine) */
    session b;
    session_open(&b, NULL, tu_tmp_path("resumed.db"));
    say(&b, "Once upon a time, there was a dragon", 0);
    assert_string_equal(b.reply, first);
    session_close(&b);

    session c;
    session_open(&c, NULL, tu_tmp_path("resumed.db"));
    int64_t id;
    char why[700];
    assert_int_equal(chatstore_resolve(c.cs, "last", &id, why, sizeof why), 0);
    chatstore_conv cv;
    assert_int_equal(chatstore_load(c.cs, id, &cv, why, sizeof why), 0);
    assert_int_equal(cv.n, 2);
    assert_string_equal(cv.msgs[1].text, first);
    assert_non_null(cv.ctx); /* the exact tokens */
    c.last_id = cv.msgs[1].id;
    worker_request open = {.reset_cache = 1, .set_conv = 1, .conv = cv.ctx, .n_conv = cv.n_ctx};
    chatstore_announce_restore(c.cs);
    run(&c, &open, 0);
    assert_int_equal(c.status, KV_OK);
    char note[700];
    assert_true(chatstore_take_note(c.cs, note, sizeof note));
    assert_non_null(strstr(note, "restored the KV cache of"));
    size_t n_ctx = cv.n_ctx;
    chatstore_conv_free(&cv);
    say(&c, " The dragon was sad because", 1);
    assert_string_equal(c.reply, want); /* exactly as the uninterrupted chat */
    /* only the new message (and the last sampled token, never in the cache) was prefilled */
    assert_true(c.st.n_reused >= (int)n_ctx - 1);
    assert_true(c.st.n_prefilled <= c.st.n_prompt - (int)n_ctx + 1);
    char rep[1600];
    chatstore_report(c.cs, rep, sizeof rep);
    assert_non_null(strstr(rep, "1 of 1 lookups hit"));
    session_close(&c);
}

/* A copy of stories260K with one weight byte changed (the header and tensor table as before). */
static const char *changed_model(void)
{
    const char *src = tu_path("models/stories260K.gguf");
    const char *dst = tu_tmp_path("changed.gguf");
    size_t len;
    char *b = tu_read_file(src, &len);
    assert_non_null(b);
    gguf_file *g = NULL;
    kv_error ke = {0};
    assert_int_equal(gguf_open(src, &g, &ke), KV_OK);
    size_t off = (size_t)g->data_offset + 1; /* the first bytes of the tensor data */
    gguf_close(g);
    b[off] ^= 0x01;
    FILE *f = fopen(dst, "wb");
    assert_int_equal(fwrite(b, 1, len, f), len);
    fclose(f);
    free(b);
    return dst;
}

static void test_changed_model_never_reuses(void **state)
{
    (void)state;
    const char *db = tu_tmp_path("changed.db");
    session a;
    session_open(&a, NULL, db);
    say(&a, "Once upon a time, there was a little girl named Lily who had a red ball", 0);
    char fp1[33];
    chatstore_fingerprint(a.e, fp1);
    int32_t *conv = NULL;
    size_t n_conv = 0;
    {
        int64_t id;
        char why[700];
        chatstore_conv cv;
        assert_int_equal(chatstore_resolve(a.cs, "last", &id, why, sizeof why), 0);
        assert_int_equal(chatstore_load(a.cs, id, &cv, why, sizeof why), 0);
        conv = cv.ctx;
        n_conv = cv.n_ctx;
        cv.ctx = NULL;
        chatstore_conv_free(&cv);
    }
    session_close(&a);
    assert_non_null(conv);

    session b;
    session_open(&b, changed_model(), db);
    char fp2[33];
    chatstore_fingerprint(b.e, fp2);
    assert_string_not_equal(fp1, fp2);
    assert_int_equal(memcmp(fp1, fp2, 16), 0); /* the engine's header fingerprint alone cannot tell */
    worker_request open = {.reset_cache = 1, .set_conv = 1, .conv = conv, .n_conv = n_conv};
    run(&b, &open, 0);
    int n = 0;
    engine_seq_tokens(b.e, ENGINE_SEQ_DEFAULT, &n);
    assert_int_equal(n, 0); /* nothing restored */
    char rep[1600];
    chatstore_report(b.cs, rep, sizeof rep);
    assert_non_null(strstr(rep, "0 of 1 lookups hit"));
    session_close(&b);
    free(conv);
}

static void test_shared_prefix_stored_once(void **state)
{
    (void)state;
    const char *db = tu_tmp_path("shared.db");
    const char *sys = "You are a storyteller who tells short, happy stories about animals in the forest, with a "
                      "kind ending and simple words.\n\n";
    const char *asks[3] = {"Tell me about a fox", "Tell me about an owl and the moon", "What did the bear eat"};
    for (int i = 0; i < 3; i++) {
        session x; /* each chat in a fresh engine: the store is the only place the prefix can come from */
        session_open(&x, NULL, db);
        char text[600];
        snprintf(text, sizeof text, "%s%s", sys, asks[i]);
        say(&x, text, 0);
        assert_int_equal(x.status, KV_OK);
        if (i == 2) {
            /* the third chat reused the system prompt's blocks from the store */
            assert_true(x.st.n_reused >= 32);
            char rep[1600];
            chatstore_report(x.cs, rep, sizeof rep);
            assert_non_null(strstr(rep, "1 of 1 lookups hit"));
        }
        session_close(&x);
    }
    /* one shared row, used by the third chat; the system prompt is not stored a third time */
    assert_int_equal(tu_sql_int(db, "SELECT count(*) FROM kv_prefixes WHERE kind = 1"), 1);
    assert_true(tu_sql_int(db, "SELECT hits FROM kv_prefixes WHERE kind = 1") >= 1);
    assert_int_equal(tu_sql_int(db, "SELECT count(*) FROM kv_prefixes WHERE kind = 0"), 3);
    /* and every snapshot rests on it, holding only its own positions */
    assert_int_equal(tu_sql_int(db, "SELECT count(*) FROM kv_prefixes WHERE kind = 0 AND base_id = (SELECT id FROM "
                                "kv_prefixes WHERE kind = 1)"), 3);
}

/* ---- a system prompt shared by many chats is stored once ------------------------------------------ */

/* About 200 tokens of stories260K: every chat below starts with it. */
static const char *long_sys =
    "You are a storyteller for small children. You tell short and happy stories about animals who live in the big "
    "green forest: a fox, an owl, a bear, a rabbit and a little bird. Every story has a kind ending, simple words "
    "and a lesson about sharing, being brave or helping a friend. The animals talk to each other and they like to "
    "play in the sun and eat sweet berries. At night the owl sings a soft song.\n\n";

typedef struct chat_ref {
    int32_t toks[1024];      /* the chat's KV positions when it was saved */
    int n;
    float *logits;           /* after feeding one more token on top of them, in the chat's own engine */
    size_t full_len;         /* a whole blob of those positions */
    size_t bytes_per_token;
} chat_ref;

#define NEXT_TOKEN 300

/* One more token on top of the sequence's n positions: the logits (malloc'd). */
static float *next_logits(engine *e, const int32_t *toks, int n)
{
    int32_t *t = malloc(sizeof(int32_t) * (size_t)(n + 1));
    memcpy(t, toks, sizeof(int32_t) * (size_t)n);
    t[n] = NEXT_TOKEN;
    kv_error ke = {0};
    gen_stats st;
    if (engine_prefill_seq(e, ENGINE_SEQ_DEFAULT, t, (size_t)n + 1, NULL, &st, &ke)) fail_msg("prefill: %s", ke.msg);
    assert_int_equal(st.n_reused, n);
    assert_int_equal(st.n_prefilled, 1);
    int n_vocab = engine_model(e)->hp.n_vocab;
    float *l = malloc(sizeof(float) * (size_t)n_vocab);
    memcpy(l, engine_logits(e), sizeof(float) * (size_t)n_vocab);
    free(t);
    return l;
}

/* Close a session after its generator thread has finished (the save hook included); with ref,
 * first record what the chat's KV cache holds and the logits one token further. */
static void session_close_ref(session *x, chat_ref *ref)
{
    worker_destroy(x->w); /* joins the generator thread: the save hook is done */
    x->w = NULL;
    if (ref) {
        int n = 0;
        const int32_t *t = engine_seq_tokens(x->e, ENGINE_SEQ_DEFAULT, &n);
        assert_true(n > 0 && n < 1024);
        assert_int_equal(kv_seq_n_clean(engine_kv(x->e), ENGINE_SEQ_DEFAULT), n);
        memcpy(ref->toks, t, sizeof(int32_t) * (size_t)n);
        ref->n = n;
        void *blob;
        kv_error ke = {0};
        assert_int_equal(engine_seq_save(x->e, ENGINE_SEQ_DEFAULT, -1, &blob, &ref->full_len, &ke), KV_OK);
        free(blob);
        kv_cache_stats ks;
        kv_cache_get_stats(engine_kv(x->e), &ks);
        ref->bytes_per_token = ks.bytes_per_token;
        ref->logits = next_logits(x->e, ref->toks, n);
    }
    chatstore_close(x->cs);
    sampler_free(x->s);
    engine_close(x->e);
}

/* (each starts differently: the chats share exactly the system prompt) */
static const char *asks[3] = {"Tell me about the fox and the river", "Sing a song of an owl and the moon",
                              "What did the bear eat for dinner"};

/* Three chats, each in a fresh engine, all starting with long_sys; refs[i] what each held. */
static void three_chats(const char *db, chat_ref refs[3])
{
    for (int i = 0; i < 3; i++) {
        session x;
        session_open(&x, NULL, db);
        char text[2048];
        snprintf(text, sizeof text, "%s%s", long_sys, asks[i]);
        say(&x, text, 0);
        assert_int_equal(x.status, KV_OK);
        if (i > 0) assert_true(x.st.n_reused >= 160); /* the system prompt came from the store */
        session_close_ref(&x, &refs[i]);
    }
}

/* Resume chat ref in a fresh engine (as `kvchat --resume` does) and run its conversation's
 * restore; returns the session (open) with the note taken into note. */
static void resume(session *x, const char *db, const chat_ref *ref, char *note, size_t cap)
{
    session_open(x, NULL, db);
    chatstore_announce_restore(x->cs);
    worker_request open = {.reset_cache = 1, .set_conv = 1, .conv = ref->toks, .n_conv = (size_t)ref->n};
    run(x, &open, 0);
    assert_int_equal(x->status, KV_OK);
    note[0] = 0;
    chatstore_take_note(x->cs, note, cap);
}

static void free_refs(chat_ref refs[3])
{
    for (int i = 0; i < 3; i++) free(refs[i].logits);
}

/* Resume chat ref in a fresh engine: its tokens back, and bitwise its logits one token further. */
static void check_resume(const char *db, const chat_ref *ref, int show)
{
    session x;
    char note[700];
    double t0 = tu_now_ms();
    resume(&x, db, ref, note, sizeof note);
    double ms = tu_now_ms() - t0;
    assert_non_null(strstr(note, "restored the KV cache of"));
    assert_non_null(strstr(note, "a shared prefix of"));
    if (show) print_message("%s (resume %.1f ms with engine start)\n", note, ms);
    worker_destroy(x.w);
    x.w = NULL;
    int n = 0;
    const int32_t *t = engine_seq_tokens(x.e, ENGINE_SEQ_DEFAULT, &n);
    assert_int_equal(n, ref->n);
    assert_memory_equal(t, ref->toks, sizeof(int32_t) * (size_t)n);
    int n_vocab = engine_model(x.e)->hp.n_vocab;
    float *l = next_logits(x.e, ref->toks, n);
    assert_memory_equal(l, ref->logits, sizeof(float) * (size_t)n_vocab); /* bitwise */
    free(l);
    chatstore_close(x.cs);
    sampler_free(x.s);
    engine_close(x.e);
}

static void test_system_prompt_stored_once(void **state)
{
    (void)state;
    const char *db = tu_tmp_path("sysonce.db");
    static chat_ref refs[3];
    three_chats(db, refs);
    size_t bpt = refs[0].bytes_per_token;
    /* one shared row: the system prompt's whole blocks */
    assert_int_equal(tu_sql_int(db, "SELECT count(*) FROM kv_prefixes WHERE kind = 1"), 1);
    long long a = tu_sql_int(db, "SELECT n_tokens FROM kv_prefixes WHERE kind = 1");
    long long shared_id = tu_sql_int(db, "SELECT id FROM kv_prefixes WHERE kind = 1");
    long long shared_size = tu_sql_int(db, "SELECT size FROM kv_prefixes WHERE kind = 1");
    assert_true(a >= 160 && a % KV_BLOCK_SIZE == 0);
    assert_int_equal(tu_sql_int(db, "SELECT base_id IS NULL FROM kv_prefixes WHERE kind = 1"), 1);
    /* every chat's snapshot is a delta over it, holding only its own positions */
    assert_int_equal(tu_sql_int(db, "SELECT count(*) FROM kv_prefixes WHERE kind = 0"), 3);
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM kv_prefixes WHERE kind = 0 AND base_id = %lld", shared_id);
    assert_int_equal(tu_sql_int(db, sql), 3);
    long long total = tu_sql_int(db, "SELECT sum(size) FROM kv_prefixes");
    size_t sum_full = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(sql, sizeof sql, "SELECT size FROM kv_prefixes WHERE kind = 0 AND n_tokens = %d", refs[i].n);
        long long d = tu_sql_int(db, sql);
        assert_true(d > 0);
        /* smaller than the whole snapshot by (about) the shared part */
        assert_true((double)d < (double)refs[i].full_len - 0.9 * (double)a * (double)bpt);
        assert_int_equal((size_t)d, refs[i].full_len - (size_t)a * (4 + bpt));
        sum_full += refs[i].full_len;
    }
    /* the system prompt's K/V once: one shared blob + the deltas = the whole snapshots less two
     * copies of the shared part */
    assert_int_equal((size_t)total, sum_full - 2 * (size_t)a * (4 + bpt) + 72);
    print_message("3 chats sharing a %lld-token system prompt (%zu bytes of K/V per token): stored %lld bytes (shared "
                  "%lld + deltas); whole snapshots would be %zu, plus the shared row %zu (the old scheme)\n",
                  a, bpt, total, shared_size, sum_full, sum_full + (size_t)shared_size);
    /* `kvchat check`: nothing wrong with deltas */
    store *s;
    store_error err = {0};
    assert_int_equal(store_open(db, 0, &s, &err), STORE_OK);
    tu_store_check_clean(s);
    store_kv_stats ks;
    assert_int_equal(store_kv_stats_get(s, &ks, &err), STORE_OK);
    assert_int_equal(ks.n_delta, 3);
    assert_int_equal(ks.bytes, (uint64_t)total);
    store_close(s);

    /* resuming each chat: base, then delta — the logits one token further bitwise as in the chat */
    for (int i = 0; i < 3; i++) check_resume(db, &refs[i], i == 0);

    /* a fourth chat branching from the first after its question: the longer shared prefix is
     * stored once too, as a delta over the system prompt, and the first chat rests on it now */
    static chat_ref r4;
    {
        session x;
        session_open(&x, NULL, db);
        char text[2048];
        snprintf(text, sizeof text, "%s%s, please", long_sys, asks[0]);
        say(&x, text, 0);
        assert_int_equal(x.status, KV_OK);
        session_close_ref(&x, &r4);
    }
    assert_int_equal(tu_sql_int(db, "SELECT count(*) FROM kv_prefixes WHERE kind = 1"), 2);
    snprintf(sql, sizeof sql, "SELECT n_tokens FROM kv_prefixes WHERE kind = 1 AND base_id = %lld", shared_id);
    long long a2 = tu_sql_int(db, sql);
    assert_true(a2 > a);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM kv_prefixes d JOIN kv_prefixes b ON b.id = d.base_id WHERE d.kind = 0 AND "
             "b.n_tokens = %lld AND d.n_tokens IN (%d, %d)",
             a2, refs[0].n, r4.n);
    assert_int_equal(tu_sql_int(db, sql), 2);
    long long total4 = tu_sql_int(db, "SELECT sum(size) FROM kv_prefixes");
    /* + the fourth chat's own positions and the new shared part, which the first chat gave up */
    assert_int_equal((size_t)total4, (size_t)total + r4.full_len + 72 - (size_t)a2 * (4 + bpt));
    check_resume(db, &r4, 0);
    check_resume(db, &refs[0], 0);

    /* evicting the shared row (least recently used here) takes its deltas along: none is left
     * without its base; a resumed chat then prefills */
    snprintf(sql, sizeof sql, "UPDATE kv_prefixes SET last_used = 1 WHERE id = %lld", shared_id);
    sqlite3 *d;
    assert_int_equal(sqlite3_open(db, &d), SQLITE_OK);
    assert_int_equal(sqlite3_exec(d, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(d);
    assert_int_equal(store_open(db, 0, &s, &err), STORE_OK);
    int ev = 0;
    assert_int_equal(store_kv_evict(s, (uint64_t)total4 - 1, &ev, &err), STORE_OK);
    assert_int_equal(ev, 6);
    tu_store_check_clean(s);
    store_close(s);
    assert_int_equal(tu_sql_int(db, "SELECT count(*) FROM kv_prefixes"), 0);
    session x;
    char note[700];
    resume(&x, db, &refs[0], note, sizeof note);
    assert_non_null(strstr(note, "no KV cache stored"));
    x.last_id = 0;
    say(&x, " The fox", 1);
    assert_int_equal(x.status, KV_OK);
    assert_int_equal(x.st.n_reused, 0);
    session_close(&x);
    free_refs(refs);
    free(r4.logits);
}

/* A damaged delta is dropped alone (its base still serves); a damaged base goes with its deltas. */
static void test_shared_prefix_corrupt(void **state)
{
    (void)state;
    const char *db = tu_tmp_path("syscorrupt.db");
    static chat_ref refs[3];
    three_chats(db, refs);
    long long a = tu_sql_int(db, "SELECT n_tokens FROM kv_prefixes WHERE kind = 1");
    char sql[512];
    /* chat 3's delta */
    snprintf(sql, sizeof sql,
             "UPDATE kv_chunks SET data = CAST(substr(data, 1, 100) || x'ff' || substr(data, 102) AS BLOB) WHERE "
             "prefix_id = (SELECT id FROM kv_prefixes WHERE kind = 0 AND n_tokens = %d)",
             refs[2].n);
    sqlite3 *d;
    assert_int_equal(sqlite3_open(db, &d), SQLITE_OK);
    assert_int_equal(sqlite3_exec(d, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(d);
    session x;
    char note[700];
    resume(&x, db, &refs[2], note, sizeof note);
    assert_non_null(strstr(note, "checksum"));
    assert_non_null(strstr(note, "not used"));
    int n = 0;
    engine_seq_tokens(x.e, ENGINE_SEQ_DEFAULT, &n);
    assert_int_equal(n, (int)a); /* the shared base was good: restored */
    say(&x, " The bear", 1);
    assert_int_equal(x.status, KV_OK);
    assert_int_equal(x.st.n_reused, (int)a); /* the rest prefilled */
    session_close(&x);
    assert_int_equal(tu_sql_int(db, "SELECT count(*) FROM kv_prefixes WHERE kind = 1"), 1);
    /* the shared base */
    assert_int_equal(sqlite3_open(db, &d), SQLITE_OK);
    assert_int_equal(sqlite3_exec(d,
                                  "UPDATE kv_chunks SET data = CAST(substr(data, 1, 100) || x'ff' || substr(data, 102) AS "
                                  "BLOB) WHERE prefix_id = (SELECT id FROM kv_prefixes WHERE kind = 1)",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(d);
    resume(&x, db, &refs[0], note, sizeof note);
    assert_non_null(strstr(note, "checksum"));
    assert_non_null(strstr(note, "with the deltas resting on it"));
    engine_seq_tokens(x.e, ENGINE_SEQ_DEFAULT, &n);
    assert_int_equal(n, 0);
    assert_int_equal(tu_sql_int(db, "SELECT count(*) FROM kv_prefixes"), 0); /* no delta left without its base */
    say(&x, " The fox", 1);
    assert_int_equal(x.status, KV_OK);
    assert_int_equal(x.st.n_reused, 0); /* prefilled instead */
    session_close(&x);
    free_refs(refs);
}

static void test_corrupt_blob_chat_goes_on(void **state)
{
    (void)state;
    const char *db = tu_tmp_path("corrupt.db");
    session a;
    session_open(&a, NULL, db);
    say(&a, "Once upon a time, there was a little girl named Lily who had a red ball", 0);
    session_close(&a);
    sqlite3 *d;
    assert_int_equal(sqlite3_open(db, &d), SQLITE_OK);
    assert_int_equal(sqlite3_exec(d, "UPDATE kv_chunks SET data = CAST(substr(data, 1, 100) || x'ff' || substr(data, 102) AS BLOB)",
                                  NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(d);
    session b;
    session_open(&b, NULL, db);
    int64_t id;
    char why[700];
    chatstore_conv cv;
    assert_int_equal(chatstore_resolve(b.cs, "last", &id, why, sizeof why), 0);
    assert_int_equal(chatstore_load(b.cs, id, &cv, why, sizeof why), 0);
    b.last_id = cv.msgs[cv.n - 1].id;
    worker_request open = {.reset_cache = 1, .set_conv = 1, .conv = cv.ctx, .n_conv = cv.n_ctx};
    run(&b, &open, 0);
    chatstore_conv_free(&cv);
    char note[700];
    assert_true(chatstore_take_note(b.cs, note, sizeof note));
    assert_non_null(strstr(note, "checksum"));
    assert_non_null(strstr(note, "not used"));
    say(&b, " She played all day", 1);
    assert_int_equal(b.status, KV_OK);
    assert_true(b.len > 0);
    assert_int_equal(b.st.n_reused, 0); /* prefilled instead */
    session_close(&b);
    /* the corrupt prefix was dropped, a good one saved in its place */
    assert_int_equal(tu_sql_int(db, "SELECT count(*) FROM kv_prefixes"), 1);
    store *s;
    store_error err = {0};
    assert_int_equal(store_open(db, 0, &s, &err), STORE_OK);
    tu_store_check_clean(s);
    store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restore_bitwise_f16),
        cmocka_unit_test(test_restore_bitwise_f32),
        cmocka_unit_test(test_resume_continues_exactly),
        cmocka_unit_test(test_changed_model_never_reuses),
        cmocka_unit_test(test_shared_prefix_stored_once),
        cmocka_unit_test(test_corrupt_blob_chat_goes_on),
        cmocka_unit_test(test_system_prompt_stored_once),
        cmocka_unit_test(test_shared_prefix_corrupt),
    };
    return cmocka_run_group_tests(tests, setup_dir, tu_tmpdir_teardown);
}
