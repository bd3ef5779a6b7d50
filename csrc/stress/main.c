/* main.c: kpool-stress, the stand-alone stress driver (DESIGN.md section 5).
 *
 * usage: kpool-stress [--workload W] [--allocator A] [--threads N] [--ops N]
 *                     [--seed N] [--verify|--no-verify] [--size N]
 *                     [--burst-bytes N] [--duration S] [--repeat N] | --list | --help
 *
 * Job: parse the arguments into a kps_config, run the measurement (repeat
 * times) through stress.c and print one JSON object per measurement on its
 * own line on stdout. kpool.bench starts it once per measurement, with peers
 * under LD_PRELOAD and --allocator system.
 * Exit status: 0 ok, 1 the run failed (allocation failure, threads), 2 bad
 * arguments, 3 verification found damaged or overlapping blocks.
 * Defaults: mixed, kpool, 1 thread, 1000000 ops, seed 1, verify off (this
 * is the timing tool; kpool.stress() verifies by default).
 * Signals: SIGINT/SIGTERM set a flag (the handler does nothing else); the
 * main thread polls it between kps_wait calls and calls kps_stop, so the
 * workers stop early and the JSON still comes out, with "stopped": true.
 * --duration S stops each measurement after S seconds the same way
 * ("stop_reason": "duration"; "ops" counts what was done).
 */
#include "stress.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
    (void)sig;
    interrupted = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: kpool-stress [--workload W] [--allocator A] [--threads N] [--ops N]\n"
            "                    [--seed N] [--verify|--no-verify] [--size N] [--burst-bytes N]\n"
            "                    [--duration S] [--repeat N] | --list | --help\n"
            "  --workload     pairs mixed random larson prodcons burst frag (default mixed)\n"
            "  --allocator    kpool kpool-pool system null (default kpool); peers: system under LD_PRELOAD\n"
            "  --threads      worker threads (default 1)\n"
            "  --ops          operations over all threads (default 1000000; frag: small blocks)\n"
            "  --seed         RNG seed (default 1)\n"
            "  --verify       stamp and check every block (default off)\n"
            "  --size         block size for pairs (default 32)\n"
            "  --burst-bytes  total bytes for burst (default 1 GiB)\n"
            "  --duration     stop each measurement after S seconds (default: no limit)\n"
            "  --repeat       measurements to print (default 1)\n"
            "  --list         print the workloads and allocators as JSON\n"
            "exit: 0 ok, 1 run failed, 2 bad arguments, 3 corruption found\n");
}

/* Parse a non-negative integer with an optional k/m/g suffix (powers of 2). */
static int parse_u64(const char *s, unsigned long long *out) {
    if (!s || !*s || *s == '-') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s) return -1;
    unsigned shift = 0;
    if (*end == 'k' || *end == 'K') shift = 10;
    else if (*end == 'm' || *end == 'M') shift = 20;
    else if (*end == 'g' || *end == 'G') shift = 30;
    if (shift) end++;
    if (*end) return -1;
    if (shift && v > (~0ull >> shift)) return -1;
    *out = v << shift;
    return 0;
}

static void print_list(void) {
    printf("{\"workloads\":[");
    for (int i = 0; kps_workloads[i]; i++) printf("%s\"%s\"", i ? "," : "", kps_workloads[i]);
    printf("],\"allocators\":[");
    for (int i = 0; kps_allocators[i]; i++) printf("%s\"%s\"", i ? "," : "", kps_allocators[i]);
    printf("]}\n");
}

int main(int argc, char **argv) {
    kps_config cfg = {.workload = "mixed", .allocator = "kpool", .threads = 1, .ops = 1000000, .seed = 1};
    unsigned long long repeat = 1, v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        char flag[32];
        const char *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) == 0 && eq && (size_t)(eq - a) < sizeof flag) {
            memcpy(flag, a, (size_t)(eq - a));
            flag[eq - a] = 0;
            val = eq + 1;
            a = flag;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--list")) {
            print_list();
            return 0;
        }
        if (!strcmp(a, "--verify") && !val) { cfg.verify = 1; continue; }
        if (!strcmp(a, "--no-verify") && !val) { cfg.verify = 0; continue; }
        static const char *const with_value[] = {"--workload", "--allocator", "--threads", "--ops", "--seed",
                                                 "--size", "--burst-bytes", "--duration", "--repeat", NULL};
        int known = 0;
        for (int k = 0; with_value[k]; k++) known |= !strcmp(a, with_value[k]);
        if (!known) {
            fprintf(stderr, "kpool-stress: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kpool-stress: %s needs a value\n", a);
                return 2;
            }
            val = argv[++i];
        }
        if (!strcmp(a, "--workload")) { cfg.workload = val; continue; }
        if (!strcmp(a, "--allocator")) { cfg.allocator = val; continue; }
        if (!strcmp(a, "--duration")) {
            char *end;
            errno = 0;
            double d = strtod(val, &end);
            if (errno || end == val || *end || !(d >= 1e-3 && d <= 1e9)) {
                fprintf(stderr, "kpool-stress: --duration: '%s' is not a number of seconds in 0.001..1e9\n", val);
                return 2;
            }
            cfg.duration = d;
            continue;
        }
        if (parse_u64(val, &v) != 0) {
            fprintf(stderr, "kpool-stress: %s: '%s' is not a non-negative integer\n", a, val);
            return 2;
        }
        if (!strcmp(a, "--threads")) {
            if (v < 1 || v > 4096) {
                fprintf(stderr, "kpool-stress: --threads must be 1..4096\n");
                return 2;
            }
            cfg.threads = (int)v;
        } else if (!strcmp(a, "--ops")) cfg.ops = v;
        else if (!strcmp(a, "--seed")) cfg.seed = v;
        else if (!strcmp(a, "--size")) cfg.size = (size_t)v;
        else if (!strcmp(a, "--burst-bytes")) cfg.burst_bytes = (size_t)v;
        else if (!strcmp(a, "--repeat")) {
            if (v < 1 || v > 100000) {
                fprintf(stderr, "kpool-stress: --repeat must be 1..100000\n");
                return 2;
            }
            repeat = v;
        }
    }
    if (cfg.size == 0 && !strcmp(cfg.workload, "pairs")) cfg.size = 32;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    int status = 0;
    for (unsigned long long rep = 0; rep < repeat && !interrupted; rep++) {
        char err[256];
        kps_run *run = NULL;
        int rc = kps_start(&cfg, &run, err, sizeof err);
        if (rc == -1) {
            fprintf(stderr, "kpool-stress: %s\n", err);
            return 2;
        }
        if (rc != 0) {
            fprintf(stderr, "kpool-stress: %s\n", err);
            return 1;
        }
        int stop_sent = 0;
        while (!kps_wait(run, 50)) {
            if (interrupted && !stop_sent) {
                kps_stop(run);
                stop_sent = 1;
            }
        }
        if (interrupted && !stop_sent) kps_stop(run);
        char *json = kps_finish(run);
        if (!json) {
            fprintf(stderr, "kpool-stress: out of memory for the result\n");
            return 1;
        }
        printf("%s\n", json);
        fflush(stdout);
        if (strstr(json, "\"corrupt\":0,") == NULL) status = 3;
        else if (status == 0 && strstr(json, "\"error\":null") == NULL) status = 1;
        kps_free_json(json);
    }
    return status;
}
