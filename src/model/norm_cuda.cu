/*
 * norm_cuda.cu - GPT-2's LayerNorm (plain and fused with the residual add)
 * forward and backward, and the column sums behind the bias and LayerNorm
 * weight gradients, on a CUDA device (split from ops_cuda.cu, whose header
 * comment gives the shapes and storage types).
 *
 *   LayerNorm   one warp per row, sums by an xor butterfly (every lane the
 *               same bits). Rows up to 1024 wide are kept in registers, CH
 *               chunks of 8 a lane, every load issued before the first sum;
 *               wider rows stream, the later passes from cache. Both take
 *               the sums in the same order.
 *   column sums never atomics: partial sums of fixed row ranges (a block:
 *               8 row lanes x 256 columns, 8 a thread, 16-byte loads), then
 *               their sum by part lanes in a fixed order. The order depends
 *               on N and C only: the same bits on every run.
 *
 * Built by nvcc (--fmad=true, see ops_cuda.cu) and by the GPU emulator.
 */
#include "ops_cuda_impl.h"
#include "ops_cuda_vec.h"
#include "ops_index.h"

#define ROW_WARPS   4                  /* rows (one warp each) per block of the row kernels */
#define COL_ROWS    8                  /* row lanes (warps) of a column-sum block */
#define COL_THREADS (32 * COL_ROWS)    /* threads of a column-sum block */
#define COL_SPAN    (32 * ZR_OP_CHUNK) /* columns of a column-sum block: 8 a thread */

/* ---- LayerNorm ------------------------------------------------------------------------- */

/*
 * v = chunk c (m elements, 0 beyond; none when m <= 0) of the row at off:
 * inp's, or RES: res = inp + (x + xbias), stored, as stored.
 */
template <typename S, bool RES>
__device__ __forceinline__ void ln_load(float v[8], S *res, const S *inp, const S *x,
                                        const S *xbias, uint64_t off, int c, int m, int vec)
{
    load8(inp + off + c, m, vec, v);
    if (RES) {
        float xv[8], bv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        load8(x + off + c, m, vec, xv);
        if (xbias != nullptr) {
            load8(xbias + c, m, vec, bv);
        }
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            v[i] = as_stored(v[i] + (xv[i] + bv[i]), res);
        }
        store8(res + off + c, m, vec, v);
    }
}

/*
 * One warp per row. RES: the row is first res = a + (x + xbias) (a = inp),
 * stored, and normalized as stored. Three passes over the row: the sum, the
 * centred sum of squares, the output; the later ones read from cache.
 */
template <typename S, bool RES>
__global__ void __launch_bounds__(ROW_WARPS * 32)
    layernorm_fwd(S *out, S *res, float *mean, float *rstd, const S *inp, const S *x,
                  const S *xbias, const S *w, const S *b, int N, int C, int vec)
{
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) {
        return; /* the whole warp: no lane waits in a shuffle for it */
    }
    uint64_t off = zr_op_offset((uint64_t)row, C, 0);
    const S *src = RES ? res + off : inp + off;
    float sum = 0.0f;
    for (int c = lane * 8; c < C; c += 256) {
        int m = min(8, C - c);
        float v[8];
        ln_load<S, RES>(v, res, inp, x, xbias, off, c, m, vec);
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            sum += v[i]; /* 0 beyond m */
        }
    }
    float mu = group_sum<32>(sum) / (float)C;
    float ss = 0.0f;
    for (int c = lane * 8; c < C; c += 256) {
        int m = min(8, C - c);
        float v[8];
        load8(src + c, m, vec, v);
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            float d = v[i] - mu;
            ss += i < m ? d * d : 0.0f;
        }
    }
    float rs = 1.0f / sqrtf(group_sum<32>(ss) / (float)C + 1e-5f);
    for (int c = lane * 8; c < C; c += 256) {
        int m = min(8, C - c);
        float v[8], wv[8], bv[8];
        load8(src + c, m, vec, v);
        load8(w + c, m, vec, wv);
        load8(b + c, m, vec, bv);
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            v[i] = (v[i] - mu) * rs * wv[i] + bv[i];
        }
        store8(out + off + c, m, vec, v);
    }
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

/*
 * The same LayerNorm with the row kept in registers: lane l holds chunks
 * l, l + 32, ... (CH of them, C <= 256 CH), all loaded before the first
 * sum, so the row is read once with CH 16-byte loads a lane in flight. The
 * sums run in the order of layernorm_fwd's, so the results are its bits.
 */
template <typename S, bool RES, int CH>
__global__ void __launch_bounds__(ROW_WARPS * 32)
    layernorm_fwd_reg(S *out, S *res, float *mean, float *rstd, const S *inp, const S *x,
                      const S *xbias, const S *w, const S *b, int N, int C, int vec)
{
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) {
        return;
    }
    uint64_t off = zr_op_offset((uint64_t)row, C, 0);
    float v[CH][8], sum = 0.0f, ss = 0.0f;
    ZR_UNROLL
    for (int k = 0; k < CH; k++) {
        int c = lane * 8 + k * 256;
        ln_load<S, RES>(v[k], res, inp, x, xbias, off, c, min(8, C - c), vec);
    }
    ZR_UNROLL
    for (int k = 0; k < CH; k++) {
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            sum += v[k][i]; /* 0 beyond C */
        }
    }
    float mu = group_sum<32>(sum) / (float)C;
    ZR_UNROLL
    for (int k = 0; k < CH; k++) {
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            float d = v[k][i] - mu;
            ss += lane * 8 + k * 256 + i < C ? d * d : 0.0f;
        }
    }
    float rs = 1.0f / sqrtf(group_sum<32>(ss) / (float)C + 1e-5f);
    ZR_UNROLL
    for (int k = 0; k < CH; k++) {
        int c = lane * 8 + k * 256, m = min(8, C - c);
        float wv[8], bv[8];
        load8(w + c, m, vec, wv);
        load8(b + c, m, vec, bv);
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            v[k][i] = (v[k][i] - mu) * rs * wv[i] + bv[i];
        }
        store8(out + off + c, m, vec, v[k]);
    }
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

/* The input gradient of a LayerNorm, one warp per row: dinp (+)= ... */
template <typename S>
__global__ void __launch_bounds__(ROW_WARPS * 32)
    layernorm_bwd_rows(S *dinp, const S *dout, const S *inp, const S *w, const float *mean,
                       const float *rstd, int N, int C, int accumulate, int vec)
{
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) {
        return;
    }
    uint64_t off = zr_op_offset((uint64_t)row, C, 0);
    float mu = mean[row], rs = rstd[row], a1 = 0.0f, a2 = 0.0f;
    for (int c = lane * 8; c < C; c += 256) {
        int m = min(8, C - c);
        float d[8], xv[8], wv[8];
        load8(dout + off + c, m, vec, d);
        load8(inp + off + c, m, vec, xv);
        load8(w + c, m, vec, wv);
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            float dn = wv[i] * d[i], nrm = (xv[i] - mu) * rs;
            a1 += dn;
            a2 += i < m ? dn * nrm : 0.0f;
        }
    }
    float dn_mean = group_sum<32>(a1) / (float)C, dnn_mean = group_sum<32>(a2) / (float)C;
    for (int c = lane * 8; c < C; c += 256) {
        int m = min(8, C - c);
        float d[8], xv[8], wv[8], dx[8];
        load8(dout + off + c, m, vec, d);
        load8(inp + off + c, m, vec, xv);
        load8(w + c, m, vec, wv);
        if (accumulate) {
            load8(dinp + off + c, m, vec, dx);
        }
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            float nrm = (xv[i] - mu) * rs;
            float g = (wv[i] * d[i] - dn_mean - nrm * dnn_mean) * rs;
            dx[i] = accumulate ? dx[i] + g : g;
        }
        store8(dinp + off + c, m, vec, dx);
    }
}

/*
 * The same input gradient with the row in registers (CH chunks a lane,
 * C <= 256 CH): dout, inp and w read once, CH loads of each in flight; the
 * sums in layernorm_bwd_rows' order.
 */
template <typename S, int CH>
__global__ void __launch_bounds__(ROW_WARPS * 32)
    layernorm_bwd_reg(S *dinp, const S *dout, const S *inp, const S *w, const float *mean,
                      const float *rstd, int N, int C, int accumulate, int vec)
{
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) {
        return;
    }
    uint64_t off = zr_op_offset((uint64_t)row, C, 0);
    float mu = mean[row], rs = rstd[row], a1 = 0.0f, a2 = 0.0f;
    float dn[CH][8], nrm[CH][8];
    ZR_UNROLL
    for (int k = 0; k < CH; k++) {
        int c = lane * 8 + k * 256, m = min(8, C - c);
        float wv[8];
        load8(dout + off + c, m, vec, dn[k]);
        load8(inp + off + c, m, vec, nrm[k]);
        load8(w + c, m, vec, wv);
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            dn[k][i] = wv[i] * dn[k][i];
            nrm[k][i] = (nrm[k][i] - mu) * rs;
        }
    }
    ZR_UNROLL
    for (int k = 0; k < CH; k++) {
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            a1 += dn[k][i];
            a2 += lane * 8 + k * 256 + i < C ? dn[k][i] * nrm[k][i] : 0.0f;
        }
    }
    float dn_mean = group_sum<32>(a1) / (float)C, dnn_mean = group_sum<32>(a2) / (float)C;
    ZR_UNROLL
    for (int k = 0; k < CH; k++) {
        int c = lane * 8 + k * 256, m = min(8, C - c);
        float dx[8];
        if (accumulate) {
            load8(dinp + off + c, m, vec, dx);
        }
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            float g = (dn[k][i] - dn_mean - nrm[k][i] * dnn_mean) * rs;
            dx[i] = accumulate ? dx[i] + g : g;
        }
        store8(dinp + off + c, m, vec, dx);
    }
}

/* ---- column sums ------------------------------------------------------------------------ */

/*
 * Pass 1 of a sum over rows: a block of COL_ROWS row lanes x 32 threads
 * covers COL_SPAN = 256 columns, 8 a thread (one 16-byte access in bf16,
 * two in fp32, where vec), and sums rows [p * rpp, (p + 1) * rpp): row lane
 * y every COL_ROWS-th row from the range's start + y, in order; then thread
 * t of the block adds the row lanes' sums of column t in lane order. LN
 * (NOUT = 2): part 0 sums (x - mean) * rstd * d (the weight's gradient),
 * part 1 sums d. RMS (RMSNorm's weight, NOUT = 1): sums (x * rstd) * d.
 * The order depends on N and C only: the same bits every run.
 */
template <typename S, int NOUT, bool RMS = false>
__global__ void __launch_bounds__(COL_THREADS)
    colsum_part(float *part, const S *d, const S *x, const float *mean, const float *rstd, int N,
                int C, int rpp, int vec)
{
    __shared__ float sh[NOUT][COL_ROWS][COL_SPAN];
    int tx = (int)threadIdx.x % 32, y = (int)threadIdx.x / 32;
    int c0 = (int)blockIdx.x * COL_SPAN, col = c0 + tx * ZR_OP_CHUNK, p = (int)blockIdx.y;
    int r0 = p * rpp, r1 = min(N, r0 + rpp), m = min(ZR_OP_CHUNK, C - col);
    float a0[8] = {0, 0, 0, 0, 0, 0, 0, 0}, a1[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (m > 0) {
        for (int r = r0 + y; r < r1; r += COL_ROWS) {
            float dv[8];
            load8(d + zr_op_offset((uint64_t)r, C, col), m, vec, dv);
            if (NOUT == 2) {
                float xv[8], mu = mean[r], rs = rstd[r];
                load8(x + zr_op_offset((uint64_t)r, C, col), m, vec, xv);
                ZR_UNROLL
                for (int i = 0; i < 8; i++) {
                    a0[i] += (xv[i] - mu) * rs * dv[i];
                }
            }
            if (RMS) {
                float xv[8], rs = rstd[r];
                load8(x + zr_op_offset((uint64_t)r, C, col), m, vec, xv);
                ZR_UNROLL
                for (int i = 0; i < 8; i++) {
                    a1[i] += (xv[i] * rs) * dv[i];
                }
            } else {
                ZR_UNROLL
                for (int i = 0; i < 8; i++) {
                    a1[i] += dv[i];
                }
            }
        }
    }
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        sh[NOUT - 1][y][tx * ZR_OP_CHUNK + i] = a1[i];
        sh[0][y][tx * ZR_OP_CHUNK + i] = NOUT == 2 ? a0[i] : a1[i];
    }
    __syncthreads();
    int t = (int)threadIdx.x;
    if (c0 + t < C) {
        ZR_UNROLL
        for (int o = 0; o < NOUT; o++) {
            float s = sh[o][0][t];
            for (int k = 1; k < COL_ROWS; k++) {
                s += sh[o][k][t];
            }
            part[((size_t)p * NOUT + o) * C + c0 + t] = s;
        }
    }
}

/*
 * Pass 2: out_o[col] += the partials of every row range. A block of
 * COL_ROWS part lanes x 32 columns: part lane y adds ranges y, y + COL_ROWS,
 * ... in order, then the lanes are added in lane order.
 */
template <typename S, int NOUT>
__global__ void __launch_bounds__(COL_THREADS)
    colsum_final(S *out0, S *out1, const float *part, int parts, int C)
{
    __shared__ float sh[NOUT][COL_ROWS][32];
    int tx = (int)threadIdx.x % 32, y = (int)threadIdx.x / 32;
    int col = (int)blockIdx.x * 32 + tx;
    ZR_UNROLL
    for (int o = 0; o < NOUT; o++) {
        float s = 0.0f;
        if (col < C) {
            for (int p = y; p < parts; p += COL_ROWS) {
                s += part[((size_t)p * NOUT + o) * C + col];
            }
        }
        sh[o][y][tx] = s;
    }
    __syncthreads();
    if (y == 0 && col < C) {
        ZR_UNROLL
        for (int o = 0; o < NOUT; o++) {
            float s = sh[o][0][tx];
            for (int k = 1; k < COL_ROWS; k++) {
                s += sh[o][k][tx];
            }
            S *out = o == 0 ? out0 : out1;
            st1(out + col, ld1(out + col) + s);
        }
    }
}

/* ---- launchers ------------------------------------------------------------------------------ */

/* Rows in registers (CH chunks a lane) where C <= 256 CH; else the streaming kernel (CH 0). */
template <typename S, bool RES, int CH>
static void layernorm_fwd_ch(const zr_op_k_ln *a, S *res, unsigned int grid, cudaStream_t s)
{
    if (CH == 0) {
        ZR_LAUNCH((layernorm_fwd<S, RES>), grid, ROW_WARPS * 32, 0, s, sptr<S>(a->out), res,
                  a->mean, a->rstd, sptr<S>(a->inp), sptr<S>(a->x), sptr<S>(a->xbias),
                  sptr<S>(a->w), sptr<S>(a->b), a->N, a->C, a->vec);
    } else {
        ZR_LAUNCH((layernorm_fwd_reg < S, RES, CH == 0 ? 1 : CH >), grid, ROW_WARPS * 32, 0, s,
                  sptr<S>(a->out), res, a->mean, a->rstd, sptr<S>(a->inp), sptr<S>(a->x),
                  sptr<S>(a->xbias), sptr<S>(a->w), sptr<S>(a->b), a->N, a->C, a->vec);
    }
}

template <typename S, bool RES>
static cudaError_t layernorm_fwd_res(const zr_op_k_ln *a, S *res, cudaStream_t s)
{
    unsigned int grid = (unsigned int)((a->N + ROW_WARPS - 1) / ROW_WARPS);
    switch ((a->C + 255) / 256) {
    case 1:
        layernorm_fwd_ch<S, RES, 1>(a, res, grid, s);
        break;
    case 2:
        layernorm_fwd_ch<S, RES, 2>(a, res, grid, s);
        break;
    case 3:
        layernorm_fwd_ch<S, RES, 3>(a, res, grid, s);
        break;
    case 4:
        layernorm_fwd_ch<S, RES, 4>(a, res, grid, s);
        break;
    default:
        layernorm_fwd_ch<S, RES, 0>(a, res, grid, s);
    }
    return cudaGetLastError();
}

template <typename S> static cudaError_t layernorm_fwd_t(const zr_op_k_ln *a, cudaStream_t s)
{
    if (a->res != nullptr) {
        return layernorm_fwd_res<S, true>(a, sptr<S>(a->res), s);
    }
    S *none = nullptr;
    return layernorm_fwd_res<S, false>(a, none, s);
}

extern "C" cudaError_t zr_op_k_launch_layernorm_fwd(int bf16, const zr_op_k_ln *a, cudaStream_t s)
{
    return bf16 ? layernorm_fwd_t<zr_bf16_t>(a, s) : layernorm_fwd_t<float>(a, s);
}

/* The two passes of a column sum into out0 (and out1 for a LayerNorm's weights). */
template <typename S, int NOUT, bool RMS = false>
static cudaError_t colsum_t(void *out0, void *out1, const void *d, const void *x, const float *mean,
                            const float *rstd, int N, int C, float *scratch, int vec,
                            cudaStream_t s)
{
    int parts = zr_op_k_colsum_parts(N), rpp = (N + parts - 1) / parts;
    dim3 grid((unsigned int)((C + COL_SPAN - 1) / COL_SPAN), (unsigned int)parts);
    ZR_LAUNCH((colsum_part<S, NOUT, RMS>), grid, COL_THREADS, 0, s, scratch, sptr<S>(d), sptr<S>(x),
              mean, rstd, N, C, rpp, vec);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        return err;
    }
    ZR_LAUNCH((colsum_final<S, NOUT>), (unsigned int)((C + 31) / 32), COL_THREADS, 0, s,
              sptr<S>(out0), sptr<S>(out1), scratch, parts, C);
    return cudaGetLastError();
}

template <typename S>
static cudaError_t layernorm_bwd_t(void *dinp, void *dw, void *db, const void *dout,
                                   const void *inp, const void *w, const float *mean,
                                   const float *rstd, int N, int C, int accumulate, float *scratch,
                                   int vec, cudaStream_t s)
{
    unsigned int grid = (unsigned int)((N + ROW_WARPS - 1) / ROW_WARPS);
    S *di = sptr<S>(dinp);
    const S *d = sptr<S>(dout), *x = sptr<S>(inp), *wp = sptr<S>(w);
    switch ((C + 255) / 256) {
    case 1:
        ZR_LAUNCH((layernorm_bwd_reg<S, 1>), grid, ROW_WARPS * 32, 0, s, di, d, x, wp, mean, rstd,
                  N, C, accumulate, vec);
        break;
    case 2:
        ZR_LAUNCH((layernorm_bwd_reg<S, 2>), grid, ROW_WARPS * 32, 0, s, di, d, x, wp, mean, rstd,
                  N, C, accumulate, vec);
        break;
    case 3:
        ZR_LAUNCH((layernorm_bwd_reg<S, 3>), grid, ROW_WARPS * 32, 0, s, di, d, x, wp, mean, rstd,
                  N, C, accumulate, vec);
        break;
    case 4:
        ZR_LAUNCH((layernorm_bwd_reg<S, 4>), grid, ROW_WARPS * 32, 0, s, di, d, x, wp, mean, rstd,
                  N, C, accumulate, vec);
        break;
    default:
        ZR_LAUNCH(layernorm_bwd_rows<S>, grid, ROW_WARPS * 32, 0, s, di, d, x, wp, mean, rstd, N, C,
                  accumulate, vec);
    }
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        return err;
    }
    return colsum_t<S, 2>(dw, db, dout, inp, mean, rstd, N, C, scratch, vec, s);
}

extern "C" cudaError_t zr_op_k_launch_layernorm_bwd(int bf16, void *dinp, void *dw, void *db,
                                                    const void *dout, const void *inp,
                                                    const void *w, const float *mean,
                                                    const float *rstd, int N, int C, int accumulate,
                                                    float *scratch, int vec, cudaStream_t s)
{
    return bf16 ? layernorm_bwd_t<zr_bf16_t>(dinp, dw, db, dout, inp, w, mean, rstd, N, C,
                                             accumulate, scratch, vec, s)
                : layernorm_bwd_t<float>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, accumulate,
                                         scratch, vec, s);
}

extern "C" cudaError_t zr_op_k_launch_colsum(int bf16, void *db, const void *d, int N, int OC,
                                             float *scratch, int vec, cudaStream_t s)
{
    const float *none = nullptr;
    return bf16 ? colsum_t<zr_bf16_t, 1>(db, db, d, d, none, none, N, OC, scratch, vec, s)
                : colsum_t<float, 1>(db, db, d, d, none, none, N, OC, scratch, vec, s);
}

extern "C" cudaError_t zr_op_k_launch_rmsnorm_dw(int bf16, void *dw, const void *dout,
                                                 const void *inp, const float *rstd, int N, int C,
                                                 float *scratch, int vec, cudaStream_t s)
{
    const float *none = nullptr;
    return bf16 ? colsum_t<zr_bf16_t, 1, true>(dw, dw, dout, inp, none, rstd, N, C, scratch, vec, s)
                : colsum_t<float, 1, true>(dw, dw, dout, inp, none, rstd, N, C, scratch, vec, s);
}
