/*
 * test_safetensors.c - the safetensors reader and a Hugging Face folder's
 * weights (src/model/safetensors.h): headers that lie, each refused naming
 * the file and the tensor, and every byte of a header changed without a
 * crash (run in asan); parts of tensors of every dtype read exactly, at odd
 * offsets and lengths; sharded folders and each lie of their index; a
 * sharded copy of tests/data/hf/llama_gqa loading as the file does, whole
 * and by ranges.
 */
#define _POSIX_C_SOURCE 200809L

#include "test.h"
#include "test_st.h"
#include "zr/llama.h"

#include "../src/model/safetensors.h" /* internal to src/model */

#include <math.h>
#include <stdint.h>
#include <unistd.h>

static char tmp_dir[64];

static const char *hf_root(void)
{
    const char *r = getenv("ZR_HF_DATA");
    return r != NULL ? r : "tests/data/hf";
}

/* tmp_dir/name as a file holding header and `bytes` zero bytes of data. */
static void write_raw(const char *name, const char *header, size_t bytes)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    test_st_tensor t = {.bytes = bytes};
    test_st_write(path, header, &t, 1);
}

/* Opening tmp_dir/name fails with ZR_ERR_FORMAT, a message naming the file and holding want. */
static void refused(const char *name, const char *want)
{
    char path[128];
    zr_safetensors s = {0};
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    TEST_FAILS(zr_safetensors_open(&s, path), ZR_ERR_FORMAT, want);
    TEST_CHECKF(strstr(zr_error_message(), path) != NULL, "\"%s\" does not name %s",
                zr_error_message(), path);
    printf("  %s\n", zr_error_message() + strlen(tmp_dir) + 1);
    TEST_CHECK(s.tensors == NULL && s.f == NULL && s.path == NULL);
    zr_safetensors_close(&s);
}

#define F32_4 "\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]"

/* Each lie of a header: refused with its own message. */
static void test_hostile_headers(void)
{
    static const struct {
        const char *header, *want;
        size_t bytes;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
         "tensor a: data_offsets [0, 16] go past the end", 8},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}",
         "tensor a: data_offsets is not [begin, end] with begin <= end", 16},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0]}}",
         "tensor a: data_offsets is not", 16},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,1e300]}}",
         "tensor a: data_offsets is not", 16},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[-16,0]}}",
         "tensor a: data_offsets is not", 16},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4]}}", "tensor a: data_offsets is not", 16},
        {"{\"a\":{" F32_4 "},\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
         "tensors a [0, 16] and b [8, 24] overlap", 24},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\","
         "\"shape\":[1],\"data_offsets\":[12,16]}}",
         "bytes [8, 12) of the data, before tensor b, belong to no tensor", 16},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         "bytes [0, 4) of the data, before tensor a, belong to no tensor", 12},
        {"{\"a\":{" F32_4 "}}",
         "bytes [16, 20) of the data, after the last tensor a, belong to no tensor", 20},
        {"{\"__metadata__\":{}}",
         "bytes [0, 3) of the data, after the last tensor, belong to no tensor", 3},
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,16]}}",
         "tensor a: 16 bytes for 4 elements of BF16 (2 bytes each: 8)", 16},
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[4],\"data_offsets\":[0,16]}}",
         "tensor a: dtype F33 is not one safetensors defines", 16},
        {"{\"a\":{\"shape\":[4],\"data_offsets\":[0,16]}}", "tensor a: dtype (missing)", 16},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}",
         "tensor a: shape[0] is not a size", 16},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2, 2.5],\"data_offsets\":[0,16]}}",
         "tensor a: shape[1] is not a size", 16},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"4\"],\"data_offsets\":[0,16]}}",
         "tensor a: shape[0] is not a size", 16},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}",
         "tensor a: shape is not an array", 16},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,4],\"data_offsets\":[0,16]}}",
         "tensor a: shape is not an array of at most 8", 16},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,16]}}",
         "tensor a: shape[1]: the shape's bytes pass 2^64", 16},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,536870912],\"data_offsets\":[0,16]}}",
         "tensor a: shape[1]: the shape's bytes pass 2^64", 16},
        {"{\"a\":{" F32_4 "},\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}",
         "tensor a is in the header twice", 32},
        {"{\"__metadata__\":\"pt\",\"a\":{" F32_4 "}}", "__metadata__ is not an object", 16},
        {"{\"__metadata__\":{\"format\":\"pt\",\"n\":1},\"a\":{" F32_4 "}}",
         "__metadata__ key \"n\" is not a string", 16},
        {"{\"a\":5}", "tensor a: its entry is not an object", 0},
        {"{\"a\":{" F32_4 "}", "the header is not a JSON object", 16},
        {"[{\"a\":{" F32_4 "}}]", "the header is not a JSON object", 16},
        {"\"a\"", "the header is not a JSON object", 0},
        {"", "the header is not a JSON object", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "case%zu.safetensors", i);
        write_raw(name, cases[i].header, cases[i].bytes);
        refused(name, cases[i].want);
    }
    /* and what is allowed: __metadata__ of strings, an empty tensor anywhere, a scalar */
    write_raw(
        "ok.safetensors",
        "{\"__metadata__\":{\"format\":\"pt\"},\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],"
        "\"data_offsets\":[4,4]},\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}",
        4);
    char path[128];
    zr_safetensors s = {0};
    snprintf(path, sizeof path, "%s/ok.safetensors", tmp_dir);
    TEST_OK(zr_safetensors_open(&s, path));
    TEST_EQ_INT(s.count, 2);
    zr_safetensors_close(&s);
}

/* Header lengths that lie: past the file, past any header (no allocation of their size). */
static void test_hostile_lengths(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/empty.safetensors", tmp_dir);
    zr_test_write_file(path, "", 0);
    refused("empty.safetensors", "0 bytes, shorter than a safetensors header");
    const unsigned char past[12] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
    snprintf(path, sizeof path, "%s/past.safetensors", tmp_dir);
    zr_test_write_file(path, past, sizeof past);
    refused("past.safetensors", "header of 18446744073709551615 bytes in a file of 12");
    /* a sparse file of 200 MB whose header claims 150 MB: refused before any allocation */
    snprintf(path, sizeof path, "%s/huge.safetensors", tmp_dir);
    FILE *f = fopen(path, "wb");
    TEST_CHECK(f != NULL);
    if (f != NULL) {
        const uint64_t hl = 150000000;
        TEST_CHECK(fwrite(&hl, sizeof hl, 1, f) == 1);
        TEST_CHECK(ftruncate(fileno(f), 200000000) == 0);
        fclose(f);
    }
    size_t before = zr_mem_current();
    refused("huge.safetensors", "header of 150000000 bytes in a file of 200000000 (at most "
                                "100000000): not a safetensors file");
    TEST_CHECK(zr_mem_current() == before);
    unlink(path);
}

/*
 * Every byte of a valid header replaced by each of a few characters, and the
 * header cut at every length: each open succeeds or fails with
 * ZR_ERR_FORMAT, never anything else (asan: nothing read out of bounds).
 */
static void test_every_byte(void)
{
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"w\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[12,18]}}";
    const char subst[] = "9-.\"}[]e ,0x";
    size_t n = strlen(hdr), ok = 0, bad = 0, other = 0;
    char *h = malloc(n + 1), path[128];
    snprintf(path, sizeof path, "%s/byte.safetensors", tmp_dir);
    for (size_t i = 0; i <= n; i++) {
        for (size_t k = 0; k < sizeof subst; k++) {
            memcpy(h, hdr, n + 1);
            if (k == sizeof subst - 1) {
                h[i] = '\0'; /* the header cut at i */
            } else if (i < n) {
                h[i] = subst[k];
            } else {
                continue;
            }
            write_raw("byte.safetensors", h, 18);
            zr_safetensors s = {0};
            zr_status st = zr_safetensors_open(&s, path);
            ok += st == ZR_OK, bad += st == ZR_ERR_FORMAT;
            other += st != ZR_OK && st != ZR_ERR_FORMAT;
            TEST_CHECKF(st == ZR_OK || st == ZR_ERR_FORMAT, "byte %zu as '%c': %s", i, h[i],
                        zr_error_message());
            zr_safetensors_close(&s);
        }
    }
    printf("  %zu headers: %zu opened, %zu refused, %zu otherwise\n", ok + bad + other, ok, bad,
           other);
    TEST_CHECK(ok > 0 && bad > 0);
    free(h);
    zr_error_clear();
}

/* IEEE half to double, by the definition (the test's own, not the reader's). */
static double half_ref(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double x = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -x : x;
}

/* F32, BF16 and F16 tensors at odd byte offsets: every range equals the whole read's part. */
static void test_ranges(void)
{
    enum { N = 35 };
    float f[N];
    uint16_t b[N], h[N];
    zr_test_rng rng = {0x7a11};
    for (int i = 0; i < N; i++) {
        f[i] = zr_test_rng_normal(&rng);
        b[i] = (uint16_t)(zr_test_rng_next(&rng) >> 48);
        h[i] = (uint16_t)(zr_test_rng_next(&rng) >> 48);
    }
    h[0] = 0x0001, h[1] = 0x7c00, h[2] = 0xfc00, h[3] = 0x03ff, h[N - 1] = 0x8000;
    const unsigned char one = 7;
    const test_st_tensor t[] = {
        {"u", "U8", 1, {1}, &one, 1},          {"f", "F32", 2, {5, 7}, f, sizeof f},
        {"b", "BF16", 2, {7, 5}, b, sizeof b}, {"u2", "U8", 1, {1}, &one, 1},
        {"h", "F16", 1, {N}, h, sizeof h},
    };
    char path[128];
    snprintf(path, sizeof path, "%s/ranges.safetensors", tmp_dir);
    test_st_write(path, NULL, t, 5);
    zr_safetensors s = {0};
    TEST_OK(zr_safetensors_open(&s, path));
    float whole[N], part[N + 1];
    long reads = 0, wrong = 0;
    for (int k = 0; k < 3 && zr_test_failed_checks == 0; k++) {
        const char *name = k == 0 ? "f" : k == 1 ? "b" : "h";
        const zr_safetensors_tensor *x = zr_safetensors_find(&s, name);
        TEST_OK(zr_safetensors_read_f32(&s, x, whole));
        for (int i = 0; i < N; i++) {
            uint32_t bits = (uint32_t)b[i] << 16;
            float bf;
            memcpy(&bf, &bits, sizeof bf);
            double w = k == 0 ? f[i] : k == 1 ? (double)bf : half_ref(h[i]);
            wrong += !(whole[i] == w || (isnan(whole[i]) && isnan(w)));
        }
        for (size_t first = 0; first <= N; first++) {
            for (size_t count = 0; first + count <= N; count++, reads++) {
                part[count] = 12345.0f; /* the element after the range stays */
                TEST_OK(zr_safetensors_read_f32_range(&s, x, first, count, part));
                wrong += memcmp(part, whole + first, count * sizeof *part) != 0;
                wrong += part[count] != 12345.0f;
            }
        }
        TEST_FAILS(zr_safetensors_read_f32_range(&s, x, N, 1, part), ZR_ERR_INVALID,
                   "elements [35, 35 + 1) of its 35");
        TEST_FAILS(zr_safetensors_read_f32_range(&s, x, 1, SIZE_MAX, part), ZR_ERR_INVALID,
                   "of its 35");
    }
    TEST_FAILS(zr_safetensors_read_f32_range(&s, zr_safetensors_find(&s, "u"), 0, 1, part),
               ZR_ERR_INVALID, "tensor u is U8; zr reads F32, BF16 and F16");
    printf("  %ld ranges of F32, BF16 and F16 at byte offsets 1, 141 and 212: %ld wrong\n", reads,
           wrong);
    TEST_CHECK(wrong == 0);
    zr_safetensors_close(&s);
    zr_error_clear();
}

static const char *const SHARD[2] = {"model-00001-of-00002.safetensors",
                                     "model-00002-of-00002.safetensors"};

/* The copy's tensors split into dir's two shards (even ones in the first), file[i] each's. */
static void write_shards(const test_st_copy *c, const char *dir, const char **file)
{
    char path[256];
    test_st_tensor *part = calloc((size_t)c->n + 1, sizeof *part);
    for (int k = 0; k < 2; k++) {
        int m = 0;
        for (int i = k; i < c->n; i += 2) {
            part[m++] = c->t[i];
            file[i] = SHARD[k];
        }
        snprintf(path, sizeof path, "%s/%s", dir, SHARD[k]);
        test_st_write(path, NULL, part, m);
    }
    free(part);
}

static void mkdir_p(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    TEST_CHECK(system(cmd) == 0);
}

/* llama_gqa split in two shards loads as the single file does: every unit, whole and by ranges. */
static void test_sharded_llama(void)
{
    char src[400], dir[512], sh[128];
    snprintf(src, sizeof src, "%s/llama_gqa", hf_root());
    snprintf(dir, sizeof dir, "%s/model.safetensors", src);
    snprintf(sh, sizeof sh, "%s/sharded", tmp_dir);
    mkdir_p(sh);
    test_st_copy c;
    test_st_copy_open(&c, dir);
    const char **file = calloc((size_t)c.n + 1, sizeof *file);
    write_shards(&c, sh, file);
    test_st_index(sh, c.names, file, c.n);
    zr_hf_weights w = {0};
    TEST_OK(zr_hf_weights_open(&w, sh));
    TEST_EQ_INT(w.nfiles, 2);
    TEST_EQ_INT(zr_hf_weights_count(&w), c.n);
    for (int i = 0; i < c.n && zr_test_failed_checks == 0; i++) {
        const zr_safetensors *f = NULL;
        const zr_safetensors_tensor *t = zr_hf_weights_find(&w, c.names[i], &f);
        TEST_CHECKF(t != NULL && strstr(f->path, file[i]) != NULL, "%s not in %s", c.names[i],
                    file[i]);
    }
    TEST_CHECK(zr_hf_weights_find(&w, "model.nope", NULL) == NULL);
    zr_hf_weights_close(&w);

    zr_llama_config cfg;
    zr_llama m = {0};
    TEST_OK(zr_llama_config_read(&cfg, src));
    TEST_OK(zr_llama_init(&m, &cfg, 1, 4));
    long ranges = 0, wrong = 0;
    for (int u = 0; u < zr_llama_unit_count(&m) && zr_test_failed_checks == 0; u++) {
        size_t n = zr_llama_unit_numel(&m, u);
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *r = malloc(n * sizeof *r);
        TEST_OK(zr_llama_load_hf_unit(&m, src, u, a));
        TEST_OK(zr_llama_load_hf_unit(&m, sh, u, b));
        wrong += memcmp(a, b, n * sizeof *a) != 0;
        /* ranges around every tensor's start, the unit's ends, odd lengths */
        const zr_tensor_desc *d = NULL;
        int k = zr_llama_unit_tensors(&m, u, &d);
        for (int i = 0; i <= k; i++) {
            size_t at = i < k ? d[i].offset : n;
            const size_t firsts[3] = {at > 3 ? at - 3 : 0, at, at > 0 ? at - 1 : 0};
            const size_t counts[3] = {7, 1, 131};
            for (int j = 0; j < 3; j++, ranges++) {
                size_t f0 = firsts[j] < n ? firsts[j] : n - 1;
                size_t cn = counts[j] < n - f0 ? counts[j] : n - f0;
                TEST_OK(zr_llama_load_hf_range(&m, sh, u, f0, cn, r));
                wrong += memcmp(r, a + f0, cn * sizeof *r) != 0;
            }
        }
        free(a), free(b), free(r);
    }
    printf("  llama_gqa in two shards: %d units equal, %ld ranges, %ld wrong\n",
           zr_llama_unit_count(&m), ranges, wrong);
    TEST_CHECK(wrong == 0);
    float one;
    TEST_FAILS(zr_llama_load_hf_range(&m, sh, 0, zr_llama_unit_numel(&m, 0), 1, &one),
               ZR_ERR_INVALID, "elements [");
    zr_llama_free(&m);
    free(file);
    test_st_copy_close(&c);
    zr_error_clear();
}

/* Opening dir fails with code, a message naming the index and holding want. */
static void index_refused(const char *dir, zr_status code, const char *want)
{
    zr_hf_weights w = {0};
    char index[256];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    TEST_FAILS(zr_hf_weights_open(&w, dir), code, want);
    TEST_CHECKF(code != ZR_ERR_FORMAT || strstr(zr_error_message(), index) != NULL,
                "\"%s\" does not name %s", zr_error_message(), index);
    printf("  %s\n", zr_error_message() + strlen(tmp_dir) + 1);
    TEST_CHECK(w.files == NULL && w.entries == NULL && w.index == NULL);
    zr_hf_weights_close(&w);
}

static void write_index_text(const char *dir, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    zr_test_write_file(path, text, strlen(text));
}

/* Each way an index and its shards disagree: refused naming the index file and the key. */
static void test_index_refused(void)
{
    char src[512], dir[128], want[1024], path[256];
    snprintf(src, sizeof src, "%s/llama_gqa/model.safetensors", hf_root());
    snprintf(dir, sizeof dir, "%s/bad", tmp_dir);
    mkdir_p(dir);
    test_st_copy c;
    test_st_copy_open(&c, src);
    const int n = c.n;
    const char **file = calloc((size_t)n + 2, sizeof *file);
    const char **names = calloc((size_t)n + 2, sizeof *names);
    write_shards(&c, dir, file);
    index_refused(dir, ZR_ERR_IO, "neither model.safetensors nor model.safetensors.index.json");
    write_index_text(dir, "{\"weight_map\": {");
    index_refused(dir, ZR_ERR_FORMAT, "not a JSON object");
    /* an index past any real one (sparse): refused before it is read */
    char index[256];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    TEST_CHECK(truncate(index, 200000000) == 0);
    index_refused(dir, ZR_ERR_FORMAT, "200000000 bytes, more than the 100000000 an index may have");
    write_index_text(dir, "{\"metadata\": {}}");
    index_refused(dir, ZR_ERR_FORMAT, "key \"weight_map\" is missing");
    write_index_text(dir, "{\"weight_map\": [\"model-00001-of-00002.safetensors\"]}");
    index_refused(dir, ZR_ERR_FORMAT, "key \"weight_map\" is not an object");
    write_index_text(dir, "{\"weight_map\": {\"a\": 1}}");
    index_refused(dir, ZR_ERR_FORMAT, "weight_map[\"a\"] is not the name of a file");
    const char *outside[] = {"../model-00001-of-00002.safetensors",
                             "bad/model-00001-of-00002.safetensors", "..", ""};
    for (size_t k = 0; k < sizeof outside / sizeof outside[0]; k++) {
        const char *f0 = file[0];
        file[0] = outside[k];
        test_st_index(dir, c.names, file, n);
        file[0] = f0;
        snprintf(want, sizeof want, "weight_map[\"%s\"] is not the name of a file in the folder",
                 c.names[0]);
        index_refused(dir, ZR_ERR_FORMAT, want);
    }
    /* a listed file missing */
    const char *f0 = file[0];
    file[0] = "model-00003-of-00002.safetensors";
    test_st_index(dir, c.names, file, n);
    snprintf(want, sizeof want,
             "weight_map[\"%s\"]: file model-00003-of-00002.safetensors is missing", c.names[0]);
    index_refused(dir, ZR_ERR_FORMAT, want);
    /* a tensor listed under the other file */
    file[0] = SHARD[1];
    test_st_index(dir, c.names, file, n);
    snprintf(want, sizeof want, "weight_map[\"%s\"]: the tensor is not in %s/%s but in %s/%s",
             c.names[0], dir, SHARD[1], dir, SHARD[0]);
    index_refused(dir, ZR_ERR_FORMAT, want);
    file[0] = f0;
    /* a tensor listed that no file has */
    memcpy(names, c.names, (size_t)n * sizeof *names);
    names[n] = "model.layers.9.mlp.up_proj.weight";
    file[n] = SHARD[1];
    test_st_index(dir, names, file, n + 1);
    index_refused(dir, ZR_ERR_FORMAT,
                  "weight_map[\"model.layers.9.mlp.up_proj.weight\"]: the tensor is not in");
    /* listed twice */
    names[n] = c.names[1];
    test_st_index(dir, names, file, n + 1);
    snprintf(want, sizeof want, "weight_map lists \"%s\" twice", c.names[1]);
    index_refused(dir, ZR_ERR_FORMAT, want);
    /* a tensor of a file left out */
    test_st_index(dir, c.names + 1, file + 1, n - 1);
    snprintf(want, sizeof want, "tensor %s of %s/%s is not in weight_map", c.names[0], dir,
             SHARD[0]);
    index_refused(dir, ZR_ERR_FORMAT, want);
    /* a tensor in two files: a third holding one of the first's and one of its own */
    test_st_tensor third[2] = {c.t[0], c.t[0]};
    third[1].name = "extra.weight";
    snprintf(path, sizeof path, "%s/third.safetensors", dir);
    test_st_write(path, NULL, third, 2);
    names[n] = "extra.weight";
    file[n] = "third.safetensors";
    test_st_index(dir, names, file, n + 1);
    snprintf(want, sizeof want, "tensor %s is in both", c.names[0]);
    index_refused(dir, ZR_ERR_FORMAT, want);
    /* a shard whose header lies: its own error, naming it */
    snprintf(path, sizeof path, "%s/%s", dir, SHARD[1]);
    test_st_tensor liar = {.bytes = 8};
    test_st_write(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", &liar,
                  1);
    test_st_index(dir, c.names, file, n);
    TEST_FAILS(zr_hf_weights_open(&(zr_hf_weights){0}, dir), ZR_ERR_FORMAT,
               "model-00002-of-00002.safetensors: tensor a: data_offsets [0, 16] go past the end");
    free(file), free(names);
    test_st_copy_close(&c);
    zr_error_clear();
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/zr_test_safetensors_%d", (int)getpid());
    mkdir_p(tmp_dir);
    TEST_RUN(test_hostile_headers);
    TEST_RUN(test_hostile_lengths);
    TEST_RUN(test_every_byte);
    TEST_RUN(test_ranges);
    TEST_RUN(test_sharded_llama);
    TEST_RUN(test_index_refused);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot remove %s\n", tmp_dir);
    }
    return zr_test_finish();
}
