/* meters: the one-line widgets — status bar (model, threads, theme, state), KV-cache gauge, stats line (TTFT, prefill/decode tokens/s, ITL). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ui_internal.h"

void draw_status(ui *u, int y, int w);
void draw_gauge(ui *u, int y, int w);
void draw_stats(ui *u, int y, int w);

void draw_status(ui *u, int y, int w)
{
    attr_t st = u->attr[UI_EL_STATUS], acc = u->attr[UI_EL_STATUS_ACCENT];
    ui_fill(u, y, 0, w, " ", st);
    const char *sep = ui_glyph(u, " │ ", " | ");
    char right[220];
    attr_t ra = acc;
    if (u->flash[0]) snprintf(right, sizeof right, " %s ", u->flash);
    else if (u->busy)
        snprintf(right, sizeof right, " %s %s ", ui_glyph(u, "●", "*"),
                 u->stopping ? ui_glyph(u, "stopping…", "stopping...")
                 : u->phase == UI_PHASE_PREFILL ? "prefilling" : u->phase == UI_PHASE_DECODE ? "generating" : "working");
    else {
        if (w >= 100) snprintf(right, sizeof right, "%sready%sF1 help ", sep, sep);
        else snprintf(right, sizeof right, "%sready ", sep);
        ra = st;
    }
    int rw = ui_text_width(right, strlen(right));
    if (rw > w - 10) rw = w - 10 > 0 ? w - 10 : 0;
    /* items after the model name, dropped from the end until the bar fits */
    char items[7][64];
    int n_items = 0;
    snprintf(items[n_items++], 64, "%s %s", u->arch, u->weight_type);
    if (u->params[0]) snprintf(items[n_items++], 64, "%s", u->params);
    snprintf(items[n_items++], 64, "ctx %d", u->n_ctx);
    snprintf(items[n_items++], 64, "%d thread%s", u->n_threads, u->n_threads == 1 ? "" : "s");
    snprintf(items[n_items++], 64, "%s", u->mode);
    snprintf(items[n_items++], 64, "theme %.40s%s", u->theme.name, u->mono ? " (mono)" : "");
    char head[80];
    snprintf(head, sizeof head, " kvchat%s", sep);
    int avail = w - rw - 1;
    int used = ui_text_width(head, strlen(head)) + ui_text_width(u->model_name, strlen(u->model_name));
    int sw = ui_text_width(sep, strlen(sep));
    int keep = 0;
    for (int i = 0; i < n_items; i++) {
        int iw = sw + ui_text_width(items[i], strlen(items[i]));
        if (used + iw > avail) break;
        used += iw;
        keep++;
    }
    int x = ui_puts(u, y, 0, avail, head, st);
    x += ui_puts(u, y, x, avail - x, u->model_name, acc);
    for (int i = 0; i < keep; i++) {
        x += ui_puts(u, y, x, avail - x, sep, st);
        x += ui_puts(u, y, x, avail - x, items[i], st);
    }
    ui_put(u, y, w - rw, rw, right, strlen(right), ra);
}

/* Bytes in the unit that fits ("812 KiB", "3.25 MiB", "1.20 GiB"): never "0.00 MiB" for a
 * cache that holds tokens. */
static void fmt_size(char *buf, size_t cap, size_t bytes)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 3) v /= 1024, u++;
    if (u == 0 || v >= 100) snprintf(buf, cap, "%.0f %s", v, unit[u]);
    else if (v >= 10) snprintf(buf, cap, "%.1f %s", v, unit[u]);
    else snprintf(buf, cap, "%.2f %s", v, unit[u]);
}

/* The gauge's label in form 0 (full words) to 3 (shortest). */
static void gauge_label(int form, int n_tok, int n_ctx, int pct, const char *used, const char *resv, const char *reuse,
                        const char *d, char *text, size_t cap)
{
    if (form == 0) snprintf(text, cap, " %d / %d tokens (%d%%)%s%s / %s%s", n_tok, n_ctx, pct, d, used, resv, reuse);
    else if (form == 1) snprintf(text, cap, " %d/%d tok %d%%%s%s/%s%s", n_tok, n_ctx, pct, d, used, resv, reuse);
    else if (form == 2) snprintf(text, cap, " %d/%d tok%s%s/%s", n_tok, n_ctx, d, used, resv);
    else snprintf(text, cap, " %d/%d %s/%s", n_tok, n_ctx, used, resv);
}

void draw_gauge(ui *u, int y, int w)
{
    attr_t t = u->attr[UI_EL_STATS];
    int n_tok = u->have_kv ? u->kv.n_tokens : 0;
    int n_ctx = u->have_kv ? u->kv.n_ctx : u->n_ctx;
    double f = n_ctx > 0 ? (double)n_tok / n_ctx : 0;
    char used[32], resv[32], text[160];
    fmt_size(used, sizeof used, u->have_kv ? u->kv.bytes_used : 0);
    fmt_size(resv, sizeof resv, u->have_kv ? u->kv.bytes_reserved : 0);
    int pct = (int)floor(f * 100 + 0.5);
    const char *d = ui_glyph(u, " · ", " - ");
    char reuse[64] = "";
    if (u->have_stats) snprintf(reuse, sizeof reuse, "%sreused %d + new %d", d, u->stats.n_reused, u->stats.n_prefilled);
    /* the widest form that leaves a bar of 10 cells */
    /* The label's widest form that leaves a bar of 10 cells. The bar's width comes from the
     * widest label of that form (every count at n_ctx, the sizes at the reserve), so the bar
     * keeps its width as the numbers grow. */
    char reuse_max[64] = "";
    snprintf(reuse_max, sizeof reuse_max, "%sreused %d + new %d", d, n_ctx, n_ctx); /* room for it from the start */
    int form = 0, tw_max = 0;
    for (; form < 4; form++) {
        gauge_label(form, n_ctx, n_ctx, 100, resv, resv, reuse_max, d, text, sizeof text);
        tw_max = ui_text_width(text, strlen(text));
        if (w - 4 - tw_max >= 10) break;
    }
    if (form == 4) form = 3;
    gauge_label(form, n_tok, n_ctx, pct, used, resv, reuse, d, text, sizeof text);
    int tw = ui_text_width(text, strlen(text));
    if (tw > tw_max) tw_max = tw;
    int x = ui_puts(u, y, 0, w, "KV ", u->attr[UI_EL_TITLE]);
    int bw = w - x - tw_max - 1;
    if (bw > 60) bw = 60;
    if (bw >= 4) {
        int el = pct >= u->theme.gauge_high_pct ? UI_EL_GAUGE_HIGH
                 : pct >= u->theme.gauge_mid_pct ? UI_EL_GAUGE_MID : UI_EL_GAUGE_LOW;
        attr_t fill = u->attr[el], track = u->attr[UI_EL_GAUGE_TRACK];
        double cells = f * bw;
        int full = (int)cells;
        if (full > bw) full = bw;
        ui_fill(u, y, x, full, ui_glyph(u, "█", "#"), fill);
        int k = full;
        if (full < bw) {
            int eighths = (int)((cells - full) * 8);
            static const char *const part[8] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
            if (eighths > 0 && u->unicode) {
                ui_puts(u, y, x + k, 1, part[eighths], fill);
                k++;
            }
            ui_fill(u, y, x + k, bw - k, ui_glyph(u, "░", "."), track);
        }
        x += bw;
    }
    ui_puts(u, y, x, w - x, text, t);
}

void draw_stats(ui *u, int y, int w)
{
    attr_t a = u->attr[UI_EL_STATS];
    char s[400];
    const char *d = ui_glyph(u, " · ", " | ");
    if (!u->have_stats) {
        snprintf(s, sizeof s, " Enter sends%sAlt-Enter new line%sF2 / Tab sliders%sF1 help%sEsc stops a reply", d, d, d,
                 d);
        ui_puts(u, y, 0, w, s, u->attr[UI_EL_NOTICE]);
        return;
    }
    const gen_stats *st = &u->stats;
    if (u->phase == UI_PHASE_PREFILL) {
        const char *stop = u->stopping ? ui_glyph(u, "stopping… ", "stopping... ") : "";
        if (u->prefill_total > 0)
            snprintf(s, sizeof s, " %sprefill %d / %d%s%d reused from the KV cache", stop, u->prefill_done,
                     u->prefill_total, d, st->n_reused);
        else
            snprintf(s, sizeof s, " %sprefill: %d new tokens%s%d reused from the KV cache", stop, st->n_prefilled, d,
                     st->n_reused);
        ui_puts(u, y, 0, w, s, a);
        return;
    }
    /* a rate over a handful of new tokens after a cache hit is noise (one token's forward pass
     * and the first sample): say "cached" with the reused count instead */
    char pf[48];
    if (st->n_reused > 0 && st->n_prefilled < 8) snprintf(pf, sizeof pf, "cached (%d)", st->n_reused);
    else snprintf(pf, sizeof pf, "%.0f t/s", st->prefill_tps);
    /* the widest form that fits: full words, then without the finish, then abbreviated */
    const char *fin = u->finish[0] ? u->finish : NULL;
    for (int form = 0; form < 4; form++) {
        if (form == 0 || form == 1)
            snprintf(s, sizeof s, " TTFT %.0f ms%sprefill %s%sdecode %.1f t/s%sITL %.1f ms%s%d tokens%s%s",
                     st->ttft_ms, d, pf, d, st->decode_tps, d, st->itl_ms_mean, d, st->n_generated,
                     form == 0 && fin ? d : "", form == 0 && fin ? fin : "");
        else if (form == 2)
            snprintf(s, sizeof s, " TTFT %.0fms%sprefill %s%sdecode %.1f t/s%sITL %.1fms%s%d tok", st->ttft_ms, d,
                     pf, d, st->decode_tps, d, st->itl_ms_mean, d, st->n_generated);
        else
            snprintf(s, sizeof s, " decode %.1f t/s%sTTFT %.0fms%sITL %.1fms", st->decode_tps, d, st->ttft_ms, d,
                     st->itl_ms_mean);
        if (ui_text_width(s, strlen(s)) <= w) break;
    }
    ui_puts(u, y, 0, w, s, a);
}
