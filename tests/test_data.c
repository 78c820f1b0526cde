/*
 * test_data.c - llm.c token shards of both kinds (GPT-2 uint16, llama-3
 * uint32: round trip, recognition by header, every refusal: unknown version,
 * damaged header, truncated, other llm.c files), what counts as text, paths
 * that are not regular files (FIFO, directory, device), the vocabulary of a
 * shard (its kind or zr.model.vocab_size, never its largest token), the
 * fortunes corpus, and the loader's distributed sampling, train/val split
 * and resume position; shards by pattern (sorted, one sequence, kinds not
 * mixed), windows shuffled per epoch from (seed, epoch), and a resume at
 * another world size continuing the same windows.
 */
#define _POSIX_C_SOURCE 200809L

#include "test.h"
#include "zr/data.h"
#include "zr/file.h"

#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static void tmp_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

static void read_header(const char *path, int32_t *h)
{
    FILE *f = fopen(path, "rb");
    TEST_CHECK(f != NULL && fread(h, sizeof(int32_t), 256, f) == 256);
    if (f != NULL) {
        fclose(f);
    }
}

static void test_shard_roundtrip(void)
{
    char path[512];
    tmp_path(path, sizeof path, "a.bin");
    uint16_t toks[1000];
    for (int i = 0; i < 1000; i++) {
        toks[i] = (uint16_t)(i * 7919u % ZR_GPT2_VOCAB);
    }
    TEST_OK(zr_shard_write(path, toks, 1000));
    zr_dataset ds;
    TEST_OK(zr_dataset_load_shard(&ds, path));
    TEST_EQ_INT(ds.n, 1000);
    TEST_EQ_INT(ds.kind, ZR_DATA_GPT2);
    TEST_EQ_INT(ds.token_bytes, 2);
    TEST_CHECK(ds.tokens != NULL && memcmp(ds.tokens, toks, sizeof toks) == 0);
    zr_dataset_free(&ds);
    /* no temporary left behind */
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    TEST_CHECK(access(tmp, F_OK) != 0);
    /* the exact llm.c layout */
    int32_t h[256];
    read_header(path, h);
    TEST_EQ_INT(h[0], 20240520);
    TEST_EQ_INT(h[1], 1);
    TEST_EQ_INT(h[2], 1000);
    /* llama-3: uint32 tokens, beyond what 16 bits hold */
    uint32_t big[500];
    for (int i = 0; i < 500; i++) {
        big[i] = (uint32_t)(i * 104729u % ZR_LLAMA3_VOCAB);
    }
    tmp_path(path, sizeof path, "l3.bin");
    TEST_OK(zr_shard_write_kind(path, ZR_DATA_LLAMA3, big, 500));
    read_header(path, h);
    TEST_EQ_INT(h[0], 20240801);
    TEST_EQ_INT(h[1], 7);
    TEST_EQ_INT(h[2], 500);
    struct stat sb;
    TEST_CHECK(stat(path, &sb) == 0 && sb.st_size == 1024 + 500 * 4);
    TEST_OK(zr_dataset_load_shard(&ds, path));
    TEST_EQ_INT(ds.kind, ZR_DATA_LLAMA3);
    TEST_EQ_INT(ds.token_bytes, 4);
    TEST_EQ_INT(ds.n, 500);
    TEST_CHECK(memcmp(ds.tokens, big, sizeof big) == 0);
    TEST_CHECK(ds.max_token > 65535);
    zr_dataset_free(&ds);
    /* empty shard */
    tmp_path(path, sizeof path, "a.bin");
    TEST_OK(zr_shard_write(path, toks, 0));
    TEST_OK(zr_dataset_load_shard(&ds, path));
    TEST_EQ_INT(ds.n, 0);
    zr_dataset_free(&ds);
    TEST_FAILS(zr_shard_write_kind(path, ZR_DATA_TEXT, toks, 1), ZR_ERR_INVALID, "not text");
}

/* Every kind is recognised by its header, with the kind's vocabulary. */
static void test_kinds(void)
{
    char path[512];
    zr_dataset ds;
    uint16_t small[300];
    for (int i = 0; i < 300; i++) {
        small[i] = (uint16_t)(i % 11); /* the largest token is 10 ... */
    }
    tmp_path(path, sizeof path, "g.bin");
    TEST_OK(zr_shard_write(path, small, 300));
    TEST_OK(zr_dataset_load(&ds, path, 0));
    TEST_EQ_INT(ds.kind, ZR_DATA_GPT2);
    TEST_EQ_INT(ds.vocab, 50257); /* ... but the vocabulary is GPT-2's */
    TEST_EQ_INT(ds.max_token, 10);
    zr_dataset_free(&ds);
    uint32_t l3[300];
    for (int i = 0; i < 300; i++) {
        l3[i] = 128255u - (uint32_t)i;
    }
    tmp_path(path, sizeof path, "l.bin");
    TEST_OK(zr_shard_write_kind(path, ZR_DATA_LLAMA3, l3, 300));
    TEST_OK(zr_dataset_load(&ds, path, 0));
    TEST_EQ_INT(ds.kind, ZR_DATA_LLAMA3);
    TEST_EQ_INT(ds.vocab, 128256);
    TEST_EQ_INT(zr_dataset_token(&ds, 0), 128255);
    /* the loader hands out the 32-bit tokens unchanged */
    zr_loader l;
    TEST_OK(zr_loader_init(&l, &ds, ZR_SPLIT_TRAIN, 2, 8, 0, 1));
    int in[16], tg[16];
    zr_loader_next(&l, in, tg);
    TEST_EQ_INT(in[0], 128255);
    TEST_EQ_INT(tg[0], 128254);
    TEST_EQ_INT(in[15], 128240);
    zr_dataset_free(&ds);
    const char *text = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n";
    tmp_path(path, sizeof path, "t.txt");
    zr_test_write_file(path, text, strlen(text));
    TEST_OK(zr_dataset_load(&ds, path, 0));
    TEST_EQ_INT(ds.kind, ZR_DATA_TEXT);
    TEST_EQ_INT(ds.vocab, 256);
    TEST_EQ_INT(ds.n, strlen(text));
    zr_dataset_free(&ds);
    TEST_CHECK(strcmp(zr_data_kind_name(ZR_DATA_LLAMA3), "llm.c llama-3 token shard") == 0);
}

static void test_shard_refused(void)
{
    char path[512];
    tmp_path(path, sizeof path, "bad.bin");
    int32_t h[256 + 16] = {0};
    h[0] = 20240520;
    h[1] = 1;
    h[2] = 16; /* 16 tokens = 32 bytes after the header */
    zr_dataset ds;
    zr_test_write_file(path, h, 1024 + 32);
    TEST_OK(zr_dataset_load(&ds, path, 0));
    zr_dataset_free(&ds);
    /* truncated and oversized */
    zr_test_write_file(path, h, 1024 + 30);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_FORMAT,
               "bad.bin: llm.c GPT-2 token shard with a token count of 16");
    TEST_CHECK(ds.tokens == NULL);
    zr_test_write_file(path, h, 1024 + 34);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_FORMAT, "truncated or damaged");
    zr_test_write_file(path, h, 100);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_FORMAT,
               "truncated llm.c GPT-2 token shard header");
    /* unknown versions of known magics, named */
    h[1] = 2;
    zr_test_write_file(path, h, 1024 + 32);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_FORMAT,
               "llm.c GPT-2 token shard version 2 is not known");
    h[0] = 20240801;
    h[1] = 1;
    zr_test_write_file(path, h, 1024 + 64);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_FORMAT,
               "llm.c llama-3 token shard version 1 is not known");
    /* a llama-3 header on GPT-2-sized data: the size gives it away */
    h[1] = 7;
    zr_test_write_file(path, h, 1024 + 32);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_FORMAT, "llama-3 token shard with a token");
    h[0] = 20240520;
    h[1] = 1;
    h[2] = -5;
    zr_test_write_file(path, h, 1024 + 32);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_FORMAT, "token count of -5");
    /* other llm.c files are named, never read as text */
    h[0] = 20240326;
    zr_test_write_file(path, h, 1024 + 32);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_FORMAT, "llm.c GPT-2 model file");
    h[0] = 20240522;
    zr_test_write_file(path, h, 1024 + 32);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_FORMAT, "evaluation file");
    /* a damaged magic: not a shard any more, and not text either */
    h[0] = 20240520 ^ 0x100;
    h[1] = 1;
    h[2] = 16;
    zr_test_write_file(path, h, 1024 + 32);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_FORMAT, "is neither text nor");
    /* the kind-specific loaders refuse the other kind */
    TEST_FAILS(zr_dataset_load_shard(&ds, path), ZR_ERR_FORMAT, "not an llm.c token shard");
    h[0] = 20240520;
    zr_test_write_file(path, h, 1024 + 32);
    TEST_FAILS(zr_dataset_load_text(&ds, path), ZR_ERR_FORMAT, "not text");
    tmp_path(path, sizeof path, "missing.bin");
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_IO, "missing.bin");
}

static void test_not_regular(void)
{
    char path[512];
    zr_dataset ds;
    /* a FIFO nobody writes to would block an open for reading forever */
    tmp_path(path, sizeof path, "fifo");
    TEST_CHECK(mkfifo(path, 0600) == 0);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_INVALID, "is a FIFO");
    unlink(path);
    TEST_FAILS(zr_dataset_load(&ds, dir, 0), ZR_ERR_INVALID, "is a directory");
    TEST_FAILS(zr_dataset_load(&ds, "/dev/null", 0), ZR_ERR_INVALID, "character device");
    TEST_FAILS(zr_dataset_load_shard(&ds, "/dev/zero"), ZR_ERR_INVALID, "character device");
    TEST_CHECK(ds.tokens == NULL && ds.n == 0);
}

static void test_text(void)
{
    static const struct {
        const char *s;
        size_t n;
        long long bad;
    } cases[] = {
        {"plain ascii\n\t\r", 14, -1},
        {"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xef\xbb\xbf", 12, -1}, /* 2, 3, 4 bytes, BOM */
        {"\xf4\x8f\xbf\xbf", 4, -1},                                  /* U+10FFFF */
        {"ab\0cd", 5, 2},                                             /* NUL */
        {"a\x80", 2, 1},                                              /* lone continuation */
        {"\xc0\x80", 2, 0},                                           /* overlong NUL */
        {"\xe0\x80\x80", 3, 0},                                       /* overlong */
        {"\xed\xa0\x80", 3, 0},                                       /* surrogate */
        {"\xf4\x90\x80\x80", 4, 0},                                   /* > U+10FFFF */
        {"\xf5\x80\x80\x80", 4, 0},
        {"\xff", 1, 0},
        {"xy\xe2\x82", 4, 2}, /* cut at the end */
        {"\xc3(", 2, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        long long got = zr_text_check(cases[i].s, cases[i].n);
        TEST_CHECKF(got == cases[i].bad, "case %zu: %lld, expected %lld", i, got, cases[i].bad);
    }
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
    TEST_EQ_INT(zr_dataset_token(&ds, 6), '\n');
    zr_dataset_free(&ds);
    /* binary that is not text: refused with the offset of the first bad byte */
    unsigned char bin[64];
    for (int i = 0; i < 64; i++) {
        bin[i] = (unsigned char)(i < 40 ? 'a' : 0xfe);
    }
    tmp_path(path, sizeof path, "noise.bin");
    zr_test_write_file(path, bin, sizeof bin);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_FORMAT, "byte 40 (0xfe) is not valid UTF-8");
    bin[10] = 0;
    zr_test_write_file(path, bin, sizeof bin);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_FORMAT, "byte 10 (0x00) is a NUL byte");
    /* short files that are not shards are judged as text too */
    zr_test_write_file(path, "\x88\xd8", 2);
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_FORMAT, "is neither text nor");
}

/* The vocabulary: the kind's, or zr.model.vocab_size; never the largest token. */
static void test_vocab(void)
{
    char path[512];
    tmp_path(path, sizeof path, "v.bin");
    uint16_t toks[400];
    for (int i = 0; i < 400; i++) {
        toks[i] = (uint16_t)(i * 13 % 300);
    }
    toks[123] = 60000; /* not a GPT-2 token: another tokenizer wrote this shard */
    TEST_OK(zr_shard_write(path, toks, 400));
    zr_dataset ds;
    TEST_FAILS(zr_dataset_load(&ds, path, 0), ZR_ERR_INVALID,
               "token 60000 at position 123 is outside the vocabulary of its kind (llm.c GPT-2 "
               "token shard: 50257 tokens)");
    TEST_CHECK(strstr(zr_error_message(), "zr.model.vocab_size") != NULL);
    TEST_CHECK(ds.tokens == NULL);
    TEST_FAILS(zr_dataset_load(&ds, path, 60000), ZR_ERR_INVALID, "needs at least 60001");
    TEST_OK(zr_dataset_load(&ds, path, 60001));
    TEST_EQ_INT(ds.vocab, 60001);
    TEST_FAILS(zr_dataset_set_vocab(&ds, path, ZR_VOCAB_MAX + 1), ZR_ERR_INVALID,
               "zr.model.vocab_size 16777217 is out of range");
    TEST_FAILS(zr_dataset_set_vocab(&ds, path, -1), ZR_ERR_INVALID, "out of range");
    TEST_EQ_INT(ds.vocab, 60001);
    TEST_OK(zr_dataset_set_vocab(&ds, path, ZR_VOCAB_MAX));
    TEST_EQ_INT(ds.vocab, ZR_VOCAB_MAX);
    zr_dataset_free(&ds);
    /* text takes an explicit vocabulary as well (it must hold the bytes used) */
    tmp_path(path, sizeof path, "v.txt");
    zr_test_write_file(path, "zzzz", 4);
    TEST_OK(zr_dataset_load(&ds, path, 1000));
    TEST_EQ_INT(ds.vocab, 1000);
    zr_dataset_free(&ds);
    TEST_FAILS(zr_dataset_load(&ds, path, 100), ZR_ERR_INVALID, "token 122 at position 0");
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
    TEST_EQ_INT(ds.kind, ZR_DATA_TEXT);
    TEST_CHECK(ds.max_token < 256);
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

/* Shards by pattern: sorted, one token sequence across files, kinds not mixed, names checked. */
static void test_pattern(void)
{
    enum { S = 3, N = 700 };
    uint16_t all[S * N];
    char path[512], pat[512];
    for (int i = 0; i < S * N; i++) {
        all[i] = (uint16_t)(i * 7u % 30000);
    }
    for (int s = 0; s < S; s++) {
        char name[64];
        snprintf(name, sizeof name, "tr_%06d.bin", 2 - s); /* written out of order */
        tmp_path(path, sizeof path, name);
        TEST_OK(zr_shard_write(path, all + (2 - s) * N, N));
    }
    tmp_path(pat, sizeof pat, "tr_*.bin");
    zr_dataset ds, one;
    TEST_OK(zr_dataset_load(&ds, pat, 0));
    TEST_EQ_INT(ds.nshards, S);
    TEST_EQ_INT(ds.n, S * N);
    TEST_EQ_INT(ds.vocab, ZR_GPT2_VOCAB);
    int same = 1, got[40];
    for (int i = 0; i < S * N; i++) {
        same &= zr_dataset_token(&ds, (size_t)i) == all[i];
    }
    TEST_CHECKF(same, "the shards are not read in sorted order as one sequence");
    zr_dataset_read(&ds, N - 20, 40, got); /* across a shard boundary */
    for (int i = 0; i < 40; i++) {
        same &= got[i] == all[N - 20 + i];
    }
    TEST_CHECK(same);
    /* the data's id: three shards hash as the one file holding their tokens */
    tmp_path(path, sizeof path, "whole.bin");
    TEST_OK(zr_shard_write(path, all, S * N));
    TEST_OK(zr_dataset_load(&one, path, 0));
    TEST_EQ_INT(zr_dataset_ends_crc(&one), zr_dataset_ends_crc(&ds));
    TEST_EQ_INT(zr_dataset_names_crc(&one), 0);
    TEST_CHECK(zr_dataset_names_crc(&ds) != 0);
    zr_dataset_free(&one);
    /* the vocabulary error names the shard and the token's index in it */
    TEST_FAILS(zr_dataset_set_vocab(&ds, pat, 10000), ZR_ERR_INVALID,
               "tr_000002.bin: token 10003 at position 29 does not fit");
    zr_dataset_free(&ds);
    /* no match names the pattern; a literal path with glob characters is a file */
    tmp_path(pat, sizeof pat, "none_*.bin");
    TEST_FAILS(zr_dataset_load(&ds, pat, 0), ZR_ERR_IO, "none_*.bin matches no file");
    tmp_path(pat, sizeof pat, "lit[1].bin");
    TEST_OK(zr_shard_write(pat, all, N));
    TEST_OK(zr_dataset_load(&ds, pat, 0));
    TEST_EQ_INT(ds.nshards, 1);
    zr_dataset_free(&ds);
    /* two kinds are refused naming a file of each; a damaged shard by its name */
    uint32_t wide[N];
    for (int i = 0; i < N; i++) {
        wide[i] = all[i];
    }
    tmp_path(path, sizeof path, "tr_000003.bin");
    TEST_OK(zr_shard_write_kind(path, ZR_DATA_LLAMA3, wide, N));
    tmp_path(pat, sizeof pat, "tr_*.bin");
    TEST_FAILS(zr_dataset_load(&ds, pat, 0), ZR_ERR_FORMAT, "tr_000003.bin an llm.c llama-3");
    TEST_CHECK(strstr(zr_error_message(), "tr_000000.bin is an llm.c GPT-2") != NULL);
    FILE *f = fopen(path, "wb");
    TEST_CHECK(f != NULL && fwrite("not a shard", 1, 11, f) == 11);
    fclose(f);
    TEST_FAILS(zr_dataset_load(&ds, pat, 0), ZR_ERR_FORMAT, "tr_000003.bin is not an llm.c");
}

/* Windows of one epoch, in order or shuffled: every window once; the order from (seed, epoch). */
static void epoch_of(const zr_loader *l, uint64_t e, uint64_t *w)
{
    for (uint64_t i = 0; i < l->windows; i++) {
        w[i] = zr_loader_window(l, e * l->windows + i);
    }
}

static void test_shuffle(void)
{
    enum { N = 4001, T = 8 };
    uint16_t *toks = malloc(N * sizeof *toks);
    TEST_CHECK(toks != NULL);
    for (int i = 0; i < N; i++) {
        toks[i] = (uint16_t)i;
    }
    zr_dataset ds;
    TEST_OK(zr_dataset_from_tokens(&ds, toks, N, 65536));
    zr_loader a, b, c;
    TEST_OK(zr_loader_init(&a, &ds, ZR_SPLIT_ALL, 2, T, 0, 1));
    TEST_EQ_INT(a.windows, (N - 1) / T);
    b = c = a;
    zr_loader_shuffle(&a, 1, 1337);
    zr_loader_shuffle(&b, 1, 1337);
    zr_loader_shuffle(&c, 1, 1338);
    enum { W = (N - 1) / T };
    static uint64_t e0[W], e1[W], again[W], other[W];
    epoch_of(&a, 0, e0);
    epoch_of(&a, 1, e1);
    epoch_of(&b, 1, again);
    epoch_of(&c, 0, other);
    static unsigned char seen0[W], seen1[W];
    int moved = 0, differ = 0, differ_seed = 0;
    for (int i = 0; i < W; i++) {
        TEST_CHECK(e0[i] < W && e1[i] < W);
        seen0[e0[i] % W]++;
        seen1[e1[i] % W]++;
        moved += e0[i] != (uint64_t)i;
        differ += e0[i] != e1[i];
        differ_seed += e0[i] != other[i];
    }
    int once = 1;
    for (int i = 0; i < W; i++) {
        once &= seen0[i] == 1 && seen1[i] == 1;
    }
    TEST_CHECKF(once, "an epoch does not see every window exactly once");
    TEST_CHECKF(moved > W / 2 && differ > W / 2 && differ_seed > W / 2,
                "orders too alike: %d moved, %d differ between epochs, %d between seeds", moved,
                differ, differ_seed);
    TEST_CHECK(memcmp(e1, again, sizeof e1) == 0); /* the same seed, the same order */
    /* a batch's rows are its windows: inputs window x T.., targets shifted by one */
    int in[2 * T], tg[2 * T];
    zr_loader_next(&a, in, tg);
    TEST_EQ_INT(in[0], (int)e0[0] * T);
    TEST_EQ_INT(in[T], (int)e0[1] * T);
    TEST_EQ_INT(tg[2 * T - 1], (int)e0[1] * T + T);
    /* unshuffled: in order */
    zr_loader_shuffle(&c, 0, 1338);
    TEST_EQ_INT(zr_loader_window(&c, 5), 5);
    TEST_EQ_INT(zr_loader_window(&c, (uint64_t)W + 7), 7);
    zr_dataset_free(&ds);
    free(toks);
}

/* A resume at another world size and batch continues the same stream of windows. */
static void test_resume_any_world(void)
{
    enum { N = 3001, T = 4 };
    uint16_t *toks = malloc(N * sizeof *toks);
    TEST_CHECK(toks != NULL);
    for (int i = 0; i < N; i++) {
        toks[i] = (uint16_t)(i * 13u % 5000);
    }
    zr_dataset ds;
    TEST_OK(zr_dataset_from_tokens(&ds, toks, N, 5000));
    /* 2 ranks x B 3 for 150 steps (past an epoch of 712 windows), then 1 rank x 6, 3 x 2 */
    zr_loader two[2], one, three[3];
    for (int r = 0; r < 2; r++) {
        TEST_OK(zr_loader_init(&two[r], &ds, ZR_SPLIT_TRAIN, 3, T, r, 2));
        zr_loader_shuffle(&two[r], 1, 42);
    }
    int in[24], tg[24], ref[24], reft[24];
    for (int s = 0; s < 150; s++) {
        zr_loader_next(&two[0], in, tg);
        zr_loader_next(&two[1], in, tg);
    }
    uint64_t pos = zr_loader_windows(&two[0]);
    TEST_EQ_INT(pos, 150 * 6);
    TEST_OK(zr_loader_init(&one, &ds, ZR_SPLIT_TRAIN, 6, T, 0, 1));
    zr_loader_shuffle(&one, 1, 42);
    zr_loader_seek_windows(&one, pos);
    for (int r = 0; r < 3; r++) {
        TEST_OK(zr_loader_init(&three[r], &ds, ZR_SPLIT_TRAIN, 2, T, r, 3));
        zr_loader_shuffle(&three[r], 1, 42);
        zr_loader_seek_windows(&three[r], pos);
    }
    int same = 1;
    for (int s = 0; s < 200; s++) { /* across the next epoch's start */
        zr_loader_next(&two[0], ref, reft);
        zr_loader_next(&two[1], ref + 3 * T, reft + 3 * T);
        zr_loader_next(&one, in, tg);
        same &= memcmp(in, ref, sizeof in) == 0 && memcmp(tg, reft, sizeof tg) == 0;
        for (int r = 0; r < 3; r++) {
            zr_loader_next(&three[r], in, tg);
            same &= memcmp(in, ref + r * 2 * T, 2 * T * sizeof *in) == 0;
            same &= memcmp(tg, reft + r * 2 * T, 2 * T * sizeof *tg) == 0;
        }
    }
    TEST_CHECKF(same, "a resume at 1 or 3 ranks differs from 2 ranks straight through");
    TEST_EQ_INT(zr_loader_windows(&one), zr_loader_windows(&two[0]));
    zr_dataset_free(&ds);
    free(toks);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/zr_test_data_%d", (int)getpid());
    if (zr_file_mkdir_p(dir) != ZR_OK) {
        fprintf(stderr, "cannot create %s: %s\n", dir, zr_error_message());
        return 1;
    }
    TEST_RUN(test_shard_roundtrip);
    TEST_RUN(test_kinds);
    TEST_RUN(test_shard_refused);
    TEST_RUN(test_not_regular);
    TEST_RUN(test_text);
    TEST_RUN(test_vocab);
    TEST_RUN(test_fortunes);
    TEST_RUN(test_loader_distributed);
    TEST_RUN(test_pattern);
    TEST_RUN(test_shuffle);
    TEST_RUN(test_resume_any_world);
    static const char *const files[] = {
        "a.bin",         "l3.bin",        "g.bin",         "l.bin",
        "t.txt",         "bad.bin",       "noise.bin",     "v.bin",
        "v.txt",         "fifo",          "tr_000000.bin", "tr_000001.bin",
        "tr_000002.bin", "tr_000003.bin", "whole.bin",     "lit[1].bin"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[512];
        tmp_path(path, sizeof path, files[i]);
        unlink(path);
    }
    if (rmdir(dir) != 0) {
        fprintf(stderr, "cannot remove %s\n", dir);
    }
    return zr_test_finish();
}
