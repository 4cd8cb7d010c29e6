/*
 * The backend registry: built-in backends ("cpu", "reference") and plugins loaded at run time.
 *
 * A plugin is a shared module libflashport_<name>.so exporting FP_PLUGIN_ENTRY_SYMBOL
 * (core/backend.h). It is searched in each folder of FLASHPORT_PLUGIN_PATH (colon-separated,
 * used as given: the caller's choice), then in the folder libflashport itself was loaded from.
 * That folder is resolved to an absolute path once, when the library is loaded (while a relative
 * name the loader used still means what it meant); when it is empty or stays relative (core
 * linked into an executable started through $PATH, say) it is not searched at all, so nothing is
 * ever opened relative to the working directory. A plugin is loaded once, on first use, and kept
 * for the life of the process; a file that fails to load is remembered with its reason, so it is
 * dlopened at most once. The core passes its API version; a plugin built against another version
 * refuses, and so does the core if the ops table it returns disagrees (version, name, entries).
 * The list of available backends is computed once per process.
 *
 * "cuda", "hip" and "opencl" are known names: asking for them without their plugin is
 * "unavailable". Any other name that is neither built in nor found as a plugin is "unknown". Names
 * are limited to [a-z0-9_] so they cannot walk the file system.
 */
#include "core/internal.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PLUGINS 16

/* A loaded plugin (ops != NULL) or a remembered failure (status and why). */
typedef struct plugin_slot {
    char name[32];
    const fp_backend_ops *ops;
    flashport_status status;
    char why[768];
} plugin_slot;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static plugin_slot plugins[MAX_PLUGINS];
static int num_plugins;

/* The library's folder, absolute, with a trailing '/'; "" when unknown (then why_no_dir says
 * why). Set once, at load time (resolve_library_dir). */
static char lib_dir[4096];
static char why_no_dir[512];

static pthread_once_t available_once = PTHREAD_ONCE_INIT;
static char available[256];

/* Every backend name the library knows, in the order "available backends" lists them: the
 * built-in ones with their table, the plugins (GPU backends, loaded at run time) with none. */
static const struct {
    const char *name;
    const fp_backend_ops *(*builtin)(void); /* NULL: a plugin */
    int automatic;                          /* a plugin that "auto" tries, in this order */
} backend_names[] = {
    {"cpu", fp_cpu_backend_ops, 0},
    {"reference", fp_reference_backend_ops, 0},
    {"cuda", NULL, 1},
    {"hip", NULL, 1},
    {"opencl", NULL, 0},
};
#define NUM_BACKEND_NAMES (sizeof backend_names / sizeof backend_names[0])

const char *fp_registry_gpu_backend(size_t i)
{
    for (size_t k = 0; k < NUM_BACKEND_NAMES; k++)
        if (backend_names[k].automatic && i-- == 0)
            return backend_names[k].name;
    return NULL;
}

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
    for (size_t i = 0; i < NUM_BACKEND_NAMES; i++)
        if (!backend_names[i].builtin && strcmp(name, backend_names[i].name) == 0)
            return 1;
    return 0;
}

static const fp_backend_ops *builtin(const char *name)
{
    for (size_t i = 0; i < NUM_BACKEND_NAMES; i++)
        if (backend_names[i].builtin && strcmp(name, backend_names[i].name) == 0)
            return backend_names[i].builtin();
    return NULL;
}

/* A name for messages: at most 40 characters of it, so that what follows (the list of available
 * backends) always fits in the message. */
#define NAME_FMT    "'%.40s%s'"
#define NAME_ARG(n) (n), (strlen(n) > 40 ? "..." : "")

/* Sets lib_dir from where dladdr says this code was loaded from, resolved with realpath now, at
 * load time: a relative name (a relative LD_LIBRARY_PATH entry, a dlopen of "lib/x.so") is
 * relative to the working directory of this moment, and a later chdir must not move it. */
__attribute__((constructor)) static void resolve_library_dir(void)
{
    Dl_info info;
    char real[PATH_MAX];
    lib_dir[0] = '\0';
    if (!dladdr((void *)&fp_registry_get, &info) || !info.dli_fname || !*info.dli_fname) {
        snprintf(why_no_dir, sizeof why_no_dir, "the library's folder is unknown");
        return;
    }
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash) { /* a bare name: found through a search path, not a folder we can trust */
        snprintf(why_no_dir, sizeof why_no_dir,
                 "the library's folder is unknown (loaded as '%.200s', without a folder)",
                 info.dli_fname);
        return;
    }
    if (!realpath(info.dli_fname, real) || real[0] != '/') {
        snprintf(why_no_dir, sizeof why_no_dir,
                 "the library's folder is unknown ('%.200s' does not resolve)", info.dli_fname);
        return;
    }
    const char *last = strrchr(real, '/');
    size_t len = (size_t)(last - real + 1);
    if (len >= sizeof lib_dir) {
        snprintf(why_no_dir, sizeof why_no_dir, "the library's folder name is too long");
        return;
    }
    memcpy(lib_dir, real, len);
    lib_dir[len] = '\0';
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
    fp_clear_error(); /* what the plugin says, not an older message */
    flashport_status st = entry(FP_PLUGIN_API_VERSION, fp_host(), &got);
    if (st != FLASHPORT_OK) {
        snprintf(why, why_size, "%s refused to register (plugin API %d): %s", path,
                 FP_PLUGIN_API_VERSION,
                 *flashport_last_error() ? flashport_last_error() : "no reason given");
        dlclose(handle);
        return FLASHPORT_ERR_BACKEND_UNAVAILABLE;
    }
    const char *missing = !got                   ? "its ops table (it returned NULL)"
                          : !got->open           ? "open"
                          : !got->close          ? "close"
                          : !got->caps           ? "caps"
                          : !got->malloc_fn      ? "malloc_fn"
                          : !got->free_fn        ? "free_fn"
                          : !got->copy_to_device ? "copy_to_device"
                          : !got->copy_to_host   ? "copy_to_host"
                          : !got->synchronize    ? "synchronize"
                          : !got->forward        ? "forward"
                                                 : NULL;
    if (got && got->api_version != FP_PLUGIN_API_VERSION)
        snprintf(why, why_size, "%s was built for plugin API version %u, core expects %d", path,
                 got->api_version, FP_PLUGIN_API_VERSION);
    else if (got && (!got->name || strcmp(got->name, name) != 0))
        snprintf(why, why_size, "%s registers as backend '%.40s', not '%s'", path,
                 got->name ? got->name : "(null)", name);
    else if (missing)
        snprintf(why, why_size, "%s returned OK but lacks %s", path, missing);
    else {
        *ops = got;
        return FLASHPORT_OK;
    }
    dlclose(handle);
    return FLASHPORT_ERR_BACKEND_UNAVAILABLE;
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
    if (!lib_dir[0]) {
        snprintf(why, why_size, "plugin libflashport_%s.so not found in FLASHPORT_PLUGIN_PATH; %s",
                 name, why_no_dir);
        return FLASHPORT_ERR_BACKEND_UNAVAILABLE;
    }
    snprintf(path, sizeof path, "%slibflashport_%s.so", lib_dir, name);
    int r = try_plugin_file(path, name, ops, why, why_size);
    if (r >= 0)
        return (flashport_status)r;
    snprintf(why, why_size,
             "plugin libflashport_%s.so not found in FLASHPORT_PLUGIN_PATH or %.400s", name,
             lib_dir);
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
        snprintf(why, why_size, NAME_FMT " is not a backend name", NAME_ARG(name));
        return FLASHPORT_ERR_BACKEND_UNKNOWN;
    }
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < num_plugins; i++) {
        if (strcmp(plugins[i].name, name) == 0) {
            *ops = plugins[i].ops;
            snprintf(why, why_size, "%s", plugins[i].why);
            flashport_status st = plugins[i].status;
            pthread_mutex_unlock(&registry_lock);
            return st;
        }
    }
    *ops = NULL;
    flashport_status st = load_plugin(name, ops, why, why_size);
    if (st != FLASHPORT_OK && !is_known_plugin(name) && strstr(why, "not found"))
        st = FLASHPORT_ERR_BACKEND_UNKNOWN;
    /* A missing file costs only a few failed fopens; remembering it would let a stream of
     * unknown names fill the table. */
    if (num_plugins < MAX_PLUGINS && !strstr(why, "not found")) {
        plugin_slot *slot = &plugins[num_plugins++];
        snprintf(slot->name, sizeof slot->name, "%s", name);
        slot->ops = st == FLASHPORT_OK ? *ops : NULL;
        slot->status = st;
        snprintf(slot->why, sizeof slot->why, "%s", why);
    }
    pthread_mutex_unlock(&registry_lock);
    return st;
}

/* The list, once per process: probing opens every backend, a GPU's context included. */
static void compute_available(void)
{
    char why[1024];
    char *buf = available;
    const size_t size = sizeof available;
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < NUM_BACKEND_NAMES; i++) {
        const fp_backend_ops *ops;
        if (lookup(backend_names[i].name, &ops, why, sizeof why) != FLASHPORT_OK)
            continue;
        void *ctx = NULL;
        char saved[1024];
        snprintf(saved, sizeof saved, "%s", flashport_last_error());
        flashport_status st = ops->open(0, &ctx);
        fp_set_error(FLASHPORT_OK, "%s", saved); /* probing must not clobber the caller's error */
        if (st != FLASHPORT_OK)
            continue;
        ops->close(ctx);
        int n = snprintf(buf + used, size - used, "%s%s", used ? ", " : "", backend_names[i].name);
        if (n < 0 || (size_t)n >= size - used)
            break;
        used += (size_t)n;
    }
}

size_t fp_registry_available(char *buf, size_t size)
{
    pthread_once(&available_once, compute_available);
    const size_t needed = strlen(available) + 1;
    if (size == 0)
        return needed;
    /* Whole names only: a list cut short ends at the last name that fits. */
    size_t n = needed - 1;
    if (n >= size) {
        n = size - 1;
        while (n > 0 && available[n] != ',')
            n--;
    }
    memcpy(buf, available, n);
    buf[n] = '\0';
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
        return fp_set_error(st, "unknown backend " NAME_FMT " (%.600s); available backends: %s",
                            NAME_ARG(name), why, avail);
    return fp_set_error(st, "backend " NAME_FMT " is unavailable: %.600s; available backends: %s",
                        NAME_ARG(name), why, avail);
}
