/* stress.h: the multithreaded allocator workload driver (DESIGN.md section 5).
 *
 * Built two ways from one source: into the Python extension kpool._core
 * (kpool.stress(), run with the GIL released) and into the executable
 * kpool-stress (main.c), which prints one JSON line per measurement.
 *
 * Use: kps_start() validates the configuration and starts the worker
 * threads; kps_wait() polls for completion (so a caller can check for
 * signals between polls); kps_stop() or kps_cancel() asks the workers of one
 * run to stop early, kps_cancel_all() those of every run in progress (from
 * any thread, even a signal handler), and cfg.duration stops a run after
 * that many seconds; kps_finish() joins them and returns the result as a
 * JSON object text, which says whether and why the run stopped early
 * ("stopped", "stop_reason") and counts the ops actually done.
 *
 * Workers look at the stop request, the cancel epoch and the deadline every
 * KPS_STOP_EVERY (4096) operations, while a producer waits for room in a
 * full ring, and during burst's 1 s pause, so a run stops within a
 * fraction of a millisecond of a request (the threads that wait for others,
 * consumers and barriers, follow them).
 */
#ifndef KPOOL_STRESS_H
#define KPOOL_STRESS_H

#include <stddef.h>
#include <stdint.h>

typedef struct kps_config {
    const char *workload;   /* pairs mixed random larson prodcons burst frag */
    const char *allocator;  /* kpool kpool-pool system null */
    int threads;            /* >= 1 */
    uint64_t ops;           /* >= 1: total operations over all threads */
    uint64_t seed;
    int verify;             /* stamp every block and check it before free */
    size_t size;            /* block size for one-size workloads (pairs); 0 = 32 */
    size_t burst_bytes;     /* total for burst; 0 = 1 GiB */
    double duration;        /* seconds: stop after this long (counted from the
                               threads' start); 0 = no limit, else 1e-3..1e9 */
} kps_config;

typedef struct kps_run kps_run;

/* 0 and *out set on success; -1 on a bad configuration with a message in
 * err (NUL-terminated, at most errlen bytes); -2 if threads could not be
 * started (message in err). */
int kps_start(const kps_config *cfg, kps_run **out, char *err, size_t errlen);
/* 1 when every worker has finished, 0 if still running after timeout_ms. */
int kps_wait(kps_run *run, int timeout_ms);
/* Ask the workers to stop at their next check; kps_finish still reports
 * ("stop_reason": "stop"). */
void kps_stop(kps_run *run);
/* The same, reported as "stop_reason": "cancel". */
void kps_cancel(kps_run *run);
/* Cancel every run started by kps_start and not yet given to kps_finish
 * (each run remembers the cancel epoch it started in; this bumps it). One
 * atomic add: safe from any thread and from a signal handler. Returns how
 * many runs were in progress. */
int kps_cancel_all(void);
/* Joins the workers, frees run, returns a malloc'd NUL-terminated JSON
 * object (free it with kps_free_json), or NULL when out of memory. */
char *kps_finish(kps_run *run);
void kps_free_json(char *json);

/* NULL-terminated lists of the names accepted above. */
extern const char *const kps_workloads[];
extern const char *const kps_allocators[];

#endif /* KPOOL_STRESS_H */
