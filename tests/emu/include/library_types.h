/*
 * library_types.h - the GPU emulator's data-type enumeration of the CUDA
 * math libraries (tests/emu, issue 24): the values of CUDA 13's
 * library_types.h that zr passes to cuBLAS. Valid C11 and C++.
 */
#ifndef ZR_EMU_LIBRARY_TYPES_H
#define ZR_EMU_LIBRARY_TYPES_H

/* The numbers are CUDA's, so an argument means the same in both builds. */
typedef enum cudaDataType_t {
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14,
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
} cudaDataType;
typedef cudaDataType cudaDataType_t;

#endif /* ZR_EMU_LIBRARY_TYPES_H */
