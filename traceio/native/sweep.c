/* phase_sweep: time per step and phase from segments at levels (analyze/tables/phases.py).
 *
 * The same sweep as phases.sweep in numpy: the boundaries of every segment and step, sorted;
 * for each elementary interval between two boundaries, which levels cover it (a bit mask)
 * and which step holds it. The phase of a mask comes from a table the caller builds with
 * phases.label, so the rules live in Python only; this file only sweeps. Boundaries are
 * sorted as 64-bit words: starts and ends apart, each by a natural merge sort (below:
 * a rank's segments come nearly sorted, which a radix sort does not use), then merged.
 *
 * Steps must be disjoint (the build's always are) and segments lie within 2^58 ns of each
 * other; otherwise the function returns None and the caller sweeps in numpy.
 */
#include "otf2native.h"

#include <stdlib.h>
#include <string.h>

/* A boundary packed in 64 bits: its time since the first boundary (SHIFT bits up), then
 * level * 2 + (0: a segment starts, 1: it ends). Sorting these sorts by time; boundaries at
 * the same time are applied together, so their order does not matter. */
enum { SHIFT = 6 };
#define MAX_SPAN (UINT64_C(1) << (64 - SHIFT))

/* A natural merge sort, for the nearly sorted: runs already in order are found, short ones
 * grown to MINRUN by insertion, and neighbours merged in rounds, each merge moving only
 * where the two runs overlap (a rank's segment ends come nearly sorted, and its starts: a
 * region starts just before the regions it calls, which end before it). The whole sweep of
 * a rank's 670k segments took 26 ms with it, 39 ms with an LSD radix sort, two thirds of
 * which was the sort. O(n log n) whatever the input. */
enum { MINRUN = 32 };

/* the first position in a[lo, hi) whose value is above v (upper) or not below it */
static size_t bound(const uint64_t *a, size_t lo, size_t hi, uint64_t v, int upper) {
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (upper ? a[mid] <= v : a[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Merge the sorted a[lo, mid) and a[mid, hi); ``tmp`` has room for mid - lo. */
static void merge_runs(uint64_t *a, size_t lo, size_t mid, size_t hi, uint64_t *tmp) {
    if (a[mid - 1] <= a[mid])
        return;
    size_t i = bound(a, lo, mid, a[mid], 1);     /* a[lo, i) stays where it is */
    size_t j = bound(a, mid, hi, a[mid - 1], 0); /* and a[j, hi) */
    size_t nl = mid - i, x = 0, y = mid, o = i;
    memcpy(tmp, a + i, nl * sizeof(uint64_t));
    while (x < nl && y < j)
        a[o++] = tmp[x] <= a[y] ? tmp[x++] : a[y++];
    while (x < nl)
        a[o++] = tmp[x++];
}

/* Sort ``a`` (n values) in place, ``tmp`` room for n. 0, or -1 when out of memory. */
static int sort_boundaries(uint64_t *a, uint64_t *tmp, size_t n) {
    if (n < 2)
        return 0;
    size_t cap = n / MINRUN + 2, runs = 0;
    size_t *end = malloc(cap * sizeof(size_t)); /* where each run ends */
    if (end == NULL)
        return -1;
    for (size_t start = 0; start < n;) {
        size_t stop = start + 1;
        while (stop < n && a[stop - 1] <= a[stop])
            stop++;
        if (stop - start < MINRUN) { /* grown by insertion, then on as far as it stays in order */
            size_t grown = start + MINRUN < n ? start + MINRUN : n;
            for (size_t k = stop; k < grown; k++) {
                uint64_t v = a[k];
                size_t at = k;
                while (at > start && a[at - 1] > v) {
                    a[at] = a[at - 1];
                    at--;
                }
                a[at] = v;
            }
            stop = grown;
            while (stop < n && a[stop - 1] <= a[stop])
                stop++;
        }
        end[runs++] = stop;
        start = stop;
    }
    while (runs > 1) { /* a round: runs 2k and 2k + 1 become one */
        size_t kept = 0;
        for (size_t r = 0; r < runs; r += 2) {
            size_t lo = r ? end[r - 1] : 0;
            if (r + 1 < runs)
                merge_runs(a, lo, end[r], end[r + 1], tmp);
            end[kept++] = end[r + 1 < runs ? r + 1 : r];
        }
        runs = kept;
    }
    free(end);
    return 0;
}

typedef struct {
    const int64_t *start, *end, *level;
    size_t n;
    const int64_t *step_start, *step_end;
    size_t k;
    const uint8_t *table; /* phase code of each cover mask */
    size_t table_len;
    int codes;
    int64_t *out; /* k x codes */
} Sweep;

typedef struct {
    int64_t start;
    size_t index;
} StepStart;

static int cmp_step(const void *a, const void *b) {
    const StepStart *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* 0: done; 1: steps overlap or the span is too long (nothing written); -1: out of memory. */
static int sweep_run(const Sweep *s) {
    size_t *order = malloc((s->k ? s->k : 1) * sizeof(size_t));
    uint64_t *b = malloc((2 * s->n + 1) * sizeof(uint64_t));
    uint64_t *tmp = malloc((2 * s->n + 1) * sizeof(uint64_t));
    int rc = -1;
    if (order == NULL || b == NULL || tmp == NULL)
        goto done;
    int in_order = 1;
    for (size_t j = 0; j < s->k; j++) {
        order[j] = j;
        if (j && s->step_start[j] < s->step_start[j - 1])
            in_order = 0;
    }
    if (!in_order) { /* the build's steps come sorted; others by start, then position */
        StepStart *by = malloc(s->k * sizeof(StepStart));
        if (by == NULL)
            goto done;
        for (size_t j = 0; j < s->k; j++)
            by[j] = (StepStart){s->step_start[j], j};
        qsort(by, s->k, sizeof(StepStart), cmp_step);
        for (size_t j = 0; j < s->k; j++)
            order[j] = by[j].index;
        free(by);
    }
    for (size_t j = 1; j < s->k; j++)
        if (s->step_start[order[j]] < s->step_end[order[j - 1]]) {
            rc = 1;
            goto done;
        }
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (size_t i = 0; i < s->n; i++)
        if (s->end[i] > s->start[i]) {
            lo = s->start[i] < lo ? s->start[i] : lo;
            hi = s->end[i] > hi ? s->end[i] : hi;
        }
    uint64_t span = lo <= hi ? (uint64_t)hi - (uint64_t)lo : 0;
    if (span >= MAX_SPAN) {
        rc = 1; /* over 2^58 ns (9 years) between boundaries: the numpy sweep does it */
        goto done;
    }
    /* the starts in b, the ends after them, each sorted, then merged into tmp */
    size_t h = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->end[i] <= s->start[i])
            continue; /* empty: covers nothing */
        uint64_t level = (uint64_t)s->level[i] * 2;
        b[h] = (((uint64_t)s->start[i] - (uint64_t)lo) << SHIFT) | level;
        b[s->n + h++] = (((uint64_t)s->end[i] - (uint64_t)lo) << SHIFT) | (level + 1);
    }
    uint64_t *starts = b, *ends = b + s->n, *sorted = tmp;
    if (sort_boundaries(starts, tmp, h) < 0 || sort_boundaries(ends, tmp, h) < 0)
        goto done;
    size_t m = 0, x = 0, y = 0;
    while (x < h && y < h)
        sorted[m++] = starts[x] <= ends[y] ? starts[x++] : ends[y++];
    while (x < h)
        sorted[m++] = starts[x++];
    while (y < h)
        sorted[m++] = ends[y++];
    int32_t cover[32] = {0};
    uint32_t mask = 0;
    size_t i = 0, p = 0;      /* next boundary, current step (in start order) */
    int64_t t = INT64_MIN;    /* left end of the current elementary interval */
    int started = 0;
    for (;;) {
        /* the next boundary time: a segment's, or the current step's start or end */
        int64_t next = INT64_MAX;
        int any = 0;
        if (i < m) {
            next = (int64_t)((uint64_t)lo + (sorted[i] >> SHIFT));
            any = 1;
        }
        while (p < s->k && s->step_end[order[p]] <= t)
            p++;
        if (p < s->k) {
            int64_t edge = s->step_start[order[p]] > t ? s->step_start[order[p]] : s->step_end[order[p]];
            if (!any || edge < next)
                next = edge;
            any = 1;
        }
        if (!any)
            break;
        if (started && p < s->k && s->step_start[order[p]] <= t && t < s->step_end[order[p]]) {
            uint8_t code = mask < s->table_len ? s->table[mask] : 0;
            s->out[order[p] * (size_t)s->codes + code] += next - t;
        }
        /* apply every segment boundary at ``next`` */
        while (i < m && (int64_t)((uint64_t)lo + (sorted[i] >> SHIFT)) == next) {
            int level = (int)((sorted[i] & ((1u << SHIFT) - 1)) >> 1);
            cover[level] += (sorted[i] & 1) ? -1 : 1;
            if (cover[level] > 0)
                mask |= UINT32_C(1) << level;
            else
                mask &= ~(UINT32_C(1) << level);
            i++;
        }
        t = next;
        started = 1;
    }
    rc = 0;
done:
    free(order);
    free(b);
    free(tmp);
    return rc;
}

static int int64_view(PyObject *obj, Py_buffer *view, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (view->itemsize != 8 || view->format == NULL || (strcmp(view->format, "q") && strcmp(view->format, "l"))) {
        PyErr_Format(PyExc_TypeError, "phase_sweep: %s must be a contiguous int64 array", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* phase_sweep(seg_start, seg_end, seg_level, step_start, step_end, table, codes)
 *   -> Column of len(step_start) x codes int64 (ns per step and phase), or None when it declines. */
PyObject *native_phase_sweep(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[5], *table_obj;
    int codes;
    if (!PyArg_ParseTuple(args, "OOOOOOi", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &table_obj, &codes))
        return NULL;
    static const char *names[5] = {"seg_start", "seg_end", "seg_level", "step_start", "step_end"};
    Py_buffer v[5] = {{0}}, tv = {0};
    int got = 0;
    PyObject *result = NULL;
    for (; got < 5; got++)
        if (int64_view(objs[got], &v[got], names[got]) < 0)
            goto done;
    if (PyObject_GetBuffer(table_obj, &tv, PyBUF_SIMPLE) < 0)
        goto done;
    size_t n = (size_t)v[0].len / 8, k = (size_t)v[3].len / 8;
    if ((size_t)v[1].len / 8 != n || (size_t)v[2].len / 8 != n || (size_t)v[4].len / 8 != k || codes < 1) {
        PyErr_SetString(PyExc_ValueError, "phase_sweep: segment columns (or step columns) differ in length");
        goto done;
    }
    const int64_t *level = v[2].buf;
    for (size_t i = 0; i < n; i++)
        if (level[i] < 0 || level[i] >= 31 || (INT64_C(1) << level[i]) >= (int64_t)tv.len) {
            PyErr_SetString(PyExc_ValueError, "phase_sweep: a segment level has no bit in the table of cover masks");
            goto done;
        }
    for (size_t j = 0; j < (size_t)tv.len; j++)
        if (((const uint8_t *)tv.buf)[j] >= codes) {
            PyErr_SetString(PyExc_ValueError, "phase_sweep: the table holds a code beyond codes");
            goto done;
        }
    int64_t *out = calloc(k ? k * (size_t)codes : 1, sizeof(int64_t));
    if (out == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Sweep s = {v[0].buf, v[1].buf, level, n, v[3].buf, v[4].buf, k, tv.buf, (size_t)tv.len, codes, out};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sweep_run(&s);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        free(out);
        PyErr_NoMemory();
    } else if (rc > 0) {
        free(out);
        result = Py_NewRef(Py_None);
    } else {
        result = column_new((char *)out, k * (size_t)codes * sizeof(int64_t));
    }
done:
    for (int j = 0; j < got; j++)
        PyBuffer_Release(&v[j]);
    if (tv.obj != NULL)
        PyBuffer_Release(&tv);
    return result;
}
