/* sampler: the per-request sampling chain (penalties → top-k → top-p → min-p → temperature → draw) and its seeded RNG. */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* top_k up to this size is selected with a bounded heap in one pass over the logits; larger
 * top_k collects every candidate and uses quickselect. */
#define TOPK_HEAP_MAX 1024

/* Ranges at or below this size are finished by sorting. */
#define SMALL_RANGE 32

/* The draw's cumulative sums are taken per block of this many survivors, then across blocks. */
#define DRAW_BLOCK 64

/* Independent accumulators in the scanning loops, so that they vectorize. */
#define LANES 8

struct sampler {
    int32_t n_vocab;
    sampler_params params;
    uint64_t seed;        /* seed in use (never SAMPLER_SEED_RANDOM) */
    sampler_rng rng;
    int32_t *hist;        /* ring of the last SAMPLER_MAX_LAST_N accepted tokens */
    uint32_t hist_len;    /* tokens held, <= SAMPLER_MAX_LAST_N */
    uint32_t hist_next;   /* slot the next accepted token goes to */
    float *work;          /* [n_vocab] penalized logits */
    float *prob;          /* [n_vocab] by token id: exp(logit - max), top-p's mass */
    float *fw;            /* [n_vocab] by survivor position: final weights exp((logit-max)/T) */
    double *bsum;         /* [n_vocab / DRAW_BLOCK + 1] sums of fw per block */
    uint64_t *cand;       /* [n_vocab] candidates: sort keys or token ids */
    int32_t *count;       /* [n_vocab] occurrences in the penalty window; zero between calls */
    unsigned char *mark;  /* [n_vocab] per-token flags; zero between calls */
};

/* ---------------------------------------------------------------------------------------
 * RNG: SplitMix64 and xoshiro256** (Blackman & Vigna), written from the published algorithm. */

uint64_t sampler_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

void sampler_rng_seed(sampler_rng *r, uint64_t seed)
{
    uint64_t st = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = sampler_splitmix64(&st);
}

static inline uint64_t rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t sampler_rng_next(sampler_rng *r)
{
    uint64_t *s = r->s;
    const uint64_t out = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return out;
}

double sampler_rng_uniform(sampler_rng *r)
{
    return (double)(sampler_rng_next(r) >> 11) * 0x1.0p-53;
}

/* A seed from getrandom(2); if that fails, SplitMix64 of the clock, pid, an address and a
 * counter. Never returns SAMPLER_SEED_RANDOM, so the result can be recorded and replayed. */
static uint64_t pick_random_seed(const void *salt)
{
    static _Atomic uint64_t calls;
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t st = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
        st ^= (uint64_t)getpid() << 40;
        st ^= (uint64_t)(uintptr_t)salt;
        st ^= atomic_fetch_add(&calls, 1) * UINT64_C(0xd1342543de82ef95);
        x = sampler_splitmix64(&st);
    }
    if (x == SAMPLER_SEED_RANDOM)
        x = 0;
    return x;
}

static void reseed(sampler *s)
{
    s->seed = s->params.seed == SAMPLER_SEED_RANDOM ? pick_random_seed(s) : s->params.seed;
    sampler_rng_seed(&s->rng, s->seed);
}

/* ---------------------------------------------------------------------------------------
 * Parameters */

void sampler_params_default(sampler_params *p)
{
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = SAMPLER_SEED_RANDOM;
}

int sampler_params_validate(const sampler_params *p, kv_error *err)
{
    if (!p)
        return kv_error_set(err, KV_ERR_INVALID, "sampler: params is NULL");
    if (!isfinite(p->temperature))
        return kv_error_set(err, KV_ERR_INVALID, "sampler: temperature %g is not finite",
                            (double)p->temperature);
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
        return kv_error_set(err, KV_ERR_INVALID, "sampler: top_p %g not in [0, 1]",
                            (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return kv_error_set(err, KV_ERR_INVALID, "sampler: min_p %g not in [0, 1]",
                            (double)p->min_p);
    if (!(isfinite(p->repeat_penalty) && p->repeat_penalty > 0.0f))
        return kv_error_set(err, KV_ERR_INVALID,
                            "sampler: repeat_penalty %g must be finite and > 0",
                            (double)p->repeat_penalty);
    if (p->repeat_last_n < -1 || p->repeat_last_n > SAMPLER_MAX_LAST_N)
        return kv_error_set(err, KV_ERR_INVALID, "sampler: repeat_last_n %d not in [-1, %d]",
                            (int)p->repeat_last_n, SAMPLER_MAX_LAST_N);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return kv_error_set(err, KV_ERR_INVALID, "sampler: presence_penalty %g not in [-2, 2]",
                            (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return kv_error_set(err, KV_ERR_INVALID, "sampler: frequency_penalty %g not in [-2, 2]",
                            (double)p->frequency_penalty);
    return KV_OK;
}

/* ---------------------------------------------------------------------------------------
 * Life cycle */

sampler *sampler_create(int32_t n_vocab, const sampler_params *p, kv_error *err)
{
    sampler_params def;
    if (!p) {
        sampler_params_default(&def);
        p = &def;
    }
    if (n_vocab <= 0 || n_vocab == INT32_MAX) {
        kv_error_set(err, KV_ERR_INVALID, "sampler: n_vocab %d must be in [1, %d]",
                     (int)n_vocab, INT32_MAX - 1);
        return NULL;
    }
    if (sampler_params_validate(p, err) != KV_OK)
        return NULL;

    sampler *s = calloc(1, sizeof *s);
    if (!s) {
        kv_error_set(err, KV_ERR_NOMEM, "sampler: out of memory for the sampler");
        return NULL;
    }
    size_t n = (size_t)n_vocab;
    s->n_vocab = n_vocab;
    s->hist = malloc(SAMPLER_MAX_LAST_N * sizeof *s->hist);
    s->work = malloc(n * sizeof *s->work);
    s->prob = malloc(n * sizeof *s->prob);
    s->fw = malloc(n * sizeof *s->fw);
    s->bsum = malloc((n / DRAW_BLOCK + 1) * sizeof *s->bsum);
    s->cand = malloc(n * sizeof *s->cand);
    s->count = calloc(n, sizeof *s->count);
    s->mark = calloc(n, sizeof *s->mark);
    if (!s->hist || !s->work || !s->prob || !s->fw || !s->bsum || !s->cand || !s->count ||
        !s->mark) {
        kv_error_set(err, KV_ERR_NOMEM,
                     "sampler: out of memory for the scratch buffers of n_vocab %d (%zu bytes)",
                     (int)n_vocab,
                     n * (4 * sizeof(float) + sizeof(uint64_t) + 1) +
                         (n / DRAW_BLOCK + 1) * sizeof(double) + SAMPLER_MAX_LAST_N * 4);
        sampler_free(s);
        return NULL;
    }
    s->params = *p;
    reseed(s);
    return s;
}

void sampler_free(sampler *s)
{
    if (!s)
        return;
    free(s->hist);
    free(s->work);
    free(s->prob);
    free(s->fw);
    free(s->bsum);
    free(s->cand);
    free(s->count);
    free(s->mark);
    free(s);
}

void sampler_set_params(sampler *s, const sampler_params *p)
{
    if (!s || !p)
        return;
    int seed_changed = p->seed != s->params.seed;
    s->params = *p;
    if (seed_changed)
        reseed(s);
}

const sampler_params *sampler_get_params(const sampler *s)
{
    return s ? &s->params : NULL;
}

uint64_t sampler_seed(const sampler *s)
{
    return s ? s->seed : 0;
}

void sampler_accept(sampler *s, int32_t token)
{
    if (!s || token < 0 || token >= s->n_vocab)
        return;
    s->hist[s->hist_next] = token;
    s->hist_next = (s->hist_next + 1) % SAMPLER_MAX_LAST_N;
    if (s->hist_len < SAMPLER_MAX_LAST_N)
        s->hist_len++;
}

void sampler_reset(sampler *s)
{
    if (!s)
        return;
    s->hist_len = 0;
    s->hist_next = 0;
    reseed(s);
}


/* ---------------------------------------------------------------------------------------
 * Kernels over whole arrays, written with LANES independent accumulators or as fixed-size
 * blocks so that the compiler vectorizes them (these loops are the cost at n_vocab 150k). */

/* e^x for x <= 0 without a library call, so that loops over it vectorize: Cody–Waite range
 * reduction x = k ln2 + r with |r| <= ln2/2 (ln2 split in a 16-bit head and a tail so k ln2
 * is exact), e^r by its degree-7 Taylor polynomial (truncation < 1e-8 relative), and 2^k by
 * writing the exponent bits. Measured against exp() on [-86, 0]: max relative error
 * 1.02e-7, under one float ulp; e^0 = 1 exactly. Below -86 (and for -inf) the result is 0:
 * e^-86 ~ 4e-38 is the smallest value produced, so nothing is ever subnormal (subnormal
 * arithmetic is slow), and weights that small relative to the max (1) never matter. */
static inline float exp_nonpos(float x)
{
    const float lo = -86.0f;
    const float xc = x < lo ? lo : x;
    const float k = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* rint(x/ln2) */
    float r = xc - k * 0.693145751953125f;
    r = r - k * 1.428606765330187e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)k + 127) << 23; /* k in [-125, 0] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < lo ? 0.0f : p * scale;
}

/* out[j] = e^((in[j] - mx) / T) for j < n; in may equal out; every in[j] <= mx, T > 0. */
static void exp_block(const float *in, float *out, size_t n, float mx, float T)
{
    size_t j = 0;
    for (; j + LANES <= n; j += LANES) {
        float t[LANES]; /* all loads before all stores: vectorizes even when in == out */
        for (int q = 0; q < LANES; q++)
            t[q] = in[j + q];
        for (int q = 0; q < LANES; q++)
            out[j + q] = exp_nonpos((t[q] - mx) / T);
    }
    for (; j < n; j++)
        out[j] = exp_nonpos((in[j] - mx) / T);
}

/* Sum of w[0..n) in double, lane by lane (a fixed order: the same inputs give the same bits). */
static double sum_f32(const float *w, size_t n)
{
    double acc[LANES] = {0};
    size_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int q = 0; q < LANES; q++)
            acc[q] += w[j + q];
    double s = 0.0;
    for (int q = 0; q < LANES; q++)
        s += acc[q];
    for (; j < n; j++)
        s += w[j];
    return s;
}

/* Maximum of x[0..n) (-inf if all are) and whether any is NaN or +Inf. */
static float max_and_check(const float *x, size_t n, int *bad)
{
    float mx[LANES];
    int bd[LANES];
    for (int q = 0; q < LANES; q++) {
        mx[q] = -INFINITY;
        bd[q] = 0;
    }
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int q = 0; q < LANES; q++) {
            const float v = x[i + q];
            bd[q] |= !(v <= FLT_MAX); /* NaN or +Inf; -Inf is a masked token */
            mx[q] = v > mx[q] ? v : mx[q];
        }
    }
    float m = -INFINITY;
    int b = 0;
    for (; i < n; i++) {
        b |= !(x[i] <= FLT_MAX);
        m = x[i] > m ? x[i] : m;
    }
    for (int q = 0; q < LANES; q++) {
        b |= bd[q];
        m = mx[q] > m ? mx[q] : m;
    }
    *bad = b;
    return m;
}

/* Lowest i with x[i] == v (n if none). */
static size_t first_equal(const float *x, size_t n, float v)
{
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        int any = 0;
        for (int q = 0; q < LANES; q++)
            any |= x[i + q] == v;
        if (any)
            break;
    }
    for (; i < n; i++)
        if (x[i] == v)
            return i;
    return n;
}

/* ---------------------------------------------------------------------------------------
 * Candidate keys and the small sorting/selection kit.
 *
 * Candidates are 64-bit keys whose ascending order is the order a stage ranks tokens in:
 *   logit key (top-k): high half = the logit mapped to an unsigned integer in descending
 *                      order, low half = token id: "logit descending, then id ascending";
 *   mass key (top-p):  high half = the bits of the token's probability weight (>= 0, so
 *                      its bits are ordered like its value) inverted, low half = token id:
 *                      "probability descending, then id ascending".
 * Keys are distinct (the id is in them), so every order is total and ties at a top-k or
 * top-p boundary always keep the lowest ids. */

static inline uint64_t logit_key(float x, int32_t id)
{
    uint32_t u;
    x += 0.0f; /* -0 → +0: the two zeros tie and fall through to the id */
    memcpy(&u, &x, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* unsigned order == float order */
    return ((uint64_t)(uint32_t)~u << 32) | (uint32_t)id;
}

static inline uint64_t mass_key(float w, int32_t id)
{
    uint32_t u;
    memcpy(&u, &w, sizeof u);
    return ((uint64_t)(uint32_t)~u << 32) | (uint32_t)id;
}

static inline float key_mass(uint64_t k)
{
    const uint32_t u = ~(uint32_t)(k >> 32);
    float w;
    memcpy(&w, &u, sizeof w);
    return w;
}

static inline int32_t key_id(uint64_t k)
{
    return (int32_t)(uint32_t)k;
}

static inline void swap_u64(uint64_t *a, uint64_t *b)
{
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

static unsigned ilog2_sz(size_t n)
{
    unsigned r = 0;
    while (n >>= 1)
        r++;
    return r;
}

static void insertion_sort_u64(uint64_t *a, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        uint64_t v = a[i];
        size_t j = i;
        while (j > 0 && a[j - 1] > v) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
}

/* Max-heap on a[0..n): move a[i] down to its place. */
static void sift_down_u64(uint64_t *a, size_t n, size_t i)
{
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && a[c + 1] > a[c])
            c++;
        if (a[c] <= a[i])
            return;
        swap_u64(&a[c], &a[i]);
        i = c;
    }
}

static void heapsort_u64(uint64_t *a, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_down_u64(a, n, i);
    for (size_t e = n; e-- > 1;) {
        swap_u64(&a[0], &a[e]);
        sift_down_u64(a, e, 0);
    }
}

/* Partition a[0..n) (n >= 3, distinct keys) around the median of a[0], a[n/2], a[n-1];
 * returns the pivot's final index p: a[0..p) < a[p] < a(p..n). Lomuto's scheme without a
 * branch on the comparison (always swap, advance conditionally): a[i..j) holds keys >=
 * pivot, so swapping a[i] with a[j] keeps that true whichever side a[j] belongs to. */
static size_t partition_u64(uint64_t *a, size_t n)
{
    size_t mid = n / 2, last = n - 1;
    if (a[mid] < a[0])
        swap_u64(&a[mid], &a[0]);
    if (a[last] < a[0])
        swap_u64(&a[last], &a[0]);
    if (a[last] < a[mid])
        swap_u64(&a[last], &a[mid]);
    swap_u64(&a[mid], &a[last]); /* the median, as pivot, to the end */
    const uint64_t pv = a[last];
    size_t i = 0;
    for (size_t j = 0; j < last; j++) {
        const uint64_t v = a[j];
        a[j] = a[i];
        a[i] = v;
        i += v < pv;
    }
    swap_u64(&a[i], &a[last]);
    return i;
}

/* Introsort: quicksort recursing on the smaller side, heapsort past the depth limit. */
static void sort_u64_rec(uint64_t *a, size_t n, unsigned depth)
{
    while (n > SMALL_RANGE) {
        if (depth-- == 0) {
            heapsort_u64(a, n);
            return;
        }
        size_t p = partition_u64(a, n);
        if (p < n - p - 1) {
            sort_u64_rec(a, p, depth);
            a += p + 1;
            n -= p + 1;
        } else {
            sort_u64_rec(a + p + 1, n - p - 1, depth);
            n = p;
        }
    }
    insertion_sort_u64(a, n);
}

static void sort_u64(uint64_t *a, size_t n)
{
    sort_u64_rec(a, n, 2 * ilog2_sz(n) + 4);
}

/* Quickselect (Hoare's FIND): afterwards a[0..k) hold the k smallest keys, in no order.
 * Past the depth limit the remaining range is sorted (introselect). */
static void select_u64(uint64_t *a, size_t n, size_t k)
{
    size_t lo = 0, hi = n;
    unsigned depth = 2 * ilog2_sz(n) + 4;
    while (hi - lo > SMALL_RANGE) {
        if (depth-- == 0)
            break;
        size_t p = lo + partition_u64(a + lo, hi - lo);
        if (p == k || p + 1 == k)
            return;
        if (k < p)
            hi = p;
        else
            lo = p + 1;
    }
    sort_u64(a + lo, hi - lo);
}

/* Sum of the masses of mass keys a[0..n), lane by lane. */
static double mass_sum(const uint64_t *a, size_t n)
{
    double acc[LANES] = {0};
    size_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int q = 0; q < LANES; q++)
            acc[q] += key_mass(a[j + q]);
    double s = 0.0;
    for (int q = 0; q < LANES; q++)
        s += acc[q];
    for (; j < n; j++)
        s += key_mass(a[j]);
    return s;
}

/* ---------------------------------------------------------------------------------------
 * The stages */

/* Tokens of history the penalties look at (0 when every penalty is off). */
static uint32_t penalty_window(const sampler *s)
{
    const sampler_params *p = &s->params;
    if (p->repeat_last_n == 0)
        return 0;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
        p->frequency_penalty == 0.0f)
        return 0;
    uint32_t want = p->repeat_last_n < 0 ? SAMPLER_MAX_LAST_N : (uint32_t)p->repeat_last_n;
    return want < s->hist_len ? want : s->hist_len;
}

/* Validate the params, check the logits, apply the penalties. On success *lp points at the
 * logits the later stages read (logits itself when no penalty applies, else s->work) and
 * *maxp is their maximum, which is finite. */
static int prepare(sampler *s, const float *logits, const float **lp, float *maxp,
                   kv_error *err)
{
    const sampler_params *p = &s->params;
    int rc = sampler_params_validate(p, err);
    if (rc != KV_OK)
        return rc;
    if (!logits)
        return kv_error_set(err, KV_ERR_INVALID, "sampler: logits is NULL");

    const size_t n = (size_t)s->n_vocab;
    int bad;
    float mx = max_and_check(logits, n, &bad);
    if (bad) {
        for (size_t i = 0; i < n; i++)
            if (!(logits[i] <= FLT_MAX))
                return kv_error_set(err, KV_ERR_NONFINITE,
                                    "sampler: token %zu has a non-finite logit (%g)", i,
                                    (double)logits[i]);
    }

    const float *L = logits;
    const uint32_t win = penalty_window(s);
    if (win > 0) {
        float *w = s->work;
        memcpy(w, logits, n * sizeof *w);
        const float rp = p->repeat_penalty, pp = p->presence_penalty,
                    fp = p->frequency_penalty;
        const uint32_t start = (s->hist_next + SAMPLER_MAX_LAST_N - win) % SAMPLER_MAX_LAST_N;
        for (uint32_t j = 0; j < win; j++)
            s->count[s->hist[(start + j) % SAMPLER_MAX_LAST_N]]++;
        int32_t bad_tok = -1;
        float bad_old = 0.0f, bad_new = 0.0f;
        int rescan = 0;
        float raised = -INFINITY;
        for (uint32_t j = 0; j < win; j++) {
            const int32_t t = s->hist[(start + j) % SAMPLER_MAX_LAST_N];
            const int32_t c = s->count[t];
            if (c == 0)
                continue; /* already penalized (a repeat within the window) */
            s->count[t] = 0;
            const float x = w[t];
            float y = x;
            if (rp != 1.0f)
                y = y > 0.0f ? y / rp : y * rp; /* CTRL, sign-corrected as in llama.cpp */
            y -= (float)c * fp + pp;            /* OpenAI frequency + presence */
            if (!(y <= FLT_MAX) && bad_tok < 0) {
                bad_tok = t;
                bad_old = x;
                bad_new = y;
            }
            if (x == mx && y < x)
                rescan = 1; /* a token at the max went down */
            raised = y > raised ? y : raised;
            w[t] = y;
        }
        if (bad_tok >= 0)
            return kv_error_set(err, KV_ERR_NONFINITE,
                                "sampler: token %d logit %g became %g after the penalties "
                                "(repeat_penalty %g, presence_penalty %g, frequency_penalty %g)",
                                (int)bad_tok, (double)bad_old, (double)bad_new, (double)rp,
                                (double)pp, (double)fp);
        if (rescan)
            mx = max_and_check(w, n, &bad);
        else if (raised > mx)
            mx = raised;
        L = w;
    }
    if (mx == -INFINITY)
        return kv_error_set(err, KV_ERR_NONFINITE,
                            "sampler: every logit is -inf (all %d tokens masked)",
                            (int)s->n_vocab);
    *lp = L;
    *maxp = mx;
    return KV_OK;
}

/* Top-k for small k: one pass keeping the k smallest logit keys in a max-heap h[0..k).
 * Tokens are visited in ascending id, so one whose logit merely equals the heap's worst
 * can never enter (it would lose the id tie-break): a float compare against that worst
 * logit, done LANES tokens at a time, rejects almost every token. Returns the number kept
 * (fewer than k when fewer tokens are finite). */
static size_t topk_heap(const float *L, size_t n, size_t k, uint64_t *h)
{
    size_t m = 0, i = 0;
    for (; i < n && m < k; i++)
        if (L[i] > -INFINITY)
            h[m++] = logit_key(L[i], (int32_t)i);
    if (m < k)
        return m;
    for (size_t j = k / 2; j-- > 0;)
        sift_down_u64(h, k, j);
    float thr = L[key_id(h[0])];
    while (i < n) {
        if (i + LANES <= n) {
            int any = 0;
            for (int q = 0; q < LANES; q++)
                any |= L[i + q] > thr;
            if (!any) {
                i += LANES;
                continue;
            }
        }
        const size_t end = i + LANES < n ? i + LANES : n;
        for (; i < end; i++) {
            if (L[i] > thr) {
                h[0] = logit_key(L[i], (int32_t)i);
                sift_down_u64(h, k, 0);
                thr = L[key_id(h[0])];
            }
        }
    }
    return k;
}

/* Top-p (Holtzman et al. 2019) on mass keys a[0..n): reorder a so that its first c entries
 * are the smallest prefix, in key order, whose mass reaches target (= top_p × the total mass
 * of what top-k kept), and return c (>= 1; n if the target is never reached). This is a
 * quickselect on mass — partition, sum the more probable side, keep or drop it — so no full
 * sort is needed; the last small range is sorted and walked token by token. Mass is summed
 * in double; partial sums are taken in partition order rather than strictly in sorted order,
 * which can move the boundary only when the cumulative mass lands within ~1e-15 (relative)
 * of the target. */
static size_t top_p_cut(uint64_t *a, size_t n, double target)
{
    size_t lo = 0, hi = n;
    double acc = 0.0; /* mass of a[0..lo), all of which is kept */
    unsigned depth = 2 * ilog2_sz(n) + 4;
    while (hi - lo > SMALL_RANGE && depth-- > 0) {
        const size_t p = lo + partition_u64(a + lo, hi - lo);
        const double left = mass_sum(a + lo, p - lo);
        if (p > lo && acc + left >= target) {
            hi = p; /* the cut lies in a[lo..p) */
            continue;
        }
        acc += left + key_mass(a[p]);
        if (acc >= target)
            return p + 1;
        lo = p + 1;
    }
    sort_u64(a + lo, hi - lo);
    for (size_t j = lo; j < hi; j++) {
        acc += key_mass(a[j]);
        if (acc >= target)
            return j + 1;
    }
    return hi;
}

/* Run every stage but the draw. On success s->cand[0..*mp) holds the surviving token ids in
 * ascending order, s->fw[j] the final weight of s->cand[j], s->bsum the weights' sums per
 * DRAW_BLOCK, and *sump their total (>= 1: the argmax survives every stage with weight
 * exactly 1). */
static int run_chain(sampler *s, const float *logits, size_t *mp, double *sump, kv_error *err)
{
    const float *L;
    float mx;
    int rc = prepare(s, logits, &L, &mx, err);
    if (rc != KV_OK)
        return rc;

    const sampler_params *p = &s->params;
    const size_t n = (size_t)s->n_vocab;
    uint64_t *c = s->cand;
    float *w = s->prob;

    if (!(p->temperature > 0.0f)) { /* greedy: the first (lowest id) token at the max */
        c[0] = first_equal(L, n, mx);
        s->fw[0] = 1.0f;
        s->bsum[0] = 1.0;
        *mp = 1;
        *sump = 1.0;
        return KV_OK;
    }

    const int top_p_on = p->top_p < 1.0f, min_p_on = p->min_p > 0.0f;
    /* min-p (Nguyen et al. 2024) in logit space, as llama.cpp does it: p / p_max >= min_p
     * <=> logit >= max + ln(min_p). Off, the bar is -FLT_MAX, which only drops the -inf
     * (masked) tokens. */
    const float bar = min_p_on ? mx + logf(p->min_p) : -FLT_MAX;
    double z = 0.0; /* top-p's total: the softmax mass of what top-k kept */
    size_t m;
    int by_id; /* c[0..m) is in ascending id */

    if (p->top_k > 0 && (size_t)p->top_k < n) {
        /* top-k (Fan et al. 2018) */
        const size_t k = (size_t)p->top_k;
        if (k <= TOPK_HEAP_MAX) {
            m = topk_heap(L, n, k, c);
        } else {
            m = 0;
            for (size_t i = 0; i < n; i++) {
                c[m] = logit_key(L[i], (int32_t)i);
                m += L[i] > -INFINITY;
            }
            if (k < m) {
                select_u64(c, m, k);
                m = k;
            }
        }
        for (size_t j = 0; j < m; j++)
            c[j] = (uint32_t)key_id(c[j]);
        if (top_p_on) {
            for (size_t j = 0; j < m; j++) {
                const float e = exp_nonpos(L[c[j]] - mx);
                w[c[j]] = e;
                z += e;
            }
        }
        if (min_p_on) {
            size_t kept = 0;
            for (size_t j = 0; j < m; j++)
                if (L[c[j]] >= bar)
                    c[kept++] = c[j];
            m = kept;
        }
        by_id = 0;
    } else {
        if (top_p_on) {
            exp_block(L, w, n, mx, 1.0f);
            z = sum_f32(w, n);
        }
        m = 0;
        for (size_t i = 0; i < n; i++) {
            c[m] = i;
            m += L[i] >= bar;
        }
        by_id = 1;
    }
    /* Min-p before top-p keeps the same set as llama.cpp's top-p → min-p: both keep a prefix
     * of the probability order and the max, so their composition is the shorter prefix in
     * either order — provided top-p's total z is taken over the top-k set, as it is above. */

    /* top-p (Holtzman et al. 2019) */
    if (top_p_on && m > 1) {
        for (size_t j = 0; j < m; j++)
            c[j] = mass_key(w[c[j]], (int32_t)c[j]);
        m = top_p_cut(c, m, (double)p->top_p * z);
        for (size_t j = 0; j < m; j++)
            c[j] = (uint32_t)key_id(c[j]);
        by_id = 0;
    }

    /* ascending token id: the draw's order, so that the draw depends only on the surviving
     * set and the RNG, not on which stages produced it */
    if (!by_id) {
        if (m <= 64 || m <= n / 64) {
            sort_u64(c, m);
        } else {
            for (size_t j = 0; j < m; j++)
                s->mark[c[j]] = 1;
            size_t kept = 0;
            for (size_t i = 0; i < n; i++) {
                c[kept] = i;
                kept += s->mark[i];
                s->mark[i] = 0;
            }
            m = kept;
        }
    }

    /* temperature, after the truncation stages as in llama.cpp's default chain; computed as
     * (logit - max) / T, which cannot overflow where logit / T - max / T can */
    float *fw = s->fw;
    for (size_t j = 0; j < m; j++)
        fw[j] = L[c[j]];
    exp_block(fw, fw, m, mx, p->temperature);
    double sum = 0.0;
    for (size_t b = 0, j0 = 0; j0 < m; b++, j0 += DRAW_BLOCK) {
        const size_t len = m - j0 < DRAW_BLOCK ? m - j0 : DRAW_BLOCK;
        s->bsum[b] = sum_f32(fw + j0, len);
        sum += s->bsum[b];
    }
    *mp = m;
    *sump = sum;
    return KV_OK;
}

/* Inverse CDF: the first survivor (ascending id) whose cumulative weight exceeds u × sum;
 * cumulative weights are block sums up to the block, then token by token inside it. */
static int32_t draw_token(const sampler *s, size_t m, double sum, double u)
{
    const double target = u * sum;
    const float *fw = s->fw;
    double cum = 0.0;
    for (size_t b = 0, j0 = 0; j0 < m; b++, j0 += DRAW_BLOCK) {
        const double next = cum + s->bsum[b];
        if (target < next) {
            const size_t j1 = m - j0 < DRAW_BLOCK ? m : j0 + DRAW_BLOCK;
            size_t last = j0;
            for (size_t j = j0; j < j1; j++) {
                if (fw[j] > 0.0f) {
                    cum += fw[j];
                    last = j;
                    if (target < cum)
                        return (int32_t)s->cand[j];
                }
            }
            return (int32_t)s->cand[last]; /* rounding: past the block's running sum */
        }
        cum = next;
    }
    for (size_t j = m; j-- > 0;) /* rounding: target >= sum */
        if (fw[j] > 0.0f)
            return (int32_t)s->cand[j];
    return (int32_t)s->cand[0];
}

int sampler_sample(sampler *s, const float *logits, int32_t *token_out, kv_error *err)
{
    if (!s || !token_out)
        return kv_error_set(err, KV_ERR_INVALID, "sampler: %s is NULL",
                            !s ? "sampler" : "token_out");
    size_t m;
    double sum;
    int rc = run_chain(s, logits, &m, &sum, err);
    if (rc != KV_OK)
        return rc;
    if (!(s->params.temperature > 0.0f)) {
        *token_out = (int32_t)s->cand[0];
        return KV_OK;
    }
    *token_out = draw_token(s, m, sum, sampler_rng_uniform(&s->rng));
    return KV_OK;
}

int sampler_dist(sampler *s, const float *logits, int32_t *ids, float *probs, int32_t *n_out,
                 kv_error *err)
{
    if (!s || !ids || !probs || !n_out)
        return kv_error_set(err, KV_ERR_INVALID, "sampler: NULL argument to sampler_dist");
    size_t m;
    double sum;
    int rc = run_chain(s, logits, &m, &sum, err);
    if (rc != KV_OK)
        return rc;
    for (size_t j = 0; j < m; j++) {
        ids[j] = (int32_t)s->cand[j];
        probs[j] = (float)(s->fw[j] / sum);
    }
    *n_out = (int32_t)m;
    return KV_OK;
}

int sampler_penalize(sampler *s, const float *logits, float *out, kv_error *err)
{
    if (!s || !out)
        return kv_error_set(err, KV_ERR_INVALID, "sampler: NULL argument to sampler_penalize");
    const float *L;
    float mx;
    int rc = prepare(s, logits, &L, &mx, err);
    if (rc != KV_OK)
        return rc;
    if (L != out)
        memmove(out, L, (size_t)s->n_vocab * sizeof *out);
    return KV_OK;
}
