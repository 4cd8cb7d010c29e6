/*
 * flashport_timer: device events when the backend has them (fp_backend_ops.event_*), else the
 * host's monotonic clock read after synchronizing the backend, so host backends and plugins
 * without events time the same way.
 */
#include "core/internal.h"

#include <stdlib.h>
#include <time.h>

struct flashport_timer {
    flashport_backend *be;
    void *start, *stop; /* device events, or NULL on the host clock */
    double host_start_ms, host_stop_ms;
};

static int has_events(const flashport_backend *be)
{
    const fp_backend_ops *ops = be->ops;
    return ops->event_create && ops->event_record && ops->event_elapsed_ms && ops->event_destroy;
}

static double host_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

flashport_status flashport_timer_create(flashport_backend *be, flashport_timer **out)
{
    fp_clear_error();
    if (!be || !out)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "backend or timer is NULL");
    *out = NULL;
    flashport_timer *t = (flashport_timer *)calloc(1, sizeof *t);
    if (!t)
        return fp_set_error(FLASHPORT_ERR_OUT_OF_MEMORY, "cannot allocate a timer");
    t->be = be;
    if (has_events(be)) {
        flashport_status st = be->ops->event_create(be->ctx, &t->start);
        if (st == FLASHPORT_OK)
            st = be->ops->event_create(be->ctx, &t->stop);
        if (st != FLASHPORT_OK) {
            flashport_timer_destroy(t);
            return st;
        }
    }
    *out = t;
    return FLASHPORT_OK;
}

static flashport_status mark(flashport_timer *t, void *event, double *host)
{
    fp_clear_error();
    if (!t)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "timer is NULL");
    flashport_backend *be = t->be;
    if (event)
        return be->ops->event_record(be->ctx, event);
    flashport_status st = be->ops->synchronize(be->ctx);
    *host = host_ms();
    return st;
}

flashport_status flashport_timer_start(flashport_timer *t)
{
    return mark(t, t ? t->start : NULL, t ? &t->host_start_ms : NULL);
}

flashport_status flashport_timer_stop(flashport_timer *t)
{
    return mark(t, t ? t->stop : NULL, t ? &t->host_stop_ms : NULL);
}

flashport_status flashport_timer_elapsed_ms(flashport_timer *t, float *ms)
{
    fp_clear_error();
    if (!t || !ms)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "timer or ms is NULL");
    if (t->start)
        return t->be->ops->event_elapsed_ms(t->be->ctx, t->start, t->stop, ms);
    *ms = (float)(t->host_stop_ms - t->host_start_ms);
    return FLASHPORT_OK;
}

void flashport_timer_destroy(flashport_timer *t)
{
    if (!t)
        return;
    if (t->start)
        t->be->ops->event_destroy(t->be->ctx, t->start);
    if (t->stop)
        t->be->ops->event_destroy(t->be->ctx, t->stop);
    free(t);
}
