/*
 * test_data.c - token shards (round trip, corrupt and truncated files), the
 * byte tokenizer, the fortunes corpus, and the loader's distributed sampling,
 * train/val split and resume position.
 */
#define _POSIX_C_SOURCE 200809L

#include "test.h"
#include "zr/data.h"

#include <unistd.h>

static char dir[256];

static void tmp_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

static void test_shard_roundtrip(void)
{
    char path[512];
    tmp_path(path, sizeof path, "a.bin");
    uint16_t toks[1000];
    for (int i = 0; i < 1000; i++) {
        toks[i] = (uint16_t)(i * 7919u);
    }
    TEST_OK(zr_shard_write(path, toks, 1000));
    uint16_t *back = NULL;
    size_t n = 0;
    TEST_OK(zr_shard_read(path, &back, &n));
    TEST_EQ_INT(n, 1000);
    TEST_CHECK(back != NULL && memcmp(back, toks, sizeof toks) == 0);
    zr_free(back);
    /* no temporary left behind */
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    TEST_CHECK(access(tmp, F_OK) != 0);
    /* the exact llm.c layout */
    FILE *f = fopen(path, "rb");
    int32_t h[256];
    TEST_CHECK(f != NULL && fread(h, sizeof h, 1, f) == 1);
    if (f != NULL) {
        fclose(f);
    }
    TEST_EQ_INT(h[0], 20240520);
    TEST_EQ_INT(h[1], 1);
    TEST_EQ_INT(h[2], 1000);
    /* empty shard */
    TEST_OK(zr_shard_write(path, toks, 0));
    TEST_OK(zr_shard_read(path, &back, &n));
    TEST_EQ_INT(n, 0);
    zr_free(back);
}

static void test_shard_corrupt(void)
{
    char path[512];
    tmp_path(path, sizeof path, "bad.bin");
    int32_t h[256 + 16] = {0};
    h[0] = 20240520;
    h[1] = 1;
    h[2] = 16; /* 16 tokens = 32 bytes after the header */
    uint16_t *t = NULL;
    size_t n;
    zr_test_write_file(path, h, 1024 + 32);
    TEST_OK(zr_shard_read(path, &t, &n));
    zr_free(t);
    zr_test_write_file(path, h, 1024 + 30);
    TEST_FAILS(zr_shard_read(path, &t, &n), ZR_ERR_FORMAT, "bad.bin: token count 16");
    TEST_CHECK(t == NULL);
    zr_test_write_file(path, h, 1024 + 34);
    TEST_FAILS(zr_shard_read(path, &t, &n), ZR_ERR_FORMAT, "truncated or corrupt");
    zr_test_write_file(path, h, 100);
    TEST_FAILS(zr_shard_read(path, &t, &n), ZR_ERR_FORMAT, "truncated token shard header");
    h[0] = 20240326; /* a model file is not a shard */
    zr_test_write_file(path, h, 1024 + 32);
    TEST_FAILS(zr_shard_read(path, &t, &n), ZR_ERR_FORMAT, "bad.bin: not a token shard: magic");
    h[0] = 20240520;
    h[1] = 2;
    zr_test_write_file(path, h, 1024 + 32);
    TEST_FAILS(zr_shard_read(path, &t, &n), ZR_ERR_FORMAT, "version 2");
    h[1] = 1;
    h[2] = -5;
    zr_test_write_file(path, h, 1024 + 32);
    TEST_FAILS(zr_shard_read(path, &t, &n), ZR_ERR_FORMAT, "token count -5");
    tmp_path(path, sizeof path, "missing.bin");
    TEST_FAILS(zr_shard_read(path, &t, &n), ZR_ERR_IO, "missing.bin: cannot open");
}

static void test_bytes_and_text(void)
{
    const char *s = "h\xc3\xa9llo\n"; /* UTF-8 passes through byte by byte */
    uint16_t t[16];
    zr_bytes_encode(s, strlen(s), t);
    TEST_EQ_INT(t[1], 0xc3);
    TEST_EQ_INT(t[2], 0xa9);
    char back[16] = {0};
    zr_bytes_decode(t, strlen(s), back);
    TEST_CHECK(strcmp(back, s) == 0);
    char path[512];
    tmp_path(path, sizeof path, "t.txt");
    zr_test_write_file(path, s, strlen(s));
    zr_dataset ds;
    TEST_OK(zr_dataset_load_text(&ds, path));
    TEST_EQ_INT(ds.n, strlen(s));
    TEST_EQ_INT(ds.vocab, 256);
    TEST_EQ_INT(ds.tokens[6], '\n');
    zr_dataset_free(&ds);
}

static void test_fortunes(void)
{
    zr_dataset ds;
    TEST_OK(zr_dataset_load_fortunes(&ds, NULL));
    TEST_CHECK(ds.n > 100000);
    TEST_EQ_INT(ds.vocab, 256);
    zr_dataset again;
    TEST_OK(zr_dataset_load_fortunes(&again, NULL));
    TEST_CHECK(again.n == ds.n && memcmp(again.tokens, ds.tokens, ds.n * 2) == 0);
    zr_dataset_free(&again);
    zr_dataset_free(&ds);
    TEST_FAILS(zr_dataset_load_fortunes(&ds, "/nonexistent/fortunes"), ZR_ERR_IO, "make setup");
}

static void test_loader_distributed(void)
{
    enum { N = 10007 };
    uint16_t *toks = malloc(N * sizeof *toks);
    TEST_CHECK(toks != NULL);
    for (int i = 0; i < N; i++) {
        toks[i] = (uint16_t)((i * 31u) % 1000);
    }
    zr_dataset ds;
    TEST_OK(zr_dataset_from_tokens(&ds, toks, N, 1000));
    const int W = 3, B = 2, T = 16;
    zr_loader one, part[3];
    TEST_OK(zr_loader_init(&one, &ds, ZR_SPLIT_TRAIN, W * B, T, 0, 1));
    for (int r = 0; r < W; r++) {
        TEST_OK(zr_loader_init(&part[r], &ds, ZR_SPLIT_TRAIN, B, T, r, W));
    }
    size_t epoch = zr_loader_batches_per_epoch(&one);
    TEST_EQ_INT(epoch, zr_loader_batches_per_epoch(&part[0]));
    TEST_EQ_INT(epoch, (N - N * 5 / 100 - 1) / (W * B * T));
    int gi[96], gt[96], li[32], lt[32];
    int same = 1, shifted = 1;
    for (size_t step = 0; step < epoch + 5; step++) { /* across the wrap-around */
        zr_loader_next(&one, gi, gt);
        for (int r = 0; r < W; r++) {
            zr_loader_next(&part[r], li, lt);
            same &= memcmp(li, gi + r * B * T, sizeof li) == 0;
            same &= memcmp(lt, gt + r * B * T, sizeof lt) == 0;
        }
        for (int i = 0; i + 1 < W * B * T; i++) {
            shifted &= gt[i] == gi[i + 1];
        }
    }
    TEST_CHECKF(same, "the 3 ranks' slices differ from the 1-rank global batch");
    TEST_CHECK(shifted);

    /* resume: seek to a saved position and get the same batches again */
    zr_loader a, b;
    TEST_OK(zr_loader_init(&a, &ds, ZR_SPLIT_TRAIN, B, T, 1, W));
    TEST_OK(zr_loader_init(&b, &ds, ZR_SPLIT_TRAIN, B, T, 1, W));
    for (int s = 0; s < 7; s++) {
        zr_loader_next(&a, li, lt);
    }
    uint64_t pos = zr_loader_position(&a);
    TEST_EQ_INT(pos, 7);
    int ai[32], at[32];
    zr_loader_next(&a, ai, at);
    zr_loader_seek(&b, pos);
    zr_loader_next(&b, li, lt);
    TEST_CHECK(memcmp(ai, li, sizeof li) == 0 && memcmp(at, lt, sizeof lt) == 0);

    /* validation split: the last 5%, disjoint from training */
    zr_loader v;
    TEST_OK(zr_loader_init(&v, &ds, ZR_SPLIT_VAL, 1, 8, 0, 1));
    zr_loader_next(&v, li, lt);
    TEST_EQ_INT(li[0], toks[N - N * 5 / 100]);
    TEST_FAILS(zr_loader_init(&v, &ds, ZR_SPLIT_VAL, 4, 128, 0, 1), ZR_ERR_INVALID,
               "validation split has 500 tokens");
    TEST_FAILS(zr_loader_init(&v, &ds, ZR_SPLIT_TRAIN, 1, 8, 3, 3), ZR_ERR_INVALID, "rank 3 of 3");
    zr_dataset_free(&ds);
    free(toks);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/zr_test_data_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot create %s\n", dir);
        return 1;
    }
    TEST_RUN(test_shard_roundtrip);
    TEST_RUN(test_shard_corrupt);
    TEST_RUN(test_bytes_and_text);
    TEST_RUN(test_fortunes);
    TEST_RUN(test_loader_distributed);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot remove %s\n", dir);
    }
    return zr_test_finish();
}
