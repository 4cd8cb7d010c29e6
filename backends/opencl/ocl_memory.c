/*
 * flashport pointers for OpenCL buffer objects.
 *
 * The API hands out and takes plain pointers (and callers do pointer arithmetic inside an
 * allocation: packed q/k/v slices, varlen offsets), while OpenCL 1.2 memory is a cl_mem handle.
 * Each flashport_malloc reserves an inaccessible range of the process's address space
 * (PROT_NONE, no memory behind it) as large as the buffer and returns its start; a pointer maps
 * back to (buffer, byte offset) by finding the range that holds it. The ranges are distinct from
 * each other and from all host memory, so the core's aliasing checks work on them, and a host
 * dereference faults at once instead of reading something else.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */

#include "backends/opencl/ocl_host.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Index of the allocation whose base is the largest one <= addr, or -1. */
static int find(const fp_ocl_ctx *ctx, uintptr_t addr)
{
    int lo = 0, hi = ctx->num_allocs - 1, found = -1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (ctx->allocs[mid].base <= addr) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

flashport_status fp_ocl_alloc_add(fp_ocl_ctx *ctx, cl_mem mem, size_t bytes, void **ptr)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t reserved = (bytes + page - 1) / page * page;
    void *range =
        mmap(NULL, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (range == MAP_FAILED)
        return fp_ocl_host()->set_error(FLASHPORT_ERR_OUT_OF_MEMORY,
                                        "opencl: cannot reserve %zu bytes of address space for "
                                        "a buffer's pointer",
                                        reserved);
    pthread_mutex_lock(&ctx->lock);
    if (ctx->num_allocs == ctx->cap_allocs) {
        int cap = ctx->cap_allocs ? 2 * ctx->cap_allocs : 64;
        fp_ocl_alloc *grown = realloc(ctx->allocs, (size_t)cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&ctx->lock);
            munmap(range, reserved);
            return fp_ocl_host()->set_error(FLASHPORT_ERR_OUT_OF_MEMORY,
                                            "opencl: cannot grow the allocation table");
        }
        ctx->allocs = grown;
        ctx->cap_allocs = cap;
    }
    const uintptr_t base = (uintptr_t)range;
    const int at = find(ctx, base) + 1;
    memmove(&ctx->allocs[at + 1], &ctx->allocs[at],
            (size_t)(ctx->num_allocs - at) * sizeof ctx->allocs[0]);
    ctx->allocs[at].base = base;
    ctx->allocs[at].bytes = bytes;
    ctx->allocs[at].reserved = reserved;
    ctx->allocs[at].mem = mem;
    ctx->num_allocs++;
    pthread_mutex_unlock(&ctx->lock);
    *ptr = range;
    return FLASHPORT_OK;
}

flashport_status fp_ocl_alloc_remove(fp_ocl_ctx *ctx, void *ptr, cl_mem *mem)
{
    pthread_mutex_lock(&ctx->lock);
    const int at = find(ctx, (uintptr_t)ptr);
    if (at < 0 || ctx->allocs[at].base != (uintptr_t)ptr) {
        pthread_mutex_unlock(&ctx->lock);
        return fp_ocl_host()->set_error(FLASHPORT_ERR_INVALID_VALUE,
                                        "opencl: %p is not a pointer flashport_malloc returned "
                                        "on this handle",
                                        ptr);
    }
    const fp_ocl_alloc a = ctx->allocs[at];
    memmove(&ctx->allocs[at], &ctx->allocs[at + 1],
            (size_t)(ctx->num_allocs - at - 1) * sizeof ctx->allocs[0]);
    ctx->num_allocs--;
    pthread_mutex_unlock(&ctx->lock);
    munmap((void *)a.base, a.reserved);
    *mem = a.mem;
    return FLASHPORT_OK;
}

flashport_status fp_ocl_resolve(const fp_ocl_ctx *ctx, const void *ptr, size_t bytes,
                                const char *what, cl_mem *mem, size_t *offset)
{
    const uintptr_t addr = (uintptr_t)ptr;
    const int at = find(ctx, addr);
    if (at >= 0) {
        const fp_ocl_alloc *a = &ctx->allocs[at];
        const size_t off = addr - a->base;
        if (off <= a->bytes && bytes <= a->bytes - off) {
            *mem = a->mem;
            *offset = off;
            return FLASHPORT_OK;
        }
    }
    return fp_ocl_host()->set_error(FLASHPORT_ERR_INVALID_VALUE,
                                    "opencl: %s (%p, %zu bytes) is not inside one allocation "
                                    "that flashport_malloc returned on this handle",
                                    what, ptr, bytes);
}

void fp_ocl_alloc_release_all(fp_ocl_ctx *ctx)
{
    for (int i = 0; i < ctx->num_allocs; i++) {
        (void)ctx->cl->clReleaseMemObject(ctx->allocs[i].mem);
        munmap((void *)ctx->allocs[i].base, ctx->allocs[i].reserved);
    }
    free(ctx->allocs);
    ctx->allocs = NULL;
    ctx->num_allocs = ctx->cap_allocs = 0;
}
