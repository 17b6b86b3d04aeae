/*
 * A stand-in for libnvidia-ml.so.1 (NVML) for machines without an NVIDIA GPU.
 *
 * Build it as libnvidia-ml.so.1 and put its folder on LD_LIBRARY_PATH: pynvml's own ctypes
 * code then loads it and calls it exactly as it calls the real driver library. Only the entry
 * points gputap uses are here; pynvml answers NVML_ERROR_FUNCTION_NOT_FOUND for anything
 * else, as the real library does for a symbol an old driver lacks.
 *
 *     gcc -shared -fPIC -o libnvidia-ml.so.1 fake_nvml.c -lpthread
 *     gcc -shared -fPIC -DFAKE_NVML_OLD_DRIVER -o libnvidia-ml.so.1 fake_nvml.c -lpthread
 *
 * The second build is a driver of the R460 era: no nvmlDeviceGetComputeRunningProcesses_v3
 * (pynvml's unversioned call then raises NVMLLibraryMismatchError) and no
 * nvmlDeviceGetMemoryInfo_v2; names without the "NVIDIA " prefix ("A100-SXM4-80GB"); MIG
 * device UUIDs in the old form MIG-GPU-<parent UUID>/<GPU instance>/<compute instance>.
 *
 * The machine is described by the environment (read at the first nvmlInit), or, when
 * FAKE_NVML_FILE names a file, by that file's lines KEY=VALUE with the same keys without the
 * FAKE_NVML_ prefix (DEVICES=..., USE=..., FAIL_CALLS=..., PRIVILEGED=...). The file is
 * re-read whenever it changes (checked on every call), so a test can change the machine under
 * a running process; after a re-read every MIG device handle given out before answers
 * NVML_ERROR_INVALID_ARGUMENT (NVML: handles must be requested again after a
 * reconfiguration), and a GPU handle stays valid only if the same UUID is at the same index.
 * Write it atomically (a new file renamed over the old).
 *
 * FAKE_NVML_FAIL=driver     nvmlInit answers NVML_ERROR_DRIVER_NOT_LOADED (no kernel module)
 * FAKE_NVML_FAIL=mismatch   nvmlInit answers NVML_ERROR_LIB_RM_VERSION_MISMATCH (driver
 *                           upgraded without a reboot)
 *
 * DEVICES  entries separated by ';' (spaces and newlines around them ignored).
 *   A GPU:         NAME|UUID|MEMORY_MIB|MIG
 *                  MIG is "none" (card cannot do MIG: GetMigMode answers NOT_SUPPORTED),
 *                  "off" or "on" (MIG-capable, 7 MIG device slots, like A100/H100/H200),
 *                  "on>off" or "off>on" (the current mode, then the pending one that applies
 *                  after a GPU reset), or "lost": a GPU that fell off the bus, still counted,
 *                  whose GetHandleByIndex and GetHandleByUUID answer NVML_ERROR_GPU_IS_LOST.
 *   A MIG device:  @SLOT|NAME|UUID|MEMORY_MIB[|GI]
 *                  in slot SLOT (0..6) of the GPU entry before it, GPU instance id GI (by
 *                  default as an A100 numbers them: 7g 0, 4g 1, 3g 1 and 2, 2g 3 to 5, 1g 7
 *                  to 13, in order; the profile is read from NAME). Slots not listed are
 *                  empty: GetMigDeviceHandleByIndex answers NVML_ERROR_NOT_FOUND for them.
 *                  MIG devices exist only while their GPU's current mode is on.
 *   Unset or empty: no GPU (nvmlDeviceGetCount gives 0). A malformed value makes nvmlInit
 *   answer NVML_ERROR_UNKNOWN and print why on stderr.
 *
 * USE      what the devices are doing, entries separated by ';':
 *                  UUID|UTILIZATION|USED_MIB|COMPUTE_PROCESSES
 *                  for a GPU or MIG device of DEVICES (an unknown UUID is malformed).
 *                  UTILIZATION is the device's true engine activity: N (percent, steady) or
 *                  N/ON_MS/PERIOD_MS (N % during the first ON_MS of every PERIOD_MS of wall
 *                  time, else 0). Unlisted devices are idle: 0 %, no process, only the
 *                  driver's own memory used. COMPUTE_PROCESSES hold contexts whatever the
 *                  activity: "0|3000|1" is a context that does nothing.
 *                  MIG devices and GPUs in MIG mode have no utilisation (GetUtilizationRates
 *                  and GetSamples answer NOT_SUPPORTED, as NVML does).
 *
 * FAIL_CALLS  failures of single calls, entries FUNCTION@UUID=CODE separated by ';':
 *                  FUNCTION is an exported name (nvmlDeviceGetMemoryInfo) or '*' for every
 *                  call on that device; UUID the device's (for the calls that find a handle:
 *                  the device asked for); CODE GPU_IS_LOST, UNKNOWN, NO_PERMISSION or
 *                  NOT_SUPPORTED.
 *
 * PRIVILEGED  1 (default) or 0: a process without privileges, whose process lists of MIG
 *                  devices and of GPUs in MIG mode answer NVML_ERROR_NO_PERMISSION.
 *
 * EVENTS   what the driver reports, entries SEQ|UUID|TYPE|DATA[|GI|CI] separated by ';':
 *                  SEQ a number unique in the list, UUID a GPU's as written in DEVICES, TYPE
 *                  "xid" (nvmlEventTypeXidCriticalError, DATA the XID) or "dbe"
 *                  (nvmlEventTypeDoubleBitEccError), GI and CI the GPU and compute instance
 *                  (default 0xFFFFFFFF: the whole GPU). Each SEQ is delivered once by
 *                  nvmlEventSetWait_v2 to every event set registered for that GPU and type,
 *                  whenever it was registered. The wait re-reads the file every 20 ms outside
 *                  the lock, so other calls go on while a thread waits.
 * ECC      uncorrected ECC error counts, entries UUID|VOLATILE|AGGREGATE (a GPU's UUID);
 *                  unlisted GPUs count 0, corrected errors always 0.
 * REMAP    row remapping, entries UUID|CORRECTABLE|UNCORRECTABLE|PENDING|FAILURE (rows remapped
 *                  for each kind of error, then 0 or 1); unlisted GPUs 0|0|0|0.
 *                  Cards without ECC (names with RTX, GeForce or Matrox) answer NOT_SUPPORTED to
 *                  ECC and remap calls, and do not offer the double-bit ECC event; remap calls
 *                  also on cards before Ampere (T4, V100, P100). MIG device handles answer
 *                  NOT_SUPPORTED to ECC and remap calls: ask the GPU.
 *
 * A GPU marked lost answers NVML_ERROR_GPU_IS_LOST to every call on a handle given out before.
 *
 * Memory: every device shows the driver's own memory as used, even idle: a whole GPU
 * min(512, MEMORY_MIB / 256) MiB, a MIG device 12 MiB (GetMemoryInfo: used = USED_MIB + that;
 * GetMemoryInfo_v2: the same used, and that as reserved).
 *
 * Utilisation: the mean over one sample period of 1/6 s. GetUtilizationRates answers the last
 * whole period; GetSamples(NVML_GPU_UTILIZATION_SAMPLES, lastSeen) the periods ending after
 * lastSeen (timestamps in microseconds since the epoch), at most the last 120 (20 s), and
 * NVML_ERROR_NOT_FOUND when none is newer.
 *
 * Example, one H200 and an A100 with two MIG devices:
 *
 *   NVIDIA H200|GPU-9d5e...|143771|off;
 *   NVIDIA A100-SXM4-80GB|GPU-4a1c...|81920|on;
 *   @0|NVIDIA A100-SXM4-80GB MIG 3g.40gb|MIG-77b0...|40192;
 *   @3|NVIDIA A100-SXM4-80GB MIG 1g.10gb|MIG-0c2e...|9984
 *
 * Return codes, buffer sizes and struct layouts are NVML's (nvml.h); handles are opaque
 * values that encode the device and when it was handed out, and any other value is
 * NVML_ERROR_INVALID_ARGUMENT.
 */

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
} nvmlReturn_t;

#define NVML_DEVICE_MIG_DISABLE 0
#define NVML_DEVICE_MIG_ENABLE 1
#define NVML_GPU_UTILIZATION_SAMPLES 1
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_EVENT_SINGLE_BIT_ECC 0x1ULL
#define NVML_EVENT_DOUBLE_BIT_ECC 0x2ULL
#define NVML_EVENT_PSTATE 0x4ULL
#define NVML_EVENT_XID 0x8ULL
#define NVML_EVENT_CLOCK 0x10ULL
#define NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1
#define NVML_VOLATILE_ECC 0
#define NVML_AGGREGATE_ECC 1
#define NVML_MEMORY_LOCATION_DEVICE_MEMORY 2 /* also NVML_MEMORY_LOCATION_DRAM */
#define NVML_MEMORY_LOCATION_COUNT 8

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t; /* nvmlProcessInfo_v3_t is the same layout */

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;

#define NVML_STRUCT_VERSION(name, ver) (unsigned int)(sizeof(name##_v##ver##_t) | ((ver) << 24U))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(nvmlMemory, 2)

#define MAX_GPUS 16
#define MAX_MIG_SLOTS 7
#define MAX_FAILS 64
#define MAX_EVENTS 256
#define TEXT_SIZE 96 /* NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define SAMPLE_US 166667ULL
#define KEPT_SAMPLES 120
#define NO_INSTANCE 0xFFFFFFFFu

#ifdef FAKE_NVML_OLD_DRIVER
#define DRIVER_VERSION "460.106.00"
#define CUDA_VERSION 11020
#else
#define DRIVER_VERSION "570.172.08"
#define CUDA_VERSION 12080
#endif

enum mig_mode { MIG_NONE, MIG_OFF, MIG_ON };

struct fake_device {
    int used;
    char name[TEXT_SIZE];
    char uuid[TEXT_SIZE]; /* as written in DEVICES */
    unsigned long long memory_mib;
    unsigned long long driver_mib;
    enum mig_mode mig, pending; /* whole GPUs only */
    int lost;
    struct fake_device *parent; /* MIG devices only */
    unsigned int gpu, slot;     /* where it sits in the tables */
    unsigned int gpu_instance;  /* MIG devices only */
    unsigned int level, on_ms, period_ms; /* USE: activity */
    unsigned long long used_mib;
    unsigned int processes;
    unsigned long long ecc_volatile, ecc_aggregate;        /* ECC: uncorrected, whole GPUs */
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure; /* REMAP */
};

struct fake_event {
    unsigned long long seq;
    char uuid[TEXT_SIZE]; /* the GPU's, as written in DEVICES */
    unsigned long long type, data;
    unsigned int gpu_instance, compute_instance;
};

struct fail {
    char function[64];
    char uuid[TEXT_SIZE];
    nvmlReturn_t code;
};

struct machine {
    struct fake_device gpus[MAX_GPUS];
    struct fake_device migs[MAX_GPUS][MAX_MIG_SLOTS];
    unsigned int gpu_count;
    struct fail fails[MAX_FAILS];
    unsigned int fail_count;
    int privileged;
    struct fake_event events[MAX_EVENTS];
    unsigned int event_count;
};

typedef struct opaque_device *nvmlDevice_t;

static struct machine m;
static unsigned int init_count;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* handle generations: a GPU's changes when another UUID takes its index, all MIG ones on
 * every re-read */
static unsigned int gpu_generation[MAX_GPUS];
static unsigned int mig_generation;
static struct stat file_seen;

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
        s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
        *--end = '\0';
    return s;
}

static int bad(const char *what, const char *entry, const char *why) {
    fprintf(stderr, "fake NVML: %s entry '%s': %s\n", what, entry, why);
    return 0;
}

/* Split "a|b|c|d[|e]" into min..max trimmed fields; the count, or 0. */
static int fields(char *entry, char *out[], int min, int max) {
    int n = 0;
    char *rest = entry;
    while (n < max) {
        char *bar = strchr(rest, '|');
        if (bar)
            *bar = '\0';
        out[n++] = trim(rest);
        if (!bar)
            return n >= min ? n : 0;
        rest = bar + 1;
    }
    return 0;
}

static int fill(struct fake_device *d, const char *entry, char *name, char *uuid, char *mib) {
    char *end;
    if (!*name || strlen(name) >= TEXT_SIZE)
        return bad("DEVICES", entry, "name must be 1 to 95 characters");
    if (!*uuid || strlen(uuid) >= TEXT_SIZE - 8)
        return bad("DEVICES", entry, "UUID must be 1 to 87 characters");
    d->memory_mib = strtoull(mib, &end, 10);
    if (!*mib || *end)
        return bad("DEVICES", entry, "memory must be a whole number of MiB");
    strcpy(d->name, name);
    strcpy(d->uuid, uuid);
    d->used = 1;
    return 1;
}

static int parse_mig_mode(const char *text, enum mig_mode *current, enum mig_mode *pending) {
    static const struct {
        const char *text;
        enum mig_mode current, pending;
    } modes[] = {{"none", MIG_NONE, MIG_NONE}, {"off", MIG_OFF, MIG_OFF}, {"on", MIG_ON, MIG_ON},
                 {"on>off", MIG_ON, MIG_OFF},  {"off>on", MIG_OFF, MIG_ON}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (!strcmp(text, modes[i].text)) {
            *current = modes[i].current;
            *pending = modes[i].pending;
            return 1;
        }
    return 0;
}

/* The GPU instance id an A100 gives the next instance of this many slices on one GPU. */
static unsigned int default_instance(struct machine *t, unsigned int gpu, const char *name) {
    const char *mig = strstr(name, "MIG ");
    unsigned int g = mig ? (unsigned int)atoi(mig + 4) : 1;
    unsigned int first = g == 7 ? 0 : g == 4 ? 1 : g == 3 ? 1 : g == 2 ? 3 : 7;
    unsigned int taken = 0;
    for (int s = 0; s < MAX_MIG_SLOTS; s++) {
        struct fake_device *o = &t->migs[gpu][s];
        if (o->used && o->gpu_instance >= first && o->gpu_instance < first + 7)
            taken++;
    }
    return first + taken;
}

static int parse_devices(struct machine *t, const char *spec) {
    if (!spec)
        return 1;
    char *copy = strdup(spec), *save = NULL, *f[5];
    int ok = 1;
    for (char *tok = strtok_r(copy, ";", &save); ok && tok; tok = strtok_r(NULL, ";", &save)) {
        char *entry = trim(tok), shown[256];
        if (!*entry)
            continue;
        snprintf(shown, sizeof shown, "%s", entry);
        int n = fields(entry, f, 4, 5);
        if (!n || (n == 5 && f[0][0] != '@')) {
            ok = bad("DEVICES", shown,
                     "want NAME|UUID|MEMORY_MIB|MIG or @SLOT|NAME|UUID|MEMORY_MIB[|GI]");
        } else if (f[0][0] == '@') {
            char *end;
            long slot = strtol(f[0] + 1, &end, 10);
            struct fake_device *gpu = t->gpu_count ? &t->gpus[t->gpu_count - 1] : NULL;
            if (!gpu || gpu->mig == MIG_NONE || gpu->lost)
                ok = bad("DEVICES", shown, "a MIG device must follow a GPU whose MIG is off or on");
            else if (!f[0][1] || *end || slot < 0 || slot >= MAX_MIG_SLOTS)
                ok = bad("DEVICES", shown, "slot must be 0 to 6");
            else if (t->migs[gpu->gpu][slot].used)
                ok = bad("DEVICES", shown, "slot already taken");
            else {
                struct fake_device *d = &t->migs[gpu->gpu][slot];
                unsigned int instance = default_instance(t, gpu->gpu, f[1]);
                if (n == 5) {
                    long gi = strtol(f[4], &end, 10);
                    if (!*f[4] || *end || gi < 0 || gi > 14)
                        ok = bad("DEVICES", shown, "GI must be 0 to 14");
                    instance = (unsigned int)gi;
                }
                if (ok && (ok = fill(d, shown, f[1], f[2], f[3]))) {
                    d->parent = gpu;
                    d->gpu = gpu->gpu;
                    d->slot = (unsigned int)slot;
                    d->gpu_instance = instance;
                    d->driver_mib = 12;
                }
            }
        } else if (t->gpu_count == MAX_GPUS) {
            ok = bad("DEVICES", shown, "at most 16 GPUs");
        } else {
            struct fake_device *d = &t->gpus[t->gpu_count];
            if (!strcmp(f[3], "lost"))
                d->lost = 1;
            else if (!parse_mig_mode(f[3], &d->mig, &d->pending))
                ok = bad("DEVICES", shown, "MIG must be none, off, on, on>off, off>on or lost");
            if (ok && (ok = fill(d, shown, f[0], f[1], f[2]))) {
                d->gpu = t->gpu_count++;
                d->driver_mib = d->memory_mib / 256 < 512 ? d->memory_mib / 256 : 512;
            }
        }
    }
    free(copy);
    return ok;
}

/* The GPU or MIG device with this UUID as written in DEVICES, or NULL. */
static struct fake_device *find_configured(struct machine *t, const char *uuid) {
    for (unsigned int i = 0; i < t->gpu_count; i++) {
        if (!strcmp(t->gpus[i].uuid, uuid))
            return &t->gpus[i];
        for (int s = 0; s < MAX_MIG_SLOTS; s++)
            if (t->migs[i][s].used && !strcmp(t->migs[i][s].uuid, uuid))
                return &t->migs[i][s];
    }
    return NULL;
}

static int parse_use(struct machine *t, const char *spec) {
    if (!spec)
        return 1;
    char *copy = strdup(spec), *save = NULL, *f[4];
    int ok = 1;
    for (char *tok = strtok_r(copy, ";", &save); ok && tok; tok = strtok_r(NULL, ";", &save)) {
        char *entry = trim(tok), shown[256], *end2, *end3;
        unsigned int level = 0, on_ms = 0, period_ms = 0;
        if (!*entry)
            continue;
        snprintf(shown, sizeof shown, "%s", entry);
        if (!fields(entry, f, 4, 4)) {
            ok = bad("USE", shown, "want UUID|UTILIZATION|USED_MIB|PROCESSES");
            continue;
        }
        struct fake_device *d = find_configured(t, f[0]);
        int parts = sscanf(f[1], "%u/%u/%u", &level, &on_ms, &period_ms);
        char again[64];
        if (parts == 1)
            snprintf(again, sizeof again, "%u", level);
        else
            snprintf(again, sizeof again, "%u/%u/%u", level, on_ms, period_ms);
        unsigned long long used = strtoull(f[2], &end2, 10);
        unsigned long processes = strtoul(f[3], &end3, 10);
        if (!d)
            ok = bad("USE", shown, "no device with this UUID in DEVICES");
        else if ((parts != 1 && parts != 3) || strcmp(again, f[1]) || level > 100 ||
                 (parts == 3 && (period_ms == 0 || on_ms > period_ms)))
            ok = bad("USE", shown, "utilisation must be N or N/ON_MS/PERIOD_MS, N 0 to 100");
        else if (!*f[2] || *end2 || used + d->driver_mib > d->memory_mib)
            ok = bad("USE", shown, "used memory must be whole MiB, within the device's");
        else if (!*f[3] || *end3 || processes > 64)
            ok = bad("USE", shown, "processes must be 0 to 64");
        else {
            d->level = level;
            d->on_ms = parts == 3 ? on_ms : 0;
            d->period_ms = parts == 3 ? period_ms : 0;
            d->used_mib = used;
            d->processes = (unsigned int)processes;
        }
    }
    free(copy);
    return ok;
}

static int parse_fails(struct machine *t, const char *spec) {
    static const struct {
        const char *name;
        nvmlReturn_t code;
    } codes[] = {{"GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST},
                 {"UNKNOWN", NVML_ERROR_UNKNOWN},
                 {"NO_PERMISSION", NVML_ERROR_NO_PERMISSION},
                 {"NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED}};
    if (!spec)
        return 1;
    char *copy = strdup(spec), *save = NULL;
    int ok = 1;
    for (char *tok = strtok_r(copy, ";", &save); ok && tok; tok = strtok_r(NULL, ";", &save)) {
        char *entry = trim(tok), shown[256];
        if (!*entry)
            continue;
        snprintf(shown, sizeof shown, "%s", entry);
        char *at = strchr(entry, '@'), *eq = at ? strchr(at, '=') : NULL;
        if (!at || !eq || t->fail_count == MAX_FAILS) {
            ok = bad("FAIL_CALLS", shown, "want FUNCTION@UUID=CODE (at most 64)");
            continue;
        }
        *at = *eq = '\0';
        char *function = trim(entry), *uuid = trim(at + 1), *code = trim(eq + 1);
        struct fail *fail = &t->fails[t->fail_count];
        fail->code = NVML_SUCCESS;
        for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
            if (!strcmp(code, codes[i].name))
                fail->code = codes[i].code;
        if (!*function || strlen(function) >= sizeof fail->function)
            ok = bad("FAIL_CALLS", shown, "FUNCTION must be an NVML function name or *");
        else if (!find_configured(t, uuid))
            ok = bad("FAIL_CALLS", shown, "no device with this UUID in DEVICES");
        else if (fail->code == NVML_SUCCESS)
            ok = bad("FAIL_CALLS", shown,
                     "CODE must be GPU_IS_LOST, UNKNOWN, NO_PERMISSION or NOT_SUPPORTED");
        else {
            strcpy(fail->function, function);
            strcpy(fail->uuid, uuid);
            t->fail_count++;
        }
    }
    free(copy);
    return ok;
}

/* A whole number in text (nothing else); 1 if it is one. */
static int number(const char *text, unsigned long long *out) {
    char *end;
    if (!*text || *text == '-')
        return 0;
    *out = strtoull(text, &end, 10);
    return !*end;
}

/* The GPU (not a MIG device) with this UUID as written in DEVICES, or NULL. */
static struct fake_device *find_gpu(struct machine *t, const char *uuid) {
    struct fake_device *d = find_configured(t, uuid);
    return d && !d->parent ? d : NULL;
}

static int parse_events(struct machine *t, const char *spec) {
    if (!spec)
        return 1;
    char *copy = strdup(spec), *save = NULL, *f[6];
    int ok = 1;
    for (char *tok = strtok_r(copy, ";", &save); ok && tok; tok = strtok_r(NULL, ";", &save)) {
        char *entry = trim(tok), shown[256];
        unsigned long long seq, data, gi = NO_INSTANCE, ci = NO_INSTANCE;
        if (!*entry)
            continue;
        snprintf(shown, sizeof shown, "%s", entry);
        int n = fields(entry, f, 4, 6);
        if (!n || n == 5 || t->event_count == MAX_EVENTS) {
            ok = bad("EVENTS", shown, "want SEQ|UUID|TYPE|DATA[|GI|CI] (at most 256)");
            continue;
        }
        struct fake_event *e = &t->events[t->event_count];
        if (!number(f[0], &seq))
            ok = bad("EVENTS", shown, "SEQ must be a whole number");
        else if (!find_gpu(t, f[1]))
            ok = bad("EVENTS", shown, "no GPU with this UUID in DEVICES");
        else if (strcmp(f[2], "xid") && strcmp(f[2], "dbe"))
            ok = bad("EVENTS", shown, "TYPE must be xid or dbe");
        else if (!number(f[3], &data))
            ok = bad("EVENTS", shown, "DATA must be a whole number (the XID)");
        else if (n == 6 && (!number(f[4], &gi) || !number(f[5], &ci) || gi > NO_INSTANCE ||
                            ci > NO_INSTANCE))
            ok = bad("EVENTS", shown, "GI and CI must be whole numbers (4294967295: none)");
        for (unsigned int i = 0; ok && i < t->event_count; i++)
            if (t->events[i].seq == seq)
                ok = bad("EVENTS", shown, "SEQ already used");
        if (ok) {
            e->seq = seq;
            strcpy(e->uuid, f[1]);
            e->type = !strcmp(f[2], "xid") ? NVML_EVENT_XID : NVML_EVENT_DOUBLE_BIT_ECC;
            e->data = data;
            e->gpu_instance = (unsigned int)gi;
            e->compute_instance = (unsigned int)ci;
            t->event_count++;
        }
    }
    free(copy);
    return ok;
}

static int parse_ecc(struct machine *t, const char *spec) {
    if (!spec)
        return 1;
    char *copy = strdup(spec), *save = NULL, *f[3];
    int ok = 1;
    for (char *tok = strtok_r(copy, ";", &save); ok && tok; tok = strtok_r(NULL, ";", &save)) {
        char *entry = trim(tok), shown[256];
        unsigned long long volatile_count, aggregate;
        if (!*entry)
            continue;
        snprintf(shown, sizeof shown, "%s", entry);
        struct fake_device *d = fields(entry, f, 3, 3) ? find_gpu(t, f[0]) : NULL;
        if (!d)
            ok = bad("ECC", shown, "want UUID|VOLATILE|AGGREGATE, UUID a GPU's in DEVICES");
        else if (!number(f[1], &volatile_count) || !number(f[2], &aggregate))
            ok = bad("ECC", shown, "counts must be whole numbers");
        else {
            d->ecc_volatile = volatile_count;
            d->ecc_aggregate = aggregate;
        }
    }
    free(copy);
    return ok;
}

static int parse_remap(struct machine *t, const char *spec) {
    if (!spec)
        return 1;
    char *copy = strdup(spec), *save = NULL, *f[5];
    int ok = 1;
    for (char *tok = strtok_r(copy, ";", &save); ok && tok; tok = strtok_r(NULL, ";", &save)) {
        char *entry = trim(tok), shown[256];
        unsigned long long corr, unc, pending, failure;
        if (!*entry)
            continue;
        snprintf(shown, sizeof shown, "%s", entry);
        struct fake_device *d = fields(entry, f, 5, 5) ? find_gpu(t, f[0]) : NULL;
        if (!d)
            ok = bad("REMAP", shown,
                     "want UUID|CORRECTABLE|UNCORRECTABLE|PENDING|FAILURE, UUID a GPU's");
        else if (!number(f[1], &corr) || !number(f[2], &unc) || corr > 65535 || unc > 65535)
            ok = bad("REMAP", shown, "rows must be whole numbers");
        else if (!number(f[3], &pending) || !number(f[4], &failure) || pending > 1 || failure > 1)
            ok = bad("REMAP", shown, "PENDING and FAILURE must be 0 or 1");
        else {
            d->remap_corr = (unsigned int)corr;
            d->remap_unc = (unsigned int)unc;
            d->remap_pending = (unsigned int)pending;
            d->remap_failure = (unsigned int)failure;
        }
    }
    free(copy);
    return ok;
}

/* KEY=VALUE lines of FAKE_NVML_FILE, or the FAKE_NVML_KEY variables. */
static int parse_machine(struct machine *t) {
    memset(t, 0, sizeof *t);
    t->privileged = 1;
    const char *path = getenv("FAKE_NVML_FILE");
    const char *keys[] = {"DEVICES", "USE", "FAIL_CALLS", "PRIVILEGED", "EVENTS", "ECC", "REMAP"};
    enum { KEYS = sizeof keys / sizeof keys[0] };
    char *values[KEYS] = {NULL}, *text = NULL;
    if (path) {
        FILE *file = fopen(path, "r");
        if (!file) {
            fprintf(stderr, "fake NVML: cannot read FAKE_NVML_FILE %s\n", path);
            return 0;
        }
        size_t size = 0;
        char chunk[4096];
        for (size_t n; (n = fread(chunk, 1, sizeof chunk, file)) > 0; size += n) {
            text = realloc(text, size + n + 1);
            memcpy(text + size, chunk, n);
        }
        fclose(file);
        text = text ? text : calloc(1, 1);
        text[size] = '\0';
        char *save = NULL;
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            char *eq = strchr(line, '=');
            int known = 0;
            for (int k = 0; eq && k < KEYS; k++)
                if ((size_t)(eq - line) == strlen(keys[k]) && !strncmp(line, keys[k], eq - line))
                    values[k] = eq + 1, known = 1;
            if (!known && *trim(line)) {
                fprintf(stderr, "fake NVML: FAKE_NVML_FILE line '%.40s': want KEY=VALUE, KEY one"
                                " of DEVICES, USE, FAIL_CALLS, PRIVILEGED, EVENTS, ECC, REMAP\n",
                        line);
                free(text);
                return 0;
            }
        }
    } else {
        for (int k = 0; k < KEYS; k++) {
            char name[64];
            snprintf(name, sizeof name, "FAKE_NVML_%s", keys[k]);
            values[k] = getenv(name);
        }
    }
    int ok = parse_devices(t, values[0]) && parse_use(t, values[1]) &&
             parse_fails(t, values[2]) && parse_events(t, values[4]) && parse_ecc(t, values[5]) &&
             parse_remap(t, values[6]);
    if (ok && values[3]) {
        char *p = trim(values[3]);
        if (strcmp(p, "0") && strcmp(p, "1"))
            ok = bad("PRIVILEGED", p, "must be 0 or 1");
        t->privileged = !strcmp(p, "1");
    }
    free(text);
    return ok;
}

/* Take a new description: handles of devices that changed stop working. */
static void adopt(struct machine *next) {
    for (unsigned int i = 0; i < MAX_GPUS; i++)
        if (i >= next->gpu_count || i >= m.gpu_count || strcmp(next->gpus[i].uuid, m.gpus[i].uuid))
            gpu_generation[i]++;
    mig_generation++;
    memcpy(&m, next, sizeof m);
    for (unsigned int i = 0; i < m.gpu_count; i++)
        for (int s = 0; s < MAX_MIG_SLOTS; s++)
            if (m.migs[i][s].used)
                m.migs[i][s].parent = &m.gpus[i];
}

static int same_file(const struct stat *a, const struct stat *b) {
    return a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Re-read FAKE_NVML_FILE if it changed since it was last read. */
static void refresh(void) {
    const char *path = getenv("FAKE_NVML_FILE");
    struct stat now;
    if (!path || stat(path, &now) != 0 || same_file(&now, &file_seen))
        return;
    static struct machine next;
    if (parse_machine(&next))
        adopt(&next);
    file_seen = now;
}

/* -- what callers see ------------------------------------------------------------------- */

static void reported_name(const struct fake_device *d, char *out) {
    const char *name = d->name;
#ifdef FAKE_NVML_OLD_DRIVER
    if (!strncmp(name, "NVIDIA ", 7))
        name += 7;
#endif
    snprintf(out, TEXT_SIZE, "%s", name);
}

static void reported_uuid(const struct fake_device *d, char *out) {
#ifdef FAKE_NVML_OLD_DRIVER
    if (d->parent) {
        snprintf(out, TEXT_SIZE, "MIG-%.80s/%u/0", d->parent->uuid, d->gpu_instance);
        return;
    }
#endif
    snprintf(out, TEXT_SIZE, "%s", d->uuid);
}

/* The device with this UUID as NVML reports it (or as written, where they differ), or NULL. */
static struct fake_device *find_uuid(const char *uuid) {
    char shown[TEXT_SIZE];
    for (unsigned int i = 0; i < m.gpu_count; i++) {
        for (int s = -1; s < MAX_MIG_SLOTS; s++) {
            struct fake_device *d = s < 0 ? &m.gpus[i] : &m.migs[i][s];
            if (!d->used)
                continue;
            reported_uuid(d, shown);
            if (!strcmp(shown, uuid))
                return d;
        }
    }
    return NULL;
}

static nvmlDevice_t handle_of(const struct fake_device *d) {
    uintptr_t generation = d->parent ? mig_generation : gpu_generation[d->gpu];
    uintptr_t slot = d->parent ? d->slot + 1 : 0;
    return (nvmlDevice_t)(((uintptr_t)0xF4 << 40) | ((generation & 0xFFFFFF) << 16) |
                          ((uintptr_t)d->gpu << 8) | slot);
}

/* A handle this library gave out that is still valid, GPU or MIG device; NULL otherwise. */
static struct fake_device *lookup(nvmlDevice_t handle) {
    uintptr_t h = (uintptr_t)handle;
    unsigned int gpu = (h >> 8) & 0xFF, slot = h & 0xFF;
    unsigned int generation = (h >> 16) & 0xFFFFFF;
    if ((h >> 40) != 0xF4 || gpu >= m.gpu_count || slot > MAX_MIG_SLOTS)
        return NULL;
    if (slot == 0)
        return generation == (gpu_generation[gpu] & 0xFFFFFF) ? &m.gpus[gpu] : NULL;
    struct fake_device *d = &m.migs[gpu][slot - 1];
    if (!d->used || m.gpus[gpu].mig != MIG_ON || generation != (mig_generation & 0xFFFFFF))
        return NULL;
    return d;
}

/* The failure FAIL_CALLS sets for nvml<function> on this device, or NVML_SUCCESS. */
static nvmlReturn_t injected(const char *function, const struct fake_device *d) {
    for (unsigned int i = 0; i < m.fail_count; i++) {
        const struct fail *f = &m.fails[i];
        if (strcmp(f->uuid, d->uuid))
            continue;
        if (!strcmp(f->function, "*") ||
            (!strncmp(f->function, "nvml", 4) && !strcmp(f->function + 4, function)))
            return f->code;
    }
    return NVML_SUCCESS;
}

/* Every exported call: one at a time, the machine re-read if it changed. */
#define LOCKED(call)                                                                               \
    do {                                                                                           \
        pthread_mutex_lock(&lock);                                                                 \
        if (init_count)                                                                            \
            refresh();                                                                             \
        nvmlReturn_t result_ = init_count ? (call) : NVML_ERROR_UNINITIALIZED;                     \
        pthread_mutex_unlock(&lock);                                                               \
        return result_;                                                                            \
    } while (0)

#define REQUIRE_DEVICE(d, handle)                                                                  \
    struct fake_device *d = lookup(handle);                                                        \
    if (!d)                                                                                        \
        return NVML_ERROR_INVALID_ARGUMENT;                                                        \
    if (d->lost)                                                                                   \
        return NVML_ERROR_GPU_IS_LOST;                                                             \
    do {                                                                                           \
        nvmlReturn_t failure_ = injected(__func__ + 3, d); /* do_X implements nvmlX */            \
        if (failure_ != NVML_SUCCESS)                                                              \
            return failure_;                                                                       \
    } while (0)

/* The implementations below are do_<exported name without the nvml prefix>. */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    const char *fail = getenv("FAKE_NVML_FAIL");
    if (fail && !strcmp(fail, "driver"))
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (fail && !strcmp(fail, "mismatch"))
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    pthread_mutex_lock(&lock);
    nvmlReturn_t result = NVML_SUCCESS;
    if (init_count == 0) {
        static struct machine next;
        const char *path = getenv("FAKE_NVML_FILE");
        if (path)
            stat(path, &file_seen);
        if (parse_machine(&next))
            adopt(&next);
        else
            result = NVML_ERROR_UNKNOWN;
    }
    if (result == NVML_SUCCESS)
        init_count++;
    pthread_mutex_unlock(&lock);
    return result;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t result = init_count ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count)
        init_count--;
    pthread_mutex_unlock(&lock);
    return result;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case NVML_ERROR_NO_PERMISSION:
        return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND:
        return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
        return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT:
        return "Timeout";
    case NVML_ERROR_GPU_IS_LOST:
        return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
        return "Argument version mismatch";
    default:
        return "Unknown Error";
    }
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length) {
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

static nvmlReturn_t do_SystemGetDriverVersion(char *version, unsigned int length) {
    return copy_text(DRIVER_VERSION, version, length);
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    LOCKED(do_SystemGetDriverVersion(version, length));
}

static nvmlReturn_t do_SystemGetCudaDriverVersion(int *version) {
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = CUDA_VERSION;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    LOCKED(do_SystemGetCudaDriverVersion(version));
}

static nvmlReturn_t do_DeviceGetCount_v2(unsigned int *count) {
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = m.gpu_count;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { LOCKED(do_DeviceGetCount_v2(count)); }

static nvmlReturn_t do_DeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!device || index >= m.gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_device *d = &m.gpus[index];
    nvmlReturn_t failure = injected("DeviceGetHandleByIndex_v2", d);
    if (failure != NVML_SUCCESS)
        return failure;
    if (d->lost)
        return NVML_ERROR_GPU_IS_LOST;
    *device = handle_of(d);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    LOCKED(do_DeviceGetHandleByIndex_v2(index, device));
}

static nvmlReturn_t do_DeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_device *d = find_uuid(uuid);
    if (!d || (d->parent && d->parent->mig != MIG_ON))
        return NVML_ERROR_NOT_FOUND;
    nvmlReturn_t failure = injected("DeviceGetHandleByUUID", d);
    if (failure != NVML_SUCCESS)
        return failure;
    if (d->lost || (d->parent && d->parent->lost))
        return NVML_ERROR_GPU_IS_LOST;
    *device = handle_of(d);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    LOCKED(do_DeviceGetHandleByUUID(uuid, device));
}

static nvmlReturn_t do_DeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    REQUIRE_DEVICE(d, device);
    char shown[TEXT_SIZE];
    reported_name(d, shown);
    return copy_text(shown, name, length);
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    LOCKED(do_DeviceGetName(device, name, length));
}

static nvmlReturn_t do_DeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    REQUIRE_DEVICE(d, device);
    char shown[TEXT_SIZE];
    reported_uuid(d, shown);
    return copy_text(shown, uuid, length);
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    LOCKED(do_DeviceGetUUID(device, uuid, length));
}

static nvmlReturn_t do_DeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    REQUIRE_DEVICE(d, device);
    if (!index || d->parent)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = d->gpu;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    LOCKED(do_DeviceGetIndex(device, index));
}

static unsigned long long used_bytes(const struct fake_device *d) {
    unsigned long long used = d->used_mib + d->driver_mib;
    if (!d->parent && d->mig == MIG_ON)
        for (int s = 0; s < MAX_MIG_SLOTS; s++)
            if (m.migs[d->gpu][s].used)
                used += m.migs[d->gpu][s].used_mib + m.migs[d->gpu][s].driver_mib;
    return used << 20;
}

static nvmlReturn_t do_DeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    REQUIRE_DEVICE(d, device);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = d->memory_mib << 20;
    memory->used = used_bytes(d);
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    LOCKED(do_DeviceGetMemoryInfo(device, memory));
}

#ifndef FAKE_NVML_OLD_DRIVER
static nvmlReturn_t do_DeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    REQUIRE_DEVICE(d, device);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = d->memory_mib << 20;
    memory->reserved = d->driver_mib << 20;
    memory->used = used_bytes(d);
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    LOCKED(do_DeviceGetMemoryInfo_v2(device, memory));
}
#endif

static nvmlReturn_t do_DeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                        unsigned int *pendingMode) {
    REQUIRE_DEVICE(d, device);
    if (!currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent || d->mig == MIG_NONE)
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = d->mig == MIG_ON ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *pendingMode = d->pending == MIG_ON ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode) {
    LOCKED(do_DeviceGetMigMode(device, currentMode, pendingMode));
}

/* NVML: zero when MIG is not supported or not enabled. */
static nvmlReturn_t do_DeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    REQUIRE_DEVICE(d, device);
    if (!count || d->parent)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = d->mig == MIG_ON ? MAX_MIG_SLOTS : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    LOCKED(do_DeviceGetMaxMigDeviceCount(device, count));
}

static nvmlReturn_t do_DeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                       nvmlDevice_t *migDevice) {
    struct fake_device *d = lookup(device);
    if (!d || !migDevice || d->parent || index >= MAX_MIG_SLOTS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig == MIG_NONE)
        return NVML_ERROR_NOT_SUPPORTED;
    struct fake_device *slot = &m.migs[d->gpu][index];
    if (d->mig != MIG_ON || !slot->used)
        return NVML_ERROR_NOT_FOUND;
    nvmlReturn_t failure = injected("DeviceGetMigDeviceHandleByIndex", slot);
    if (failure != NVML_SUCCESS)
        return failure;
    *migDevice = handle_of(slot);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice) {
    LOCKED(do_DeviceGetMigDeviceHandleByIndex(device, index, migDevice));
}

static nvmlReturn_t do_DeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMig) {
    REQUIRE_DEVICE(d, device);
    if (!isMig)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMig = d->parent != NULL;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMig) {
    LOCKED(do_DeviceIsMigDeviceHandle(device, isMig));
}

static nvmlReturn_t do_DeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                                nvmlDevice_t *device) {
    REQUIRE_DEVICE(d, migDevice);
    if (!device || !d->parent)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = handle_of(d->parent);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                          nvmlDevice_t *device) {
    LOCKED(do_DeviceGetDeviceHandleFromMigDeviceHandle(migDevice, device));
}

static nvmlReturn_t do_DeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    REQUIRE_DEVICE(d, device);
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->parent)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = d->gpu_instance;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    LOCKED(do_DeviceGetGpuInstanceId(device, id));
}

static nvmlReturn_t do_DeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    REQUIRE_DEVICE(d, device);
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->parent)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    LOCKED(do_DeviceGetComputeInstanceId(device, id));
}

static unsigned long long now_us(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (unsigned long long)tv.tv_sec * 1000000ULL + (unsigned long long)tv.tv_usec;
}

/* Mean activity, percent, over the sample period that ends at end_us. */
static unsigned int period_mean(const struct fake_device *d, unsigned long long end_us) {
    if (d->period_ms == 0)
        return d->level;
    unsigned long long on = 0, start_ms = (end_us - SAMPLE_US) / 1000, end_ms = end_us / 1000;
    for (unsigned long long t = start_ms; t < end_ms; t++)
        on += (t % d->period_ms) < d->on_ms;
    return (unsigned int)((on * d->level + (end_ms - start_ms) / 2) / (end_ms - start_ms));
}

static nvmlReturn_t do_DeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *rates) {
    REQUIRE_DEVICE(d, device);
    if (!rates)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent || d->mig == MIG_ON)
        return NVML_ERROR_NOT_SUPPORTED;
    rates->gpu = period_mean(d, now_us() / SAMPLE_US * SAMPLE_US);
    rates->memory = d->memory_mib ? (unsigned int)(d->used_mib * 100 / d->memory_mib) : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *rates) {
    LOCKED(do_DeviceGetUtilizationRates(device, rates));
}

/* As NVML: with no buffer the count there is now; with one, as many as fit, oldest first. */
static nvmlReturn_t do_DeviceGetSamples(nvmlDevice_t device, int type, unsigned long long lastSeen,
                                        int *valueType, unsigned int *count,
                                        nvmlSample_t *samples) {
    REQUIRE_DEVICE(d, device);
    if (!valueType || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (type != NVML_GPU_UTILIZATION_SAMPLES || d->parent || d->mig == MIG_ON)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned long long last = now_us() / SAMPLE_US, first = last - (KEPT_SAMPLES - 1);
    if (first <= lastSeen / SAMPLE_US)
        first = lastSeen / SAMPLE_US + 1;
    if (first > last)
        return NVML_ERROR_NOT_FOUND;
    *valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    unsigned int there = (unsigned int)(last - first + 1);
    if (!samples) {
        *count = there;
        return NVML_SUCCESS;
    }
    unsigned int given = there < *count ? there : *count;
    for (unsigned int i = 0; i < given; i++) {
        samples[i].timeStamp = (first + i) * SAMPLE_US;
        samples[i].sampleValue.ullVal = 0;
        samples[i].sampleValue.uiVal = period_mean(d, samples[i].timeStamp);
    }
    *count = given;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, int type, unsigned long long lastSeen,
                                  int *valueType, unsigned int *count, nvmlSample_t *samples) {
    LOCKED(do_DeviceGetSamples(device, type, lastSeen, valueType, count, samples));
}

/* The compute processes of a device: its own, or for a GPU in MIG mode those of every MIG
 * device on it (with their instance ids). With too small a buffer (or none), the count
 * needed and INSUFFICIENT_SIZE, as NVML. */
static nvmlReturn_t processes(struct fake_device *d, unsigned int *infoCount,
                              nvmlProcessInfo_v2_t *v2, nvmlProcessInfo_v1_t *v1) {
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    int mig = d->parent || d->mig == MIG_ON;
    if (mig && !m.privileged)
        return NVML_ERROR_NO_PERMISSION;
    struct fake_device *owners[MAX_MIG_SLOTS + 1];
    unsigned int n_owners = 0, total = 0;
    if (!d->parent && d->mig == MIG_ON) {
        for (int s = 0; s < MAX_MIG_SLOTS; s++)
            if (m.migs[d->gpu][s].used)
                owners[n_owners++] = &m.migs[d->gpu][s];
    } else {
        owners[n_owners++] = d;
    }
    for (unsigned int o = 0; o < n_owners; o++)
        total += owners[o]->processes;
    if (total == 0) {
        *infoCount = 0;
        return NVML_SUCCESS;
    }
    if ((!v2 && !v1) || *infoCount < total) {
        *infoCount = total;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int i = 0;
    for (unsigned int o = 0; o < n_owners; o++) {
        struct fake_device *p = owners[o];
        for (unsigned int k = 0; k < p->processes; k++, i++) {
            unsigned int pid = 4000 + p->gpu * 100 + (p->parent ? (p->slot + 1) * 10 : 0) + k;
            unsigned long long memory = (p->used_mib << 20) / p->processes;
            if (v2) {
                v2[i].pid = pid;
                v2[i].usedGpuMemory = memory;
                v2[i].gpuInstanceId = p->parent ? p->gpu_instance : NO_INSTANCE;
                v2[i].computeInstanceId = p->parent ? 0 : NO_INSTANCE;
            } else {
                v1[i].pid = pid;
                v1[i].usedGpuMemory = memory;
            }
        }
    }
    *infoCount = total;
    return NVML_SUCCESS;
}

static nvmlReturn_t do_DeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *n,
                                                        nvmlProcessInfo_v1_t *infos) {
    REQUIRE_DEVICE(d, device);
    return processes(d, n, NULL, infos);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *n,
                                                  nvmlProcessInfo_v1_t *infos) {
    LOCKED(do_DeviceGetComputeRunningProcesses(device, n, infos));
}

static nvmlReturn_t do_DeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *n,
                                                           nvmlProcessInfo_v2_t *infos) {
    REQUIRE_DEVICE(d, device);
    return processes(d, n, infos, NULL);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *n,
                                                     nvmlProcessInfo_v2_t *infos) {
    LOCKED(do_DeviceGetComputeRunningProcesses_v2(device, n, infos));
}

#ifndef FAKE_NVML_OLD_DRIVER
static nvmlReturn_t do_DeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *n,
                                                           nvmlProcessInfo_v2_t *infos) {
    REQUIRE_DEVICE(d, device);
    return processes(d, n, infos, NULL);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *n,
                                                     nvmlProcessInfo_v2_t *infos) {
    LOCKED(do_DeviceGetComputeRunningProcesses_v3(device, n, infos));
}
#endif

/* -- health: events, ECC counts, row remapping (every driver build has them) --------------
 *
 * An event set records what it was registered for (GPU UUID as written, event types) and
 * which EVENTS SEQs it has delivered. nvmlEventSetWait_v2 takes the lock only to look, so a
 * thread waiting for events never holds up the other calls. */
#define EVENT_SET_MAGIC 0x45564E54u

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

struct fake_event_set {
    unsigned int magic;
    unsigned int registered;
    struct {
        char uuid[TEXT_SIZE];
        unsigned long long types;
    } on[MAX_GPUS];
    unsigned long long *delivered; /* SEQs */
    unsigned int delivered_count;
};

typedef struct fake_event_set *nvmlEventSet_t;

static int name_has(const struct fake_device *d, const char *const words[]) {
    const char *name = d->parent ? d->parent->name : d->name;
    for (size_t i = 0; words[i]; i++)
        if (strstr(name, words[i]))
            return 1;
    return 0;
}

static int has_ecc(const struct fake_device *d) {
    static const char *const without[] = {"RTX", "GeForce", "Matrox", NULL};
    return !name_has(d, without);
}

/* Row remapping came with Ampere; the cards before it retire pages instead. */
static int has_remap(const struct fake_device *d) {
    static const char *const before_ampere[] = {" T4", "V100", "P100", NULL};
    return has_ecc(d) && !name_has(d, before_ampere);
}

static unsigned long long supported_events(const struct fake_device *d) {
    unsigned long long types = NVML_EVENT_PSTATE | NVML_EVENT_CLOCK | NVML_EVENT_XID;
    return has_ecc(d) ? types | NVML_EVENT_SINGLE_BIT_ECC | NVML_EVENT_DOUBLE_BIT_ECC : types;
}

static nvmlReturn_t do_EventSetCreate(nvmlEventSet_t *set) {
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_event_set *s = calloc(1, sizeof *s);
    if (!s)
        return NVML_ERROR_UNKNOWN;
    s->magic = EVENT_SET_MAGIC;
    *set = s;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) { LOCKED(do_EventSetCreate(set)); }

static nvmlReturn_t do_EventSetFree(nvmlEventSet_t set) {
    if (!set || set->magic != EVENT_SET_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    set->magic = 0;
    free(set->delivered);
    free(set);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { LOCKED(do_EventSetFree(set)); }

static nvmlReturn_t do_DeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                    unsigned long long *eventTypes) {
    REQUIRE_DEVICE(d, device);
    if (!eventTypes)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent) /* events are registered on the GPU; they name the instance */
        return NVML_ERROR_NOT_SUPPORTED;
    *eventTypes = supported_events(d);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                              unsigned long long *eventTypes) {
    LOCKED(do_DeviceGetSupportedEventTypes(device, eventTypes));
}

static nvmlReturn_t do_DeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                            nvmlEventSet_t set) {
    REQUIRE_DEVICE(d, device);
    if (!set || set->magic != EVENT_SET_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent || (eventTypes & ~supported_events(d)))
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int i = 0;
    while (i < set->registered && strcmp(set->on[i].uuid, d->uuid))
        i++;
    if (i == set->registered) {
        if (i == MAX_GPUS)
            return NVML_ERROR_UNKNOWN;
        strcpy(set->on[i].uuid, d->uuid);
        set->registered++;
    }
    set->on[i].types |= eventTypes;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set) {
    LOCKED(do_DeviceRegisterEvents(device, eventTypes, set));
}

/* The first EVENTS entry this set is registered for and has not had: into data, SUCCESS;
 * NVML_ERROR_TIMEOUT when there is none now. */
static nvmlReturn_t do_EventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data) {
    if (!set || set->magic != EVENT_SET_MAGIC || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int e = 0; e < m.event_count; e++) {
        const struct fake_event *event = &m.events[e];
        int wanted = 0, had = 0;
        for (unsigned int i = 0; i < set->registered; i++)
            wanted |= !strcmp(set->on[i].uuid, event->uuid) && (set->on[i].types & event->type);
        for (unsigned int i = 0; wanted && i < set->delivered_count; i++)
            had |= set->delivered[i] == event->seq;
        struct fake_device *gpu = find_gpu(&m, event->uuid);
        if (!wanted || had || !gpu)
            continue;
        unsigned long long *grown =
            realloc(set->delivered, (set->delivered_count + 1) * sizeof *set->delivered);
        if (!grown)
            return NVML_ERROR_UNKNOWN;
        set->delivered = grown;
        set->delivered[set->delivered_count++] = event->seq;
        data->device = handle_of(gpu);
        data->eventType = event->type;
        data->eventData = event->data;
        data->gpuInstanceId = event->gpu_instance;
        data->computeInstanceId = event->compute_instance;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_TIMEOUT;
}
/* Not LOCKED as a whole: looks every 20 ms under the lock, sleeps outside it. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeoutms) {
    unsigned long long deadline = now_us() + timeoutms * 1000ULL;
    for (;;) {
        pthread_mutex_lock(&lock);
        if (init_count)
            refresh();
        nvmlReturn_t result = init_count ? do_EventSetWait_v2(set, data) : NVML_ERROR_UNINITIALIZED;
        pthread_mutex_unlock(&lock);
        unsigned long long now = now_us();
        if (result != NVML_ERROR_TIMEOUT || now >= deadline)
            return result;
        unsigned long long pause = deadline - now < 20000 ? deadline - now : 20000;
        struct timespec nap = {0, (long)(pause * 1000)};
        nanosleep(&nap, NULL);
    }
}

/* Uncorrected errors of a GPU; none corrected. */
static nvmlReturn_t ecc_count(const struct fake_device *d, int errorType, int counterType,
                              unsigned long long *count) {
    if (!count || errorType < 0 || errorType > NVML_MEMORY_ERROR_TYPE_UNCORRECTED ||
        (counterType != NVML_VOLATILE_ECC && counterType != NVML_AGGREGATE_ECC))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent || !has_ecc(d))
        return NVML_ERROR_NOT_SUPPORTED;
    if (errorType != NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        *count = 0;
    else
        *count = counterType == NVML_VOLATILE_ECC ? d->ecc_volatile : d->ecc_aggregate;
    return NVML_SUCCESS;
}

static nvmlReturn_t do_DeviceGetTotalEccErrors(nvmlDevice_t device, int errorType,
                                               int counterType, unsigned long long *count) {
    REQUIRE_DEVICE(d, device);
    return ecc_count(d, errorType, counterType, count);
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                         unsigned long long *count) {
    LOCKED(do_DeviceGetTotalEccErrors(device, errorType, counterType, count));
}

/* Every uncorrected error is in device memory (DRAM); the other locations count none. */
static nvmlReturn_t do_DeviceGetMemoryErrorCounter(nvmlDevice_t device, int errorType,
                                                   int counterType, int locationType,
                                                   unsigned long long *count) {
    REQUIRE_DEVICE(d, device);
    if (locationType < 0 || locationType >= NVML_MEMORY_LOCATION_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t result = ecc_count(d, errorType, counterType, count);
    if (result == NVML_SUCCESS && locationType != NVML_MEMORY_LOCATION_DEVICE_MEMORY)
        *count = 0;
    return result;
}
nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, int errorType, int counterType,
                                             int locationType, unsigned long long *count) {
    LOCKED(do_DeviceGetMemoryErrorCounter(device, errorType, counterType, locationType, count));
}

static nvmlReturn_t do_DeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                             unsigned int *uncRows, unsigned int *isPending,
                                             unsigned int *failureOccurred) {
    REQUIRE_DEVICE(d, device);
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent || !has_remap(d))
        return NVML_ERROR_NOT_SUPPORTED;
    *corrRows = d->remap_corr;
    *uncRows = d->remap_unc;
    *isPending = d->remap_pending;
    *failureOccurred = d->remap_failure;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                       unsigned int *uncRows, unsigned int *isPending,
                                       unsigned int *failureOccurred) {
    LOCKED(do_DeviceGetRemappedRows(device, corrRows, uncRows, isPending, failureOccurred));
}

/* -- GPM: per-instance activity counters (Hopper and later; not on the old driver) -------
 *
 * A GPU counts GPM when its name is a Hopper or Blackwell card (H100, H200, H800, H20,
 * GH200, B200); others (A100, A30, ...) answer isSupportedDevice 0 and NOT_SUPPORTED to
 * samples. A sample of a MIG device is taken on its GPU by GPU instance id
 * (nvmlGpmMigSampleGet); it holds the time and the instance's activity so far, which is the
 * USE entry's UTILIZATION of that MIG device (N, or the N/ON_MS/PERIOD_MS pattern). Between
 * two samples of one instance, NVML_GPM_METRIC_GRAPHICS_UTIL and NVML_GPM_METRIC_SM_UTIL are
 * its mean activity in percent; other metrics answer NOT_SUPPORTED in their nvmlReturn. */
#ifndef FAKE_NVML_OLD_DRIVER
#define NVML_GPM_METRICS_GET_VERSION 1
#define NVML_GPM_SUPPORT_VERSION 1
#define NVML_GPM_METRIC_GRAPHICS_UTIL 1
#define NVML_GPM_METRIC_SM_UTIL 2
#define GPM_METRICS_MAX 98 /* NVML_GPM_METRIC_MAX of the first header with GPM; later ones grow */
#define GPM_MAGIC 0x47504D31u

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo;
} nvmlGpmMetric_t;

struct fake_gpm_sample {
    unsigned int magic;
    int taken;
    unsigned int gpu, gpu_instance;
    unsigned long long at_us;
    unsigned long long active; /* percent x milliseconds of activity since the epoch */
};

typedef struct fake_gpm_sample *nvmlGpmSample_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[GPM_METRICS_MAX];
} nvmlGpmMetricsGet_t;

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

static int gpm_capable(const struct fake_device *gpu) {
    static const char *cards[] = {"H100", "H200", "H800", "H20", "GH200", "B200"};
    for (size_t i = 0; i < sizeof cards / sizeof cards[0]; i++)
        if (strstr(gpu->name, cards[i]))
            return 1;
    return 0;
}

/* Activity of d from the epoch to t_ms, in percent x milliseconds. */
static unsigned long long activity_until(const struct fake_device *d, unsigned long long t_ms) {
    if (d->period_ms == 0)
        return d->level * t_ms;
    unsigned long long rest = t_ms % d->period_ms;
    return d->level * ((t_ms / d->period_ms) * d->on_ms + (rest < d->on_ms ? rest : d->on_ms));
}

static nvmlReturn_t do_GpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    REQUIRE_DEVICE(d, device);
    if (!support || d->parent) /* asked of the GPU, not of a MIG device */
        return NVML_ERROR_INVALID_ARGUMENT;
    if (support->version != NVML_GPM_SUPPORT_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    support->isSupportedDevice = (unsigned int)gpm_capable(d);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    LOCKED(do_GpmQueryDeviceSupport(device, support));
}

static nvmlReturn_t do_GpmSampleAlloc(nvmlGpmSample_t *sample) {
    if (!sample)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_gpm_sample *s = calloc(1, sizeof *s);
    if (!s)
        return NVML_ERROR_UNKNOWN;
    s->magic = GPM_MAGIC;
    *sample = s;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) { LOCKED(do_GpmSampleAlloc(sample)); }

static nvmlReturn_t do_GpmSampleFree(nvmlGpmSample_t sample) {
    if (!sample || sample->magic != GPM_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    sample->magic = 0;
    free(sample);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) { LOCKED(do_GpmSampleFree(sample)); }

static nvmlReturn_t do_GpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId,
                                       nvmlGpmSample_t sample) {
    REQUIRE_DEVICE(d, device);
    if (!sample || sample->magic != GPM_MAGIC || d->parent)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpm_capable(d))
        return NVML_ERROR_NOT_SUPPORTED;
    struct fake_device *instance = NULL;
    for (int s = 0; d->mig == MIG_ON && s < MAX_MIG_SLOTS; s++)
        if (m.migs[d->gpu][s].used && m.migs[d->gpu][s].gpu_instance == gpuInstanceId)
            instance = &m.migs[d->gpu][s];
    if (!instance)
        return NVML_ERROR_INVALID_ARGUMENT;
    sample->taken = 1;
    sample->gpu = d->gpu;
    sample->gpu_instance = gpuInstanceId;
    sample->at_us = now_us();
    sample->active = activity_until(instance, sample->at_us / 1000);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId,
                                 nvmlGpmSample_t sample) {
    LOCKED(do_GpmMigSampleGet(device, gpuInstanceId, sample));
}

static nvmlReturn_t do_GpmMetricsGet(nvmlGpmMetricsGet_t *request) {
    static char graphics[] = "gr_util", graphics_long[] = "graphics utilization";
    static char sm[] = "sm_util", sm_long[] = "SM utilization", percent[] = "%";
    if (!request)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (request->version != NVML_GPM_METRICS_GET_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct fake_gpm_sample *a = request->sample1, *b = request->sample2;
    if (!a || !b || a->magic != GPM_MAGIC || b->magic != GPM_MAGIC || !a->taken || !b->taken ||
        a->gpu != b->gpu || a->gpu_instance != b->gpu_instance || b->at_us / 1000 <= a->at_us / 1000)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (request->numMetrics == 0 || request->numMetrics > GPM_METRICS_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    double mean = (double)(b->active - a->active) / (double)(b->at_us / 1000 - a->at_us / 1000);
    for (unsigned int i = 0; i < request->numMetrics; i++) {
        nvmlGpmMetric_t *metric = &request->metrics[i];
        unsigned int id = metric->metricId;
        int known = id == NVML_GPM_METRIC_GRAPHICS_UTIL || id == NVML_GPM_METRIC_SM_UTIL;
        metric->nvmlReturn = known ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
        metric->value = known ? mean : 0.0;
        metric->metricInfo.shortName = id == NVML_GPM_METRIC_SM_UTIL ? sm : graphics;
        metric->metricInfo.longName = id == NVML_GPM_METRIC_SM_UTIL ? sm_long : graphics_long;
        metric->metricInfo.unit = percent;
    }
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *request) {
    LOCKED(do_GpmMetricsGet(request));
}
#endif
