/*
 * gpt_tensors.h - the order of a transformer block's tensors inside its
 * parameter unit (llm.c's order), shared by the CPU model (gpt.c) and the
 * device model (gpt_cuda.c): both index one unit layout, so it is written
 * once.
 */
#ifndef ZR_MODEL_GPT_TENSORS_H
#define ZR_MODEL_GPT_TENSORS_H

/* block tensor indices, in llm.c order */
enum {
    T_LN1W,
    T_LN1B,
    T_QKVW,
    T_QKVB,
    T_ATTPROJW,
    T_ATTPROJB,
    T_LN2W,
    T_LN2B,
    T_FCW,
    T_FCB,
    T_FCPROJW,
    T_FCPROJB
};

#endif
