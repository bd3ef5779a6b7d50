/* check.h: the tiny test harness of kpool's C tests.
 * CHECK(cond) counts a check and reports a failure with its line; RUN(fn)
 * runs one test function; DONE() prints the totals and returns the exit
 * status (0 only if every check passed). */
#ifndef KP_CHECK_H
#define KP_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int check_total, check_failed;
static const char *check_test = "";

#define CHECK(cond) do { check_total++; if (!(cond)) { check_failed++; \
    fprintf(stderr, "FAIL %s:%d in %s: %s\n", __FILE__, __LINE__, check_test, #cond); } } while (0)
#define CHECK_EQ(a, b) do { long long va_ = (long long)(a), vb_ = (long long)(b); check_total++; \
    if (va_ != vb_) { check_failed++; fprintf(stderr, "FAIL %s:%d in %s: %s == %s (%lld != %lld)\n", \
    __FILE__, __LINE__, check_test, #a, #b, va_, vb_); } } while (0)
#define RUN(fn) do { check_test = #fn; int before_ = check_failed; fn(); \
    printf("%s %s\n", check_failed == before_ ? "ok  " : "FAIL", #fn); fflush(stdout); } while (0)
#define DONE() (printf("%d passed, %d failed\n", check_total - check_failed, check_failed), check_failed != 0)

#endif
