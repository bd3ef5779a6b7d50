/* stress.h: the multithreaded allocator workload driver (DESIGN.md section 5).
 *
 * Built two ways from one source: into the Python extension kpool._core
 * (kpool.stress(), run with the GIL released) and into the executable
 * kpool-stress (main.c), which prints one JSON line per measurement.
 *
 * Use: kps_start() validates the configuration and starts the worker
 * threads; kps_wait() polls for completion (so a caller can check for
 * signals between polls); kps_stop() asks the workers to stop early;
 * kps_finish() joins them and returns the result as a JSON object text.
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
} kps_config;

typedef struct kps_run kps_run;

/* 0 and *out set on success; -1 on a bad configuration with a message in
 * err (NUL-terminated, at most errlen bytes); -2 if threads could not be
 * started (message in err). */
int kps_start(const kps_config *cfg, kps_run **out, char *err, size_t errlen);
/* 1 when every worker has finished, 0 if still running after timeout_ms. */
int kps_wait(kps_run *run, int timeout_ms);
/* Ask the workers to stop at their next check; kps_finish still reports. */
void kps_stop(kps_run *run);
/* Joins the workers, frees run, returns a malloc'd NUL-terminated JSON
 * object (free it with kps_free_json), or NULL when out of memory. */
char *kps_finish(kps_run *run);
void kps_free_json(char *json);

/* NULL-terminated lists of the names accepted above. */
extern const char *const kps_workloads[];
extern const char *const kps_allocators[];

#endif /* KPOOL_STRESS_H */
