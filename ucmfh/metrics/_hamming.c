/*
 * Exact Hamming ranking on the CPU for ucmfh.metrics: top-K lists, distance
 * histograms, AP@K and AP over the whole ranking, by popcount and counting.
 *
 * Codes are packed bits viewed as uint64 words, [n, words] row-major (padding
 * bits zero in both sets, so they add no distance); labels are multi-hot bits
 * likewise, [n, label_words]. Ranking is Hamming distance ascending, ties by
 * retrieval index ascending (docs/reference.md §6). Nothing is sorted: distances are
 * small integers, so a ranking is a counting sort, and a top-K keeps, per
 * distance, the first K items met in index order.
 *
 * Every entry point takes C-contiguous buffers, checks their sizes and runs
 * without the GIL, so Python can split the queries over threads. The loops
 * are compiled several times for the x86-64 features a CPU may have
 * (AVX-512 VPOPCNTDQ, AVX2, POPCNT) and the best is chosen at run time; the
 * results are integers and do not depend on the choice.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TILE 8192  /* retrieval items scanned by every query of a call before the next tile */
#define BLOCK 64   /* items whose distances are computed together, then scanned */

typedef struct {
    const uint64_t *q, *r;     /* codes [nq, words], [nr, words] */
    const uint64_t *ql, *rl;   /* labels [nq, lwords], [nr, lwords]; NULL when unused */
    Py_ssize_t nq, nr;
    int words, lwords, n_bits; /* distances lie in 0 .. n_bits */
} Job;

/* ------------------------------------------------------------ inner loops */

static inline __attribute__((always_inline)) void
distances(const uint64_t *q, const uint64_t *r, Py_ssize_t m, int words, uint16_t *out)
{
    if (words == 1) {
        const uint64_t q0 = q[0];
        for (Py_ssize_t j = 0; j < m; j++)
            out[j] = (uint16_t)__builtin_popcountll(q0 ^ r[j]);
    } else if (words == 2) {
        const uint64_t q0 = q[0], q1 = q[1];
        for (Py_ssize_t j = 0; j < m; j++)
            out[j] = (uint16_t)(__builtin_popcountll(q0 ^ r[2 * j]) + __builtin_popcountll(q1 ^ r[2 * j + 1]));
    } else {
        for (Py_ssize_t j = 0; j < m; j++) {
            unsigned s = 0;
            for (int w = 0; w < words; w++)
                s += (unsigned)__builtin_popcountll(q[w] ^ r[j * words + w]);
            out[j] = (uint16_t)s;
        }
    }
}

static inline __attribute__((always_inline)) void
relevance(const uint64_t *ql, const uint64_t *rl, Py_ssize_t m, int lwords, uint8_t *out)
{
    if (lwords == 1) {
        const uint64_t l0 = ql[0];
        for (Py_ssize_t j = 0; j < m; j++)
            out[j] = (l0 & rl[j]) != 0;
    } else {
        for (Py_ssize_t j = 0; j < m; j++) {
            uint64_t any = 0;
            for (int w = 0; w < lwords; w++)
                any |= ql[w] & rl[j * lwords + w];
            out[j] = any != 0;
        }
    }
}

static inline __attribute__((always_inline)) unsigned
block_min(const uint16_t *d, Py_ssize_t m)
{
    unsigned lo = 0xFFFF;
    for (Py_ssize_t j = 0; j < m; j++)
        lo = d[j] < lo ? d[j] : lo;
    return lo;
}

/* ---------------------------------------------------------- top-K, small K
 *
 * Per query: for each distance d <= thr, the first (up to k) items met at d,
 * in index order. lt counts the kept items nearer than thr; once it reaches k,
 * nothing at thr or beyond can enter the top k, so thr drops; once thr's list
 * is full, nothing at thr can enter either (lim = thr - 1). Every item of
 * the final top k is kept (it is among the first k at its distance, and its
 * distance never exceeds thr), so reading the lists in distance order gives
 * the exact ranking. Memory: (n_bits + 1) * k slots per query.
 */
static inline __attribute__((always_inline)) void
topk_buckets_body(const Job *job, Py_ssize_t k, int32_t *cnt, int64_t *slot, int *thr, Py_ssize_t *lt)
{
    const int nd = job->n_bits + 1;
    uint16_t dist[BLOCK];
    for (Py_ssize_t i = 0; i < job->nq; i++) {
        thr[i] = job->n_bits;
        lt[i] = 0;
    }
    for (Py_ssize_t t0 = 0; t0 < job->nr; t0 += TILE) {
        const Py_ssize_t t1 = t0 + TILE < job->nr ? t0 + TILE : job->nr;
        for (Py_ssize_t i = 0; i < job->nq; i++) {
            const uint64_t *q = job->q + i * job->words;
            int32_t *c = cnt + i * nd;
            int64_t *s = slot + i * nd * k;
            int th = thr[i];
            Py_ssize_t below = lt[i];
            int lim = th - (c[th] >= k); /* the farthest distance that can still enter */
            for (Py_ssize_t b0 = t0; b0 < t1; b0 += BLOCK) {
                const Py_ssize_t m = b0 + BLOCK < t1 ? BLOCK : t1 - b0;
                distances(q, job->r + b0 * job->words, m, job->words, dist);
                if ((int)block_min(dist, m) > lim)
                    continue;
                for (Py_ssize_t j = 0; j < m; j++) {
                    const int d = dist[j];
                    if (d > lim)
                        continue;
                    s[(Py_ssize_t)d * k + c[d]++] = b0 + j; /* d <= lim: its list has room */
                    if (d < th && ++below >= k) {
                        while (below >= k) {
                            th--;
                            below -= c[th];
                        }
                    }
                    lim = th - (c[th] >= k);
                }
            }
            thr[i] = th;
            lt[i] = below;
        }
    }
}

/* ---------------------------------------------------------- top-K, any K
 *
 * A counting sort cut at k: pass 1 counts items per distance; the cut-off
 * distance t and the number taken at t follow; pass 2 writes each item at
 * its place in index order. Memory: n_bits + 1 counters per query.
 */
static inline __attribute__((always_inline)) void
histogram_body(const Job *job, int64_t *h_all, int64_t *h_rel)
{
    const int nd = job->n_bits + 1;
    uint16_t dist[BLOCK];
    uint8_t rel[BLOCK];
    for (Py_ssize_t t0 = 0; t0 < job->nr; t0 += TILE) {
        const Py_ssize_t t1 = t0 + TILE < job->nr ? t0 + TILE : job->nr;
        for (Py_ssize_t i = 0; i < job->nq; i++) {
            const uint64_t *q = job->q + i * job->words;
            int64_t *ha = h_all + i * nd;
            int64_t *hr = h_rel ? h_rel + i * nd : NULL;
            for (Py_ssize_t b0 = t0; b0 < t1; b0 += BLOCK) {
                const Py_ssize_t m = b0 + BLOCK < t1 ? BLOCK : t1 - b0;
                distances(q, job->r + b0 * job->words, m, job->words, dist);
                if (hr) {
                    relevance(job->ql + i * job->lwords, job->rl + b0 * job->lwords, m, job->lwords, rel);
                    for (Py_ssize_t j = 0; j < m; j++) {
                        ha[dist[j]]++;
                        hr[dist[j]] += rel[j];
                    }
                } else {
                    for (Py_ssize_t j = 0; j < m; j++)
                        ha[dist[j]]++;
                }
            }
        }
    }
}

/* ---------------------------------------------------------- histograms cut at k
 *
 * The counts of the histograms above that a top k depends on, ties and all: per
 * query, every item at a distance up to the cut distance (the distance of the
 * k-th item), the group that the cut splits included. th bounds the cut from
 * above: the smallest distance with k items counted at or below it. Counts only
 * grow, so the cut never exceeds th, and an item (or a block) beyond th is
 * skipped. Counts beyond the final cut are partial.
 */
static inline __attribute__((always_inline)) void
cut_histogram_body(const Job *job, Py_ssize_t k, int64_t *h_all, int64_t *h_rel)
{
    const int nd = job->n_bits + 1;
    uint16_t dist[BLOCK];
    uint8_t rel[BLOCK];
    int *thr = malloc((size_t)(job->nq ? job->nq : 1) * sizeof(int));
    int64_t *within = malloc((size_t)(job->nq ? job->nq : 1) * sizeof(int64_t));
    if (!thr || !within) {
        free(thr);
        free(within);
        histogram_body(job, h_all, h_rel);
        return;
    }
    for (Py_ssize_t i = 0; i < job->nq; i++) {
        thr[i] = job->n_bits;
        within[i] = 0;
    }
    for (Py_ssize_t t0 = 0; t0 < job->nr; t0 += TILE) {
        const Py_ssize_t t1 = t0 + TILE < job->nr ? t0 + TILE : job->nr;
        for (Py_ssize_t i = 0; i < job->nq; i++) {
            const uint64_t *q = job->q + i * job->words;
            int64_t *ha = h_all + i * nd;
            int64_t *hr = h_rel + i * nd;
            int th = thr[i];
            int64_t in = within[i]; /* items counted at distances <= th */
            for (Py_ssize_t b0 = t0; b0 < t1; b0 += BLOCK) {
                const Py_ssize_t m = b0 + BLOCK < t1 ? BLOCK : t1 - b0;
                distances(q, job->r + b0 * job->words, m, job->words, dist);
                if ((int)block_min(dist, m) > th)
                    continue;
                relevance(job->ql + i * job->lwords, job->rl + b0 * job->lwords, m, job->lwords, rel);
                for (Py_ssize_t j = 0; j < m; j++) {
                    const int d = dist[j];
                    if (d > th)
                        continue;
                    ha[d]++;
                    hr[d] += rel[j];
                    in++;
                    if (d == th)
                        continue; /* in - ha[th] is unchanged: th holds */
                    while (th > 0 && in - ha[th] >= k) {
                        in -= ha[th];
                        th--;
                    }
                }
            }
            thr[i] = th;
            within[i] = in;
        }
    }
    free(thr);
    free(within);
}

static inline __attribute__((always_inline)) void
topk_counting_body(const Job *job, Py_ssize_t k, int64_t *hist, int *cut, int64_t *take, int64_t *out_idx,
                   int64_t *out_dist)
{
    const int nd = job->n_bits + 1;
    uint16_t dist[BLOCK];
    histogram_body(job, hist, NULL);
    for (Py_ssize_t i = 0; i < job->nq; i++) {
        /* hist becomes each distance's next write position; take: places left at the cut */
        int64_t *h = hist + i * nd;
        int64_t pos = 0;
        int d = 0;
        while (pos + h[d] < k) {
            const int64_t n = h[d];
            h[d] = pos;
            pos += n;
            d++;
        }
        cut[i] = d;
        take[i] = k - pos;
        h[d] = pos;
    }
    for (Py_ssize_t t0 = 0; t0 < job->nr; t0 += TILE) {
        const Py_ssize_t t1 = t0 + TILE < job->nr ? t0 + TILE : job->nr;
        for (Py_ssize_t i = 0; i < job->nq; i++) {
            const uint64_t *q = job->q + i * job->words;
            int64_t *h = hist + i * nd;
            int64_t *o = out_idx + i * k, *od = out_dist + i * k;
            const int c = cut[i];
            for (Py_ssize_t b0 = t0; b0 < t1; b0 += BLOCK) {
                const Py_ssize_t m = b0 + BLOCK < t1 ? BLOCK : t1 - b0;
                distances(q, job->r + b0 * job->words, m, job->words, dist);
                if ((int)block_min(dist, m) > c)
                    continue;
                for (Py_ssize_t j = 0; j < m; j++) {
                    const int d = dist[j];
                    if (d < c || (d == c && take[i] > 0)) {
                        take[i] -= d == c;
                        od[h[d]] = d;
                        o[h[d]++] = b0 + j;
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------ AP, all items
 *
 * The position of a relevant item j at distance d is (items nearer than d) +
 * (items at d with an index below j) + 1; its rank among the relevant items
 * likewise. Pass 1 makes the histograms, pass 2 walks the items in index
 * order carrying per-distance counts. AP terms are rounded to fixed point
 * (round half to even, like torch.round) and summed as integers, so the sum
 * does not depend on the order of work.
 */
static inline __attribute__((always_inline)) void
ap_all_body(const Job *job, double scale, int64_t *h_all, int64_t *h_rel, int64_t *total)
{
    const int nd = job->n_bits + 1;
    uint16_t dist[BLOCK];
    uint8_t rel[BLOCK];
    double rank[BLOCK + 1], position[BLOCK + 1];
    histogram_body(job, h_all, h_rel);
    for (Py_ssize_t i = 0; i < job->nq; i++) {
        /* histograms become (items nearer than d) + 1 and (relevant nearer than d) + 1 */
        int64_t *ha = h_all + i * nd, *hr = h_rel + i * nd;
        int64_t pa = 1, pr = 1;
        for (int d = 0; d < nd; d++) {
            const int64_t na = ha[d], nr = hr[d];
            ha[d] = pa;
            hr[d] = pr;
            pa += na;
            pr += nr;
        }
        total[i] = 0;
    }
    for (Py_ssize_t t0 = 0; t0 < job->nr; t0 += TILE) {
        const Py_ssize_t t1 = t0 + TILE < job->nr ? t0 + TILE : job->nr;
        for (Py_ssize_t i = 0; i < job->nq; i++) {
            const uint64_t *q = job->q + i * job->words;
            int64_t *ha = h_all + i * nd, *hr = h_rel + i * nd;
            int64_t sum = total[i];
            for (Py_ssize_t b0 = t0; b0 < t1; b0 += BLOCK) {
                const Py_ssize_t m = b0 + BLOCK < t1 ? BLOCK : t1 - b0;
                distances(q, job->r + b0 * job->words, m, job->words, dist);
                relevance(job->ql + i * job->lwords, job->rl + b0 * job->lwords, m, job->lwords, rel);
                /* counts first, without branches: a relevant item's (rank, position) is kept */
                int n = 0;
                for (Py_ssize_t j = 0; j < m; j++) {
                    const int d = dist[j];
                    rank[n] = (double)hr[d];
                    position[n] = (double)ha[d]++;
                    hr[d] += rel[j];
                    n += rel[j];
                }
                for (int t = 0; t < n; t++)
                    sum += (int64_t)nearbyint(rank[t] / position[t] * scale);
            }
            total[i] = sum;
        }
    }
}

/* --------------------------------------------- per-CPU builds and dispatch */

#define DEFINE_KERNELS(SUFFIX, ATTR)                                                                   \
    ATTR static void topk_buckets_##SUFFIX(const Job *j, Py_ssize_t k, int32_t *c, int64_t *s, int *t, \
                                           Py_ssize_t *l)                                              \
    { topk_buckets_body(j, k, c, s, t, l); }                                                           \
    ATTR static void topk_counting_##SUFFIX(const Job *j, Py_ssize_t k, int64_t *h, int *c, int64_t *t, \
                                            int64_t *o, int64_t *od)                                    \
    { topk_counting_body(j, k, h, c, t, o, od); }                                                      \
    ATTR static void histogram_##SUFFIX(const Job *j, int64_t *a, int64_t *r)                          \
    { histogram_body(j, a, r); }                                                                       \
    ATTR static void cut_histogram_##SUFFIX(const Job *j, Py_ssize_t k, int64_t *a, int64_t *r)        \
    { cut_histogram_body(j, k, a, r); }                                                                \
    ATTR static void ap_all_##SUFFIX(const Job *j, double s, int64_t *a, int64_t *r, int64_t *t)       \
    { ap_all_body(j, s, a, r, t); }

typedef struct {
    const char *name;
    void (*topk_buckets)(const Job *, Py_ssize_t, int32_t *, int64_t *, int *, Py_ssize_t *);
    void (*topk_counting)(const Job *, Py_ssize_t, int64_t *, int *, int64_t *, int64_t *, int64_t *);
    void (*histogram)(const Job *, int64_t *, int64_t *);
    void (*cut_histogram)(const Job *, Py_ssize_t, int64_t *, int64_t *);
    void (*ap_all)(const Job *, double, int64_t *, int64_t *, int64_t *);
} Kernels;

#define KERNELS(SUFFIX, NAME) \
    { NAME, topk_buckets_##SUFFIX, topk_counting_##SUFFIX, histogram_##SUFFIX, cut_histogram_##SUFFIX, \
      ap_all_##SUFFIX }

DEFINE_KERNELS(generic, )
static const Kernels GENERIC = KERNELS(generic, "generic");

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_X86_BUILDS 1
DEFINE_KERNELS(popcnt, __attribute__((target("popcnt"))))
DEFINE_KERNELS(avx2, __attribute__((target("popcnt,avx2,bmi2"))))
DEFINE_KERNELS(avx512, __attribute__((target("popcnt,avx2,bmi2,avx512f,avx512bw,avx512vl,avx512vpopcntdq"))))
static const Kernels POPCNT = KERNELS(popcnt, "popcnt");
static const Kernels AVX2 = KERNELS(avx2, "avx2");
static const Kernels AVX512 = KERNELS(avx512, "avx512vpopcntdq");
#endif

static const Kernels *kernels = &GENERIC;

static void choose_kernels(void)
{
#ifdef HAVE_X86_BUILDS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vpopcntdq") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        kernels = &AVX512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt"))
        kernels = &AVX2;
    else if (__builtin_cpu_supports("popcnt"))
        kernels = &POPCNT;
#endif
}

/* ------------------------------------------------ multi-index hashing search
 *
 * The exact top k of each query among items held in substring tables (ucmfh.search.mih):
 * per substring j, the item positions sorted by substring value (pos[j * nr ...]) and where
 * each value's bucket starts (off[start_j + value], 2^width + 1 entries). Buckets are probed
 * radius by radius (all substrings at r before any at r + 1), so an item is first met at
 * r = its smallest substring distance, in the first substring at that distance: it is kept
 * only there, which its own code says (no per-item memory, one read of its code). After
 * radius r in substrings 0..j, an item not found is at distance m * r + j + 1 or more
 * (pigeonhole), so the search stops when k found items lie below that.
 *
 * Beside each position, its item's sketch in that substring's table (sk[j * nr ...]): the
 * low bits of the next substring ((j + 1) mod m), 16 of them, and 8 more in the position's top
 * byte where positions take 24 bits (job->small, up to 2^24 items; MIH_SKETCH_BITS). An item kept in substring
 * j's bucket at radius r is at distance r there, more than r in each substring before j and at
 * least r in each after it (else it was met before), and in the next substring at least as far
 * as its sketch is from the query's. An entry whose bound exceeds the k-th smallest distance found
 * so far is passed over without reading its code, a read at random: it is not among the k nearest,
 * since that distance only falls. The stopping rule is unchanged: such an item lies beyond k found
 * items.
 *
 * Every read at random is asked for (__builtin_prefetch) well before it is made, so that the cache
 * misses overlap instead of queueing: a bucket's offsets MIH_OFFSETS_AHEAD buckets of the probing
 * order before it is probed, its first entries MIH_ENTRIES_AHEAD buckets before, and the code of an
 * entry its sketch keeps MIH_LAG kept entries before it is read (the rest at the end of each
 * substring's radius, before the stopping rule counts what was found).
 */
typedef struct {
    const uint64_t *q, *r;  /* query words [nq, words], item words [nr, words] */
    const int32_t *layout;  /* [m, 4]: word, bit offset, width, start of the substring's offsets */
    const uint32_t *pos;    /* [m * nr] */
    const uint32_t *off;    /* concatenated bucket offsets (into a substring's nr positions) */
    const uint16_t *sk;     /* [m * nr] each position's sketch (its low 16 bits) */
    Py_ssize_t nq, nr, k;
    int64_t budget; /* what a query may cost (MIH_BUCKET_COST) before it is left to the scan (out_p = -1) */
    int words, m, n_bits;
    int small; /* positions take 24 bits, their top byte 8 more sketch bits */
} MihJob;

/* How far ahead reads are asked for: the offsets of the bucket MIH_OFFSETS_AHEAD on in the probing order, the first
 * MIH_ENTRY_LINES cache lines of the positions and sketches of the one MIH_ENTRIES_AHEAD on (its offsets asked for
 * before), and an entry's code MIH_LAG kept entries before it is read. A bucket's sketches are checked MIH_CHUNK
 * entries at a time, branch-free. Measured on one core, 10M trained 64-bit codes (scripts/bench_mih.py). */
#ifndef MIH_OFFSETS_AHEAD
#define MIH_OFFSETS_AHEAD 16
#endif
#ifndef MIH_ENTRIES_AHEAD
#define MIH_ENTRIES_AHEAD 8
#endif
#ifndef MIH_ENTRY_LINES
#define MIH_ENTRY_LINES 4
#endif
#ifndef MIH_CHUNK
#define MIH_CHUNK 256
#endif
#ifndef MIH_LAG
#define MIH_LAG 32
#endif
/* The budget's unit is one entry whose code is read (at random). A bucket's probe (two reads of its offsets,
 * at random) costs about as much as this many; an entry passed over by its sketch, an eighth of one. */
#define MIH_BUCKET_COST 4

static int cmp_int64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Reorder a[0..n) so that its kk smallest values come first, in any order (quickselect, median of three). */
static void select_smallest(int64_t *a, Py_ssize_t n, Py_ssize_t kk)
{
    Py_ssize_t lo = 0, hi = n - 1;
    if (kk <= 0 || kk >= n)
        return;
    while (lo < hi) {
        const Py_ssize_t mid = lo + (hi - lo) / 2;
        int64_t x = a[lo], y = a[mid], z = a[hi];
        const int64_t pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot)
                i++;
            while (a[j] > pivot)
                j--;
            if (i <= j) {
                const int64_t t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        /* a[lo..j] <= pivot <= a[i..hi]; between them, values equal to the pivot */
        if (kk - 1 <= j)
            hi = j;
        else if (kk - 1 >= i)
            lo = i;
        else
            return;
    }
}

/* Sketch bits where positions need all 32 bits, and where they take 24 (the top byte holding 8 more). */
#define MIH_SKETCH_BITS 16
#define MIH_SKETCH_BITS_SMALL 24

/* A place in the probing order: substring j's bucket value ^ x at radius r (x has r bits set). The order is
 * every substring at radius r, 0 to m - 1, before any at r + 1; a substring narrower than r has no buckets there. */
typedef struct {
    int r, j;
    uint64_t x;
} MihCursor;

/* Move c to the next bucket of the order (Gosper's hack: the next x with as many bits set). Returns 1 where
 * c left substring j's radius r (that step of the order is over); c->r > maxw: past the last bucket. */
static inline __attribute__((always_inline)) int mih_next(MihCursor *c, const int32_t *layout, int m, int maxw)
{
    if (c->r) {
        const uint64_t low = c->x & (~c->x + 1), rr = c->x + low;
        c->x = (((rr ^ c->x) >> 2) >> __builtin_ctzll(low)) | rr;
        if (c->x < (1ULL << layout[4 * c->j + 2]))
            return 0;
    }
    do {
        if (++c->j == m)
            c->j = 0, c->r++;
    } while (c->r <= maxw && c->r > layout[4 * c->j + 2]);
    c->x = c->r <= maxw ? (1ULL << c->r) - 1 : 0;
    return 1;
}

/* Where the bucket at c starts and ends in its substring's positions (its two offsets). */
static inline __attribute__((always_inline)) const uint32_t *
mih_offsets(const MihJob *job, const uint64_t *value, MihCursor c)
{
    return job->off + job->layout[4 * c.j + 3] + (value[c.j] ^ c.x);
}

/* Ask for the first MIH_ENTRY_LINES cache lines of the bucket at c's positions and sketches. */
static inline __attribute__((always_inline)) void mih_ask_entries(const MihJob *job, const uint64_t *value, MihCursor c)
{
    const uint32_t *o = mih_offsets(job, value, c);
    const uint64_t e0 = o[0], e1 = o[1], at = (uint64_t)c.j * (uint64_t)job->nr;
    for (uint64_t e = e0; e < e1 && e < e0 + 16 * MIH_ENTRY_LINES; e += 16)
        __builtin_prefetch(job->pos + at + e, 0, 0);
    for (uint64_t e = e0; e < e1 && e < e0 + 16 * MIH_ENTRY_LINES; e += 32)
        __builtin_prefetch(job->sk + at + e, 0, 0);
}

/* The items found so far for one query: their keys (distance * nr + position), a histogram of their distances
 * and the k-th smallest of them (nd while fewer than k). */
typedef struct {
    int64_t *keys, *hist;
    Py_ssize_t cap, n;
    int kth;
    int64_t within_kth; /* found items at distance kth or less */
} MihFound;

/* Read the codes of entries cand[from..to) of substring j's buckets at radius r, whose sketches were
 * apart[..] from the query's, and keep each met there first. Returns -1 when out of memory. */
static inline __attribute__((always_inline)) int
mih_check(MihFound *f, const MihJob *job, const uint64_t *q, int r, int j, int base, const uint32_t *cand,
          const uint8_t *apart, int from, int to)
{
    const int m = job->m, words = job->words;
    for (int c = from; c < to; c++) {
        if (base + apart[c] > f->kth)
            continue; /* beyond the k-th found, which fell since it was kept */
        const uint32_t p = cand[c];
        const uint64_t *item = job->r + (Py_ssize_t)p * words;
        int first = 1; /* met here first: no substring before j at r or less, none after below r */
        for (int jj = 0; jj < m && first; jj++) {
            if (jj == j)
                continue;
            const int32_t *o = job->layout + 4 * jj;
            const uint64_t mask = (1ULL << o[2]) - 1;
            const int dj = __builtin_popcountll(((q[o[0]] ^ item[o[0]]) >> o[1]) & mask);
            first = jj < j ? dj > r : dj >= r;
        }
        if (!first)
            continue;
        int d = 0;
        for (int w = 0; w < words; w++)
            d += __builtin_popcountll(q[w] ^ item[w]);
        if (f->n == f->cap) {
            int64_t *grown = realloc(f->keys, (size_t)(2 * f->cap) * sizeof(int64_t));
            if (!grown)
                return -1;
            f->keys = grown, f->cap *= 2;
        }
        f->keys[f->n++] = (int64_t)d * job->nr + p;
        f->hist[d]++;
        if (d <= f->kth) { /* the k-th smallest distance can only fall */
            f->within_kth++;
            while (f->within_kth - f->hist[f->kth] >= job->k)
                f->within_kth -= f->hist[f->kth--];
        }
    }
    return 0;
}

static inline __attribute__((always_inline)) int
mih_body(const MihJob *job, int64_t *out_d, int64_t *out_p)
{
    const Py_ssize_t nr = job->nr, k = job->k;
    const int m = job->m, words = job->words, nd = job->n_bits + 1;
    const int32_t *layout = job->layout;
    const int small = job->small;
    const uint32_t pos_mask = small ? 0xFFFFFFu : 0xFFFFFFFFu;
    const int sketch_bits = small ? MIH_SKETCH_BITS_SMALL : MIH_SKETCH_BITS;
    MihFound f = {.keys = malloc(1024 * sizeof(int64_t)), .hist = malloc((size_t)(nd + 1) * sizeof(int64_t)),
                  .cap = 1024}; /* hist[nd]: 0, above every distance */
    uint64_t *value = malloc((size_t)m * sizeof(uint64_t)); /* the query's substrings */
    unsigned *qsk = malloc((size_t)m * sizeof(unsigned)); /* its sketch in each substring's table */
    /* entries of the step probed (substring j, radius r) that their sketches keep, their codes asked for and read
     * MIH_LAG entries later (all of them at the step's end): positions and sketch distances */
    uint32_t cand[MIH_CHUNK + MIH_LAG];
    uint8_t apart[MIH_CHUNK + MIH_LAG];
    int maxw = 0, failed = 0;
    for (int j = 0; j < m; j++)
        maxw = layout[4 * j + 2] > maxw ? layout[4 * j + 2] : maxw;
    if (!f.keys || !f.hist || !value || !qsk)
        failed = 1;
    for (Py_ssize_t i = 0; i < job->nq && !failed; i++) {
        const uint64_t *q = job->q + i * words;
        for (int j = 0; j < m; j++) {
            const int32_t *lay = layout + 4 * j, *next = layout + 4 * ((j + 1) % m);
            const int sk_width = m > 1 ? (next[2] < sketch_bits ? next[2] : sketch_bits) : 0;
            value[j] = (q[lay[0]] >> lay[1]) & ((1ULL << lay[2]) - 1);
            qsk[j] = (unsigned)((q[next[0]] >> next[1]) & ((1ULL << sk_width) - 1));
        }
        memset(f.hist, 0, (size_t)(nd + 1) * sizeof(int64_t));
        f.n = 0, f.kth = nd, f.within_kth = 0;
        int64_t cost8 = 0; /* in eighths of the budget's unit */
        int done = 0, gave_up = 0, head = 0, tail = 0;
        /* the bucket probed, and two ahead of it: one whose offsets, one whose first entries are asked for */
        MihCursor here = {0, 0, 0}, ahead_off = here, ahead_ent = here;
        for (int a = 0; a < MIH_OFFSETS_AHEAD && ahead_off.r <= maxw; a++) {
            __builtin_prefetch(mih_offsets(job, value, ahead_off), 0, 0);
            mih_next(&ahead_off, layout, m, maxw);
        }
        for (int a = 0; a < MIH_ENTRIES_AHEAD && ahead_ent.r <= maxw; a++) {
            mih_ask_entries(job, value, ahead_ent);
            mih_next(&ahead_ent, layout, m, maxw);
        }
        while (!done) {
            const int r = here.r, j = here.j;
            const uint32_t *off = mih_offsets(job, value, here);
            const uint32_t *pos = job->pos + (Py_ssize_t)j * nr;
            const uint16_t *sk = job->sk + (Py_ssize_t)j * nr;
            const unsigned qs = qsk[j];
            /* an item kept here (met here first) is at distance r in substring j, more than r in each substring
             * before j and at least r in each after it; in the next one at least as far as its sketch is */
            const int base = (m - 1) * r + (j < m - 1 ? j : m - 2), next_least = r + (j == m - 1);
            if (ahead_off.r <= maxw) {
                __builtin_prefetch(mih_offsets(job, value, ahead_off), 0, 0);
                mih_next(&ahead_off, layout, m, maxw);
            }
            if (ahead_ent.r <= maxw) {
                mih_ask_entries(job, value, ahead_ent);
                mih_next(&ahead_ent, layout, m, maxw);
            }
            const uint32_t end = off[1];
            cost8 += (int64_t)end - off[0] + 8 * MIH_BUCKET_COST;
            if ((cost8 >> 3) > job->budget) {
                gave_up = 1;
                break;
            }
            const int step_over = mih_next(&here, layout, m, maxw);
            for (uint64_t t0 = off[0]; t0 < end; t0 += MIH_CHUNK) {
                const int lim = f.kth - base; /* an entry whose sketch is farther is beyond the k-th found */
                if (next_least > lim)
                    break; /* every entry here is: the k-th distance only falls */
                if (tail + MIH_CHUNK > MIH_CHUNK + MIH_LAG) { /* room for a chunk */
                    memmove(cand, cand + head, (size_t)(tail - head) * sizeof *cand);
                    memmove(apart, apart + head, (size_t)(tail - head) * sizeof *apart);
                    tail -= head, head = 0;
                }
                const uint64_t t1 = end - t0 < MIH_CHUNK ? end : t0 + MIH_CHUNK;
                const int from = tail;
                for (uint64_t t = t0; t < t1; t++) { /* branch-free */
                    const uint32_t p = pos[t];
                    const int d = __builtin_popcount(qs ^ ((unsigned)sk[t] | (small ? (p >> 24) << 16 : 0u)));
                    cand[tail] = p & pos_mask;
                    apart[tail] = (uint8_t)d;
                    tail += d <= lim;
                }
                for (int c = from; c < tail; c++)
                    __builtin_prefetch(job->r + (Py_ssize_t)cand[c] * words, 0, 0);
                cost8 += (int64_t)7 * (tail - from); /* a code read: a whole unit with the eighth above */
                if (tail - head > MIH_LAG) {
                    failed = mih_check(&f, job, q, r, j, base, cand, apart, head, tail - MIH_LAG);
                    head = tail - MIH_LAG;
                    if (failed)
                        break;
                }
            }
            if (step_over && !failed) { /* substring j's radius r probed: the codes kept, then the bound */
                failed = mih_check(&f, job, q, r, j, base, cand, apart, head, tail);
                head = tail = 0;
                const int64_t bound = (int64_t)m * r + j + 1; /* every item nearer than this is found */
                int64_t below = 0;
                for (int d = 0; d < nd && d < bound; d++)
                    below += f.hist[d];
                done = below >= k || f.n == nr || here.r > maxw;
            }
            done |= failed;
        }
        if (failed)
            break;
        if (gave_up) {
            for (Py_ssize_t t = 0; t < k; t++)
                out_d[i * k + t] = out_p[i * k + t] = -1;
            continue;
        }
        /* the k smallest keys (distance, position) without sorting all that were found: those below the
         * distance where the histogram reaches k, and the ties at it, then a selection among them */
        int64_t before = 0;
        int at = 0;
        while (at < nd - 1 && before + f.hist[at] < k)
            before += f.hist[at++];
        const int64_t cut = ((int64_t)at + 1) * nr;
        Py_ssize_t n_sel = 0;
        for (Py_ssize_t t = 0; t < f.n; t++)
            if (f.keys[t] < cut)
                f.keys[n_sel++] = f.keys[t];
        select_smallest(f.keys, n_sel, k);
        qsort(f.keys, (size_t)k, sizeof(int64_t), cmp_int64); /* by (distance, position) */
        for (Py_ssize_t t = 0; t < k; t++) {
            out_d[i * k + t] = f.keys[t] / nr;
            out_p[i * k + t] = f.keys[t] % nr;
        }
    }
    free(f.keys), free(f.hist), free(value), free(qsk);
    return failed ? -1 : 0;
}

static int mih_generic(const MihJob *job, int64_t *d, int64_t *p) { return mih_body(job, d, p); }
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
__attribute__((target("popcnt"))) static int mih_popcnt(const MihJob *job, int64_t *d, int64_t *p)
{
    return mih_body(job, d, p);
}
#endif

/* ------------------------------------------------------- Python interface */

typedef struct {
    Py_buffer bufs[10];
    int n;
} Buffers;

static void release(Buffers *b)
{
    for (int i = 0; i < b->n; i++)
        PyBuffer_Release(&b->bufs[i]);
    b->n = 0;
}

/* Take a C-contiguous buffer of exactly `nbytes` bytes; writable when asked. */
static void *take(Buffers *b, PyObject *obj, Py_ssize_t nbytes, int writable, const char *what)
{
    Py_buffer *view = &b->bufs[b->n];
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return NULL;
    b->n++;
    if (view->len != nbytes) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd bytes, got %zd", what, nbytes, view->len);
        return NULL;
    }
    return view->buf;
}

/* The end of a call that got this far: the buffers go back; None, or MemoryError when out of memory. */
static PyObject *finish(Buffers *b, int out_of_memory)
{
    release(b);
    if (out_of_memory)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* Fill `job` from the arguments (and check k when the call takes one). -1 with an exception set when they are off. */
static int parse_job(Job *job, Buffers *b, PyObject *q, PyObject *r, Py_ssize_t nq, Py_ssize_t nr, int words,
                     int n_bits, int takes_k, Py_ssize_t k, PyObject *ql, PyObject *rl, int lwords)
{
    if (nq < 0 || nr < 1 || words < 1 || n_bits < 0 || n_bits > 64 * words || n_bits > 0xFFFF) {
        PyErr_Format(PyExc_ValueError, "bad sizes: nq=%zd nr=%zd words=%d n_bits=%d", nq, nr, words, n_bits);
        return -1;
    }
    if (takes_k && (k < 1 || k > nr)) {
        PyErr_Format(PyExc_ValueError, "k must be in 1 .. %zd, got %zd", nr, k);
        return -1;
    }
    job->nq = nq;
    job->nr = nr;
    job->words = words;
    job->n_bits = n_bits;
    job->lwords = lwords;
    job->ql = job->rl = NULL;
    if (!(job->q = take(b, q, nq * words * 8, 0, "query codes")) ||
        !(job->r = take(b, r, nr * words * 8, 0, "retrieval codes")))
        return -1;
    if (ql != NULL) {
        if (lwords < 1) {
            PyErr_SetString(PyExc_ValueError, "label_words must be >= 1");
            return -1;
        }
        if (!(job->ql = take(b, ql, nq * lwords * 8, 0, "query labels")) ||
            !(job->rl = take(b, rl, nr * lwords * 8, 0, "retrieval labels")))
            return -1;
    }
    return 0;
}

/* The first k items of every query of `job` by (distance, index); no GIL needed. -1: out of memory. */
static int top_k_run(const Job *job, Py_ssize_t k, int64_t *out_idx, int64_t *out_dist)
{
    const Py_ssize_t nd = job->n_bits + 1, nq = job->nq;
    int failed = 0;
    if (nd * k <= 65536) {
        /* queries in groups, so that the lists take at most 2**22 slots (32 MiB) */
        const Py_ssize_t cap = ((Py_ssize_t)1 << 22) / (nd * k);
        const Py_ssize_t group = nq < cap ? (nq ? nq : 1) : cap;
        int32_t *cnt = malloc((size_t)(group * nd) * sizeof(int32_t));
        int64_t *slot = malloc((size_t)(group * nd * k) * sizeof(int64_t));
        int *thr = malloc((size_t)group * sizeof(int));
        Py_ssize_t *lt = malloc((size_t)group * sizeof(Py_ssize_t));
        if (cnt && slot && thr && lt) {
            for (Py_ssize_t g0 = 0; g0 < nq; g0 += group) {
                Job part = *job;
                part.q = job->q + g0 * job->words;
                part.nq = g0 + group < nq ? group : nq - g0;
                memset(cnt, 0, (size_t)(part.nq * nd) * sizeof(int32_t));
                kernels->topk_buckets(&part, k, cnt, slot, thr, lt);
                for (Py_ssize_t i = 0; i < part.nq; i++) {
                    int64_t *o = out_idx + (g0 + i) * k, *od = out_dist + (g0 + i) * k;
                    Py_ssize_t n = 0;
                    for (int d = 0; d <= thr[i] && n < k; d++) {
                        const int32_t c = cnt[i * nd + d];
                        for (int32_t j = 0; j < c && n < k; j++, n++) {
                            o[n] = slot[(i * nd + d) * k + j];
                            od[n] = d;
                        }
                    }
                }
            }
        } else {
            failed = 1;
        }
        free(cnt);
        free(slot);
        free(thr);
        free(lt);
    } else {
        int64_t *hist = calloc((size_t)(nq * nd + 1), sizeof(int64_t));
        int *cut = malloc((size_t)(nq ? nq : 1) * sizeof(int));
        int64_t *left = malloc((size_t)(nq ? nq : 1) * sizeof(int64_t));
        if (hist && cut && left)
            kernels->topk_counting(job, k, hist, cut, left, out_idx, out_dist);
        else
            failed = 1;
        free(hist);
        free(cut);
        free(left);
    }
    return failed ? -1 : 0;
}

PyDoc_STRVAR(top_k_doc,
"top_k(query, retrieval, n_query, n_retrieval, words, n_bits, k, out_index, out_distance)\n--\n\n"
"Write the first k retrieval items of each query, by (Hamming distance, index), into\n"
"out_index and their distances into out_distance (both int64 [n_query, k]); 1 <= k <= n_retrieval.");

static PyObject *py_top_k(PyObject *self, PyObject *args)
{
    PyObject *q, *r, *out, *out_d;
    Py_ssize_t nq, nr, k;
    int words, n_bits, failed;
    if (!PyArg_ParseTuple(args, "OOnniinOO", &q, &r, &nq, &nr, &words, &n_bits, &k, &out, &out_d))
        return NULL;
    Buffers b = {.n = 0};
    Job job;
    if (parse_job(&job, &b, q, r, nq, nr, words, n_bits, 1, k, NULL, NULL, 0) < 0)
        goto fail;
    int64_t *out_idx = take(&b, out, nq * k * 8, 1, "out_index");
    int64_t *out_dist = out_idx ? take(&b, out_d, nq * k * 8, 1, "out_distance") : NULL;
    if (!out_dist)
        goto fail;
    Py_BEGIN_ALLOW_THREADS
    failed = top_k_run(&job, k, out_idx, out_dist);
    Py_END_ALLOW_THREADS
    return finish(&b, failed);
fail:
    release(&b);
    return NULL;
}

PyDoc_STRVAR(average_precision_doc,
"average_precision(query, retrieval, n_query, n_retrieval, words, n_bits, k, query_labels,\n"
"                  retrieval_labels, label_words, scale, out_total, out_found)\n--\n\n"
"AP@k in fixed point: out_total[i] = sum over the relevant items among the first k of\n"
"round(hits / position * scale), out_found[i] = relevant items among the first k; int64 [n_query].\n"
"k = n_retrieval ranks everything by counting, with no lists.");

static PyObject *py_average_precision(PyObject *self, PyObject *args)
{
    PyObject *q, *r, *ql, *rl, *ot, *of;
    Py_ssize_t nq, nr, k;
    int words, n_bits, lwords, failed = 0;
    double scale;
    if (!PyArg_ParseTuple(args, "OOnniinOOidOO", &q, &r, &nq, &nr, &words, &n_bits, &k, &ql, &rl, &lwords,
                          &scale, &ot, &of))
        return NULL;
    Buffers b = {.n = 0};
    Job job;
    if (parse_job(&job, &b, q, r, nq, nr, words, n_bits, 1, k, ql, rl, lwords) < 0)
        goto fail;
    int64_t *total = take(&b, ot, nq * 8, 1, "out_total");
    int64_t *found = total ? take(&b, of, nq * 8, 1, "out_found") : NULL;
    if (!found)
        goto fail;
    if (k == nr) {
        const Py_ssize_t nd = n_bits + 1;
        int64_t *h_all = calloc((size_t)(nq * nd + 1), sizeof(int64_t));
        int64_t *h_rel = calloc((size_t)(nq * nd + 1), sizeof(int64_t));
        failed = !h_all || !h_rel;
        if (!failed) {
            Py_BEGIN_ALLOW_THREADS
            kernels->ap_all(&job, scale, h_all, h_rel, total);
            for (Py_ssize_t i = 0; i < nq; i++) /* after pass 2: the last counter is 1 + relevant items */
                found[i] = h_rel[i * nd + nd - 1] - 1;
            Py_END_ALLOW_THREADS
        }
        free(h_all);
        free(h_rel);
        return finish(&b, failed);
    }
    /* ranked lists of up to 256 queries at a time */
    const Py_ssize_t group = nq < 256 ? (nq ? nq : 1) : 256;
    int64_t *idx = malloc((size_t)(group * k) * sizeof(int64_t));
    int64_t *dist = malloc((size_t)(group * k) * sizeof(int64_t));
    Py_BEGIN_ALLOW_THREADS
    failed = !idx || !dist;
    for (Py_ssize_t g0 = 0; g0 < nq && !failed; g0 += group) {
        Job part = job;
        part.q = job.q + g0 * words;
        part.ql = job.ql + g0 * lwords;
        part.nq = g0 + group < nq ? group : nq - g0;
        if (top_k_run(&part, k, idx, dist) < 0) {
            failed = 1;
            break;
        }
        for (Py_ssize_t i = 0; i < part.nq; i++) {
            const uint64_t *lq = part.ql + i * lwords;
            int64_t hits = 0, sum = 0;
            for (Py_ssize_t p = 0; p < k; p++) {
                const uint64_t *lr = job.rl + idx[i * k + p] * lwords;
                uint64_t any = 0;
                for (int w = 0; w < lwords; w++)
                    any |= lq[w] & lr[w];
                if (any) {
                    hits++;
                    sum += (int64_t)nearbyint((double)hits / (double)(p + 1) * scale);
                }
            }
            total[g0 + i] = sum;
            found[g0 + i] = hits;
        }
    }
    Py_END_ALLOW_THREADS
    free(idx);
    free(dist);
    return finish(&b, failed);
fail:
    release(&b);
    return NULL;
}

PyDoc_STRVAR(histograms_doc,
"histograms(query, retrieval, n_query, n_retrieval, words, n_bits, query_labels, retrieval_labels,\n"
"           label_words, out_all, out_relevant, k=0)\n--\n\n"
"Count, per query and distance 0..n_bits, the retrieval items (out_all) and those sharing a\n"
"label with the query (out_relevant); both int64 [n_query, n_bits + 1], overwritten.\n"
"With 1 <= k < n_retrieval, only the counts up to the distance of the k-th item are exact\n"
"(the rest are partial): what a top k depends on, at a fraction of the cost.");

static PyObject *py_histograms(PyObject *self, PyObject *args)
{
    PyObject *q, *r, *ql, *rl, *oa, *orel;
    Py_ssize_t nq, nr, k = 0;
    int words, n_bits, lwords;
    if (!PyArg_ParseTuple(args, "OOnniiOOiOO|n", &q, &r, &nq, &nr, &words, &n_bits, &ql, &rl, &lwords, &oa, &orel,
                          &k))
        return NULL;
    Buffers b = {.n = 0};
    Job job;
    if (parse_job(&job, &b, q, r, nq, nr, words, n_bits, 0, 0, ql, rl, lwords) < 0)
        goto fail;
    const Py_ssize_t nbytes = nq * (n_bits + 1) * 8;
    int64_t *h_all = take(&b, oa, nbytes, 1, "out_all");
    int64_t *h_rel = h_all ? take(&b, orel, nbytes, 1, "out_relevant") : NULL;
    if (!h_rel)
        goto fail;
    Py_BEGIN_ALLOW_THREADS
    memset(h_all, 0, (size_t)nbytes);
    memset(h_rel, 0, (size_t)nbytes);
    if (k >= 1 && k < nr)
        kernels->cut_histogram(&job, k, h_all, h_rel);
    else
        kernels->histogram(&job, h_all, h_rel);
    Py_END_ALLOW_THREADS
    return finish(&b, 0);
fail:
    release(&b);
    return NULL;
}

PyDoc_STRVAR(mih_search_doc,
"mih_search(queries, n_query, items, n_items, words, n_bits, k, layout, m, positions, offsets, n_offsets,\n"
"           sketches, small, budget, out_distance, out_position)\n--\n\n"
"Exact top k (1 <= k <= n_items) of each query by (Hamming distance, position) from multi-index\n"
"tables: layout int32 [m, 4] (word, bit offset, width, start in offsets), positions uint32\n"
"[m * n_items] (with small, n_items <= 2^24 and the top byte holds sketch bits 16-23), offsets uint32\n"
"[n_offsets], sketches uint16 [m * n_items] (each position's low 16 bits of the next substring);\n"
"outputs int64 [n_query, k]. A query that would cost more than\n"
"budget (entries whose code is read, buckets and passed-over entries as their share) stops: its\n"
"row is -1, for the linear scan.");

static PyObject *py_mih_search(PyObject *self, PyObject *args)
{
    PyObject *q, *r, *lay, *pos, *off, *sk, *od, *op;
    Py_ssize_t nq, nr, k, n_off;
    long long budget;
    int words, n_bits, m, small, failed = 0;
    if (!PyArg_ParseTuple(args, "OnOniinOiOOnOpLOO", &q, &nq, &r, &nr, &words, &n_bits, &k, &lay, &m, &pos, &off, &n_off,
                          &sk, &small, &budget, &od, &op))
        return NULL;
    if (nq < 0 || nr < 1 || words < 1 || m < 1 || k < 1 || k > nr || n_bits < 1 || n_bits > 64 * words ||
        nr > 0xFFFFFFFFLL || nq >= 0xFFFFFFFFLL || (small && nr > (1LL << 24))) {
        PyErr_SetString(PyExc_ValueError, "mih_search: sizes out of range");
        return NULL;
    }
    Buffers b = {.n = 0};
    MihJob job = {.nq = nq, .nr = nr, .k = k, .budget = budget, .words = words, .m = m, .n_bits = n_bits,
                  .small = small};
    job.q = take(&b, q, nq * words * 8, 0, "queries");
    job.r = job.q ? take(&b, r, nr * words * 8, 0, "items") : NULL;
    job.layout = job.r ? take(&b, lay, (Py_ssize_t)m * 16, 0, "layout") : NULL;
    job.pos = job.layout ? take(&b, pos, (Py_ssize_t)m * nr * 4, 0, "positions") : NULL;
    job.off = job.pos ? take(&b, off, n_off * 4, 0, "offsets") : NULL;
    job.sk = job.off ? take(&b, sk, (Py_ssize_t)m * nr * 2, 0, "sketches") : NULL;
    int64_t *out_d = job.sk ? take(&b, od, nq * k * 8, 1, "out_distance") : NULL;
    int64_t *out_p = out_d ? take(&b, op, nq * k * 8, 1, "out_position") : NULL;
    if (!out_p) {
        release(&b);
        return NULL;
    }
    for (int j = 0; j < m; j++) { /* every bucket offset read must lie in the array */
        const int32_t *l = job.layout + 4 * j;
        if (l[0] < 0 || l[0] >= words || l[1] < 0 || l[2] < 1 || l[2] > 30 || l[1] + l[2] > 64 || l[3] < 0 ||
            (int64_t)l[3] + (1LL << l[2]) + 1 > n_off) {
            release(&b);
            PyErr_Format(PyExc_ValueError, "mih_search: substring %d of the layout is out of range", j);
            return NULL;
        }
    }
    Py_BEGIN_ALLOW_THREADS
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    failed = (__builtin_cpu_supports("popcnt") && kernels != &GENERIC ? mih_popcnt : mih_generic)(&job, out_d, out_p);
#else
    failed = mih_generic(&job, out_d, out_p);
#endif
    Py_END_ALLOW_THREADS
    return finish(&b, failed < 0);
}

static PyObject *py_kernel_name(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(kernels->name);
}

static PyObject *py_use_generic(PyObject *self, PyObject *arg)
{
    int generic = PyObject_IsTrue(arg);
    if (generic < 0)
        return NULL;
    kernels = &GENERIC;
    if (!generic)
        choose_kernels();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"top_k", py_top_k, METH_VARARGS, top_k_doc},
    {"average_precision", py_average_precision, METH_VARARGS, average_precision_doc},
    {"histograms", py_histograms, METH_VARARGS, histograms_doc},
    {"mih_search", py_mih_search, METH_VARARGS, mih_search_doc},
    {"kernel_name", py_kernel_name, METH_NOARGS, "The build of the loops chosen for this CPU."},
    {"use_generic", py_use_generic, METH_O, "use_generic(True) forces the portable loops (tests); False re-chooses."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hamming", "Exact Hamming ranking kernels (see ucmfh.metrics.native).", -1, methods,
};

PyMODINIT_FUNC PyInit__hamming(void)
{
    choose_kernels();
    return PyModule_Create(&module);
}
