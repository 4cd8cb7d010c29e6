/*
 * Lists every OpenCL program (dtype, head-dim class, tile, variant) the backend can build on an
 * NVIDIA device of compute capability >= 8.0, by ocl_plan.h's planner: each call's plan on the
 * tensor-core variant, and where that is the tensor-core one, the plain program a refused build
 * falls back to, for the device's default variant (FA2-shaped) and FLASHPORT_OPENCL_MMA=nv-tile.
 * One line a plan, "DTYPE D T MMA BQ FAST" (DTYPE as FP_OCL_DTYPE: 0 f32, 1 f16, 2 bf16; MMA 1
 * for the tile-shaped tensor-core variant, 2 for the FA2-shaped program; BQ and FAST the
 * backward's FP_OCL_BQ and FP_OCL_BWD_FAST: the defaults, and for the FA2-shaped bf16 programs
 * also what FLASHPORT_OPENCL_BWD_FAST=0 and FLASHPORT_OPENCL_BWD_BQ=16 build, the device A/B's
 * settings), duplicates included; tests/opencl/check_ptx.sh compiles each distinct one to PTX
 * and assembles it.
 *
 *   plan_programs [LOCAL_BYTES]     (default 49152, NVIDIA's CL_DEVICE_LOCAL_MEM_SIZE)
 */
#include "backends/opencl/ocl_plan.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    const size_t local = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : 48 << 10;
    for (int dtype = 0; dtype < 3; dtype++)
        for (int64_t hd = 1; hd <= 256; hd++)
            for (int kind = FP_OCL_FORWARD; kind <= FP_OCL_BACKWARD_FUSED; kind++) {
                for (int dev = 0; dev < 2; dev++) { /* the default, and nv-tile */
                    const int64_t c = fp_ocl_dim_class(hd);
                    int64_t t = 0;
                    const int v = fp_ocl_plan(kind, c, local, dev ? FP_OCL_MMA_NV : FP_OCL_FA2_NV,
                                              dtype == 0, &t);
                    if (t == 0)
                        continue;
                    const long long bq = FP_OCL_FA2_BQ(c);
                    printf("%d %lld %lld %d %lld 1\n", dtype, (long long)c, (long long)t,
                           fp_ocl_variant_fa2(v) ? 2 : v != FP_OCL_PLAIN, bq);
                    if (fp_ocl_variant_fa2(v) && dtype == 2) {
                        printf("%d %lld %lld 2 %lld 0\n", dtype, (long long)c, (long long)t, bq);
                        printf("%d %lld %lld 2 %d 1\n", dtype, (long long)c, (long long)t,
                               FP_OCL_FA2_BQ_MIN);
                    }
                    if (v != FP_OCL_PLAIN) {
                        (void)fp_ocl_plan(kind, c, local, FP_OCL_PLAIN, 0, &t);
                        printf("%d %lld %lld 0 %lld 1\n", dtype, (long long)c, (long long)t, bq);
                    }
                }
            }
    return 0;
}
