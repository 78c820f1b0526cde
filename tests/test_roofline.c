/*
 * test_roofline.c - the roofline ledger of a GPT step (zr/roofline.h).
 *
 *   flops      the ledger's FLOP total against zr_gpt_flops_per_step, GPT-2 124M
 *              and a tiny GPT: they differ by exactly 6 L B T C, the ledger's
 *              causal attention over (T + 1) / 2 keys a query where the
 *              model's count takes T / 2; the classifier over V, not Vp
 *   bytes      the rows of a tiny GPT (B 1, T 4, C 8, NH 2, V 10, Vp 16, L 1,
 *              bf16) against figures worked out by hand, and the step's
 *              sums per phase equal to the rows'
 *   roofline   the time bound: each row at max(FLOPs / GEMM rate, bytes / copy
 *              rate), summed per phase
 *   launches   (the GPU emulator only) kernel launches and GEMM calls of one
 *              training step of the device model (forward, backward, zr bench
 *              model's optimizer: cast, AdamW, cast per unit) at L = 1, 2, 3,
 *              counted by the emulator, equal to the ledger's table; prints
 *              the count per step as a + b L
 */
#include "test.h"
#include "zr/model.h"
#include "zr/roofline.h"

#if ZR_CUDA_EMU
#include "zr/model_cuda.h"
#include "zr/optim.h"
#include "zr/quant_cuda.h"
#include "zr_emu.h"
#endif

#include <string.h>

static const zr_roofline_row *row(const zr_roofline_row *rows, int n, const char *name)
{
    for (int i = 0; i < n; i++) {
        if (strcmp(rows[i].name, name) == 0) {
            return &rows[i];
        }
    }
    TEST_CHECKF(0, "no ledger row %s", name);
    return &rows[0];
}

static void check_flops(const zr_gpt_config *cfg, int B, int T)
{
    zr_roofline_row rows[ZR_ROOFLINE_MAX_ROWS];
    int n = zr_roofline_ledger(cfg, B, T, 2, rows);
    double ledger = zr_roofline_sum_phase(rows, n, ZR_ROOFLINE_PHASES).flops;
    double model = zr_gpt_flops_per_step(cfg, B, T);
    double diff = 6.0 * cfg->layers * B * T * cfg->channels;
    TEST_CHECKF(fabs(ledger - model - diff) <= 1e-12 * model,
                "ledger %.17g FLOPs, model %.17g, difference %.17g (want 6 L B T C = %.17g)",
                ledger, model, ledger - model, diff);
    /* the same FLOPs whatever the element size */
    zr_roofline_row rows4[ZR_ROOFLINE_MAX_ROWS];
    TEST_EQ_INT(zr_roofline_ledger(cfg, B, T, 4, rows4), n);
    TEST_CHECK(zr_roofline_sum_phase(rows4, n, ZR_ROOFLINE_PHASES).flops == ledger);
}

static void test_flops(void)
{
    const zr_gpt_config gpt2 = {1024, 50257, 50304, 12, 12, 768};
    const zr_gpt_config tiny = {4, 10, 16, 1, 2, 8};
    check_flops(&gpt2, 32, 1024);
    check_flops(&gpt2, 4, 64);
    check_flops(&tiny, 1, 4);
    check_flops(&tiny, 3, 3);
}

static void test_bytes(void)
{
    /* N = B T = 4 tokens, C 8, NH 2, V 10, Vp 16, L 1, bf16 (e = 2) */
    const zr_gpt_config tiny = {4, 10, 16, 1, 2, 8};
    zr_roofline_row r[ZR_ROOFLINE_MAX_ROWS];
    int n = zr_roofline_ledger(&tiny, 1, 4, 2, r);
    /* tokens 16 + wte rows min(4, 10) x 8 x 2 = 64 + wpe 4 x 8 x 2 = 64 + out 64 */
    TEST_NEAR(row(r, n, "fwd.encoder")->bytes, 208, 0);
    /* x 64 + w b 32 + y 64 in bf16; mean rstd 2 x 4 x 4 = 32 */
    TEST_NEAR(row(r, n, "fwd.ln1")->bytes, 192, 0);
    /* ln1 64 + W 24 x 8 x 2 = 384 + b 48 + qkv 4 x 24 x 2 = 192; 2 x 4 x 8 x 24 FLOPs */
    TEST_NEAR(row(r, n, "fwd.qkv")->bytes, 688, 0);
    TEST_NEAR(row(r, n, "fwd.qkv")->flops, 1536, 0);
    /* qkv 192 + atty 64 + lse 2 heads x 4 x 4 = 32; per head (hs 4) 1 + 2 + 3 + 4 = 10
     * query-key pairs, Q K^T and P V 2 x 4 FLOPs each: 2 x 10 x 8 x 2 heads */
    TEST_NEAR(row(r, n, "fwd.attention")->bytes, 288, 0);
    TEST_NEAR(row(r, n, "fwd.attention")->flops, 320, 0);
    TEST_NEAR(row(r, n, "bwd.attention")->flops, 640, 0);
    /* dO 64 + qkv 192 + O 64 + dqkv 192 + lse 32 */
    TEST_NEAR(row(r, n, "bwd.attention")->bytes, 544, 0);
    /* logits 4 x 10 x 2 = 80 + targets 16 + losses 16 + lse 16 */
    TEST_NEAR(row(r, n, "fwd.xent")->bytes, 128, 0);
    /* dres 64, fch_gelu 4 x 32 x 2 = 256, W 32 x 8 x 2 x 2 = 1024, b 8 x 2 x 2 = 32 */
    TEST_NEAR(row(r, n, "bwd.fcproj_dw")->bytes, 1376, 0);
    /* dln 64 + x 64 + dres 64 read and written 128 + w 16 + dw db 64; mean rstd 32 */
    TEST_NEAR(row(r, n, "bwd.ln2")->bytes, 368, 0);
    /* 16 x 8 + 4 x 8 = 160 (unit 0) + 872 (block) + 16 (final) = 1048 parameters, 28 bytes
     * each (bf16 gradient and parameter, fp32 master, m, v read and written), over 3 units */
    TEST_EQ_INT((int)zr_gpt_config_param_count(&tiny), 1048);
    TEST_EQ_INT(row(r, n, "optim.adamw")->count, 3);
    TEST_NEAR(row(r, n, "optim.adamw")->count * row(r, n, "optim.adamw")->bytes, 28 * 1048, 1e-9);
    /* the phases add up to the step */
    zr_roofline_sum all = zr_roofline_sum_phase(r, n, ZR_ROOFLINE_PHASES), acc = {0, 0, 0, 0};
    for (int p = 0; p < ZR_ROOFLINE_PHASES; p++) {
        zr_roofline_sum s = zr_roofline_sum_phase(r, n, p);
        acc.flops += s.flops, acc.bytes += s.bytes, acc.kernels += s.kernels, acc.gemms += s.gemms;
    }
    TEST_CHECK(acc.flops == all.flops && acc.bytes == all.bytes);
    TEST_CHECK(acc.kernels == all.kernels && acc.gemms == all.gemms);
    /* fp32 activations move twice the bf16 bytes of a GEMM */
    zr_roofline_row r4[ZR_ROOFLINE_MAX_ROWS];
    zr_roofline_ledger(&tiny, 1, 4, 4, r4);
    TEST_NEAR(row(r4, n, "fwd.qkv")->bytes, 2 * 688, 0);
}

static void test_roofline(void)
{
    const zr_gpt_config tiny = {4, 10, 16, 1, 2, 8};
    zr_roofline_row r[ZR_ROOFLINE_MAX_ROWS];
    int n = zr_roofline_ledger(&tiny, 1, 4, 2, r);
    /* 1 TFLOP/s and 1 GB/s: the bytes bound every row of this tiny model */
    double total = 0;
    for (int i = 0; i < n; i++) {
        double f = r[i].flops / 1e12, b = r[i].bytes / 1e9;
        total += r[i].count * (f > b ? f : b) * 1e3;
    }
    TEST_NEAR(zr_roofline_ms(r, n, ZR_ROOFLINE_PHASES, 1, 1), total, 1e-15);
    double blocks = zr_roofline_ms(r, n, ZR_ROOFLINE_FWD_BLOCKS, 1, 1);
    TEST_CHECK(blocks > 0 && blocks < total);
    /* a slow GEMM (1e-9 TFLOP/s: 1 FLOP a ms) makes the products the bound: the block's
     * 1536 + 512 + 2048 + 2048 GEMM FLOPs and 320 of attention */
    double slow = zr_roofline_ms(r, n, ZR_ROOFLINE_FWD_BLOCKS, 1e-9, 1e9);
    TEST_NEAR(slow, 6464, 1e-6);
}

#if ZR_CUDA_EMU
/* Launches of one step of the device model with L layers (bf16, B 1, T 8), zr bench model's. */
static void count_step(int L, long long *kernels, long long *gemms)
{
    const zr_gpt_config cfg = {8, 20, 32, L, 2, 16};
    zr_device gpu;
    zr_stream *s = NULL;
    TEST_OK(zr_device_open_cuda(0, &gpu));
    TEST_OK(zr_stream_create(&gpu, &s));
    zr_gpt_cuda m;
    TEST_OK(zr_gpt_cuda_init(&m, &cfg, 1, 8, ZR_DTYPE_BF16, s));
    int nu = L + 2, in[8], tg[8];
    void *p[16], *g[16];
    float *master[16], *mom[16], *var[16], *g32[16];
    size_t numel[16];
    for (int u = 0; u < nu; u++) {
        size_t k = numel[u] = zr_gpt_config_unit_numel(&cfg, u);
        TEST_OK(zr_device_alloc_at(&gpu, &p[u], k * 2, __FILE__, __LINE__));
        TEST_OK(zr_device_alloc_at(&gpu, &g[u], k * 2, __FILE__, __LINE__));
        TEST_OK(zr_device_alloc_at(&gpu, (void **)&master[u], k * 4, __FILE__, __LINE__));
        TEST_OK(zr_device_alloc_at(&gpu, (void **)&mom[u], k * 4, __FILE__, __LINE__));
        TEST_OK(zr_device_alloc_at(&gpu, (void **)&var[u], k * 4, __FILE__, __LINE__));
        TEST_OK(zr_device_alloc_at(&gpu, (void **)&g32[u], k * 4, __FILE__, __LINE__));
        TEST_OK(zr_memset_async(p[u], 0, k * 2, s));
        TEST_OK(zr_memset_async(master[u], 0, k * 4, s));
        TEST_OK(zr_memset_async(mom[u], 0, k * 4, s));
        TEST_OK(zr_memset_async(var[u], 0, k * 4, s));
        TEST_OK(zr_memset_async(g[u], 0, k * 2, s));
    }
    for (int i = 0; i < 8; i++) {
        in[i] = (3 * i + 1) % 20;
        tg[i] = (7 * i + 2) % 20;
    }
    TEST_OK(zr_stream_sync(s));
    long long k0, g0, k1, g1;
    zr_emu_launch_counts(&k0, &g0);
    TEST_OK(zr_gpt_cuda_forward_begin(&m, in, tg));
    for (int u = 0; u < nu; u++) {
        TEST_OK(zr_gpt_cuda_forward_unit(&m, u, p[u], p[0]));
    }
    TEST_OK(zr_gpt_cuda_backward_begin(&m));
    for (int u = nu - 1; u >= 0; u--) {
        TEST_OK(zr_gpt_cuda_backward_unit(&m, u, u > 0 ? p[u] : NULL, p[0], g[u], g[0]));
    }
    zr_adamw h = zr_adamw_default();
    for (int u = 0; u < nu; u++) {
        TEST_OK(zr_bf16_cuda_to_f32(g32[u], g[u], numel[u], s));
        TEST_OK(zr_adamw_cuda_update(&h, 1e-4f, 1, 1.0f, 1, master[u], g32[u], mom[u], var[u],
                                     numel[u], s));
        TEST_OK(zr_bf16_cuda_from_f32(p[u], master[u], numel[u], s));
    }
    TEST_OK(zr_stream_sync(s));
    zr_emu_launch_counts(&k1, &g1);
    float loss = 0;
    TEST_OK(zr_gpt_cuda_loss(&m, &loss));
    TEST_CHECKF(isfinite(loss), "loss %g", loss);
    *kernels = k1 - k0;
    *gemms = g1 - g0;
    zr_gpt_cuda_free(&m);
    for (int u = 0; u < nu; u++) {
        zr_device_free(&gpu, p[u]), zr_device_free(&gpu, g[u]), zr_device_free(&gpu, master[u]);
        zr_device_free(&gpu, mom[u]), zr_device_free(&gpu, var[u]), zr_device_free(&gpu, g32[u]);
    }
    zr_stream_destroy(s);
}

static void test_launches(void)
{
    long long k[4] = {0}, g[4] = {0};
    for (int L = 1; L <= 3; L++) {
        const zr_gpt_config cfg = {8, 20, 32, L, 2, 16};
        zr_roofline_row r[ZR_ROOFLINE_MAX_ROWS];
        zr_roofline_sum want =
            zr_roofline_sum_phase(r, zr_roofline_ledger(&cfg, 1, 8, 2, r), ZR_ROOFLINE_PHASES);
        count_step(L, &k[L], &g[L]);
        TEST_CHECKF(k[L] == want.kernels && g[L] == want.gemms,
                    "L = %d: the emulator counted %lld kernel launches and %lld GEMM calls a step, "
                    "the ledger says %ld and %ld (update launch_table in src/model/roofline.c)",
                    L, k[L], g[L], want.kernels, want.gemms);
    }
    printf("  launches per step: %lld + %lld L kernels, %lld + %lld L GEMM calls (emulator)\n",
           k[1] - (k[2] - k[1]), k[2] - k[1], g[1] - (g[2] - g[1]), g[2] - g[1]);
    TEST_CHECK(k[3] - k[2] == k[2] - k[1] && g[3] - g[2] == g[2] - g[1]);
}
#endif

int main(void)
{
    TEST_RUN(test_flops);
    TEST_RUN(test_bytes);
    TEST_RUN(test_roofline);
#if ZR_CUDA_EMU
    TEST_RUN(test_launches);
#endif
    return zr_test_finish();
}
