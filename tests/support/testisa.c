/* testisa: a cmocka group per kernel level (see testisa.h). */
#include "tests/support/testisa.h"

#include <stdio.h>
#include <stdlib.h>

#include "engine/kernels/kernels.h"

int tu_run_every_isa(const char *group, const struct CMUnitTest *tests, size_t n, CMFixtureFunction setup,
                     CMFixtureFunction teardown)
{
    const char *env = getenv("KVCHAT_ISA");
    int only = env && *env ? kern_isa_parse(env) : -1, failed = 0, ran = 0;
    for (int isa = 0; isa < KERN_ISA_COUNT; isa++) {
        if ((only >= 0 && isa != only) || kern_select((kern_isa)isa)) continue;
        char name[96];
        snprintf(name, sizeof name, "%s @%s", group, kern_isa_name((kern_isa)isa));
        printf("== %s\n", name);
        fflush(stdout);
        failed += _cmocka_run_group_tests(name, tests, n, setup, teardown);
        ran++;
    }
    if (!ran) {
        fprintf(stderr, "%s: KVCHAT_ISA=%s is not a level this CPU runs\n", group, env ? env : "");
        return 1;
    }
    return failed;
}
