/*
 * Status strings, the thread-local last-error message, and FLASHPORT_LOG logging: the host
 * services (fp_host_api) that the core hands to every backend, built in or plugin.
 */
#include "core/backend.h"
#include "core/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[1024];

const char *flashport_status_string(flashport_status status)
{
    switch (status) {
    case FLASHPORT_OK:
        return "FLASHPORT_OK";
    case FLASHPORT_ERR_NULL_POINTER:
        return "FLASHPORT_ERR_NULL_POINTER";
    case FLASHPORT_ERR_INVALID_VALUE:
        return "FLASHPORT_ERR_INVALID_VALUE";
    case FLASHPORT_ERR_SHAPE_MISMATCH:
        return "FLASHPORT_ERR_SHAPE_MISMATCH";
    case FLASHPORT_ERR_DTYPE_MISMATCH:
        return "FLASHPORT_ERR_DTYPE_MISMATCH";
    case FLASHPORT_ERR_HEAD_RATIO:
        return "FLASHPORT_ERR_HEAD_RATIO";
    case FLASHPORT_ERR_BAD_SIZE:
        return "FLASHPORT_ERR_BAD_SIZE";
    case FLASHPORT_ERR_BAD_STRIDE:
        return "FLASHPORT_ERR_BAD_STRIDE";
    case FLASHPORT_ERR_ALIASING:
        return "FLASHPORT_ERR_ALIASING";
    case FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM:
        return "FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM";
    case FLASHPORT_ERR_UNSUPPORTED_DTYPE:
        return "FLASHPORT_ERR_UNSUPPORTED_DTYPE";
    case FLASHPORT_ERR_UNSUPPORTED_LAYOUT:
        return "FLASHPORT_ERR_UNSUPPORTED_LAYOUT";
    case FLASHPORT_ERR_UNSUPPORTED_FEATURE:
        return "FLASHPORT_ERR_UNSUPPORTED_FEATURE";
    case FLASHPORT_ERR_BAD_SEQLENS:
        return "FLASHPORT_ERR_BAD_SEQLENS";
    case FLASHPORT_ERR_BACKEND_UNKNOWN:
        return "FLASHPORT_ERR_BACKEND_UNKNOWN";
    case FLASHPORT_ERR_BACKEND_UNAVAILABLE:
        return "FLASHPORT_ERR_BACKEND_UNAVAILABLE";
    case FLASHPORT_ERR_NO_DEVICE:
        return "FLASHPORT_ERR_NO_DEVICE";
    case FLASHPORT_ERR_OUT_OF_MEMORY:
        return "FLASHPORT_ERR_OUT_OF_MEMORY";
    case FLASHPORT_ERR_DEVICE:
        return "FLASHPORT_ERR_DEVICE";
    case FLASHPORT_ERR_INTERNAL:
        return "FLASHPORT_ERR_INTERNAL";
    case FLASHPORT_ERR_UNINITIALIZED:
        return "FLASHPORT_ERR_UNINITIALIZED";
    case FLASHPORT_ERR_BUFFER_TOO_SMALL:
        return "FLASHPORT_ERR_BUFFER_TOO_SMALL";
    }
    return "FLASHPORT_ERR_UNKNOWN_STATUS";
}

const char *flashport_last_error(void)
{
    return last_error;
}

void fp_clear_error(void)
{
    last_error[0] = '\0';
}

static flashport_status set_error_v(flashport_status status, const char *fmt, va_list ap)
{
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    return status;
}

flashport_status fp_set_error(flashport_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error_v(status, fmt, ap);
    va_end(ap);
    return status;
}

/* FLASHPORT_LOG is read once; logging is for people, so a missed update after start is fine. */
static int log_state = -1;

int fp_log_enabled(void)
{
    int s = __atomic_load_n(&log_state, __ATOMIC_RELAXED);
    if (s < 0) {
        const char *env = getenv("FLASHPORT_LOG");
        s = env && *env && strcmp(env, "0") != 0;
        __atomic_store_n(&log_state, s, __ATOMIC_RELAXED);
    }
    return s;
}

void fp_log(const char *fmt, ...)
{
    if (!fp_log_enabled())
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[flashport] %s\n", line);
}

static const fp_host_api host_api = {
    FP_PLUGIN_API_VERSION,
    fp_set_error,
    fp_log,
    fp_log_enabled,
};

const fp_host_api *fp_host(void)
{
    return &host_api;
}
