/*
 * The OpenCL ICD loader, opened at run time: libOpenCL.so.1 (the soname every Linux ICD loader
 * has), else libOpenCL.so. Resolved once per process and never closed, as the registry keeps
 * plugins.
 */
#include "backends/opencl/ocl_host.h"

#include <dlfcn.h>
#include <stdio.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static fp_ocl_api api;
static const fp_ocl_api *loaded;
static char load_error[512];

static void load(void)
{
    static const char *const names[] = {"libOpenCL.so.1", "libOpenCL.so"};
    void *handle = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !handle; i++)
        handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        snprintf(load_error, sizeof load_error, "no OpenCL ICD loader (libOpenCL.so.1): %s",
                 dlerror());
        return;
    }
#define FP_OCL_RESOLVE(name)                                                                       \
    *(void **)&api.name = dlsym(handle, #name);                                                    \
    if (!api.name) {                                                                               \
        snprintf(load_error, sizeof load_error, "the OpenCL ICD loader lacks %s (OpenCL 1.2)",     \
                 #name);                                                                           \
        dlclose(handle);                                                                           \
        return;                                                                                    \
    }
    FP_OCL_FUNCTIONS(FP_OCL_RESOLVE)
#undef FP_OCL_RESOLVE
    loaded = &api;
}

const fp_ocl_api *fp_ocl_load(char *why, size_t why_size)
{
    pthread_once(&once, load);
    if (!loaded)
        snprintf(why, why_size, "%s", load_error);
    return loaded;
}
