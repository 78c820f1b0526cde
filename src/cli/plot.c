/*
 * plot.c - "zr plot": loss and throughput curves of one or more runs, from
 * their JSON-lines metrics files, rendered to a PNG by gnuplot.
 *
 *   zr plot -o out.png run1/metrics.jsonl [run2/metrics.jsonl ...]
 *
 * gnuplot does the drawing (no plotting code in C): the metrics are copied
 * into plain whitespace-separated data files and a small script in a
 * temporary folder, gnuplot runs it and draws into that folder, zr checks
 * the PNG is whole and writes it to OUT by the rule of every output
 * (zr/file.h: never one of the metrics files, never a device or a link),
 * and the folder is removed. One curve per
 * run, labelled by the metrics file's folder name; two panels: loss (train
 * solid, validation dashed) and tokens/s against the step.
 */
#define _POSIX_C_SOURCE 200809L

#include "cli.h"

#include "zr/file.h"
#include "zr/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: zr plot [-o OUT.png] [--title TEXT] METRICS.jsonl [METRICS.jsonl ...]\n"
               "  renders loss and tokens/s against the step, one curve per run (labelled by\n"
               "  the folder of its metrics file), with gnuplot; OUT defaults to metrics.png\n");
}

/* A gnuplot single-quoted string: a quote inside is written twice. */
static void put_quoted(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s != '\0'; s++) {
        if (*s == '\'') {
            fputc('\'', f);
        }
        if (*s != '\n' && *s != '\r') {
            fputc(*s, f);
        }
    }
    fputc('\'', f);
}

static void put_num(FILE *f, double v)
{
    if (isfinite(v)) {
        fprintf(f, " %.9g", v);
    } else {
        fprintf(f, " NaN");
    }
}

/*
 * Run k's data: "<dir>/run<k>.train" (step loss tokens_per_s lr) and, if it
 * has any, "<dir>/run<k>.val" (step val_loss). Returns 0 on failure.
 */
static int write_data(const char *dir, int k, const zr_metrics_series *s, int *has_val,
                      int *has_loss, int *has_tps)
{
    char path[320];
    *has_val = *has_loss = *has_tps = 0;
    snprintf(path, sizeof path, "%s/run%d.train", dir, k);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "zr plot: cannot write %s: %s\n", path, strerror(errno));
        return 0;
    }
    for (size_t i = 0; i < s->count; i++) {
        const zr_metrics_point *p = &s->points[i];
        if (isnan(p->loss) && isnan(p->tokens_per_s)) {
            continue; /* a validation-only line */
        }
        fprintf(f, "%lld", p->step);
        put_num(f, p->loss);
        put_num(f, p->tokens_per_s);
        put_num(f, p->lr);
        fputc('\n', f);
        *has_loss |= isfinite(p->loss) != 0;
        *has_tps |= isfinite(p->tokens_per_s) != 0;
    }
    int ok = !ferror(f);
    ok &= fclose(f) == 0;
    snprintf(path, sizeof path, "%s/run%d.val", dir, k);
    f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "zr plot: cannot write %s: %s\n", path, strerror(errno));
        return 0;
    }
    for (size_t i = 0; i < s->count; i++) {
        if (isfinite(s->points[i].val_loss)) {
            fprintf(f, "%lld %.9g\n", s->points[i].step, s->points[i].val_loss);
            *has_val = 1;
        }
    }
    ok &= !ferror(f);
    ok &= fclose(f) == 0;
    if (!ok) {
        fprintf(stderr, "zr plot: cannot write the data files in %s\n", dir);
    }
    return ok;
}

/* Run gnuplot on script: 0 on success; 1 if it could not run, 2 if it failed (both print why). */
static int run_gnuplot(const char *script)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "zr plot: cannot start gnuplot: %s\n", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        char *args[] = {"gnuplot", (char *)script, NULL};
        execvp("gnuplot", args);
        _exit(errno == ENOENT ? 127 : 126);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "zr plot: waiting for gnuplot: %s\n", strerror(errno));
            return 1;
        }
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
        fprintf(stderr, "zr plot: gnuplot not found: install gnuplot-nox, e.g. make setup "
                        "(or apt-get install gnuplot-nox)\n");
        return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "zr plot: gnuplot failed; its script and data are kept in %s\n", script);
        return 2;
    }
    return 0;
}

/* Remove the temporary folder and what this command put in it. */
static void cleanup(const char *dir, int nruns)
{
    char path[320];
    for (int k = 0; k < nruns; k++) {
        snprintf(path, sizeof path, "%s/run%d.train", dir, k);
        unlink(path);
        snprintf(path, sizeof path, "%s/run%d.val", dir, k);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/plot.gp", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/plot.png", dir);
    unlink(path);
    rmdir(dir);
}

/*
 * gnuplot's PNG (dir/plot.png) to out: only a whole PNG (its signature, and
 * the IEND chunk that ends every PNG: gnuplot exits 0 after a write it could
 * not finish), through zr's writer (zr/file.h), every byte checked.
 */
static int install_png(const char *dir, const char *out)
{
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    static const unsigned char iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
    char png[320];
    snprintf(png, sizeof png, "%s/plot.png", dir);
    char *data = NULL;
    size_t n = 0;
    zr_status st = zr_file_read_all(png, &data, &n);
    if (st == ZR_OK && (n < sizeof sig + sizeof iend || memcmp(data, sig, sizeof sig) != 0 ||
                        memcmp(data + n - sizeof iend, iend, sizeof iend) != 0)) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__,
                         "gnuplot did not write a whole PNG (%zu bytes, no end chunk): is %s full?",
                         n, dir);
    }
    if (st == ZR_OK) {
        st = zr_file_write_atomic(out, data, n);
    }
    zr_free(data);
    if (st != ZR_OK) {
        fprintf(stderr, "zr plot: %s; nothing was written to %s\n", zr_error_message(), out);
        return 0;
    }
    return 1;
}

/* One panel: column col of every run's train file, plus validation curves if val. */
static void panel(FILE *f, const char *dir, zr_metrics_series *runs, int nruns, const int *has,
                  const int *has_val, int col, const char *title, const char *ylabel)
{
    fprintf(f, "set title ");
    put_quoted(f, title);
    fprintf(f, "\nset ylabel ");
    put_quoted(f, ylabel);
    fprintf(f, "\n");
    int any = 0;
    for (int k = 0; k < nruns; k++) {
        any |= has[k] || (has_val != NULL && has_val[k]);
    }
    if (!any) {
        /* gnuplot refuses a plot without points; say so on the panel instead */
        fprintf(f, "set label 1 'no data' at graph 0.5, 0.5 center\n"
                   "set yrange [0:1]\nplot -1 notitle\nunset label 1\nset autoscale y\n");
        return;
    }
    const char *sep = "plot ";
    for (int k = 0; k < nruns; k++) {
        char path[320];
        if (has[k]) {
            snprintf(path, sizeof path, "%s/run%d.train", dir, k);
            fprintf(f, "%s", sep);
            put_quoted(f, path);
            fprintf(f, " using 1:%d with lines lw 2 lc %d title ", col, k + 1);
            put_quoted(f, runs[k].name);
            sep = ", \\\n     ";
        }
        if (has_val != NULL && has_val[k]) {
            char label[300];
            snprintf(label, sizeof label, "%s (validation)", runs[k].name);
            snprintf(path, sizeof path, "%s/run%d.val", dir, k);
            fprintf(f, "%s", sep);
            put_quoted(f, path);
            fprintf(f, " using 1:2 with linespoints dt 2 pt 7 ps 0.6 lw 2 lc %d title ", k + 1);
            put_quoted(f, label);
            sep = ", \\\n     ";
        }
    }
    fprintf(f, "\n");
}

/*
 * The options; returns -1 to go on, else the exit code. first is the index of
 * the first metrics file, nruns how many there are.
 */
static int parse_args(int argc, char **argv, const char **out, const char **title, int *first,
                      int *nruns)
{
    *first = argc;
    *nruns = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if ((strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0 ||
             strcmp(argv[i], "--title") == 0) &&
            i + 1 < argc) {
            if (strcmp(argv[i], "--title") == 0) {
                *title = argv[++i];
            } else {
                *out = argv[++i];
            }
        } else if (argv[i][0] == '-') {
            zr_cli_bad_arg("plot", argc, argv, i);
            usage(stderr);
            return 2;
        } else {
            if (*first == argc) {
                *first = i;
            }
            (*nruns)++;
        }
    }
    if (*nruns == 0) {
        fprintf(stderr, "zr plot: no metrics files given\n");
        usage(stderr);
        return 2;
    }
    return -1;
}

/* A fresh folder under $TMPDIR (or /tmp); dir is left empty when none could be made. */
static int make_tmpdir(char *dir, size_t cap)
{
    const char *tmp = getenv("TMPDIR");
    int dn = snprintf(dir, cap, "%s/zr-plot-XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (dn < 0 || (size_t)dn >= cap) {
        fprintf(stderr, "zr plot: TMPDIR is too long for a temporary folder\n");
        dir[0] = '\0';
        return 0;
    }
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "zr plot: cannot make a temporary folder %s: %s\n", dir, strerror(errno));
        dir[0] = '\0';
        return 0;
    }
    return 1;
}

/* The gnuplot script that draws both panels into out; 0 (reported) when it cannot be written. */
static int write_script(const char *script, const char *dir, const char *title,
                        zr_metrics_series *runs, int nruns, const int *has)
{
    const int *has_loss = has, *has_tps = has + nruns, *has_val = has + 2 * nruns;
    FILE *f = fopen(script, "w");
    if (f == NULL) {
        fprintf(stderr, "zr plot: cannot write %s: %s\n", script, strerror(errno));
        return 0;
    }
    /* pngcairo draws nicer lines; plain png (libgd) is the fallback. gnuplot writes into the
       private folder; install_png checks the result and puts it in place */
    fprintf(f, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
               "    set terminal pngcairo size 1000,900 noenhanced font ',10'\n"
               "} else {\n"
               "    set terminal png size 1000,900 noenhanced\n"
               "}\n"
               "set output ");
    char png[320];
    snprintf(png, sizeof png, "%s/plot.png", dir);
    put_quoted(f, png);
    fprintf(f,
            "\nset datafile missing 'NaN'\nset grid\nset key top right opaque\nset xlabel 'step'\n"
            "set multiplot layout 2,1 title ");
    put_quoted(f, title);
    fprintf(f, "\n");
    panel(f, dir, runs, nruns, has_loss, has_val, 2, "loss", "loss");
    panel(f, dir, runs, nruns, has_tps, NULL, 3, "throughput", "tokens/s");
    fprintf(f, "unset multiplot\nset output\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "zr plot: cannot write %s\n", script);
        return 0;
    }
    return 1;
}

/*
 * Read the metrics files (argv from first, past the options) into runs
 * (*nread of them, to free) and check out against them (the picture never
 * replaces what it is drawn from); 0, or the exit code, having said why.
 */
static int read_runs(int argc, char **argv, int first, const char *out, zr_metrics_series *runs,
                     int *nread, int *replaces)
{
    zr_file_inputs in;
    zr_file_inputs_init(&in);
    zr_status st = ZR_OK;
    int rc = 1;
    for (int i = first; i < argc && st == ZR_OK; i++) {
        if (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0 ||
            strcmp(argv[i], "--title") == 0) {
            i++;
            continue;
        }
        st = zr_metrics_read(argv[i], &runs[(*nread)++]);
        if (st == ZR_OK) {
            st = zr_file_inputs_add(&in, argv[i], "a metrics file plotted");
        }
    }
    if (st == ZR_OK) {
        rc = 2;
        st = zr_file_output_check(out, "-o", &in, replaces);
    }
    zr_file_inputs_free(&in);
    if (st != ZR_OK) {
        fprintf(stderr, "zr plot: %s\n", zr_error_message());
        return rc;
    }
    return 0;
}

int zr_cli_plot(int argc, char **argv)
{
    const char *out = "metrics.png", *title = "zr training runs";
    int first, nruns;
    int prc = parse_args(argc, argv, &out, &title, &first, &nruns);
    if (prc >= 0) {
        return prc;
    }
    zr_metrics_series *runs = NULL;
    int *has = NULL;
    if (ZR_ALLOC_STATUS(runs, (size_t)nruns) != ZR_OK ||
        ZR_ALLOC_STATUS(has, 3 * (size_t)nruns) != ZR_OK) {
        zr_free(runs);
        fprintf(stderr, "zr plot: %s\n", zr_error_message());
        return 1;
    }
    int *has_loss = has, *has_tps = has + nruns, *has_val = has + 2 * nruns;
    int k = 0, nread = 0, replaces = 0;
    char dir[256] = "";
    int rc = read_runs(argc, argv, first, out, runs, &nread, &replaces);
    if (rc != 0) {
        goto done;
    }
    rc = 1;
    if (!make_tmpdir(dir, sizeof dir)) {
        goto done;
    }
    for (k = 0; k < nruns; k++) {
        if (!write_data(dir, k, &runs[k], &has_val[k], &has_loss[k], &has_tps[k])) {
            k++;
            goto done;
        }
    }
    char script[320];
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    if (!write_script(script, dir, title, runs, nruns, has)) {
        goto done;
    }
    int gp = run_gnuplot(script);
    if (gp == 0 && install_png(dir, out)) {
        printf("zr plot: wrote %s (%d run%s)%s\n", out, nruns, nruns == 1 ? "" : "s",
               replaces ? "; it replaced the file that was there" : "");
        rc = 0;
    } else if (gp == 2) {
        dir[0] = '\0'; /* keep the files for a look at what gnuplot disliked */
    }
done:
    if (dir[0] != '\0') {
        cleanup(dir, k);
    }
    for (int i = 0; i < nread; i++) {
        zr_metrics_free(&runs[i]);
    }
    zr_free(runs);
    zr_free(has);
    return rc;
}
