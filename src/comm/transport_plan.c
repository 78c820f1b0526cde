/*
 * transport_plan.c - the calls of the data-plane transports as plain
 * functions (transport_plan.h): the messages of an exchange in the MPI
 * transport's order and chunks, the staging extent, the split colours of
 * NCCL's group communicators, the shared-GPU check. No MPI, no CUDA: the
 * transports call these, and tests check them without a device.
 */
#include "transport_plan.h"

#include <string.h>

/* Appends the chunks of one message; *k counts every entry, out gets the first max. */
static void add_chunks(int peer, int recv, size_t offset, size_t bytes, size_t chunk, zr_xmsg *out,
                       size_t max, size_t *k)
{
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t len = bytes - off < chunk ? bytes - off : chunk;
        if (*k < max) {
            out[*k] = (zr_xmsg){peer, recv, offset + off, len};
        }
        (*k)++;
    }
}

size_t zr_xplan_messages(int n, int me, const size_t *scount, const size_t *sdisp,
                         const size_t *rcount, const size_t *rdisp, size_t chunk, zr_xmsg *out,
                         size_t max)
{
    ZR_ASSERT(chunk > 0 && me >= 0 && me < n);
    size_t k = 0;
    /* receives first, from me-1 down and around, so that peers spread their load */
    for (int i = 1; i < n; i++) {
        int p = (me + n - i) % n;
        add_chunks(p, 1, rdisp[p], rcount[p], chunk, out, max, &k);
    }
    for (int i = 1; i < n; i++) {
        int p = (me + i) % n;
        add_chunks(p, 0, sdisp[p], scount[p], chunk, out, max, &k);
    }
    return k;
}

size_t zr_xplan_extent(const zr_xmsg *m, size_t count, int recv)
{
    size_t end = 0;
    for (size_t i = 0; i < count; i++) {
        if (m[i].recv == recv && m[i].offset + m[i].bytes > end) {
            end = m[i].offset + m[i].bytes;
        }
    }
    return end;
}

/* The chunks of the message that starts at chunk f: up to the first chunk that does not continue
 * it; *bytes = its length. */
static size_t message_end(const zr_xmsg *m, size_t count, size_t f, size_t *bytes)
{
    size_t e = f + 1;
    *bytes = m[f].bytes;
    while (e < count && m[e].peer == m[f].peer && m[e].recv == m[f].recv &&
           m[e].offset == m[f].offset + *bytes) {
        *bytes += m[e].bytes;
        e++;
    }
    return e;
}

size_t zr_xplan_stage(const zr_xmsg *m, size_t count, size_t *stage, size_t *copy)
{
    size_t next = 0;
    for (size_t f = 0; f < count;) {
        size_t bytes, e = message_end(m, count, f, &bytes);
        size_t same = SIZE_MAX; /* the first chunk of an earlier send message with these bytes */
        for (size_t g = 0; g < f && !m[f].recv && same == SIZE_MAX;) {
            size_t gb, ge = message_end(m, count, g, &gb);
            if (!m[g].recv && m[g].offset == m[f].offset && gb == bytes) {
                same = g;
            }
            g = ge;
        }
        for (size_t i = f; i < e; i++) {
            if (m[i].recv) {
                stage[i] = m[i].offset;
                copy[i] = i;
            } else if (same != SIZE_MAX) {
                stage[i] = stage[same + (i - f)];
                copy[i] = copy[same + (i - f)];
            } else {
                stage[i] = next + (m[i].offset - m[f].offset);
                copy[i] = i;
            }
        }
        if (!m[f].recv && same == SIZE_MAX) {
            next += bytes;
        }
        f = e;
    }
    return next;
}

zr_xsplit zr_xplan_split(const zr_comm *c, zr_group g)
{
    /* a group is the ranks first, first + stride, ...: first names it among its kind */
    zr_xsplit s = {c->first[g], c->rank[g]};
    return s;
}

int zr_xplan_shared_gpu(const zr_gpu_id *ids, int n, int *a, int *b)
{
    *a = *b = -1;
    for (int j = 1; j < n; j++) {
        for (int i = 0; i < j; i++) {
            if (ids[i].node == ids[j].node &&
                memcmp(ids[i].uuid, ids[j].uuid, sizeof ids[i].uuid) == 0) {
                *a = i;
                *b = j;
                return 1;
            }
        }
    }
    return 0;
}
