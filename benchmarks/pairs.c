/* pairs.c: ns per malloc/free pair of 32 B, kpool against the process's
 * malloc (glibc, or a peer under LD_PRELOAD), in one process, interleaved
 * round by round, median and range over rounds.
 *
 *   make -C csrc
 *   cc -O2 -Icsrc/include benchmarks/pairs.c -o /tmp/pairs -Lcsrc/build -lkpool -Wl,-rpath,$PWD/csrc/build
 *   /tmp/pairs [PAIRS_PER_ROUND] [ROUNDS]
 */
#define _POSIX_C_SOURCE 200809L
#include "kpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define ROUND(name, ALLOC, FREE) do {                                       \
        double t0 = now();                                                  \
        for (long i = 0; i < n; i++) {                                      \
            void *p = ALLOC;                                                \
            __asm__ volatile("" : : "r"(p) : "memory");                     \
            FREE;                                                           \
        }                                                                   \
        name[r] = (now() - t0) * 1e9 / (double)n;                           \
    } while (0)

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000000;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (n < 1 || rounds < 1 || rounds > 100) return 2;
    double kp[100], kps[100], sys[100];
    free(malloc(32));
    kp_free(kp_malloc(32));
    for (int r = 0; r < rounds; r++) {
        if (r % 2) {
            ROUND(sys, malloc(32), free(p));
            ROUND(kp, kp_malloc(32), kp_free(p));
            ROUND(kps, kp_malloc(32), kp_free_sized(p, 32));
        } else {
            ROUND(kp, kp_malloc(32), kp_free(p));
            ROUND(kps, kp_malloc(32), kp_free_sized(p, 32));
            ROUND(sys, malloc(32), free(p));
        }
    }
    qsort(kp, (size_t)rounds, sizeof(double), cmp);
    qsort(kps, (size_t)rounds, sizeof(double), cmp);
    qsort(sys, (size_t)rounds, sizeof(double), cmp);
    printf("%ld pairs of 32 B per round, %d rounds, interleaved; ns per pair, median [min-max]\n", n, rounds);
    printf("kp_malloc + kp_free        %6.2f [%.2f-%.2f]\n", kp[rounds / 2], kp[0], kp[rounds - 1]);
    printf("kp_malloc + kp_free_sized  %6.2f [%.2f-%.2f]\n", kps[rounds / 2], kps[0], kps[rounds - 1]);
    printf("malloc + free (process's)  %6.2f [%.2f-%.2f]\n", sys[rounds / 2], sys[0], sys[rounds - 1]);
    return 0;
}
