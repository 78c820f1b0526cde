/*
 * device.c - the device layer of zr/device.h: the CPU device (today's host
 * code), the choice of a rank's GPU, and memory, streams, events and copies
 * on either kind of device.
 *
 * What a CUDA device does is device_cuda.c's (zr_device_cuda_ops), compiled
 * only where CUDA is built; a build without compiles device_nocuda.c, whose
 * every CUDA request fails at once with "built without CUDA". The CPU
 * device and the rank-to-GPU mapping work regardless.
 */
#define _POSIX_C_SOURCE 200809L

#include "device_impl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

zr_device zr_device_cpu(void)
{
    zr_device d;
    memset(&d, 0, sizeof d);
    d.kind = ZR_DEVICE_CPU;
    d.ordinal = -1;
    snprintf(d.name, sizeof d.name, "cpu");
    return d;
}

int zr_device_same(const zr_device *a, const zr_device *b)
{
    return a->kind == b->kind && (a->kind == ZR_DEVICE_CPU || a->ordinal == b->ordinal);
}

zr_status zr_device_parse(const char *spec, zr_device_kind *kind, int *ordinal)
{
    if (spec != NULL && strcmp(spec, "cpu") == 0) {
        *kind = ZR_DEVICE_CPU;
        *ordinal = -1;
        return ZR_OK;
    }
    if (spec != NULL && strcmp(spec, "cuda") == 0) {
        *kind = ZR_DEVICE_CUDA;
        *ordinal = -1;
        return ZR_OK;
    }
    if (spec != NULL && strncmp(spec, "cuda:", 5) == 0 && isdigit((unsigned char)spec[5])) {
        char *end;
        long v = strtol(spec + 5, &end, 10);
        if (*end == '\0' && v <= 1024) {
            *kind = ZR_DEVICE_CUDA;
            *ordinal = (int)v;
            return ZR_OK;
        }
    }
    ZR_FAIL(ZR_ERR_INVALID, "device '%s': expected cpu, cuda or cuda:N", spec ? spec : "(null)");
}

/* ---- the rank's GPU ----------------------------------------------------------- */

/*
 * The leading valid entries of a CUDA_VISIBLE_DEVICES value: an index
 * (digits) or a GPU/MIG UUID; CUDA ignores everything from the first invalid
 * entry on. Copies entry `want` (if >= 0) into out.
 */
static int visible_entries(const char *env, int want, char *out, size_t size)
{
    int n = 0;
    const char *p = env;
    while (*p != '\0') {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len > 0 && isspace((unsigned char)*p)) {
            p++, len--;
        }
        while (len > 0 && isspace((unsigned char)p[len - 1])) {
            len--;
        }
        int ok = len > 0;
        if (ok && (strncmp(p, "GPU-", 4) == 0 || strncmp(p, "MIG-", 4) == 0)) {
            ok = len > 4;
        } else {
            for (size_t i = 0; i < len && ok; i++) {
                ok = isdigit((unsigned char)p[i]) != 0;
            }
        }
        if (!ok) {
            break;
        }
        if (n == want) {
            snprintf(out, size, "%.*s", (int)len, p);
        }
        n++;
        if (end == NULL) {
            break;
        }
        p = end + 1;
    }
    return n;
}

zr_status zr_device_map_rank(int local_rank, int local_size, const char *visible_env,
                             int runtime_count, zr_gpu_choice *out)
{
    memset(out, 0, sizeof *out);
    if (local_size < 1 || local_rank < 0 || local_rank >= local_size) {
        ZR_FAIL(ZR_ERR_INVALID, "GPU choice: local rank %d of %d ranks on the node", local_rank,
                local_size);
    }
    int visible = runtime_count;
    if (visible_env != NULL) {
        int listed = visible_entries(visible_env, -1, NULL, 0);
        visible = listed < runtime_count ? listed : runtime_count;
    }
    if (visible <= 0) {
        ZR_FAIL(ZR_ERR_DEVICE, "no GPU found: %d device%s, CUDA_VISIBLE_DEVICES %s%s%s",
                runtime_count, runtime_count == 1 ? "" : "s", visible_env ? "'" : "unset",
                visible_env ? visible_env : "", visible_env ? "'" : "");
    }
    out->visible = visible;
    out->ordinal = local_rank % visible;
    /* ranks o, o + visible, o + 2 visible, ... share ordinal o */
    out->sharing = (local_size - out->ordinal + visible - 1) / visible;
    if (visible_env != NULL) {
        visible_entries(visible_env, out->ordinal, out->physical, sizeof out->physical);
    } else {
        snprintf(out->physical, sizeof out->physical, "%d", out->ordinal);
    }
    return ZR_OK;
}

void zr_device_describe(const zr_device *dev, char *buf, size_t size)
{
    if (dev->kind == ZR_DEVICE_CPU) {
        snprintf(buf, size, "cpu");
        return;
    }
    snprintf(buf, size, "cuda:%d %s (sm_%d%d, %.1f GiB, %d SMs)", dev->ordinal, dev->name,
             dev->cc_major, dev->cc_minor, (double)dev->total_mem / (1024.0 * 1024 * 1024),
             dev->sm_count);
}

/* ---- memory ----------------------------------------------------------------------- */

zr_status zr_device_alloc_at(const zr_device *dev, void **out, size_t bytes, const char *file,
                             int line)
{
    *out = NULL;
    if (dev->kind == ZR_DEVICE_CPU) {
        return zr_alloc_at(out, bytes, file, line);
    }
    return zr_device_cuda_ops.alloc(dev, out, bytes, file, line);
}

void zr_device_free(const zr_device *dev, void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    if (dev->kind == ZR_DEVICE_CPU) {
        zr_free(ptr);
        return;
    }
    ZR_ASSERT(zr_device_cuda_ops.free != NULL); /* else: a CUDA block in a build without CUDA */
    zr_device_cuda_ops.free(dev, ptr);
}

zr_status zr_host_alloc_pinned_at(const zr_device *dev, void **out, size_t bytes, const char *file,
                                  int line)
{
    *out = NULL;
    if (dev->kind == ZR_DEVICE_CPU) {
        return zr_alloc_at(out, bytes, file, line);
    }
    return zr_device_cuda_ops.alloc_pinned(out, bytes, file, line);
}

void zr_host_free_pinned(const zr_device *dev, void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    if (dev->kind == ZR_DEVICE_CPU) {
        zr_free(ptr);
        return;
    }
    ZR_ASSERT(zr_device_cuda_ops.free_pinned != NULL); /* else: a build without CUDA */
    zr_device_cuda_ops.free_pinned(ptr);
}

/* ---- streams, events, copies ------------------------------------------------------- */

zr_status zr_stream_create(const zr_device *dev, zr_stream **out)
{
    *out = NULL;
    zr_stream *s;
    ZR_ALLOC(s, 1);
    s->dev = *dev;
    if (dev->kind == ZR_DEVICE_CUDA) {
        zr_status st = zr_device_cuda_ops.stream_create(dev, &s->cuda);
        if (st != ZR_OK) {
            zr_free(s);
            return st;
        }
    }
    *out = s;
    return ZR_OK;
}

void zr_stream_destroy(zr_stream *s)
{
    if (s == NULL) {
        return;
    }
    if (s->dev.kind == ZR_DEVICE_CUDA) {
        zr_device_cuda_ops.stream_destroy(&s->dev, s->cuda);
    }
    zr_free(s);
}

const zr_device *zr_stream_device(const zr_stream *s)
{
    return &s->dev;
}

zr_status zr_stream_sync(zr_stream *s)
{
    if (s->dev.kind == ZR_DEVICE_CUDA) {
        return zr_device_cuda_ops.stream_sync(s->cuda);
    }
    return ZR_OK;
}

zr_status zr_event_create(const zr_device *dev, zr_event **out)
{
    *out = NULL;
    zr_event *e;
    ZR_ALLOC(e, 1);
    e->dev = *dev;
    if (dev->kind == ZR_DEVICE_CUDA) {
        zr_status st = zr_device_cuda_ops.event_create(dev, &e->cuda);
        if (st != ZR_OK) {
            zr_free(e);
            return st;
        }
    }
    *out = e;
    return ZR_OK;
}

void zr_event_destroy(zr_event *e)
{
    if (e == NULL) {
        return;
    }
    if (e->dev.kind == ZR_DEVICE_CUDA) {
        zr_device_cuda_ops.event_destroy(&e->dev, e->cuda);
    }
    zr_free(e);
}

static zr_status same_device(const zr_event *e, const zr_stream *s, const char *what)
{
    if (e->dev.kind != s->dev.kind || e->dev.ordinal != s->dev.ordinal) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: the event belongs to %s %d, the stream to %s %d", what,
                e->dev.kind == ZR_DEVICE_CPU ? "cpu" : "cuda", e->dev.ordinal,
                s->dev.kind == ZR_DEVICE_CPU ? "cpu" : "cuda", s->dev.ordinal);
    }
    return ZR_OK;
}

zr_status zr_event_record(zr_event *e, zr_stream *s)
{
    ZR_CHECK(same_device(e, s, "event record"));
    e->recorded = 1;
    if (e->dev.kind == ZR_DEVICE_CUDA) {
        return zr_device_cuda_ops.event_record(e->cuda, s->cuda);
    }
    e->t = zr_now();
    return ZR_OK;
}

zr_status zr_stream_wait_event(zr_stream *s, zr_event *e)
{
    ZR_CHECK(same_device(e, s, "stream wait"));
    if (s->dev.kind == ZR_DEVICE_CUDA) {
        return zr_device_cuda_ops.stream_wait(s->cuda, e->cuda);
    }
    return ZR_OK;
}

zr_status zr_event_sync(zr_event *e)
{
    if (e->dev.kind == ZR_DEVICE_CUDA) {
        return zr_device_cuda_ops.event_sync(e->cuda);
    }
    return ZR_OK;
}

zr_status zr_event_query(zr_event *e, int *done)
{
    *done = 1;
    if (e->dev.kind == ZR_DEVICE_CUDA) {
        return zr_device_cuda_ops.event_query(e->cuda, done);
    }
    return ZR_OK;
}

zr_status zr_event_elapsed_ms(zr_event *start, zr_event *end, float *ms)
{
    *ms = 0.0f;
    if (!start->recorded || !end->recorded) {
        ZR_FAIL(ZR_ERR_INVALID, "event elapsed time: an event was never recorded");
    }
    if (start->dev.kind == ZR_DEVICE_CUDA) {
        return zr_device_cuda_ops.event_elapsed(start->cuda, end->cuda, ms);
    }
    *ms = (float)((end->t - start->t) * 1e3);
    return ZR_OK;
}

zr_status zr_memcpy_async(void *dst, const void *src, size_t bytes, zr_stream *s)
{
    if (bytes == 0) {
        return ZR_OK;
    }
    if (s->dev.kind == ZR_DEVICE_CUDA) {
        return zr_device_cuda_ops.copy(dst, src, bytes, s->cuda);
    }
    memcpy(dst, src, bytes);
    return ZR_OK;
}

zr_status zr_memset_async(void *dst, int value, size_t bytes, zr_stream *s)
{
    if (bytes == 0) {
        return ZR_OK;
    }
    if (s->dev.kind == ZR_DEVICE_CUDA) {
        return zr_device_cuda_ops.fill(dst, value, bytes, s->cuda);
    }
    memset(dst, value, bytes);
    return ZR_OK;
}
