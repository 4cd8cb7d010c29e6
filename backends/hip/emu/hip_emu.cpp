/*
 * The runtime side of hip_emu.h: a one-device "GPU" whose memory is host memory, whose streams
 * are synchronous, and whose launches run block after block on FP_HIP_THREADS host threads.
 */
#include "backends/hip/hip_common.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <thread>
#include <vector>

thread_local dim3 threadIdx, blockIdx;
dim3 gridDim;

static pthread_barrier_t block_barrier;
static float shfl_slots[FP_HIP_THREADS];

void __syncthreads(void)
{
    pthread_barrier_wait(&block_barrier);
}

/* Every thread of the block calls it at the same point (attention_tile.h guarantees that), so a
 * block barrier on each side of the exchange is enough. */
float emu_shfl_xor(float v, int lane_mask)
{
    shfl_slots[threadIdx.x] = v;
    pthread_barrier_wait(&block_barrier);
    const float r = shfl_slots[threadIdx.x ^ lane_mask];
    pthread_barrier_wait(&block_barrier);
    return r;
}

/* MFMA: the waves of a block may run different numbers of instructions, so each wave of 64
 * threads exchanges its operands behind its own barrier. */
static emu_i16x4 mfma_a[FP_HIP_THREADS], mfma_b[FP_HIP_THREADS];
static pthread_barrier_t wave_barrier[FP_HIP_THREADS / 64];

static float element(short bits, int bf16)
{
    return bf16 ? fp_bf16_to_f32((uint16_t)bits) : fp_f16_to_f32((uint16_t)bits);
}

/* D = A B + C for one 16x16x16 block, with AMD's layout for v_mfma_f32_16x16x16{f16,bf16_1k}:
 * lane l holds A[l % 16][4 (l / 16) + e], B[4 (l / 16) + e][l % 16] (e = 0..3) and
 * D[4 (l / 16) + r][l % 16] (r = 0..3). */
emu_f32x4 emu_mfma_16x16x16(emu_i16x4 a, emu_i16x4 b, emu_f32x4 c, int bf16)
{
    const int t = threadIdx.x, wave = t / 64, lane = t % 64, base = wave * 64;
    mfma_a[t] = a;
    mfma_b[t] = b;
    pthread_barrier_wait(&wave_barrier[wave]);
    for (int r = 0; r < 4; r++) {
        const int i = 4 * (lane / 16) + r, j = lane % 16;
        float sum = 0.0f;
        for (int k = 0; k < 16; k++)
            sum += element(mfma_a[base + i + 16 * (k / 4)][k % 4], bf16) *
                   element(mfma_b[base + j + 16 * (k / 4)][k % 4], bf16);
        c[r] += sum;
    }
    pthread_barrier_wait(&wave_barrier[wave]);
    return c;
}

void emu_launch(void (*kernel)(fp_hip_args), dim3 grid, fp_hip_args args)
{
    gridDim = grid;
    pthread_barrier_init(&block_barrier, NULL, FP_HIP_THREADS);
    for (auto &b : wave_barrier)
        pthread_barrier_init(&b, NULL, 64);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < FP_HIP_THREADS; t++)
        threads.emplace_back([=]() {
            threadIdx = dim3(t, 0, 0);
            for (unsigned z = 0; z < grid.z; z++)
                for (unsigned y = 0; y < grid.y; y++)
                    for (unsigned x = 0; x < grid.x; x++) {
                        blockIdx = dim3(x, y, z);
                        kernel(args);
                        pthread_barrier_wait(&block_barrier); /* the block's LDS is free again */
                    }
        });
    for (auto &t : threads)
        t.join();
    for (auto &b : wave_barrier)
        pthread_barrier_destroy(&b);
    pthread_barrier_destroy(&block_barrier);
}

hipError_t hipGetDeviceCount(int *count)
{
    *count = 1;
    return hipSuccess;
}
hipError_t hipGetDevice(int *device)
{
    *device = 0;
    return hipSuccess;
}
hipError_t hipSetDevice(int)
{
    return hipSuccess;
}
hipError_t hipGetDeviceProperties(hipDeviceProp_t *prop, int)
{
    snprintf(prop->name, sizeof prop->name, "CPU emulation");
    prop->major = prop->minor = 0;
    prop->multiProcessorCount = 4;
    prop->totalGlobalMem = (size_t)1 << 30;
    return hipSuccess;
}
const char *hipGetErrorString(hipError_t)
{
    return "out of host memory";
}
const char *hipGetErrorName(hipError_t)
{
    return "hipErrorOutOfMemory";
}
hipError_t hipGetLastError(void)
{
    return hipSuccess;
}
hipError_t hipMalloc(void **ptr, size_t bytes)
{
    *ptr = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    return *ptr ? hipSuccess : hipErrorOutOfMemory;
}
hipError_t hipFree(void *ptr)
{
    free(ptr);
    return hipSuccess;
}
hipError_t hipMemcpyAsync(void *dst, const void *src, size_t bytes, int, hipStream_t)
{
    memcpy(dst, src, bytes);
    return hipSuccess;
}
hipError_t hipStreamSynchronize(hipStream_t)
{
    return hipSuccess;
}
hipError_t hipDeviceSynchronize(void)
{
    return hipSuccess;
}
hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const void *, int, size_t)
{
    *blocks = 2;
    return hipSuccess;
}
struct emu_event {
    double ms;
};
hipError_t hipEventCreate(hipEvent_t *event)
{
    *event = (hipEvent_t)calloc(1, sizeof(struct emu_event));
    return *event ? hipSuccess : hipErrorOutOfMemory;
}
hipError_t hipEventCreateWithFlags(hipEvent_t *event, int)
{
    return hipEventCreate(event);
}
hipError_t hipEventDestroy(hipEvent_t event)
{
    free(event);
    return hipSuccess;
}
/* Streams are synchronous: everything before the record has finished when it runs. */
hipError_t hipEventRecord(hipEvent_t event, hipStream_t)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    event->ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
    return hipSuccess;
}
hipError_t hipEventSynchronize(hipEvent_t)
{
    return hipSuccess;
}
hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop)
{
    *ms = (float)(stop->ms - start->ms);
    return hipSuccess;
}
hipError_t hipStreamWaitEvent(hipStream_t, hipEvent_t, int)
{
    return hipSuccess;
}
