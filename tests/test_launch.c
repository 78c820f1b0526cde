/*
 * test_launch.c - ranks agree that they were started the same way
 * (zr/launch.h), at any rank count: identical configurations pass; a key
 * that differs on some ranks is ZR_ERR_INVALID on every rank with one
 * message naming the key, each value and the ranks holding it; --help on
 * some ranks only; training data that differs in content, length or
 * vocabulary.
 */
#define ZR_TEST_MPI
#include "test.h"

#include "zr/launch.h"

static int W, R;

/* The message of the last error, identical on every rank? */
static int same_everywhere(const char *msg)
{
    uint32_t h = zr_crc32c(0, msg, strlen(msg)), lo = h, hi = h;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT32_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT32_T, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

#define TEST_MSG_HAS(s)                                                                            \
    TEST_CHECKF(strstr(zr_error_message(), (s)) != NULL, "message \"%s\" lacks \"%s\"",            \
                zr_error_message(), (s))

static void test_config_same(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_train_config cfg;
    zr_config_defaults(&cfg);
    TEST_OK(zr_config_finalize(&cfg, W));
    TEST_OK(zr_launch_check_config(&c, &cfg, 0));
    TEST_OK(zr_launch_check_config(&c, &cfg, 1));
    zr_comm_free(&c);
}

static void test_config_differs(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_train_config cfg;
    zr_config_defaults(&cfg);
    /* the last rank was started with --stage 1 (and rank 1 of 3+ with --steps 7) */
    if (R == W - 1) {
        cfg.stage = 1;
    }
    if (R == 1 && W > 2) {
        cfg.train_steps = 7;
        snprintf(cfg.data_path, sizeof cfg.data_path, "other.txt");
    }
    zr_status st = zr_launch_check_config(&c, &cfg, 0);
    char expect[200];
    if (W == 1) {
        TEST_EQ_INT(st, ZR_OK);
    } else {
        TEST_EQ_INT(st, ZR_ERR_INVALID);
        TEST_CHECK(same_everywhere(zr_error_message()));
        TEST_MSG_HAS("ranks were started with different configurations");
        if (W == 2) {
            snprintf(expect, sizeof expect, "zero_optimization.stage is 3 on rank 0, 1 on rank 1");
        } else {
            snprintf(expect, sizeof expect,
                     "zero_optimization.stage is 3 on ranks 0-%d, 1 on rank %d", W - 2, W - 1);
        }
        TEST_MSG_HAS(expect);
        if (W > 2) {
            TEST_MSG_HAS("zr.train.train_steps is 200 on ranks 0, 2");
            TEST_MSG_HAS("7 on rank 1");
            TEST_MSG_HAS("zr.data.path is \"\" on ranks 0, 2");
            TEST_MSG_HAS("\"other.txt\" on rank 1");
        }
        /* a key every rank agrees on is not named */
        TEST_CHECK(strstr(zr_error_message(), "zr.model.layers") == NULL);
    }
    /* --help on rank 0 only */
    zr_config_defaults(&cfg);
    st = zr_launch_check_config(&c, &cfg, R == 0);
    TEST_EQ_INT(st, W == 1 ? ZR_OK : ZR_ERR_INVALID);
    if (W > 1) {
        TEST_MSG_HAS("--help is given on rank 0, not given on rank");
        TEST_CHECK(same_everywhere(zr_error_message()));
    }
    /* the communicator is fine afterwards */
    TEST_OK(zr_comm_agree(&c, ZR_OK));
    zr_comm_free(&c);
}

static void test_generic(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    /* every rank its own value: at most four are spelled out */
    char v[32];
    snprintf(v, sizeof v, "v%d", R);
    const char *names[2] = {"alpha", "beta"};
    const char *values[2] = {"same", v};
    zr_status st = zr_launch_agree(&c, 2, names, values, "test", "hint here");
    if (W > 1) {
        TEST_EQ_INT(st, ZR_ERR_INVALID);
        TEST_MSG_HAS("test: beta is v0 on rank 0, v1 on rank 1");
        TEST_MSG_HAS("; hint here");
        TEST_CHECK(strstr(zr_error_message(), "alpha") == NULL);
        if (W > 4) {
            TEST_MSG_HAS("other values");
        }
        TEST_CHECK(same_everywhere(zr_error_message()));
    }
    values[1] = "";
    TEST_OK(zr_launch_agree(&c, 2, names, values, "test", NULL));
    zr_comm_free(&c);
}

static void test_data(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    enum { N = 3 << 19 }; /* 3 MiB of tokens: the middle is not hashed, the ends are */
    uint16_t *tok = malloc(sizeof *tok * N);
    TEST_CHECK(tok != NULL);
    if (tok == NULL) {
        zr_comm_free(&c);
        return;
    }
    for (size_t i = 0; i < N; i++) {
        tok[i] = (uint16_t)(i * 7 % 256);
    }
    zr_dataset d;
    TEST_OK(zr_dataset_from_tokens(&d, tok, N, 256));
    TEST_OK(zr_launch_check_data(&c, &d, "data.bin"));
    zr_dataset_free(&d);
    /* the last rank's file ends differently */
    if (R == W - 1) {
        tok[N - 1] ^= 1;
    }
    TEST_OK(zr_dataset_from_tokens(&d, tok, N, 256));
    zr_status st = zr_launch_check_data(&c, &d, "data.bin");
    if (W > 1) {
        TEST_EQ_INT(st, ZR_ERR_INVALID);
        TEST_MSG_HAS("ranks read different training data from data.bin");
        TEST_MSG_HAS("CRC-32C");
        char expect[32];
        snprintf(expect, sizeof expect, "on rank %d", W - 1);
        TEST_MSG_HAS(expect);
        TEST_CHECK(strstr(zr_error_message(), "token count") == NULL);
        TEST_CHECK(same_everywhere(zr_error_message()));
    }
    zr_dataset_free(&d);
    /* a shorter file on rank 0 */
    TEST_OK(zr_dataset_from_tokens(&d, tok, R == 0 ? N - 10 : N, 256));
    st = zr_launch_check_data(&c, &d, "");
    if (W > 1) {
        TEST_EQ_INT(st, ZR_ERR_INVALID);
        TEST_MSG_HAS("the bundled corpus");
        TEST_MSG_HAS("the token count is 1572854 on rank 0");
    }
    zr_dataset_free(&d);
    free(tok);
    zr_comm_free(&c);
}

int main(int argc, char **argv)
{
    zr_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    TEST_RUN(test_config_same);
    TEST_RUN(test_config_differs);
    TEST_RUN(test_generic);
    TEST_RUN(test_data);
    return zr_test_finish();
}
