/* fuzz_config: libFuzzer harness for config.ini parsing (app/config.c: config_load_file through
 * inih, every key's value checks), then config_apply and config_print of the result. */
#include "fuzz_util.h"

#include "app/config.h"
#include "engine/generate.h"
#include "engine/sampler.h"

static void warn(void *ud, const char *msg) { (void)ud; (void)msg; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16) return 0;
    char path[64];
    if (fuzz_as_file(data, size, path, sizeof path)) return 0;
    kv_config c;
    config_init(&c);
    (void)config_load_file(&c, path, warn, NULL);
    engine_params ep;
    sampler_params sp;
    int n_predict = 0;
    engine_params_default(&ep);
    sampler_params_default(&sp);
    config_apply(&c, &ep, &sp, &n_predict);
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull) {
        config_print(&c, devnull, NULL);
        fclose(devnull);
    }
    config_free(&c);
    return 0;
}
