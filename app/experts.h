/* experts: the text of `/show experts` — a per-layer histogram of a mixture-of-experts model's expert choices. */
#ifndef KV_EXPERTS_H
#define KV_EXPERTS_H

#include <stddef.h>
#include <stdint.h>

/* Write into buf (NUL-terminated, cut to cap) one line per layer for counts[il * n_expert + e]
 * (selections of expert e by layer il, engine_expert_counts): "L 3 ▁▅█▂…  41/128 used · top e17 9% e3 7%
 * e88 6%" — a bar per expert (per pair of experts when n_expert > 64, the larger of the two; the
 * tallest bar is the layer's most used expert), how many experts were used at all, and the three
 * most used with their share of the layer's selections; ascii = 1 draws the bars with " .:-=+*#%@".
 * A header names the total selections. Returns the bytes written (0: no counts at all). */
size_t experts_report(const uint32_t *counts, int n_layer, int n_expert, int ascii, char *buf, size_t cap);

#endif
