/* testisa: run a cmocka group once per kernel level this CPU supports (or only the level KVCHAT_ISA names), so every SIMD path is tested against the references wherever the machine can run it. */
#ifndef KV_TESTISA_H
#define KV_TESTISA_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

/* Runs tests[0..n) as group "<group> @<level>" for each level (kern_select before each run);
 * returns the number of failed tests over all levels. */
int tu_run_every_isa(const char *group, const struct CMUnitTest *tests, size_t n, CMFixtureFunction setup,
                     CMFixtureFunction teardown);

#endif
