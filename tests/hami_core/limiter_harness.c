/*
 * HAMi-core's SM limiter, run unchanged against a simulated GPU in virtual time.
 *
 * This file includes HAMi-core's own multiprocess_utilization_watcher.c (the pristine one or
 * tessera's patched one, whichever -I puts first) and runs its real code: the watcher's
 * loop (`utilization_watcher`, started by `init_utilization_watcher` as HAMi-core starts
 * it), its NVML utilization read-out (`get_used_gpu_utilization`) and the launch-side
 * token check (`rate_limiter`). What it cannot have is a GPU, a driver and a clock, so:
 *
 * - nanosleep, sleep and pthread_create are renamed (macros, before the include) to a
 *   small cooperative scheduler in virtual time: the watcher and the application are two
 *   coroutines (ucontext), each sleeping until its virtual wake-up time. Nothing runs in
 *   real time, so a run is exact and repeatable.
 * - the CUDA and NVML calls the watcher makes are stubs answering for one GPU of
 *   --sms multiprocessors of --threads-per-sm threads each; nvmlDeviceGetProcessUtilization
 *   answers with one sample for this process whose smUtil is the percentage of the last
 *   second during which one of its kernels ran (a kernel of this workload fills the GPU).
 * - the application is the gpu-check probe's loop: launches of --grid blocks, each running
 *   --kernel-us microseconds on the GPU (one at a time, in order), four launches then a
 *   synchronisation, --launch-us of CPU time per launch. With --graph each launch is a CUDA
 *   graph launch instead: charged through rate_limiter_whole_gpu where the source has it
 *   (tessera's patch; compile with -DHAVE_WHOLE_GPU_CHARGE), and not charged at all where it
 *   does not (the pinned source sends graph launches to the driver untouched).
 *
 * Output: one JSON object with the busy fraction of each one-second window after
 * --settle seconds, the unlimited busy fraction (the same loop with no limit), the
 * limiter's pool capacity and its last refill per tick.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include <ucontext.h>
#include <getopt.h>

struct timespec;
int sim_nanosleep(const struct timespec *req, struct timespec *rem);
unsigned int sim_sleep(unsigned int seconds);
int sim_pthread_create(pthread_t *thread, const pthread_attr_t *attr,
                       void *(*start)(void *), void *arg);

#define nanosleep sim_nanosleep
#define sleep sim_sleep
#define pthread_create sim_pthread_create
#include "multiprocess/multiprocess_utilization_watcher.c"
#undef nanosleep
#undef sleep
#undef pthread_create

/* --- the simulated GPU and its program ---------------------------------------------- */

static int opt_sms = 132, opt_threads = 2048, opt_limit = 30;
static long opt_grid = 2048;
static double opt_kernel_us = 1670, opt_launch_us = 10, opt_seconds = 40, opt_settle = 15;
static int opt_graph = 0;

static int64_t now_ns;         /* virtual time */
static int64_t gpu_free_at;    /* when the GPU's queue of this process drains */
#define RING 262144
static int64_t ring_start[RING], ring_end[RING];  /* kernel execution intervals */
static long ring_n;

static double busy_between(int64_t a, int64_t b) {
    int64_t busy = 0;
    long first = ring_n > RING ? ring_n - RING : 0;
    for (long i = ring_n - 1; i >= first; i--) {
        int64_t s = ring_start[i % RING], e = ring_end[i % RING];
        if (e <= a) break;                  /* intervals are in time order */
        if (s < a) s = a;
        if (e > b) e = b;
        if (e > s) busy += e - s;
    }
    return (double)busy / (double)(b - a);
}

static void launch_kernel(void) {
    int64_t start = now_ns > gpu_free_at ? now_ns : gpu_free_at;
    int64_t end = start + (int64_t)(opt_kernel_us * 1000);
    ring_start[ring_n % RING] = start;
    ring_end[ring_n % RING] = end;
    ring_n++;
    gpu_free_at = end;
}

/* --- coroutines in virtual time ----------------------------------------------------- */

typedef struct {
    ucontext_t ctx;
    int64_t wake;
    int alive;
    char *stack;
} task_t;

static ucontext_t scheduler;
static task_t tasks[2];        /* 0: the application, 1: the watcher */
static int current = -1;
static void *(*watcher_start)(void *);

static void yield_until(int64_t when) {
    task_t *t = &tasks[current];
    t->wake = when;
    swapcontext(&t->ctx, &scheduler);
}

int sim_nanosleep(const struct timespec *req, struct timespec *rem) {
    (void)rem;
    yield_until(now_ns + (int64_t)req->tv_sec * 1000000000LL + req->tv_nsec);
    return 0;
}

unsigned int sim_sleep(unsigned int seconds) {
    yield_until(now_ns + (int64_t)seconds * 1000000000LL);
    return 0;
}

static void watcher_entry(void) { watcher_start(NULL); }

int sim_pthread_create(pthread_t *thread, const pthread_attr_t *attr,
                       void *(*start)(void *), void *arg) {
    (void)thread; (void)attr; (void)arg;
    watcher_start = start;
    task_t *t = &tasks[1];
    t->stack = malloc(1 << 22);
    getcontext(&t->ctx);
    t->ctx.uc_stack.ss_sp = t->stack;
    t->ctx.uc_stack.ss_size = 1 << 22;
    t->ctx.uc_link = &scheduler;
    makecontext(&t->ctx, watcher_entry, 0);
    t->wake = now_ns;
    t->alive = 1;
    return 0;
}

static void application(void) {
    for (;;) {
        for (int i = 0; i < 4; i++) {
            if (!opt_graph) {
                rate_limiter((int)opt_grid, 256);
            } else {
#ifdef HAVE_WHOLE_GPU_CHARGE
                rate_limiter_whole_gpu();
#endif
            }
            yield_until(now_ns + (int64_t)(opt_launch_us * 1000));
            launch_kernel();
        }
        yield_until(gpu_free_at > now_ns ? gpu_free_at : now_ns);   /* synchronise */
    }
}

/* --- what the watcher asks of CUDA, NVML and HAMi-core's shared region -------------- */

int g_log_level = 0;
FILE *fp1 = NULL;
int pidfound = 1;
static shrreg_proc_slot_t my_slot;

CUresult cuCtxGetDevice(CUdevice *device) { *device = 0; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *device, int ordinal) { *device = ordinal; return CUDA_SUCCESS; }
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    (void)dev;
    if (attrib == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) *pi = opt_sms;
    else if (attrib == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) *pi = opt_threads;
    else *pi = 0;
    return CUDA_SUCCESS;
}
nvmlReturn_t nvmlInit(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { *n = 1; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) {
    *d = (nvmlDevice_t)(uintptr_t)(i + 1);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *n,
                                                  nvmlProcessInfo_v1_t *infos) {
    (void)d; (void)infos; *n = 0;
    return NVML_ERROR_NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *s,
                                             unsigned int *n, unsigned long long since) {
    (void)d; (void)since;
    int64_t from = now_ns - 1000000000LL;
    memset(&s[0], 0, sizeof(s[0]));
    s[0].pid = 4242;
    s[0].timeStamp = (unsigned long long)(now_ns / 1000);
    s[0].smUtil = (unsigned int)(100.0 * busy_between(from < 0 ? 0 : from, now_ns) + 0.5);
    *n = 1;
    return NVML_SUCCESS;
}
shrreg_proc_slot_t *find_proc_by_hostpid(int hostpid) { return hostpid == 4242 ? &my_slot : NULL; }
void lock_shrreg(void) {}
void unlock_shrreg(void) {}
void ensure_initialized(void) {}
int update_host_pid(void) { return 0; }
int init_gpu_device_utilization(void) { return 0; }
int get_utilization_switch(void) { return 1; }
int get_recent_kernel(void) { return 2; }
int set_recent_kernel(int value) { (void)value; return 0; }
int get_current_device_sm_limit(int dev) { return dev == 0 ? opt_limit : 0; }

/* --- one run -------------------------------------------------------------------------- */

static void run(int limit, double *windows, int *nwin, double *overall) {
    memset(tasks, 0, sizeof(tasks));
    memset((void *)g_cur_cuda_cores, 0, sizeof(g_cur_cuda_cores));
    memset((void *)g_total_cuda_cores, 0, sizeof(g_total_cuda_cores));
    memset(cached_sm_limit, 0, sizeof(cached_sm_limit));
    now_ns = gpu_free_at = 0;
    ring_n = 0;
    opt_limit = limit;
    init_utilization_watcher();            /* HAMi-core's own start: setspec, the thread */
    cached_util_switch = 1;                /* the watcher's first tick sets it as well */
    static char app_stack[1 << 20];
    getcontext(&tasks[0].ctx);
    tasks[0].ctx.uc_stack.ss_sp = app_stack;
    tasks[0].ctx.uc_stack.ss_size = sizeof(app_stack);
    tasks[0].ctx.uc_link = &scheduler;
    makecontext(&tasks[0].ctx, application, 0);
    tasks[0].alive = 1;
    int64_t end = (int64_t)(opt_seconds * 1e9);
    for (;;) {
        int next = -1;
        for (int i = 0; i < 2; i++)
            if (tasks[i].alive && (next < 0 || tasks[i].wake < tasks[next].wake)) next = i;
        if (next < 0 || tasks[next].wake >= end) break;
        now_ns = tasks[next].wake;
        current = next;
        swapcontext(&scheduler, &tasks[next].ctx);
    }
    int64_t settle = (int64_t)(opt_settle * 1e9);
    *nwin = 0;
    for (int64_t a = settle; a + 1000000000LL <= end; a += 1000000000LL)
        windows[(*nwin)++] = busy_between(a, a + 1000000000LL);
    *overall = busy_between(settle, end);
    free(tasks[1].stack);
    tasks[1].stack = NULL;
}

int main(int argc, char **argv) {
    static struct option opts[] = {
        {"sms", required_argument, 0, 's'},       {"threads-per-sm", required_argument, 0, 't'},
        {"limit", required_argument, 0, 'l'},     {"grid", required_argument, 0, 'g'},
        {"kernel-us", required_argument, 0, 'k'}, {"launch-us", required_argument, 0, 'u'},
        {"seconds", required_argument, 0, 'd'},   {"settle", required_argument, 0, 'w'},
        {"graph", no_argument, 0, 'G'},           {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's': opt_sms = atoi(optarg); break;
        case 't': opt_threads = atoi(optarg); break;
        case 'l': opt_limit = atoi(optarg); break;
        case 'g': opt_grid = atol(optarg); break;
        case 'k': opt_kernel_us = atof(optarg); break;
        case 'u': opt_launch_us = atof(optarg); break;
        case 'd': opt_seconds = atof(optarg); break;
        case 'w': opt_settle = atof(optarg); break;
        case 'G': opt_graph = 1; break;
        default: fprintf(stderr, "limiter_harness: unknown option\n"); return 2;
        }
    }
    if (opt_sms <= 0 || opt_threads <= 0 || opt_limit <= 0 || opt_limit > 100 || opt_grid <= 0 ||
        opt_kernel_us <= 0 || opt_seconds <= opt_settle + 1 || opt_seconds > 600) {
        fprintf(stderr, "limiter_harness: bad arguments\n");
        return 2;
    }
    static double windows[600], free_windows[600];
    int nwin = 0, nfree = 0;
    double limited = 0, unlimited = 0;
    int limit = opt_limit;
    run(100, free_windows, &nfree, &unlimited);
    run(limit, windows, &nwin, &limited);
    printf("{\"sms\": %d, \"threads_per_sm\": %d, \"limit\": %d, \"grid\": %ld, "
           "\"kernel_us\": %g, \"graph\": %s, \"unlimited_busy\": %.4f, \"busy\": %.4f, "
           "\"pool\": %lld, \"windows\": [",
           opt_sms, opt_threads, limit, opt_grid, opt_kernel_us, opt_graph ? "true" : "false", unlimited, limited,
           (long long)g_total_cuda_cores[0]);
    for (int i = 0; i < nwin; i++) printf("%s%.4f", i ? ", " : "", windows[i]);
    printf("]}\n");
    return 0;
}
