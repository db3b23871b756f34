/* gen_stats: what a generation reports — why it ended and its timings; no model internals, so the UI can show them. */
#ifndef KV_GEN_STATS_H
#define KV_GEN_STATS_H

/* Why a generation ended. */
enum gen_finish {
    GEN_FINISH_NONE = 0,
    GEN_FINISH_EOG,       /* the model produced an end-of-generation token */
    GEN_FINISH_LENGTH,    /* n_predict tokens were produced */
    GEN_FINISH_CONTEXT,   /* the KV cache is full */
    GEN_FINISH_CANCELLED, /* the caller asked to stop */
    GEN_FINISH_ERROR,     /* see the kv_error */
    GEN_FINISH_STOP,      /* a stop string appeared (on_text returned 2) */
};
const char *gen_finish_name(int finish);

/* Timings of one request, milliseconds and tokens per second (wall clock, CLOCK_MONOTONIC). */
typedef struct gen_stats {
    int n_prompt;          /* prompt tokens of the request */
    int n_reused;          /* of which were already in the KV cache (prefix reuse) */
    int n_prefilled;       /* = n_prompt - n_reused */
    int n_generated;       /* tokens sampled (including a final end-of-generation token) */
    double ttft_ms;        /* request start → first token sampled (prefill + first sample) */
    double prefill_ms;
    double prefill_tps;    /* n_prefilled / prefill time */
    double decode_ms;      /* time in single-token forward passes + sampling after the first token */
    double decode_tps;     /* tokens per second after the first */
    double itl_ms_mean;    /* inter-token latency: mean gap between consecutive tokens */
    double itl_ms_max;
    int n_reused_hash;     /* of n_reused, positions adopted from the prefix-hash table (blocks
                              of other or freed sequences) rather than this sequence's own */
    int n_truncated;       /* prompt tokens dropped to fit the context (gen_opts.truncate_prompt) */
    int n_keep;            /* positions a context shift keeps (the resolved gen_opts.n_keep) */
    int n_shifts;          /* context shifts during the request */
    int n_discarded;       /* positions they dropped */
    int n_drafted;         /* speculative decoding: tokens drafted, */
    int n_accepted;        /* of which the target accepted, */
    int n_verify;          /* in this many verification passes (forward calls after the first token) */
    int draft_stopped;     /* 1: the draft model cost at least a target step per token (measured): it
                              stopped drafting (engine/speculate.h spec_time) */
} gen_stats;

#endif
