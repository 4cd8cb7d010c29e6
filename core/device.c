/*
 * Device enumeration (flashport_device_count, flashport_device_properties): GPU plugins answer
 * through their ops table without opening a device; host backends describe the host.
 */
#include "core/internal.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static flashport_status backend_ops(const char *name, const fp_backend_ops **ops)
{
    if (!name)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "backend name is NULL");
    if (strcmp(name, "auto") == 0)
        return fp_set_error(FLASHPORT_ERR_INVALID_VALUE,
                            "device enumeration needs a backend name, not 'auto'");
    return fp_registry_get(name, ops);
}

/* The host's CPU model name from /proc/cpuinfo where there is one, else the ISA name. */
static void host_props(flashport_device_props *props)
{
#if defined(__x86_64__)
    const char *arch = "x86_64";
#elif defined(__aarch64__)
    const char *arch = "aarch64";
#else
    const char *arch = "host";
#endif
    snprintf(props->arch, sizeof props->arch, "%s", arch);
    snprintf(props->name, sizeof props->name, "%s CPU", arch);
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            const char *colon = strchr(line, ':');
            if (colon && strncmp(line, "model name", 10) == 0) {
                colon += colon[1] == ' ' ? 2 : 1;
                snprintf(props->name, sizeof props->name, "%.*s", (int)strcspn(colon, "\n"), colon);
                break;
            }
        }
        fclose(f);
    }
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    props->total_memory = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    props->multiprocessors = cpus > 0 ? (int32_t)cpus : 1;
}

flashport_status flashport_device_count(const char *name, int *count)
{
    fp_clear_error();
    if (!count)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "count is NULL");
    *count = 0;
    const fp_backend_ops *ops;
    flashport_status st = backend_ops(name, &ops);
    if (st != FLASHPORT_OK)
        return st;
    if (!ops->device_count) {
        *count = 1;
        return FLASHPORT_OK;
    }
    int n = 0;
    st = ops->device_count(&n);
    if (st == FLASHPORT_OK)
        *count = n;
    return st;
}

flashport_status flashport_device_properties(const char *name, int device,
                                             flashport_device_props *props)
{
    fp_clear_error();
    if (!props)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "props is NULL");
    const fp_backend_ops *ops;
    flashport_status st = backend_ops(name, &ops);
    if (st != FLASHPORT_OK)
        return st;
    if (device < 0)
        return fp_set_error(FLASHPORT_ERR_NO_DEVICE, "device index %d is negative", device);
    flashport_device_props got;
    memset(&got, 0, sizeof got);
    if (!ops->device_props) {
        if (device != 0)
            return fp_set_error(FLASHPORT_ERR_NO_DEVICE,
                                "backend '%s' has one device (the host), not device %d", name,
                                device);
        host_props(&got);
    } else if ((st = ops->device_props(device, &got)) != FLASHPORT_OK) {
        return st;
    }
    *props = got;
    return FLASHPORT_OK;
}
