/* controls: the sampling sliders panel (F2) — temperature, top-p, top-k, min-p, repeat penalty, max tokens — and its keys (controls_key). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ui_internal.h"

void controls_init(ui *u, const ui_slider_spec *spec, int n_ctx)
{
    slider *s = u->sliders;
    if (spec) {
        for (int i = 0; i < UI_SL_COUNT; i++) {
            const ui_slider_spec *p = &spec[i];
            s[i] = (slider){p->label, p->min, p->max, p->step, p->off_label ? p->off_value : p->min, p->decimals,
                            p->off_value, p->off_label, p->log};
        }
        if (s[UI_SL_MAX_TOKENS].log && n_ctx > s[UI_SL_MAX_TOKENS].max) s[UI_SL_MAX_TOKENS].max = n_ctx;
        return;
    }
    s[UI_SL_TEMP] = (slider){"temperature", 0, 2, 0.05, 0.8, 2, 0, "greedy", 0};
    s[UI_SL_TOP_P] = (slider){"top-p", 0, 1, 0.01, 0.95, 2, 1, "off", 0};
    s[UI_SL_TOP_K] = (slider){"top-k", 0, 200, 1, 40, 0, 0, "off", 0};
    s[UI_SL_MIN_P] = (slider){"min-p", 0, 1, 0.01, 0.05, 2, 0, "off", 0};
    s[UI_SL_REPEAT] = (slider){"repeat penalty", 1, 2, 0.05, 1, 2, 1, "off", 0};
    s[UI_SL_MAX_TOKENS] = (slider){"max tokens", 16, n_ctx > 16 ? n_ctx : 4096, 1, 0, 0, 0, "∞", 1};
}

void controls_format(const slider *s, char *buf, size_t cap)
{
    if (s->off_label && fabs(s->value - s->off_value) < 1e-9) {
        snprintf(buf, cap, "%s", s->off_label);
    } else if (s->decimals) {
        snprintf(buf, cap, "%.*f", s->decimals, s->value);
    } else {
        snprintf(buf, cap, "%.0f", s->value);
    }
}

/* A log slider has LOG_STEPS positions from min to max (each about 1.26x the one before), then
 * one more for off_value (∞); these map a value to its position and back. */
#define LOG_STEPS 30
static int log_pos(const slider *s, double v)
{
    if (s->off_label && fabs(v - s->off_value) < 1e-9) return LOG_STEPS + 1;
    if (v <= s->min) return 0;
    if (v >= s->max) return LOG_STEPS;
    return (int)lround(LOG_STEPS * log(v / s->min) / log(s->max / s->min));
}

static double log_value(const slider *s, int pos)
{
    if (pos > LOG_STEPS) return s->off_value;
    if (pos <= 0) return s->min;
    if (pos >= LOG_STEPS) return s->max;
    return round(s->min * pow(s->max / s->min, (double)pos / LOG_STEPS));
}

/* Where the knob sits, 0 (left) to 1 (right). */
static double slider_fraction(const slider *s)
{
    if (s->log) return log_pos(s, s->value) / (double)(LOG_STEPS + 1);
    return (s->value - s->min) / (s->max - s->min);
}

void controls_adjust(ui *u, int steps, int to_end)
{
    slider *s = &u->sliders[u->sel_slider];
    double v;
    if (s->log) {
        int pos = to_end < 0 ? 0 : to_end > 0 ? LOG_STEPS + 1 : log_pos(s, s->value) + steps;
        if (pos < 0) pos = 0;
        if (pos > LOG_STEPS + 1) pos = LOG_STEPS + 1;
        v = log_value(s, pos);
        if (v == s->value) return;
        s->value = v;
        ui_mark_dirty(u);
        if (u->cb.slider) u->cb.slider(u->cb.ud, u->sel_slider, v);
        return;
    }
    if (to_end < 0) v = s->min;
    else if (to_end > 0) v = s->max;
    else {
        /* snap to the grid, then move: an off-grid value from the command line (0.8 + 0.03)
         * goes to its neighbour on the grid in the direction asked; a value that is on the grid
         * but came through a float (top-p 0.95f = 0.94999999: k = 94.9999988) counts as on it */
        double k = (s->value - s->min) / s->step;
        double base = steps > 0 ? floor(k + 1e-4) : ceil(k - 1e-4);
        v = s->min + (base + steps) * s->step;
    }
    if (v < s->min) v = s->min;
    if (v > s->max) v = s->max;
    if (s->decimals) {
        double sc = pow(10, s->decimals);
        v = round(v * sc) / sc;
    } else {
        v = round(v);
    }
    if (v == s->value) return;
    s->value = v;
    ui_mark_dirty(u);
    if (u->cb.slider) u->cb.slider(u->cb.ud, u->sel_slider, v);
}

void ui_set_slider(ui *u, int id, double value)
{
    if (id < 0 || id >= UI_SL_COUNT) return;
    u->sliders[id].value = value;
    ui_mark_dirty(u);
}

/* A bar of w cells filled to fraction f, with a knob at the value. */
static void draw_bar(ui *u, int y, int x, int w, double f, int focused)
{
    if (w < 3) return;
    if (f < 0) f = 0;
    if (f > 1) f = 1;
    int knob = (int)lround(f * (w - 1));
    attr_t fill = u->attr[UI_EL_SLIDER], track = u->attr[UI_EL_SLIDER_TRACK];
    if (knob > 0) ui_fill(u, y, x, knob, ui_glyph(u, "━", "="), fill);
    ui_puts(u, y, x + knob, 1, ui_glyph(u, "●", "O"), fill | (focused ? A_BOLD : 0));
    if (w - knob - 1 > 0) ui_fill(u, y, x + knob + 1, w - knob - 1, ui_glyph(u, "─", "-"), track);
}

void controls_draw(ui *u, int y, int x, int h, int w)
{
    if (h <= 0 || w < 10) return;
    int focused = u->focus == FOCUS_PANEL;
    attr_t title = u->attr[UI_EL_TITLE];
    char t[64];
    snprintf(t, sizeof t, "%s", focused ? "Sampling  ←→ ↑↓" : "Sampling (F2)");
    if (!u->unicode && focused) snprintf(t, sizeof t, "Sampling  <> ^v");
    ui_puts(u, y, x + 1, w - 2, t, title | (focused ? A_UNDERLINE : 0));
    int rows = h - 1;
    /* Two rows per slider (label and value, bar) when they fit, else one (label, value). */
    int two = rows >= 2 * UI_SL_COUNT;
    int row = y + 1;
    for (int i = 0; i < UI_SL_COUNT && row < y + h; i++) {
        const slider *s = &u->sliders[i];
        int sel = i == u->sel_slider;
        attr_t la = sel && focused ? u->attr[UI_EL_SLIDER_FOCUS] : u->attr[UI_EL_TEXT];
        char val[32];
        controls_format(s, val, sizeof val);
        int vw = ui_text_width(val, strlen(val));
        /* label row: "› temperature      0.80" */
        if (sel && focused) ui_fill(u, row, x + 1, w - 2, " ", la);
        ui_puts(u, row, x + 1, 2, sel ? ui_glyph(u, "›", ">") : " ", la);
        ui_puts(u, row, x + 3, w - 5 - vw, s->label, la);
        ui_puts(u, row, x + w - 1 - vw, vw, val, la | A_BOLD);
        row++;
        if (two && row < y + h) {
            double f = slider_fraction(s);
            draw_bar(u, row, x + 3, w - 4, f, sel && focused);
            row++;
        }
    }
}

int controls_key(ui *u, int is_key, wint_t c)
{
    if (!is_key) { /* + and - move the selected slider; other characters are the screen's */
        if (c == '+' || c == '=') controls_adjust(u, +1, 0);
        else if (c == '-') controls_adjust(u, -1, 0);
        else return 0;
        return 1;
    }
    switch (c) {
    case KEY_UP: u->sel_slider = (u->sel_slider + UI_SL_COUNT - 1) % UI_SL_COUNT; u->dirty = 1; break;
    case KEY_DOWN: u->sel_slider = (u->sel_slider + 1) % UI_SL_COUNT; u->dirty = 1; break;
    case KEY_LEFT: controls_adjust(u, -1, 0); break;
    case KEY_RIGHT: controls_adjust(u, +1, 0); break;
    case KEYX_CTRL_LEFT: controls_adjust(u, -10, 0); break;
    case KEYX_CTRL_RIGHT: controls_adjust(u, +10, 0); break;
    case KEY_HOME: controls_adjust(u, 0, -1); break;
    case KEY_END: controls_adjust(u, 0, +1); break;
    case KEY_ENTER: u->focus = FOCUS_INPUT; u->dirty = 1; break;
    default: break; /* the panel swallows the other keys */
    }
    return 1;
}
