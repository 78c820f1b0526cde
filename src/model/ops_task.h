/*
 * ops_task.h - how the CPU operators (ops.c, ops_llama.c) become pool tasks:
 * each body is compiled for the build's target, AVX2 and AVX-512
 * (MULTIVERSION), and the task runs the one zr_ops_isa() chose; rows and
 * column blocks are handed out in grains big enough that waking a thread
 * pays off. Internal to src/model.
 */
#ifndef ZR_MODEL_OPS_TASK_H
#define ZR_MODEL_OPS_TASK_H

#include "zr/base.h"

#include <stddef.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define ZR_OPS_X86 1
#define T256       __attribute__((target("avx2")))
#define T512       __attribute__((target("avx512f")))
#else
#define ZR_OPS_X86 0
#endif

/* zr_ops_isa()'s values */
enum { ISA_SCALAR, ISA_AVX2, ISA_AVX512 };

/* Columns per block of the column-split sums: one 64-byte cache line. */
#define ZR_COLS 16
/* Elements a task should have at least, so that waking a thread pays off. */
#define ZR_GRAIN 16384

/*
 * MULTIVERSION(name, type) turns name##_body(const type *a, size_t begin,
 * size_t end) into a pool task name##_task that runs the body compiled for
 * the width a->isa names.
 */
#if ZR_OPS_X86
#define MULTIVERSION(name, type)                                                                   \
    static void name##_base(const type *a, size_t b, size_t e)                                     \
    {                                                                                              \
        name##_body(a, b, e);                                                                      \
    }                                                                                              \
    static T256 void name##_avx2(const type *a, size_t b, size_t e)                                \
    {                                                                                              \
        name##_body(a, b, e);                                                                      \
    }                                                                                              \
    static T512 void name##_avx512(const type *a, size_t b, size_t e)                              \
    {                                                                                              \
        name##_body(a, b, e);                                                                      \
    }                                                                                              \
    static void name##_task(void *arg, size_t b, size_t e, int thread)                             \
    {                                                                                              \
        const type *a = arg;                                                                       \
        (void)thread;                                                                              \
        if (a->isa == ISA_AVX512) {                                                                \
            name##_avx512(a, b, e);                                                                \
        } else if (a->isa == ISA_AVX2) {                                                           \
            name##_avx2(a, b, e);                                                                  \
        } else {                                                                                   \
            name##_base(a, b, e);                                                                  \
        }                                                                                          \
    }
#else
#define MULTIVERSION(name, type)                                                                   \
    static void name##_task(void *arg, size_t b, size_t e, int thread)                             \
    {                                                                                              \
        (void)thread;                                                                              \
        name##_body((const type *)arg, b, e);                                                      \
    }
#endif

/* Rows per task for rows of n floats. */
static inline size_t zr_ops_row_grain(size_t n)
{
    return n >= ZR_GRAIN ? 1 : ZR_GRAIN / n;
}

/* Column blocks of ZR_COLS in n columns, and blocks per task for N rows. */
static inline size_t zr_ops_col_blocks(int n)
{
    return zr_div_up((size_t)n, ZR_COLS);
}

static inline size_t zr_ops_col_grain(int N)
{
    return zr_ops_row_grain((size_t)N * ZR_COLS);
}

#endif /* ZR_MODEL_OPS_TASK_H */
