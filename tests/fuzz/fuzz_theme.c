/* fuzz_theme: libFuzzer harness for theme files (ui/theme.c: ui_theme_load_file, every style
 * spec through ui_theme_parse_style); the input is also parsed as one style spec. */
#include "fuzz_util.h"

#include "ui/theme.h"

static void warn(void *ud, const char *msg) { (void)ud; (void)msg; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16) return 0;
    char path[64];
    if (fuzz_as_file(data, size, path, sizeof path)) return 0;
    ui_theme t;
    char why[512];
    (void)ui_theme_load_file(path, &t, warn, NULL, why, sizeof why);
    char *spec = fuzz_strndup(data, size);
    if (spec) {
        ui_style st;
        (void)ui_theme_parse_style(spec, &st, why, sizeof why);
        free(spec);
    }
    return 0;
}
