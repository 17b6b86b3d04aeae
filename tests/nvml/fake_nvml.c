/*
 * A stand-in for libnvidia-ml.so.1 (NVML) for machines without an NVIDIA GPU.
 *
 * Build it as libnvidia-ml.so.1 and put its folder on LD_LIBRARY_PATH: pynvml's own ctypes
 * code then loads it and calls it exactly as it calls the real driver library. Only the entry
 * points gputap's inventory uses are here; pynvml answers NVML_ERROR_FUNCTION_NOT_FOUND for
 * anything else, as the real library does for a symbol an old driver lacks.
 *
 *     gcc -shared -fPIC -o libnvidia-ml.so.1 fake_nvml.c
 *
 * The machine it pretends to be is read from the environment at nvmlInit (the first one, or
 * the next one after the last nvmlShutdown):
 *
 * FAKE_NVML_FAIL=driver     nvmlInit answers NVML_ERROR_DRIVER_NOT_LOADED (no kernel module)
 * FAKE_NVML_FAIL=mismatch   nvmlInit answers NVML_ERROR_LIB_RM_VERSION_MISMATCH (driver
 *                           upgraded without a reboot)
 *
 * FAKE_NVML_DEVICES         entries separated by ';' (spaces and newlines around them ignored).
 *   A GPU:         NAME|UUID|MEMORY_MIB|MIG
 *                  MIG is "none" (card cannot do MIG: GetMigMode answers NOT_SUPPORTED),
 *                  "off" or "on" (MIG-capable, 7 MIG device slots, like A100/H100/H200),
 *                  or "lost": a GPU that fell off the bus, still counted, whose
 *                  GetHandleByIndex answers NVML_ERROR_GPU_IS_LOST.
 *   A MIG device:  @SLOT|NAME|UUID|MEMORY_MIB
 *                  in slot SLOT (0..6) of the GPU entry before it. Slots not listed are empty:
 *                  GetMigDeviceHandleByIndex answers NVML_ERROR_NOT_FOUND for them.
 *   Unset or empty: no GPU (nvmlDeviceGetCount gives 0). A malformed value makes nvmlInit
 *   answer NVML_ERROR_UNKNOWN and print why on stderr.
 *
 * FAKE_NVML_USE             what the devices are doing, entries separated by ';':
 *                  UUID|UTILIZATION_PERCENT|USED_MIB|COMPUTE_PROCESSES
 *                  for a GPU or MIG device of FAKE_NVML_DEVICES (an unknown UUID is malformed).
 *                  Unlisted devices are idle: 0 %, no memory used, no process. MIG devices
 *                  and GPUs in MIG mode have no utilisation (GetUtilizationRates answers
 *                  NOT_SUPPORTED, as NVML does), whatever is given here.
 *
 * Example, one H200 and an A100 with two MIG devices:
 *
 *   NVIDIA H200|GPU-9d5e...|143771|off;
 *   NVIDIA A100-SXM4-80GB|GPU-4a1c...|81920|on;
 *   @0|NVIDIA A100-SXM4-80GB MIG 3g.40gb|MIG-77b0...|40192;
 *   @3|NVIDIA A100-SXM4-80GB MIG 1g.10gb|MIG-0c2e...|9984
 *
 * Return codes, buffer sizes and struct layouts are NVML's (nvml.h); handles are opaque
 * pointers into the static tables below, and any other pointer is NVML_ERROR_INVALID_ARGUMENT.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
} nvmlReturn_t;

#define NVML_DEVICE_MIG_DISABLE 0
#define NVML_DEVICE_MIG_ENABLE 1

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
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t; /* nvmlProcessInfo_v3_t is the same layout */

#define NVML_STRUCT_VERSION(name, ver) (unsigned int)(sizeof(name##_v##ver##_t) | ((ver) << 24U))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(nvmlMemory, 2)

#define MAX_GPUS 16
#define MAX_MIG_SLOTS 7
#define TEXT_SIZE 96 /* NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_DEVICE_UUID_V2_BUFFER_SIZE */

enum mig_support { MIG_NONE, MIG_OFF, MIG_ON, LOST };

struct fake_device {
    int used;
    char name[TEXT_SIZE];
    char uuid[TEXT_SIZE];
    unsigned long long memory_mib;
    enum mig_support mig;      /* whole GPUs only */
    struct fake_device *parent; /* MIG devices only */
    unsigned int utilization;   /* FAKE_NVML_USE */
    unsigned long long used_mib;
    unsigned int processes;
};

typedef struct fake_device *nvmlDevice_t;

static struct fake_device gpus[MAX_GPUS];
static struct fake_device migs[MAX_GPUS][MAX_MIG_SLOTS];
static unsigned int gpu_count;
static unsigned int init_count;

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
        s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
        *--end = '\0';
    return s;
}

static int bad(const char *entry, const char *why) {
    fprintf(stderr, "fake NVML: FAKE_NVML_DEVICES entry '%s': %s\n", entry, why);
    return 0;
}

/* Split "a|b|c|d" into exactly four trimmed fields. */
static int fields4(char *entry, char *out[4]) {
    char *rest = entry;
    for (int i = 0; i < 4; i++) {
        char *bar = strchr(rest, '|');
        if ((i < 3) != (bar != NULL))
            return 0;
        if (bar)
            *bar = '\0';
        out[i] = trim(rest);
        rest = bar ? bar + 1 : rest;
    }
    return 1;
}

static int fill(struct fake_device *d, const char *entry, char *name, char *uuid, char *mib) {
    char *end;
    if (!*name || strlen(name) >= TEXT_SIZE)
        return bad(entry, "name must be 1 to 95 characters");
    if (!*uuid || strlen(uuid) >= TEXT_SIZE)
        return bad(entry, "UUID must be 1 to 95 characters");
    d->memory_mib = strtoull(mib, &end, 10);
    if (!*mib || *end)
        return bad(entry, "memory must be a whole number of MiB");
    strcpy(d->name, name);
    strcpy(d->uuid, uuid);
    d->used = 1;
    return 1;
}

static int parse_devices(const char *spec) {
    memset(gpus, 0, sizeof gpus);
    memset(migs, 0, sizeof migs);
    gpu_count = 0;
    if (!spec)
        return 1;
    char *copy = strdup(spec), *save = NULL, *f[4];
    int ok = 1;
    for (char *tok = strtok_r(copy, ";", &save); ok && tok; tok = strtok_r(NULL, ";", &save)) {
        char *entry = trim(tok), shown[256];
        if (!*entry)
            continue;
        snprintf(shown, sizeof shown, "%s", entry);
        if (!fields4(entry, f)) {
            ok = bad(shown, "want NAME|UUID|MEMORY_MIB|MIG or @SLOT|NAME|UUID|MEMORY_MIB");
        } else if (f[0][0] == '@') {
            char *end;
            long slot = strtol(f[0] + 1, &end, 10);
            if (gpu_count == 0 || gpus[gpu_count - 1].mig == MIG_NONE ||
                gpus[gpu_count - 1].mig == LOST)
                ok = bad(shown, "a MIG device must follow a GPU whose MIG is off or on");
            else if (!f[0][1] || *end || slot < 0 || slot >= MAX_MIG_SLOTS)
                ok = bad(shown, "slot must be 0 to 6");
            else if (migs[gpu_count - 1][slot].used)
                ok = bad(shown, "slot already taken");
            else if ((ok = fill(&migs[gpu_count - 1][slot], shown, f[1], f[2], f[3])))
                migs[gpu_count - 1][slot].parent = &gpus[gpu_count - 1];
        } else if (gpu_count == MAX_GPUS) {
            ok = bad(shown, "at most 16 GPUs");
        } else {
            struct fake_device *d = &gpus[gpu_count];
            if (!strcmp(f[3], "none"))
                d->mig = MIG_NONE;
            else if (!strcmp(f[3], "off"))
                d->mig = MIG_OFF;
            else if (!strcmp(f[3], "on"))
                d->mig = MIG_ON;
            else if (!strcmp(f[3], "lost"))
                d->mig = LOST;
            else
                ok = bad(shown, "MIG must be none, off, on or lost");
            if (ok && (ok = fill(d, shown, f[0], f[1], f[2])))
                gpu_count++;
        }
    }
    free(copy);
    return ok;
}

/* The GPU or MIG device of FAKE_NVML_DEVICES with this UUID, or NULL. */
static struct fake_device *find_uuid(const char *uuid) {
    for (unsigned int i = 0; i < gpu_count; i++) {
        if (!strcmp(gpus[i].uuid, uuid))
            return &gpus[i];
        for (int s = 0; s < MAX_MIG_SLOTS; s++)
            if (migs[i][s].used && !strcmp(migs[i][s].uuid, uuid))
                return &migs[i][s];
    }
    return NULL;
}

static int parse_use(const char *spec) {
    if (!spec)
        return 1;
    char *copy = strdup(spec), *save = NULL, *f[4];
    int ok = 1;
    for (char *tok = strtok_r(copy, ";", &save); ok && tok; tok = strtok_r(NULL, ";", &save)) {
        char *entry = trim(tok), shown[256], *end1, *end2, *end3;
        if (!*entry)
            continue;
        snprintf(shown, sizeof shown, "%s", entry);
        if (!fields4(entry, f)) {
            ok = bad(shown, "FAKE_NVML_USE wants UUID|UTILIZATION_PERCENT|USED_MIB|PROCESSES");
            continue;
        }
        struct fake_device *d = find_uuid(f[0]);
        unsigned long utilization = strtoul(f[1], &end1, 10);
        unsigned long long used = strtoull(f[2], &end2, 10);
        unsigned long processes = strtoul(f[3], &end3, 10);
        if (!d)
            ok = bad(shown, "no device with this UUID in FAKE_NVML_DEVICES");
        else if (!*f[1] || *end1 || utilization > 100)
            ok = bad(shown, "utilisation must be 0 to 100");
        else if (!*f[2] || *end2 || used > d->memory_mib)
            ok = bad(shown, "used memory must be whole MiB, at most the device's");
        else if (!*f[3] || *end3 || processes > 64)
            ok = bad(shown, "processes must be 0 to 64");
        else {
            d->utilization = (unsigned int)utilization;
            d->used_mib = used;
            d->processes = (unsigned int)processes;
        }
    }
    free(copy);
    return ok;
}

/* A handle this library gave out, whole GPU or MIG device; NULL for anything else. */
static struct fake_device *lookup(nvmlDevice_t handle) {
    for (unsigned int i = 0; i < gpu_count; i++) {
        if (handle == &gpus[i])
            return handle;
        for (int s = 0; s < MAX_MIG_SLOTS; s++)
            if (handle == &migs[i][s] && migs[i][s].used)
                return handle;
    }
    return NULL;
}

#define REQUIRE_INIT()                                                                             \
    do {                                                                                           \
        if (init_count == 0)                                                                       \
            return NVML_ERROR_UNINITIALIZED;                                                       \
    } while (0)

#define REQUIRE_DEVICE(d, handle)                                                                  \
    struct fake_device *d = lookup(handle);                                                        \
    if (!d)                                                                                        \
    return NVML_ERROR_INVALID_ARGUMENT

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    const char *fail = getenv("FAKE_NVML_FAIL");
    if (fail && !strcmp(fail, "driver"))
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (fail && !strcmp(fail, "mismatch"))
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    if (init_count == 0 &&
        (!parse_devices(getenv("FAKE_NVML_DEVICES")) || !parse_use(getenv("FAKE_NVML_USE"))))
        return NVML_ERROR_UNKNOWN;
    init_count++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    REQUIRE_INIT();
    init_count--;
    return NVML_SUCCESS;
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
    case NVML_ERROR_NOT_FOUND:
        return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
        return "Driver Not Loaded";
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

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    REQUIRE_INIT();
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    REQUIRE_INIT();
    if (!device || index >= gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpus[index].mig == LOST)
        return NVML_ERROR_GPU_IS_LOST;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length) {
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    REQUIRE_INIT();
    REQUIRE_DEVICE(d, device);
    return copy_text(d->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    REQUIRE_INIT();
    REQUIRE_DEVICE(d, device);
    return copy_text(d->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    REQUIRE_INIT();
    REQUIRE_DEVICE(d, device);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = d->memory_mib << 20;
    memory->used = d->used_mib << 20;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    REQUIRE_INIT();
    REQUIRE_DEVICE(d, device);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = d->memory_mib << 20;
    memory->reserved = 0;
    memory->used = d->used_mib << 20;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode) {
    REQUIRE_INIT();
    REQUIRE_DEVICE(d, device);
    if (!currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent || d->mig == MIG_NONE)
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = *pendingMode = d->mig == MIG_ON ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    REQUIRE_INIT();
    REQUIRE_DEVICE(d, device);
    if (!count || d->parent)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = d->mig == MIG_NONE ? 0 : MAX_MIG_SLOTS;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice) {
    REQUIRE_INIT();
    REQUIRE_DEVICE(d, device);
    if (!migDevice || d->parent || index >= MAX_MIG_SLOTS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig == MIG_NONE)
        return NVML_ERROR_NOT_SUPPORTED;
    struct fake_device *slot = &migs[d - gpus][index];
    if (d->mig != MIG_ON || !slot->used)
        return NVML_ERROR_NOT_FOUND;
    *migDevice = slot;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    REQUIRE_INIT();
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_device *d = find_uuid(uuid);
    if (!d || (d->parent && d->parent->mig != MIG_ON))
        return NVML_ERROR_NOT_FOUND;
    if (d->mig == LOST)
        return NVML_ERROR_GPU_IS_LOST;
    *device = d;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    REQUIRE_INIT();
    REQUIRE_DEVICE(d, device);
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent || d->mig == MIG_ON)
        return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = d->utilization;
    utilization->memory = d->memory_mib ? (unsigned int)(d->used_mib * 100 / d->memory_mib) : 0;
    return NVML_SUCCESS;
}

/* As NVML: with too small a buffer (or none), the count needed and INSUFFICIENT_SIZE. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos) {
    REQUIRE_INIT();
    REQUIRE_DEVICE(d, device);
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->processes == 0) {
        *infoCount = 0;
        return NVML_SUCCESS;
    }
    if (!infos || *infoCount < d->processes) {
        *infoCount = d->processes;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < d->processes; i++) {
        infos[i].pid = 4000 + i;
        infos[i].usedGpuMemory = (d->used_mib << 20) / d->processes;
        infos[i].gpuInstanceId = d->parent ? (unsigned int)(d - migs[d->parent - gpus]) : 0xFFFFFFFF;
        infos[i].computeInstanceId = d->parent ? 0 : 0xFFFFFFFF;
    }
    *infoCount = d->processes;
    return NVML_SUCCESS;
}
