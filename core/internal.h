/*
 * Core-internal declarations shared by the files of core/ (not part of the public API and not
 * seen by backends, which get the same services through fp_host_api).
 */
#ifndef FLASHPORT_CORE_INTERNAL_H
#define FLASHPORT_CORE_INTERNAL_H

#include "core/backend.h"

flashport_status fp_set_error(flashport_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void fp_clear_error(void);
void fp_log(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
int fp_log_enabled(void);

/* The registry (core/registry.c): the ops of a backend by name, loading its plugin on first use.
 * Fails with BACKEND_UNKNOWN or BACKEND_UNAVAILABLE (message names the available backends). */
flashport_status fp_registry_get(const char *name, const fp_backend_ops **ops);

/* Comma-separated names of the backends that open on this machine (probing plugins): buf gets
 * the names that fit, whole; returns the size the full list takes, its NUL included. */
size_t fp_registry_available(char *buf, size_t size);
/* The i-th GPU backend (plugin) name of the registry's table, in "auto"'s order; NULL past the
 * last. */
const char *fp_registry_gpu_backend(size_t i);

struct flashport_backend {
    const fp_backend_ops *ops;
    void *ctx;
    int device;
    fp_backend_caps caps;
    void *workspace; /* flashport_set_workspace, or NULL */
    size_t workspace_bytes;
};

#endif /* FLASHPORT_CORE_INTERNAL_H */
