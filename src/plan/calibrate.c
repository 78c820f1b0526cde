/*
 * calibrate.c - the cost model fitted to the probe's reference steps
 * (zr_plan_calibrate): what cost.c's header calls k_compute, c_byte, k_optim,
 * t_sync and k_comm, from pricing the references (zr_plan_cost_with) at
 * trial values.
 */
#include "probe_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef zr_plan_calib calib;

static const calib no_calib = {1, 0, 1, 1, 0};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The least t with sum over w of max(w_i, t) = target (w sorted); 0 if the waits reach it alone. */
static double sync_floor(const double *w, int n, double target)
{
    double suffix = 0;
    for (int i = 0; i < n; i++) {
        suffix += w[i];
    }
    if (n == 0 || target <= suffix) {
        return 0;
    }
    /* with j waits below t: j t + (the rest) = target */
    for (int j = 1; j <= n; j++) {
        suffix -= w[j - 1];
        double t = (target - suffix) / j;
        if (t >= w[j - 1] && (j == n || t <= w[j])) {
            return t;
        }
    }
    return target / n; /* not reached: with j = n the floor always fits */
}

enum { MAX_WAITS = 1 << 14, NREF = 3 };

/* What references lo..hi-1 priced with f at no floor leave: per reference, the exposure its step
   measured (target) and the priced one, and its synchronising waits (nw of them, in w after the
   earlier references'). */
typedef struct ref_waits {
    double target[NREF], exposed[NREF];
    int nw[NREF], n; /* n: all of them */
} ref_waits;

static zr_status price_refs(const zr_train_config *cfg, int vocab, const zr_probe *p, int lo,
                            int hi, const calib *f, double k_optim_replicated, double *w,
                            ref_waits *rw)
{
    memset(rw, 0, sizeof *rw);
    for (int i = lo; i < hi; i++) {
        zr_plan_choice ref = zr_probe_reference(i, p->cal_batch, (long long)p->cal_prefetch);
        calib use = *f;
        use.t_sync = 0;
        if (i == 2) {
            use.k_optim = k_optim_replicated;
        }
        zr_plan_cost r;
        ZR_CHECK(zr_plan_cost_with(cfg, vocab, p->nodes, p->ranks_per_node, &ref, p, &use,
                                   w + rw->n, NREF * MAX_WAITS - rw->n, &rw->nw[i], &r));
        rw->n += rw->nw[i];
        rw->target[i] = p->cal_step[i] - r.t_compute - r.t_codec - r.t_optim;
        rw->exposed[i] = r.t_exposed;
    }
    return ZR_OK;
}

/* The floor per wait that makes the pooled exposure of lo..hi-1 their pooled target; 0 where
   they waited less than priced at no floor. Sorts w (a copy: the caller's keeps its order). */
static double pooled_floor(const ref_waits *rw, int lo, int hi, const double *w, double *sorted)
{
    double target = 0, exposed = 0, sync = 0;
    for (int i = lo; i < hi; i++) {
        target += rw->target[i], exposed += rw->exposed[i];
    }
    if (target < exposed) {
        return 0;
    }
    for (int i = 0; i < rw->n; i++) {
        sync += w[i];
        sorted[i] = w[i];
    }
    qsort(sorted, (size_t)rw->n, sizeof *sorted, cmp_double);
    return sync_floor(sorted, rw->n, target - (exposed - sync));
}

/* The waits of one reference (stage 0's), with the computation already calibrated in f: a floor
   per wait where it waited longer than its transfers say; a scale on them where it waited less,
   by bisection (the overlap hides a scaled transfer more than in proportion). */
static zr_status fit_waits_one(const zr_train_config *cfg, int vocab, const zr_probe *p, int r,
                               double k_optim_replicated, double *w, calib *f)
{
    ref_waits rw;
    f->k_comm = 1, f->t_sync = 0;
    ZR_CHECK(price_refs(cfg, vocab, p, r, r + 1, f, k_optim_replicated, w, &rw));
    if (rw.target[r] >= rw.exposed[r]) {
        f->t_sync = pooled_floor(&rw, r, r + 1, w, w + rw.n);
        return ZR_OK;
    }
    /* exposure grows with the scale: exposed(lo_k) <= target < exposed(hi_k) */
    double lo_k = 0.1, hi_k = 1;
    f->k_comm = lo_k;
    ZR_CHECK(price_refs(cfg, vocab, p, r, r + 1, f, k_optim_replicated, w, &rw));
    if (rw.exposed[r] >= rw.target[r]) {
        return ZR_OK; /* the transfers hide ten times better than measured: no further */
    }
    for (int it = 0; it < 40 && hi_k - lo_k > 1e-12; it++) {
        f->k_comm = 0.5 * (lo_k + hi_k);
        ZR_CHECK(price_refs(cfg, vocab, p, r, r + 1, f, k_optim_replicated, w, &rw));
        if (rw.exposed[r] > rw.target[r]) {
            hi_k = f->k_comm;
        } else {
            lo_k = f->k_comm;
        }
    }
    return ZR_OK;
}

/* The two stage 3 references with transfers scaled by k (set in f): the floor that fits their
   pooled exposure (set in f; 0 where they waited less than priced at no floor, *over then the
   pooled excess) and how far ZeRO-3's exposure lands from what it measured (*r0). */
static zr_status pair_at(const zr_train_config *cfg, int vocab, const zr_probe *p, double k,
                         double *w, calib *f, double *r0, double *over)
{
    ref_waits rw;
    f->k_comm = k, f->t_sync = 0;
    ZR_CHECK(price_refs(cfg, vocab, p, 0, 2, f, 1, w, &rw));
    f->t_sync = pooled_floor(&rw, 0, 2, w, w + rw.n);
    double e = rw.exposed[0];
    for (int j = 0; j < rw.nw[0]; j++) {
        e += fmax(w[j], f->t_sync) - w[j];
    }
    *r0 = e - rw.target[0];
    *over = rw.exposed[0] + rw.exposed[1] - rw.target[0] - rw.target[1];
    return ZR_OK;
}

/* The largest scale in a..b (to 1e-12) at which pair_at's *over (which 0) or *r0 (which 1) is
   not positive, given that it is not at a and is at b: both grow with the scale. */
static zr_status pair_bisect(const zr_train_config *cfg, int vocab, const zr_probe *p, double *w,
                             calib *f, int which, double a, double b, double *k)
{
    for (int it = 0; it < 60 && b - a > 1e-12 * b; it++) {
        double m = 0.5 * (a + b), r0, over;
        ZR_CHECK(pair_at(cfg, vocab, p, m, w, f, &r0, &over));
        if ((which ? r0 : over) > 0) {
            b = m;
        } else {
            a = m;
        }
    }
    *k = a;
    return ZR_OK;
}

/*
 * Stage 3's waits from its two references, with the computation already
 * calibrated in f: the scale on the transfers (k_comm) and floor per wait
 * (t_sync) that land both steps where they measured. One figure cannot: a
 * floor adds alike to steps whose bytes differ by half, a scale in proportion
 * to their bytes (on bench/cluster's runs, replayed, the pair took the mean
 * error from 0.088 to 0.083). Each scale's floor fits the pooled exposure,
 * exactly up to the scale k_x where the transfers alone reach it; within
 * 0.1..k_x ZeRO-3's share grows with the scale, and bisection finds the one
 * that leaves it exact too, or the nearer end (k_x: no floor).
 */
static zr_status fit_waits_pair(const zr_train_config *cfg, int vocab, const zr_probe *p, double *w,
                                calib *f)
{
    const double k_lo = 0.1, k_hi = 10;
    double r_lo, r_hi, over, k_x = k_hi, k;
    ZR_CHECK(pair_at(cfg, vocab, p, k_lo, w, f, &r_lo, &over));
    if (over >= 0) {
        return ZR_OK; /* the transfers hide ten times better than measured: no further */
    }
    ZR_CHECK(pair_at(cfg, vocab, p, k_hi, w, f, &r_hi, &over));
    if (over > 0) {
        ZR_CHECK(pair_bisect(cfg, vocab, p, w, f, 0, k_lo, k_hi, &k_x));
        ZR_CHECK(pair_at(cfg, vocab, p, k_x, w, f, &r_hi, &over));
    }
    /* within k_lo..k_x the pooled exposure is exact; ZeRO-3's residual grows with the scale */
    if (r_lo >= 0 || r_hi <= 0) {
        k = r_lo >= 0 ? k_lo : k_x;
    } else {
        ZR_CHECK(pair_bisect(cfg, vocab, p, w, f, 1, k_lo, k_x, &k));
    }
    return pair_at(cfg, vocab, p, k, w, f, &r_lo, &over); /* leaves k and its floor in f */
}

/* The computation's factors from the two stage 3 references: k busy_i + c bytes_i = measured_i. */
static void fit_compute(const zr_probe *p, const zr_plan_cost *r, calib *f)
{
    double b0 = r[0].t_compute + r[0].t_codec, b1 = r[1].t_compute + r[1].t_codec;
    double y0 = r[0].bytes_inter, y1 = r[1].bytes_inter;
    double m0 = p->cal_compute[0], m1 = p->cal_compute[1];
    double det = b0 * y1 - b1 * y0, k = 0, c = -1;
    if (!p->gpu && fabs(det) > 1e-9 * (b0 * y1 + b1 * y0)) {
        k = (m0 * y1 - m1 * y0) / det;
        c = (b0 * m1 - b1 * m0) / det;
    }
    if (!(k > 0 && c >= 0)) {
        /* the bytes explain nothing (one node, or a difference within the noise) */
        c = 0;
        k = b0 + b1 > 0 ? (m0 + m1) / (b0 + b1) : 1;
    }
    f->k_compute = k, f->c_byte = c;
    double o = r[0].t_optim + r[1].t_optim;
    f->k_optim = o > 0 ? (p->cal_optim[0] + p->cal_optim[1]) / o : 1;
}

zr_status zr_plan_calibrate(const zr_train_config *cfg, int vocab, const zr_probe *p,
                            zr_plan_calibration *out)
{
    out->stage3 = out->stage012 = no_calib;
    out->k_optim_replicated = 1;
    out->calibrated = p != NULL && p->cal_batch > 0;
    if (!out->calibrated) {
        return ZR_OK;
    }
    int nref = p->cal_step[2] > 0 ? 3 : 2; /* the stage 0 reference may not have fitted */
    zr_plan_cost r[NREF];
    for (int i = 0; i < nref; i++) {
        zr_plan_choice ref = zr_probe_reference(i, p->cal_batch, (long long)p->cal_prefetch);
        ZR_CHECK(zr_plan_cost_with(cfg, vocab, p->nodes, p->ranks_per_node, &ref, p, &no_calib,
                                   NULL, 0, NULL, &r[i]));
    }
    fit_compute(p, r, &out->stage3);
    double kr = out->stage3.k_optim;
    if (nref == 3 && r[2].t_optim > 0) {
        kr = p->cal_optim[2] / r[2].t_optim;
    }
    out->k_optim_replicated = kr; /* stages 1 and 2 shard the optimizer as stage 3 does */
    double *w = NULL;
    ZR_ALLOC(w, 2 * NREF * (size_t)MAX_WAITS); /* the waits, and a sorted copy */
    /* stage 3's waits on both ZeRO-3 references; stages 0-2 reduce at the step what stage 3
       reduces during backward: theirs on stage 0's reference, where it ran; none where nothing
       is sent (one rank) */
    zr_status st = r[0].t_comm > 0 ? fit_waits_pair(cfg, vocab, p, w, &out->stage3) : ZR_OK;
    out->stage012 = out->stage3;
    if (st == ZR_OK && nref == 3 && r[2].t_comm > 0) {
        st = fit_waits_one(cfg, vocab, p, 2, kr, w, &out->stage012);
    }
    zr_free(w);
    return st;
}
