/* large_blocks.c: the two large-block patterns of issue 14, through plain
 * malloc so that each allocator runs it under LD_PRELOAD:
 *   grow     realloc one buffer from 16 KiB to 64 MiB in 16 KiB steps,
 *            touching the new tail each time;
 *   calloc   8 x calloc(1 GiB), reading one byte per 4 KiB page of each
 *            (all must be zero), then free.
 * Prints seconds and minor faults of the pattern. Build and run:
 *   gcc -O2 benchmarks/large_blocks.c -o /tmp/large_blocks
 *   LD_PRELOAD=... /usr/bin/time -f '%e s %M KB' /tmp/large_blocks grow
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static long faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "grow";
    double t0 = now();
    long f0 = faults();
    unsigned long check = 0;
    if (strcmp(what, "grow") == 0) {
        char *p = NULL;
        for (size_t n = 16384; n <= ((size_t)64 << 20); n += 16384) {
            p = realloc(p, n);
            if (!p) return 1;
            memset(p + n - 16384, (int)(n >> 14), 16384);
        }
        for (size_t i = 0; i < ((size_t)64 << 20); i += 16384) check += (unsigned char)p[i];
        free(p);
    } else if (strcmp(what, "calloc") == 0) {
        for (int k = 0; k < 8; k++) {
            unsigned char *p = calloc(1, (size_t)1 << 30);
            if (!p) return 1;
            for (size_t i = 0; i < ((size_t)1 << 30); i += 4096) check += p[i];
            free(p);
        }
    } else {
        fprintf(stderr, "usage: large_blocks grow|calloc\n");
        return 2;
    }
    printf("%s: %.3f s, %ld minor faults, check %lu\n", what, now() - t0, faults() - f0, check);
    return 0;
}
