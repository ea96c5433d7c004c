/* The merge's per-record loops (instrument/merge.py _replay_thread and _lanes), in C.
 *
 * Both produce record arrays identical to the Python versions, which stay as the fallback
 * and as the reference the tests compare against.
 */
#include "otf2native.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    Record *r;
    size_t n, cap;
} Records;

static int records_push(Records *o, Record rec) {
    if (o->n == o->cap) {
        size_t cap = o->cap < 64 ? 64 : o->cap + o->cap / 2;
        Record *p = realloc(o->r, cap * sizeof(Record));
        if (p == NULL)
            return -1;
        o->r = p;
        o->cap = cap;
    }
    o->r[o->n++] = rec;
    return 0;
}

static inline Record region_record(int64_t t, uint32_t region, uint16_t loc, uint8_t kind) {
    return (Record){t, 0, 0, 0, region, -1, -1, loc, kind, 0};
}

static int get_records(PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    if (view->len % (Py_ssize_t)sizeof(Record) != 0) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "records must be whole 48-byte EVENT_DTYPE records");
        return -1;
    }
    return 0;
}

static int contains(const int64_t *sorted, size_t n, int64_t x) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && sorted[lo] == x;
}

typedef struct {
    uint32_t recorded, written;
    size_t pos; /* index of its ENTER in the output */
} Open;

/* The ENTER / LEAVE / COLL_END records of thread ``loc`` among a rank's records -> that
 * thread's properly nested OTF2 record stream (other kinds and threads are skipped). Region
 * and communicator ids are the rank's own: ``region_map`` and ``comm_map`` give the archive's,
 * and records of regions beyond ``region_map`` (definitions lost with a killed rank) are
 * dropped, as merge._known and merge._remap do. */
PyObject *native_replay_thread(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *recs_obj, *discard_obj, *regions_obj, *comms_obj;
    unsigned int loc;
    unsigned long step, tail;
    long long end_t;
    if (!PyArg_ParseTuple(args, "OIkkOLOO", &recs_obj, &loc, &step, &tail, &discard_obj, &end_t,
                          &regions_obj, &comms_obj))
        return NULL;
    Py_buffer in, disc = {0}, regs = {0}, comms = {0};
    if (get_records(recs_obj, &in) < 0)
        return NULL;
    if (PyObject_GetBuffer(discard_obj, &disc, PyBUF_SIMPLE) < 0 ||
        PyObject_GetBuffer(regions_obj, &regs, PyBUF_SIMPLE) < 0 ||
        PyObject_GetBuffer(comms_obj, &comms, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&in);
        if (disc.obj)
            PyBuffer_Release(&disc);
        if (regs.obj)
            PyBuffer_Release(&regs);
        return NULL;
    }
    const Record *rec = in.buf;
    size_t n = (size_t)in.len / sizeof(Record);
    const int64_t *discard = disc.buf;
    size_t ndiscard = (size_t)disc.len / sizeof(int64_t);
    const uint32_t *region_map = regs.buf;
    size_t nregions = (size_t)regs.len / sizeof(uint32_t);
    const int32_t *comm_map = comms.buf;
    int32_t ncomms = (int32_t)(comms.len / (Py_ssize_t)sizeof(int32_t));

    Records out = {0};
    Open *stack = NULL;
    size_t depth = 0, stack_cap = 0;
    long long steps_seen = 0, steps_kept = 0, bad = 0, closed = 0;
    int oom = 0;
    Py_BEGIN_ALLOW_THREADS
    for (size_t i = 0; i < n && !oom; i++) {
        const Record *r = &rec[i];
        if (r->loc != loc)
            continue; /* another thread's, or not a thread's (ASYNC_COLL) */
        uint32_t region = 0;
        if (r->kind == K_ENTER || r->kind == K_LEAVE) {
            if (r->region >= nregions)
                continue;
            region = region_map[r->region];
        }
        if (r->kind == K_ENTER) {
            uint32_t written = region;
            if (region == step) {
                if (contains(discard, ndiscard, steps_seen))
                    written = (uint32_t)tail;
                else
                    steps_kept++;
                steps_seen++;
            }
            if (depth == stack_cap) {
                stack_cap = stack_cap ? 2 * stack_cap : 64;
                Open *s = realloc(stack, stack_cap * sizeof(Open));
                if (s == NULL) {
                    oom = 1;
                    break;
                }
                stack = s;
            }
            stack[depth++] = (Open){region, written, out.n};
            oom = records_push(&out, region_record(r->time, written, (uint16_t)loc, K_ENTER)) < 0;
        } else if (r->kind == K_LEAVE) {
            size_t d = depth;
            while (d > 0 && stack[d - 1].recorded != region)
                d--;
            if (d == 0) {
                bad++;
                continue;
            }
            while (depth >= d && !oom)
                oom = records_push(&out, region_record(r->time, stack[--depth].written,
                                                       (uint16_t)loc, K_LEAVE)) < 0;
        } else if (r->kind == K_COLL_END) {
            if (depth == 0) {
                bad++;
                continue;
            }
            /* the collective began when its region was entered: insert the begin after it */
            size_t at = stack[depth - 1].pos + 1;
            int64_t begin_t = out.r[at - 1].time;
            if (records_push(&out, region_record(0, 0, 0, 0)) < 0) {
                oom = 1;
                break;
            }
            memmove(&out.r[at + 1], &out.r[at], (out.n - 1 - at) * sizeof(Record));
            out.r[at] = region_record(begin_t, 0, (uint16_t)loc, K_COLL_BEGIN);
            int32_t comm = r->comm >= 0 && r->comm < ncomms ? comm_map[r->comm] : r->comm;
            Record end = {r->time, 0, r->bytes_sent, r->bytes_recv, 0, comm, r->root,
                          (uint16_t)loc, K_COLL_END, r->op};
            oom = records_push(&out, end) < 0;
        }
    }
    closed = (long long)depth;
    int64_t last = end_t;
    if (out.n && out.r[out.n - 1].time > last)
        last = out.r[out.n - 1].time;
    while (depth > 0 && !oom)
        oom = records_push(&out, region_record(last, stack[--depth].written, (uint16_t)loc,
                                               K_LEAVE)) < 0;
    Py_END_ALLOW_THREADS
    free(stack);
    PyBuffer_Release(&in);
    PyBuffer_Release(&disc);
    PyBuffer_Release(&regs);
    PyBuffer_Release(&comms);
    if (oom) {
        free(out.r);
        return PyErr_NoMemory();
    }
    PyObject *col = column_new((char *)out.r, out.n * sizeof(Record));
    if (col == NULL)
        return NULL;
    return Py_BuildValue("(NLLL)", col, steps_kept, closed, bad);
}

/* Time-sorted ASYNC_COLL records -> one stream per lane, each lane the first free one. */
PyObject *native_lanes(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *recs_obj;
    unsigned int first_index;
    if (!PyArg_ParseTuple(args, "OI", &recs_obj, &first_index))
        return NULL;
    Py_buffer in;
    if (get_records(recs_obj, &in) < 0)
        return NULL;
    const Record *rec = in.buf;
    size_t n = (size_t)in.len / sizeof(Record);
    int64_t *lane_free = NULL;
    Records *lanes = NULL;
    size_t nlanes = 0, cap = 0;
    int oom = 0;
    Py_BEGIN_ALLOW_THREADS
    for (size_t i = 0; i < n && !oom; i++) {
        const Record *r = &rec[i];
        int64_t t = r->time, end = r->aux > t ? r->aux : t;
        size_t lane = 0;
        while (lane < nlanes && lane_free[lane] > t)
            lane++;
        if (lane == nlanes) {
            if (nlanes == cap) {
                cap = cap ? 2 * cap : 8;
                int64_t *f = realloc(lane_free, cap * sizeof(int64_t));
                Records *l = f ? realloc(lanes, cap * sizeof(Records)) : NULL;
                if (f)
                    lane_free = f;
                if (l == NULL) {
                    oom = 1;
                    break;
                }
                lanes = l;
            }
            lanes[nlanes++] = (Records){0};
        }
        lane_free[lane] = end;
        uint16_t index = (uint16_t)(first_index + lane);
        Record coll_end = {end, 0, r->bytes_sent, r->bytes_recv, 0, r->comm, r->root,
                           index, K_COLL_END, r->op};
        Records *o = &lanes[lane];
        oom = records_push(o, region_record(t, r->region, index, K_ENTER)) < 0 ||
              records_push(o, region_record(t, 0, index, K_COLL_BEGIN)) < 0 ||
              records_push(o, coll_end) < 0 ||
              records_push(o, region_record(end, r->region, index, K_LEAVE)) < 0;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    free(lane_free);
    PyObject *result = oom ? PyErr_NoMemory() : PyList_New((Py_ssize_t)nlanes);
    for (size_t i = 0; i < nlanes; i++) {
        if (result == NULL) {
            free(lanes[i].r);
            continue;
        }
        PyObject *col = column_new((char *)lanes[i].r, lanes[i].n * sizeof(Record));
        PyObject *item = col ? Py_BuildValue("(IN)", first_index + (unsigned int)i, col) : NULL;
        if (item == NULL) {
            Py_CLEAR(result);
            continue;
        }
        PyList_SET_ITEM(result, (Py_ssize_t)i, item);
    }
    free(lanes);
    return result;
}
