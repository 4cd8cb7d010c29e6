#!/usr/bin/env python3
"""Writes wgmma_gen.cuh: the wgmma.mma_async instructions the sm90 kernels use, one inline
function per (shape, A source, dtype). Each spells out its N / 2 f32 accumulator registers,
which inline PTX cannot take as an array; under FP_CUDA_EMU each calls the CPU emulator's
wgmma instead (fp_emu_wgmma, backends/cuda/emu/cuda_emu.h).

    python3 backends/cuda/ptx/gen_wgmma.py > backends/cuda/ptx/wgmma_gen.cuh
"""

NS = (32, 64, 80, 96, 128, 192, 256)
NS_TT = (64,)  # both operands MN-major: the backward's dQ = dS K
NS_BT = (128,)  # A K-major, B MN-major: the D = 256 backward's dV += P^T dO, dK += dS^T Q
DTYPES = (("bf16", "bf16"), ("f16", "f16"))
EMU_DTYPE = {"f16": "FP_EMU_F16", "bf16": "FP_EMU_BF16", "e4m3": "FP_EMU_E4M3"}


def emu_call(n, dtype, a_regs, ta, tb, scale):
    """The FP_CUDA_EMU branch's call: d, N, the A registers or NULL, the descriptors, dtype,
    the transpose immediates and the scale-d operand."""
    a = "a" if a_regs else "NULL"
    a_desc = "0" if a_regs else "a_desc"
    return "    fp_emu_wgmma(d, %d, %s, %s, b_desc, %s, %d, %d, %s);" % (
        n, a, a_desc, EMU_DTYPE[dtype], ta, tb, scale)
NS_F8 = (96, 128, 256)  # e4m3: k32, both operands K-major (fp8 wgmma has no transpose)


def acc_list(n, first):
    return ", ".join("%%%d" % (first + i) for i in range(n // 2))


def fn_ss(n, tname, ptx, tt=False, bt=False):
    regs = n // 2
    if bt:
        major = "A K-major, B MN-major (transpose immediates 0, 1)"
    else:
        major = "MN-major (transpose immediates 1)" if tt else "K-major (transpose immediates 0)"
    suffix = "_bt" if bt else "_tt" if tt else ""
    ta, tb = int(tt), int(tt or bt)
    lines = [
        "/* d (+)= A B, m64n%dk16, A and B from shared memory (descriptors), f32 accumulate;" % n,
        " * accumulate = 0 overwrites d. A and B %s. */" % major,
        "FP_DEV void fp_wgmma_ss%s_m64n%dk16_%s(float (&d)[%d], uint64_t a_desc, uint64_t b_desc,"
        % (suffix, n, tname, regs),
        "                                     int accumulate)",
        "{",
        "#ifdef FP_CUDA_EMU",
        emu_call(n, tname, False, ta, tb, "accumulate"),
        "#else",
        "    asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%d, 0;\\n\"" % (regs + 2),
        "                 \"wgmma.mma_async.sync.aligned.m64n%dk16.f32.%s.%s \"" % (n, ptx, ptx),
        "                 \"{%s}, \"" % acc_list(n, 0),
        "                 \"%%%d, %%%d, p, 1, 1, %d, %d;\\n}\\n\"" % (regs, regs + 1, ta, tb),
        "                 : " + ", ".join('"+f"(d[%d])' % i for i in range(regs)),
        "                 : \"l\"(a_desc), \"l\"(b_desc), \"r\"(accumulate));",
        "#endif",
        "}",
        "",
    ]
    return "\n".join(lines)


def fn_rs(n, tname, ptx):
    regs = n // 2
    lines = [
        "/* d += A B, m64n%dk16, A from registers (the m64k16 fragment), B from shared memory," % n,
        " * MN-major (transpose-b immediate 1), f32 accumulate. */",
        "FP_DEV void fp_wgmma_rs_m64n%dk16_%s(float (&d)[%d], const uint32_t (&a)[4], uint64_t b_desc)"
        % (n, tname, regs),
        "{",
        "#ifdef FP_CUDA_EMU",
        emu_call(n, tname, True, 0, 1, "1"),
        "#else",
        "    asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%d, 0;\\n\"" % (regs + 5),
        "                 \"wgmma.mma_async.sync.aligned.m64n%dk16.f32.%s.%s \"" % (n, ptx, ptx),
        "                 \"{%s}, \"" % acc_list(n, 0),
        "                 \"{%%%d, %%%d, %%%d, %%%d}, %%%d, p, 1, 1, 1;\\n}\\n\""
        % (regs, regs + 1, regs + 2, regs + 3, regs + 4),
        "                 : " + ", ".join('"+f"(d[%d])' % i for i in range(regs)),
        "                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(b_desc), \"r\"(1));",
        "#endif",
        "}",
        "",
    ]
    return "\n".join(lines)


def fn_f8(n, a_regs):
    """e4m3 x e4m3, m64nNk32: A from shared memory (a_regs False) or registers."""
    regs = n // 2
    src = "registers (the m64k32 fragment)" if a_regs else "shared memory (descriptor)"
    if a_regs:
        sig = "const uint32_t (&a)[4], uint64_t b_desc, int accumulate"
        a_op = "{%%%d, %%%d, %%%d, %%%d}" % (regs, regs + 1, regs + 2, regs + 3)
        pred, ins = regs + 5, '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate)'
        b_op = "%%%d" % (regs + 4)
    else:
        sig = "uint64_t a_desc, uint64_t b_desc, int accumulate"
        a_op = "%%%d" % regs
        pred, ins = regs + 2, '"l"(a_desc), "l"(b_desc), "r"(accumulate)'
        b_op = "%%%d" % (regs + 1)
    lines = [
        "/* d (+)= A B, m64n%dk32, e4m3 x e4m3, A from %s, B from shared memory;" % (n, src),
        " * both K-major, f32 accumulate; accumulate = 0 overwrites d. */",
        "FP_DEV void fp_wgmma_%s_m64n%dk32_e4m3(float (&d)[%d], %s)"
        % ("rs" if a_regs else "ss", n, regs, sig),
        "{",
        "#ifdef FP_CUDA_EMU",
        emu_call(n, "e4m3", a_regs, 0, 0, "accumulate"),
        "#else",
        "    asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%d, 0;\\n\"" % pred,
        "                 \"wgmma.mma_async.sync.aligned.m64n%dk32.f32.e4m3.e4m3 \"" % n,
        "                 \"{%s}, \"" % acc_list(n, 0),
        "                 \"%s, %s, p, 1, 1;\\n}\\n\"" % (a_op, b_op),
        "                 : " + ", ".join('"+f"(d[%d])' % i for i in range(regs)),
        "                 : " + ins + ");",
        "#endif",
        "}",
        "",
    ]
    return "\n".join(lines)


def main():
    out = [
        "/* Generated by backends/cuda/ptx/gen_wgmma.py, do not edit. */",
        "#ifndef FLASHPORT_BACKENDS_CUDA_PTX_WGMMA_GEN_CUH",
        "#define FLASHPORT_BACKENDS_CUDA_PTX_WGMMA_GEN_CUH",
        "",
        "/* clang-format off */",
        "",
    ]
    for tname, ptx in DTYPES:
        for n in NS:
            out.append(fn_ss(n, tname, ptx))
            out.append(fn_rs(n, tname, ptx))
        for n in NS_TT:
            out.append(fn_ss(n, tname, ptx, tt=True))
        for n in NS_BT:
            out.append(fn_ss(n, tname, ptx, bt=True))
    for n in NS_F8:
        out.append(fn_f8(n, False))
        out.append(fn_f8(n, True))
    out += ["/* clang-format on */", "", "#endif /* FLASHPORT_BACKENDS_CUDA_PTX_WGMMA_GEN_CUH */", ""]
    print("\n".join(out), end="")


if __name__ == "__main__":
    main()
