/*
 * checkpoint.c - sharded checkpoints: the rank files (crash-safe writes, a
 * checksum on every file), zr_ckpt_save, and reading back, at any world size
 * (see zr/checkpoint.h). The manifest is manifest.c's, the directory around
 * the checkpoints ckpt_dir.c's (ckpt_impl.h).
 *
 * Every rank file holds the same canonical slice of each unit whatever the
 * ZeRO stage, so resharding is a range intersection: new rank r' needs
 * [r'*S', (r'+1)*S') of the unit and old rank q holds [q*S, (q+1)*S).
 *
 * Nothing is read before the manifest has passed its checks and the size and
 * header of every rank file agree with it; the CRC of a rank file is checked
 * the first time it is read.
 */
#define _DEFAULT_SOURCE /* fileno */

#include "ckpt_impl.h"

#include "zr/file.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define RANK_MAGIC "ZRCKRANK"
/* Elements of optimizer state moved between the engine and a file at once (1 MiB): the
   engine's state may be device memory, so it goes through a host buffer of this size */
#define CHUNK ((size_t)1 << 18)

typedef struct rank_header {
    char magic[8];
    uint32_t version;
    uint32_t rank;
    uint32_t world;
    uint32_t nunits;
    int64_t step;
    unsigned char pad[ZR_CKPT_HEADER_BYTES - 8 - 4 * 4 - 8];
} rank_header;

_Static_assert(sizeof(rank_header) == ZR_CKPT_HEADER_BYTES,
               "rank file header is part of the format");

zr_status zr_ckpt_pathf(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) {
        ZR_FAIL(ZR_ERR_INVALID, "path too long (%d bytes): %.200s...", n, out);
    }
    return ZR_OK;
}

/* Byte offset in a rank file of element i of array which (0 master, 1 m, 2 v) of unit u. */
static uint64_t file_offset(const zr_ckpt_unit_layout *lay, int u, int which, size_t i)
{
    return lay[u].offset + ((uint64_t)which * lay[u].shard + i) * sizeof(float);
}

/* ---- save ------------------------------------------------------------------------- */

static const char *const array_names[3] = {"master weights", "Adam m", "Adam v"};

/* A rank file being written: its checksum and size so far, and the engine's host buffer. */
typedef struct rank_writer {
    zr_engine *e;
    zr_file_tmp *t;
    float *chunk;
    uint32_t crc;
    uint64_t bytes;
} rank_writer;

/*
 * Elements [0, n) of array k of unit u (k < 3: zr_optim_array; 3, 4: qgZ's
 * residuals of hop k - 3) into the file, chunk by chunk, each chunk checked
 * finite as it passes: a value that is not a number is never saved.
 */
static zr_status write_array(rank_writer *w, int u, int k, size_t n)
{
    for (size_t a = 0; a < n; a += CHUNK) {
        size_t c = n - a < CHUNK ? n - a : CHUNK;
        ZR_CHECK(k < 3 ? zr_engine_optim_read(w->e, u, (zr_optim_array)k, a, c, w->chunk)
                       : zr_engine_feedback_read(w->e, u, k - 3, a, c, w->chunk));
        size_t bad = zr_first_nonfinite(w->chunk, c);
        if (bad < c) {
            ZR_FAIL(ZR_ERR_NONFINITE,
                    "not saved: the %s of unit %d hold a non-finite value (%g) at element %zu of "
                    "rank %d's part",
                    k < 3 ? array_names[k] : "qgZ residuals", u, (double)w->chunk[bad], a + bad,
                    w->e->comm->rank[ZR_GROUP_WORLD]);
        }
        ZR_CHECK(zr_file_tmp_write(w->t, w->chunk, c * sizeof(float)));
        w->crc = zr_crc32c(w->crc, w->chunk, c * sizeof(float));
        w->bytes += c * sizeof(float);
    }
    return ZR_OK;
}

static zr_status write_rank_file(zr_engine *e, const char *dir, int rank, int64_t step,
                                 uint32_t *crc_out, uint64_t *bytes_out)
{
    char path[ZR_PATH_MAX];
    ZR_CHECK(zr_ckpt_pathf(path, sizeof path, "%s/rank_%05d.bin", dir, rank));
    zr_file_tmp t;
    ZR_CHECK(zr_file_tmp_open(&t, path));
    rank_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, RANK_MAGIC, 8);
    h.version = ZR_CKPT_VERSION;
    h.rank = (uint32_t)rank;
    h.world = (uint32_t)e->comm->size[ZR_GROUP_WORLD];
    h.nunits = (uint32_t)e->nunits;
    h.step = step;
    rank_writer w = {e, &t, NULL, zr_crc32c(0, &h, sizeof h), sizeof h};
    zr_status st;
    ZR_ALLOC_GOTO(w.chunk, CHUNK, st, done);
    ZR_CHECK_GOTO(zr_file_tmp_write(&t, &h, sizeof h), st, done);
    for (int u = 0; u < e->nunits; u++) {
        for (int k = 0; k < 3; k++) {
            ZR_CHECK_GOTO(write_array(&w, u, k, zr_engine_shard(e, u)), st, done);
        }
    }
    /* qgZ's residuals after every unit's state, in the order the manifest lists them */
    for (int u = 0; zr_ckpt_feedback_saved(e) && u < e->nunits; u++) {
        for (int hop = 0; hop < 2; hop++) {
            ZR_CHECK_GOTO(write_array(&w, u, 3 + hop, zr_engine_feedback_count(e, u, hop)), st,
                          done);
        }
    }
    ZR_CHECK_GOTO(zr_file_tmp_write(&t, &w.crc, sizeof w.crc), st, done);
    w.bytes += sizeof w.crc;
    if (fflush(t.f) == 0) {
        st = zr_ckpt_fault_point(ZR_CKPT_FAULT_RANK_TMP, step, rank);
    }
done:
    zr_free(w.chunk);
    ZR_CHECK(zr_file_tmp_commit(&t, st)); /* removes the temporary file when st is an error */
    *crc_out = w.crc;
    *bytes_out = w.bytes;
    return ZR_OK;
}

/* Rank 0's part of a save, after every rank file is in step_N.partial. */
static zr_status commit(zr_engine *e, const char *partial, const char *final, const char *dir,
                        const zr_ckpt_meta *meta, const zr_ckpt_save_opts *o, const uint32_t *crcs,
                        const uint64_t *bytes)
{
    ZR_CHECK(zr_ckpt_fault_point(ZR_CKPT_FAULT_RANK_FILES, meta->step, 0));
    char *text = zr_ckpt_manifest_text(e, meta, o, crcs, bytes);
    if (text == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "out of memory writing the checkpoint manifest");
    }
    char path[ZR_PATH_MAX];
    zr_status st = zr_ckpt_pathf(path, sizeof path, "%s/manifest.json", partial);
    if (st == ZR_OK) {
        st = zr_file_write_atomic(path, text, strlen(text));
    }
    uint32_t mcrc = zr_crc32c(0, text, strlen(text));
    cJSON_free(text);
    ZR_CHECK(st);
    ZR_CHECK(zr_ckpt_fault_point(ZR_CKPT_FAULT_MANIFEST, meta->step, 0));
    /* COMPLETE (with the manifest's checksum) goes in before the rename, so
       that the rename below is the single point at which step_N appears,
       already complete; zr_file_write_atomic fsyncs step_N.partial */
    char body[64];
    int len = snprintf(body, sizeof body, "complete manifest-crc32c %u\n", mcrc);
    ZR_CHECK(zr_ckpt_pathf(path, sizeof path, "%s/COMPLETE", partial));
    ZR_CHECK(zr_file_write_atomic(path, body, (size_t)len));
    ZR_CHECK(zr_ckpt_fault_point(ZR_CKPT_FAULT_COMPLETE, meta->step, 0));
    if (rename(partial, final) != 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot rename %s to %s: %s", partial, final, strerror(errno));
    }
    ZR_CHECK(zr_ckpt_fault_point(ZR_CKPT_FAULT_RENAMED, meta->step, 0));
    ZR_CHECK(zr_file_sync_dir(dir));
    if (o->keep > 0) {
        ZR_CHECK(zr_ckpt_rotate(dir, meta->step, o->keep, o->protect));
    }
    ZR_CHECK(zr_ckpt_fault_point(ZR_CKPT_FAULT_DONE, meta->step, 0));
    return ZR_OK;
}

/* Rank 0: an empty step_N.partial under dir (a leftover .partial is a crashed save's). */
static zr_status prepare_partial(const char *dir, const char *final, const char *partial,
                                 int64_t step)
{
    ZR_CHECK(zr_file_mkdir_p(dir));
    if (zr_ckpt_exists(final)) {
        ZR_FAIL(ZR_ERR_IO, "checkpoint %s already exists; refusing to overwrite it", final);
    }
    if (zr_ckpt_exists(partial)) {
        ZR_WARN("removing %s, left by a save that did not finish", partial);
        zr_ckpt_remove_dir(partial, 0, 0);
    }
    if (mkdir(partial, 0755) != 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot create %s: %s", partial, strerror(errno));
    }
    ZR_CHECK(zr_file_sync_dir(dir));
    return zr_ckpt_fault_point(ZR_CKPT_FAULT_PARTIAL_MADE, step, 0);
}

zr_status zr_ckpt_save(zr_comm *c, zr_engine *e, const char *dir, const zr_ckpt_meta *meta,
                       const zr_ckpt_save_opts *opts, char *path_out, size_t path_len)
{
    int R = c->rank[ZR_GROUP_WORLD], W = c->size[ZR_GROUP_WORLD];
    char final[ZR_PATH_MAX], partial[ZR_PATH_MAX];
    ZR_CHECK(zr_ckpt_pathf(final, sizeof final, "%s/step_%08lld", dir, (long long)meta->step));
    ZR_CHECK(zr_ckpt_pathf(partial, sizeof partial, "%s.partial", final));
    /* every rank reaches each stage's fault point, the others where rank 0 works alone */
    zr_status st = R == 0 ? prepare_partial(dir, final, partial, meta->step)
                          : zr_ckpt_fault_point(ZR_CKPT_FAULT_PARTIAL_MADE, meta->step, R);
    st = zr_comm_agree(c, st);
    if (st != ZR_OK) {
        if (R == 0) {
            zr_ckpt_remove_dir(partial, 0, 0);
        }
        return st;
    }

    uint32_t crc = 0;
    uint64_t bytes = 0;
    st = write_rank_file(e, partial, R, meta->step, &crc, &bytes);
    zr_ckpt_slow_point();
    st = zr_comm_agree(c, st);
    if (st != ZR_OK) {
        if (R == 0) {
            zr_ckpt_remove_dir(partial, 0, 0);
        }
        return st;
    }
    uint64_t mine[2] = {crc, bytes};
    uint64_t *all = NULL, *sizes = NULL;
    uint32_t *crcs = NULL;
    /* a rank that cannot allocate still takes part in the agreement below */
    st = ZR_ALLOC_STATUS(all, 2 * (size_t)W);
    if (st == ZR_OK) {
        st = ZR_ALLOC_STATUS(crcs, (size_t)W);
    }
    if (st == ZR_OK) {
        st = ZR_ALLOC_STATUS(sizes, (size_t)W);
    }
    st = zr_comm_agree(c, st);
    if (st == ZR_OK) {
        st = zr_comm_allgather(c, ZR_GROUP_WORLD, ZR_KIND_CONTROL, mine, sizeof mine, all);
    }
    if (st == ZR_OK) {
        for (int r = 0; r < W; r++) {
            crcs[r] = (uint32_t)all[2 * r];
            sizes[r] = all[2 * r + 1];
        }
        if (R == 0) {
            st = commit(e, partial, final, dir, meta, opts, crcs, sizes);
            if (st != ZR_OK) {
                zr_ckpt_remove_dir(partial, 0, 0);
            }
        } else {
            st = zr_ckpt_fault_point(ZR_CKPT_FAULT_RANK_FILES, meta->step, R);
        }
        st = zr_comm_agree(c, st);
    }
    zr_free(all);
    zr_free(crcs);
    zr_free(sizes);
    if (st == ZR_OK && path_out != NULL) {
        snprintf(path_out, path_len, "%s", final);
    }
    return st;
}

/* ---- checking rank files against the manifest -------------------------------------- */

/* Rank file r at p has the manifest's size and a header that agrees with it. */
static zr_status check_rank_file(const char *p, int r, const zr_ckpt_manifest *m)
{
    FILE *f;
    ZR_CHECK(zr_file_open_read(p, &f));
    struct stat sb;
    rank_header h;
    zr_status st = ZR_OK;
    if (fstat(fileno(f), &sb) != 0) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_IO, "cannot size %s: %s", p, strerror(errno));
    }
    if ((uint64_t)sb.st_size < m->file_bytes) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s is truncated: %llu bytes, the manifest says %llu",
                     p, (unsigned long long)sb.st_size, (unsigned long long)m->file_bytes);
    }
    if ((uint64_t)sb.st_size > m->file_bytes) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                     "%s is longer than its manifest says: %llu bytes, not %llu", p,
                     (unsigned long long)sb.st_size, (unsigned long long)m->file_bytes);
    }
    if (fread(&h, 1, sizeof h, f) != sizeof h || memcmp(h.magic, RANK_MAGIC, 8) != 0 ||
        h.version != ZR_CKPT_VERSION) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s is not a zr rank file of version %d (bad header)",
                     p, ZR_CKPT_VERSION);
    }
    if (h.rank != (uint32_t)r || h.world != (uint32_t)m->meta.world ||
        h.nunits != (uint32_t)m->nunits || h.step != m->meta.step) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                     "%s: its header says rank %u of %u, %u units, step %lld; the "
                     "manifest says rank %d of %d, %d units, step %lld",
                     p, h.rank, h.world, h.nunits, (long long)h.step, r, m->meta.world, m->nunits,
                     (long long)m->meta.step);
    }
done:
    fclose(f);
    return st;
}

/* Every rank file exists, has the manifest's size and a header that agrees with it; no extra ones.
 */
static zr_status check_rank_files(const char *path, const zr_ckpt_manifest *m)
{
    for (int r = 0; r < m->meta.world; r++) {
        char p[ZR_PATH_MAX];
        ZR_CHECK(zr_ckpt_pathf(p, sizeof p, "%s/rank_%05d.bin", path, r));
        ZR_CHECK(check_rank_file(p, r, m));
    }
    DIR *d = opendir(path);
    if (d == NULL) {
        ZR_FAIL(ZR_ERR_IO, "cannot read checkpoint %s: %s", path, strerror(errno));
    }
    struct dirent *ent;
    zr_status st = ZR_OK;
    while ((ent = readdir(d)) != NULL) {
        unsigned q;
        char tail;
        if (sscanf(ent->d_name, "rank_%u.bi%c", &q, &tail) == 2 &&
            (q >= (unsigned)m->meta.world || strlen(ent->d_name) != 14)) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                         "%s/%s is not one of the %d rank files its manifest lists: the "
                         "checkpoint was modified",
                         path, ent->d_name, m->meta.world);
        }
    }
done:
    closedir(d);
    return st;
}

/* Read and check the manifest of checkpoint path, then cross-check its rank files. */
static zr_status open_manifest(const char *path, zr_ckpt_manifest *m)
{
    ZR_CHECK(zr_ckpt_manifest_read(path, m));
    zr_status st = check_rank_files(path, m);
    if (st != ZR_OK) {
        zr_ckpt_manifest_free(m);
    }
    return st;
}

zr_status zr_ckpt_read_section(const char *path, const char *section, char **out)
{
    zr_ckpt_manifest m;
    ZR_CHECK(zr_ckpt_manifest_read_section(path, &m, section, out));
    zr_ckpt_manifest_free(&m);
    return ZR_OK;
}

zr_status zr_ckpt_read_meta(const char *path, zr_ckpt_meta *meta)
{
    zr_ckpt_manifest m;
    ZR_CHECK(open_manifest(path, &m));
    *meta = m.meta;
    zr_ckpt_manifest_free(&m);
    return ZR_OK;
}

/* ---- reading rank files ----------------------------------------------------------- */

typedef struct reader {
    const char *path;
    zr_ckpt_manifest m;
    FILE **files; /* opened and verified on first use */
} reader;

static void reader_close(reader *rd)
{
    if (rd->files != NULL) {
        for (int r = 0; r < rd->m.meta.world; r++) {
            if (rd->files[r] != NULL) {
                fclose(rd->files[r]);
            }
        }
    }
    zr_free(rd->files);
    zr_ckpt_manifest_free(&rd->m);
    memset(rd, 0, sizeof *rd);
}

static zr_status reader_open(reader *rd, const char *path)
{
    memset(rd, 0, sizeof *rd);
    rd->path = path;
    ZR_CHECK(open_manifest(path, &rd->m));
    zr_status st = ZR_ALLOC_STATUS(rd->files, (size_t)rd->m.meta.world);
    if (st != ZR_OK) {
        reader_close(rd);
    }
    return st;
}

/* What lies at byte off (a float's) of rank file q, for messages: an array of a unit's tensor. */
static void describe(const zr_ckpt_manifest *m, int q, uint64_t off, char *out, size_t n)
{
    for (int u = 0; u < m->nunits; u++) {
        const zr_ckpt_unit_layout *L = &m->lay[u];
        uint64_t i = (off - L->offset) / sizeof(float);
        if (off >= L->offset && i < 3 * (uint64_t)L->shard) {
            char where[160];
            zr_gpt_config_element_name(&m->meta.model, u,
                                       (size_t)q * L->shard + (size_t)(i % L->shard), where,
                                       sizeof where);
            snprintf(out, n, "the %s of %s", array_names[i / L->shard], where);
            return;
        }
        i = (off - L->fb_offset) / sizeof(float);
        if (off >= L->fb_offset && i < (uint64_t)L->fb[0] + L->fb[1]) {
            int hop = i >= L->fb[0];
            snprintf(out, n, "qgZ's hop-%d error-feedback residuals of unit %d, element %llu", hop,
                     u, (unsigned long long)(hop ? i - L->fb[0] : i));
            return;
        }
    }
    snprintf(out, n, "byte %llu", (unsigned long long)off);
}

/*
 * Open rank file q and check it once (size and header: open_manifest): its
 * checksum, and, in the same pass over the bytes, that every value is a
 * number. A NaN or an infinity in a checkpoint whose checksums were made to
 * match (a bad copy, an edited file, a faulty writer) is refused here,
 * naming the file, the tensor and the element, before anything is used.
 */
static zr_status reader_file(reader *rd, int q, FILE **out)
{
    if (rd->files[q] != NULL) {
        *out = rd->files[q];
        return ZR_OK;
    }
    char p[ZR_PATH_MAX];
    ZR_CHECK(zr_ckpt_pathf(p, sizeof p, "%s/rank_%05d.bin", rd->path, q));
    FILE *f;
    ZR_CHECK(zr_file_open_read(p, &f));
    zr_status st = ZR_OK;
    uint32_t crc = 0, stored = 0;
    uint64_t total = 0, bad_at = 0; /* the first non-finite value's offset (0: none) */
    float bad_value = 0;
    float buf[1 << 14]; /* 64 KiB: the header's 64 bytes are 16 floats' worth */
    uint64_t body = rd->m.file_bytes - sizeof(uint32_t);
    while (total < body) {
        size_t want = body - total < sizeof buf ? (size_t)(body - total) : sizeof buf;
        size_t got = fread(buf, 1, want, f);
        if (got != want) {
            ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT, "%s is truncated: %llu of %llu bytes", p,
                         (unsigned long long)(total + got), (unsigned long long)rd->m.file_bytes);
        }
        crc = zr_crc32c(crc, buf, got);
        size_t skip = total < ZR_CKPT_HEADER_BYTES ? (ZR_CKPT_HEADER_BYTES - (size_t)total) / 4 : 0;
        size_t bad = skip + zr_first_nonfinite(buf + skip, got / sizeof(float) - skip);
        if (bad < got / sizeof(float) && bad_at == 0) {
            bad_at = total + bad * sizeof(float);
            bad_value = buf[bad];
        }
        total += got;
    }
    if (fread(&stored, 1, sizeof stored, f) != sizeof stored) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT, "%s is truncated (no checksum)", p);
    }
    if (fgetc(f) != EOF) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT, "%s is longer than its manifest says", p);
    }
    if (crc != stored || crc != rd->m.crcs[q]) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT,
                     "%s fails its checksum (computed %08x, file %08x, manifest %08x): the "
                     "file is damaged or was modified",
                     p, crc, stored, rd->m.crcs[q]);
    }
    if (bad_at != 0) {
        char what[256];
        describe(&rd->m, q, bad_at, what, sizeof what);
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT,
                     "%s holds a non-finite value (%g) in %s: the checkpoint was damaged or "
                     "written by a faulty program; it is not used",
                     p, (double)bad_value, what);
    }
    rd->files[q] = f;
    *out = f;
    return ZR_OK;
fail:
    fclose(f);
    return st;
}

/*
 * Fill dst with elements [lo, hi) of array which (0 master, 1 m, 2 v) of unit
 * u, in unit coordinates, from the old ranks' slices; padding reads as zero.
 */
static zr_status reader_range(reader *rd, int u, int which, size_t lo, size_t hi, float *dst)
{
    const zr_ckpt_unit_layout *L = &rd->m.lay[u];
    memset(dst, 0, (hi - lo) * sizeof(float));
    size_t end = hi < L->numel ? hi : L->numel;
    for (size_t a = lo; a < end;) {
        int q = (int)(a / L->shard);
        size_t b = ((size_t)q + 1) * L->shard;
        if (b > end) {
            b = end;
        }
        FILE *f;
        ZR_CHECK(reader_file(rd, q, &f));
        uint64_t off = file_offset(rd->m.lay, u, which, a - (size_t)q * L->shard);
        if (off > (uint64_t)LONG_MAX || fseek(f, (long)off, SEEK_SET) != 0 ||
            fread(dst + (a - lo), sizeof(float), b - a, f) != b - a) {
            ZR_FAIL(ZR_ERR_IO, "cannot read unit %d from rank file %d of %s", u, q, rd->path);
        }
        a = b;
    }
    return ZR_OK;
}

zr_status zr_ckpt_verify(const char *path)
{
    reader rd;
    ZR_CHECK(reader_open(&rd, path));
    zr_status st = ZR_OK;
    for (int q = 0; q < rd.m.meta.world; q++) {
        FILE *f;
        ZR_CHECK_GOTO(reader_file(&rd, q, &f), st, done);
    }
done:
    reader_close(&rd);
    return st;
}

zr_status zr_ckpt_read_unit(const char *path, const zr_ckpt_meta *meta, int u, float *full)
{
    (void)meta;
    reader rd;
    ZR_CHECK(reader_open(&rd, path));
    zr_status st;
    if (u < 0 || u >= rd.m.nunits) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_INVALID, "no unit %d in %s", u, path);
    }
    st = reader_range(&rd, u, 0, 0, rd.m.lay[u].numel, full);
done:
    reader_close(&rd);
    return st;
}

/*
 * qgZ's residuals of this rank, when the run keeps them: read from its own
 * rank file when the layout is the one they were saved at (they belong to
 * the rank's place in it); otherwise they start from zero and note (one
 * line) says why.
 */
static zr_status load_feedback(zr_engine *e, reader *rd, float *chunk, char *note, size_t len)
{
    if (!zr_ckpt_feedback_usable(e, &rd->m, rd->path, note, len)) {
        return ZR_OK;
    }
    int R = e->comm->rank[ZR_GROUP_WORLD];
    FILE *f;
    ZR_CHECK(reader_file(rd, R, &f));
    for (int u = 0; u < rd->m.nunits; u++) {
        const zr_ckpt_unit_layout *L = &rd->m.lay[u];
        for (int hop = 0; hop < 2; hop++) {
            uint64_t at = L->fb_offset + (hop == 1 ? L->fb[0] * sizeof(float) : 0);
            for (size_t a = 0; a < L->fb[hop]; a += CHUNK) {
                size_t n = L->fb[hop] - a < CHUNK ? L->fb[hop] - a : CHUNK;
                uint64_t off = at + a * sizeof(float);
                if (off > (uint64_t)LONG_MAX || fseek(f, (long)off, SEEK_SET) != 0 ||
                    fread(chunk, sizeof(float), n, f) != n) {
                    ZR_FAIL(ZR_ERR_IO, "cannot read the qgZ residuals of unit %d from %s", u,
                            rd->path);
                }
                ZR_CHECK(zr_engine_feedback_write(e, u, hop, L->fb[hop], a, n, chunk));
            }
        }
    }
    return ZR_OK;
}

static zr_status load_local(zr_engine *e, const char *path, zr_ckpt_meta *meta)
{
    reader rd;
    ZR_CHECK(reader_open(&rd, path));
    zr_status st = ZR_OK;
    float *chunk = NULL;
    if (rd.m.nunits != e->nunits) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_INVALID, "checkpoint %s has %d units, this model has %d",
                     path, rd.m.nunits, e->nunits);
    }
    for (int u = 0; u < e->nunits; u++) {
        if (rd.m.lay[u].numel != zr_engine_numel(e, u)) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_INVALID,
                         "checkpoint %s: unit %d has %zu parameters, this model has %zu "
                         "(a different model shape)",
                         path, u, rd.m.lay[u].numel, zr_engine_numel(e, u));
        }
    }
    if (rd.m.meta.optim_steps > INT_MAX) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                     "checkpoint %s: %lld optimizer steps is more than the engine counts (%d)",
                     path, (long long)rd.m.meta.optim_steps, INT_MAX);
    }
    int R = e->comm->rank[ZR_GROUP_WORLD];
    ZR_ALLOC_GOTO(chunk, CHUNK, st, done);
    for (int u = 0; u < e->nunits; u++) {
        size_t S = zr_engine_shard(e, u), lo = (size_t)R * S;
        for (int k = 0; k < 3; k++) {
            for (size_t a = 0; a < S; a += CHUNK) {
                size_t n = S - a < CHUNK ? S - a : CHUNK;
                ZR_CHECK_GOTO(reader_range(&rd, u, k, lo + a, lo + a + n, chunk), st, done);
                ZR_CHECK_GOTO(zr_engine_optim_write(e, u, (zr_optim_array)k, a, n, chunk), st,
                              done);
            }
        }
    }
    char note[sizeof meta->note];
    ZR_CHECK_GOTO(load_feedback(e, &rd, chunk, note, sizeof note), st, done);
    *meta = rd.m.meta;
    snprintf(meta->note, sizeof meta->note, "%s", note);
done:
    zr_free(chunk);
    reader_close(&rd);
    return st;
}

zr_status zr_ckpt_load(zr_comm *c, zr_engine *e, const char *path, zr_ckpt_meta *meta)
{
    ZR_CHECK(zr_comm_agree(c, load_local(e, path, meta)));
    ZR_CHECK(zr_engine_sync_from_shards(e));
    e->step = (int)meta->optim_steps;
    return ZR_OK;
}