/*
 * The backend registry: built-in backends ("cpu", "reference") and plugins loaded at run time.
 *
 * A plugin is a shared module libflashport_<name>.so exporting FP_PLUGIN_ENTRY_SYMBOL
 * (core/backend.h). It is searched in each folder of FLASHPORT_PLUGIN_PATH (colon-separated),
 * then in the folder libflashport itself was loaded from. It is loaded once, on first use, and
 * kept for the life of the process. The core passes its API version; a plugin built against
 * another version refuses, and so does the core if the ops table it returns disagrees.
 *
 * "cuda" and "hip" are known names: asking for them without their plugin is "unavailable".
 * Any other name that is neither built in nor found as a plugin is "unknown". Names are limited
 * to [a-z0-9_] so they cannot walk the file system.
 */
#include "core/internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PLUGINS 16

typedef struct plugin_slot {
    char name[32];
    const fp_backend_ops *ops;
} plugin_slot;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static plugin_slot plugins[MAX_PLUGINS];
static int num_plugins;

static const char *const known_plugins[] = {"cuda", "hip"};

static int valid_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof(((plugin_slot *)0)->name))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
            return 0;
    }
    return 1;
}

static int is_known_plugin(const char *name)
{
    for (size_t i = 0; i < sizeof known_plugins / sizeof known_plugins[0]; i++)
        if (strcmp(name, known_plugins[i]) == 0)
            return 1;
    return 0;
}

static const fp_backend_ops *builtin(const char *name)
{
    if (strcmp(name, "cpu") == 0)
        return fp_cpu_backend_ops();
    if (strcmp(name, "reference") == 0)
        return fp_reference_backend_ops();
    return NULL;
}

/* Folder that holds libflashport (with trailing '/'), or "" if unknown. */
static void library_dir(char *buf, size_t size)
{
    Dl_info info;
    buf[0] = '\0';
    if (dladdr((void *)&fp_registry_get, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash && (size_t)(slash - info.dli_fname + 1) < size) {
            memcpy(buf, info.dli_fname, (size_t)(slash - info.dli_fname + 1));
            buf[slash - info.dli_fname + 1] = '\0';
        }
    }
}

/* Tries one candidate file. Returns OK and sets *ops, or BACKEND_UNAVAILABLE with the reason in
 * `why` when the file exists but cannot be used, or a negative value when there is no file. */
static int try_plugin_file(const char *path, const char *name, const fp_backend_ops **ops,
                           char *why, size_t why_size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fclose(f);
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        snprintf(why, why_size, "cannot load %s: %s", path, dlerror());
        return FLASHPORT_ERR_BACKEND_UNAVAILABLE;
    }
    fp_plugin_entry_fn entry;
    *(void **)&entry = dlsym(handle, FP_PLUGIN_ENTRY_SYMBOL);
    if (!entry) {
        snprintf(why, why_size, "%s does not export %s", path, FP_PLUGIN_ENTRY_SYMBOL);
        dlclose(handle);
        return FLASHPORT_ERR_BACKEND_UNAVAILABLE;
    }
    const fp_backend_ops *got = NULL;
    flashport_status st = entry(FP_PLUGIN_API_VERSION, fp_host(), &got);
    if (st != FLASHPORT_OK || !got) {
        snprintf(why, why_size, "%s refused to register (plugin API %d): %s", path,
                 FP_PLUGIN_API_VERSION, flashport_last_error());
        dlclose(handle);
        return FLASHPORT_ERR_BACKEND_UNAVAILABLE;
    }
    if (got->api_version != FP_PLUGIN_API_VERSION || !got->name || strcmp(got->name, name) != 0 ||
        !got->open || !got->close || !got->caps || !got->malloc_fn || !got->free_fn ||
        !got->copy_to_device || !got->copy_to_host || !got->synchronize || !got->forward) {
        snprintf(why, why_size,
                 "%s is not a usable flashport plugin for '%s' (API version %u, core expects %d, "
                 "or required entries missing)",
                 path, name, got->api_version, FP_PLUGIN_API_VERSION);
        dlclose(handle);
        return FLASHPORT_ERR_BACKEND_UNAVAILABLE;
    }
    *ops = got;
    return FLASHPORT_OK;
}

/* Searches and loads the plugin; registry_lock held. */
static flashport_status load_plugin(const char *name, const fp_backend_ops **ops, char *why,
                                    size_t why_size)
{
    char path[4096 + 64]; /* a folder (< 4096) plus "/libflashport_<name>.so" */
    why[0] = '\0';
    const char *env = getenv("FLASHPORT_PLUGIN_PATH");
    if (env && *env) {
        const char *p = env;
        while (*p) {
            size_t len = strcspn(p, ":");
            if (len > 0 && len < 4096) {
                snprintf(path, sizeof path, "%.*s/libflashport_%s.so", (int)len, p, name);
                int r = try_plugin_file(path, name, ops, why, why_size);
                if (r >= 0)
                    return (flashport_status)r;
            }
            p += len;
            if (*p == ':')
                p++;
        }
    }
    char dir[4096];
    library_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%slibflashport_%s.so", dir, name);
    int r = try_plugin_file(path, name, ops, why, why_size);
    if (r >= 0)
        return (flashport_status)r;
    snprintf(why, why_size, "plugin libflashport_%s.so not found in FLASHPORT_PLUGIN_PATH or %s",
             name, dir[0] ? dir : "the library's folder");
    return FLASHPORT_ERR_BACKEND_UNAVAILABLE;
}

/* Looks up or loads; `why` gets the reason for a failure. */
static flashport_status lookup(const char *name, const fp_backend_ops **ops, char *why,
                               size_t why_size)
{
    why[0] = '\0';
    *ops = builtin(name);
    if (*ops)
        return FLASHPORT_OK;
    if (!valid_name(name)) {
        snprintf(why, why_size, "'%s' is not a backend name", name);
        return FLASHPORT_ERR_BACKEND_UNKNOWN;
    }
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < num_plugins; i++) {
        if (strcmp(plugins[i].name, name) == 0) {
            *ops = plugins[i].ops;
            pthread_mutex_unlock(&registry_lock);
            return FLASHPORT_OK;
        }
    }
    flashport_status st = load_plugin(name, ops, why, why_size);
    if (st == FLASHPORT_OK && num_plugins < MAX_PLUGINS) {
        snprintf(plugins[num_plugins].name, sizeof plugins[0].name, "%s", name);
        plugins[num_plugins].ops = *ops;
        num_plugins++;
    }
    pthread_mutex_unlock(&registry_lock);
    if (st != FLASHPORT_OK && !is_known_plugin(name) && strstr(why, "not found"))
        return FLASHPORT_ERR_BACKEND_UNKNOWN;
    return st;
}

size_t fp_registry_available(char *buf, size_t size)
{
    static const char *const candidates[] = {"cpu", "reference", "cuda", "hip"};
    char why[512];
    size_t used = 0, needed = 1;
    if (size > 0)
        buf[0] = '\0';
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
        const fp_backend_ops *ops;
        if (lookup(candidates[i], &ops, why, sizeof why) != FLASHPORT_OK)
            continue;
        void *ctx = NULL;
        char saved[1024];
        snprintf(saved, sizeof saved, "%s", flashport_last_error());
        flashport_status st = ops->open(0, &ctx);
        fp_set_error(FLASHPORT_OK, "%s", saved); /* probing must not clobber the caller's error */
        if (st != FLASHPORT_OK)
            continue;
        ops->close(ctx);
        const size_t len = (needed > 1 ? 2 : 0) + strlen(candidates[i]);
        /* Whole names only: once one does not fit, the rest are counted but not written. */
        if (used == needed - 1 && needed + len <= size) {
            snprintf(buf + used, size - used, "%s%s", used ? ", " : "", candidates[i]);
            used += len;
        }
        needed += len;
    }
    return needed;
}

flashport_status fp_registry_get(const char *name, const fp_backend_ops **ops)
{
    char why[1024];
    flashport_status st = lookup(name, ops, why, sizeof why);
    if (st == FLASHPORT_OK)
        return st;
    char avail[256];
    fp_registry_available(avail, sizeof avail);
    if (st == FLASHPORT_ERR_BACKEND_UNKNOWN)
        return fp_set_error(st, "unknown backend '%s' (%s); available backends: %s", name, why,
                            avail);
    return fp_set_error(st, "backend '%s' is unavailable: %s; available backends: %s", name, why,
                        avail);
}
