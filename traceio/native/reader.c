/* Reader: OTF2 events of some locations -> interval, collective, message and metric columns.
 *
 * Applies exactly the rules of analyze/columns.py (IntervalBuilder), location by location:
 * each Reader owns its own OTF2_Reader over the archive and reads its locations one after
 * the other with local event readers, which apply the archive's mapping tables and
 * ClockOffset interpolation (otf2_evt_reader_apply_clock_correction) just as the global event
 * reader the ``otf2`` package uses does. ``read`` runs without the GIL, so Readers over
 * different locations work in parallel threads.
 */
#include "otf2native.h"

#include <otf2/otf2.h>
#include <stdlib.h>
#include <string.h>

#if OTF2_VERSION_MAJOR < 3
#error "dltrace's native reader needs OTF2 >= 3.0"
#endif

#define NS 1000000000ULL
#define BATCH 65536
#define CHUNK_ROOM ((size_t)1 << 20) /* intervals given room at once when the events are not declared */
#define UNDEFINED_U32 0xFFFFFFFFu

/* Rows waiting for the instance ``idx`` to close (a handful at a time: regions performing a
 * collective or a message are open while it happens). */
typedef struct {
    size_t *row;
    int64_t *idx;
    size_t n, cap;
} Waiting;

/* An open region instance: the region, its idx on the location, its enter time and the
 * summed durations of its direct children closed so far (for its exclusive time). */
typedef struct {
    uint64_t region;
    int64_t idx;
    int64_t start;
    int64_t children;
} Frame;

typedef struct {
    PyObject_HEAD
    OTF2_Reader *otf2;
    size_t nloc;
    uint64_t *locs;
    int32_t *ranks;
    uint64_t *declared; /* events each location's definition declares (0: unknown) */
    uint64_t loc_read;  /* events read on the current location */
    OTF2_EvtReader *evt; /* the current location's event reader, opened when it starts: a
                            reader holds a chunk buffer (1 MB), too much for every location */
    OTF2_EvtReaderCallbacks *callbacks;
    int defs_open;
    size_t cur; /* the location being read */
    /* state of the current location */
    Frame *stack;
    size_t depth, stack_cap;
    int64_t next_idx;
    int coll_open;
    int64_t coll_idx, coll_t;
    /* the instance performing the open collective: region (-1: none), enter, and its leave
       if it closed before the collective's end record */
    int64_t coll_region, coll_start, coll_leave;
    int coll_closed;
    int64_t last_t;
    /* collective and message rows whose performing instance is still open: they get its leave
       time when it closes, and only the rows before the first of them are handed out */
    Waiting co_wait, me_wait;
    /* ticks -> ns */
    uint64_t offset, resolution;
    /* results since the last read() */
    Table iv, co, me, mt;
    uint64_t events, unmatched_leaves, truncated, unmatched_coll_ends;
    int out_of_memory;
    int busy;
} Reader;

static const size_t IV_WIDTHS[] = {8, 4, 8, 8, 4, 8, 8, 8, 1, 8};
static const size_t CO_WIDTHS[] = {8, 4, 8, 8, 8, 4, 8, 8, 8, 8, 8, 8, 8};
static const size_t ME_WIDTHS[] = {8, 4, 1, 8, 8, 8, 8, 8, 8, 8, 8};
static const size_t MT_WIDTHS[] = {8, 4, 8, 4, 8, 8};
enum { CO_REGION = 10, CO_ENTER = 11, CO_LEAVE = 12, ME_ENTER = 9, ME_LEAVE = 10 };

#define COL(t, i, type) (((type *)(t)->data[i])[(t)->rows])

/* analyze.columns.ticks_to_ns: floor((ticks - offset) * 1e9 / resolution), exactly. */
static inline int64_t to_ns(const Reader *r, uint64_t ticks) {
    if (r->resolution == NS)
        return (int64_t)(ticks - r->offset);
    if (ticks >= r->offset && r->resolution <= 18000000000ULL) {
        /* rem < resolution <= 1.8e10, so rem * 1e9 fits in 64 unsigned bits */
        uint64_t d = ticks - r->offset, q = d / r->resolution, rem = d - q * r->resolution;
        return (int64_t)(q * NS + rem * NS / r->resolution);
    }
    __int128 d = (__int128)ticks - (__int128)r->offset, res = (__int128)r->resolution;
    __int128 q = d / res, rem = d % res;
    if (rem < 0) { /* C truncates toward zero; Python floors */
        q -= 1;
        rem += res;
    }
    return (int64_t)(q * (__int128)NS + rem * (__int128)NS / res);
}

static OTF2_CallbackCode out_of_memory(Reader *r) {
    r->out_of_memory = 1;
    return OTF2_CALLBACK_INTERRUPT;
}

static inline int64_t top_idx(const Reader *r) {
    return r->depth ? r->stack[r->depth - 1].idx : -1;
}

static int wait_for(Waiting *w, size_t row, int64_t idx) {
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        size_t *rows = realloc(w->row, cap * sizeof(size_t));
        if (rows == NULL)
            return -1;
        w->row = rows;
        int64_t *idxs = realloc(w->idx, cap * sizeof(int64_t));
        if (idxs == NULL)
            return -1;
        w->idx = idxs;
        w->cap = cap;
    }
    w->row[w->n] = row;
    w->idx[w->n++] = idx;
    return 0;
}

/* The instance ``idx`` closed at ``t``: its waiting rows get their leave time. */
static void resolve(Waiting *w, Table *t, int col, int64_t idx, int64_t leave) {
    size_t k = 0;
    for (size_t i = 0; i < w->n; i++) {
        if (w->idx[i] == idx) {
            ((int64_t *)t->data[col])[w->row[i]] = leave;
        } else {
            w->row[k] = w->row[i];
            w->idx[k++] = w->idx[i];
        }
    }
    w->n = k;
}

/* Rows of ``t`` that may be handed out: those before the first still waiting. */
static size_t ready_rows(const Waiting *w, const Table *t) {
    size_t first = t->rows;
    for (size_t i = 0; i < w->n; i++)
        if (w->row[i] < first)
            first = w->row[i];
    return first;
}

static void waiting_handed_out(Waiting *w, size_t rows) {
    for (size_t i = 0; i < w->n; i++)
        w->row[i] -= rows;
}

/* Close the topmost open instance at time t (the caller reserved a row). */
static inline void close_top(Reader *r, int64_t t, uint8_t truncated) {
    Frame f = r->stack[--r->depth];
    Table *iv = &r->iv;
    if (r->depth)
        r->stack[r->depth - 1].children += t - f.start;
    COL(iv, 0, int64_t) = (int64_t)r->locs[r->cur];
    COL(iv, 1, int32_t) = r->ranks[r->cur];
    COL(iv, 2, int64_t) = f.idx;
    COL(iv, 3, int64_t) = top_idx(r);
    COL(iv, 4, int32_t) = (int32_t)r->depth;
    COL(iv, 5, int64_t) = (int64_t)f.region;
    COL(iv, 6, int64_t) = f.start;
    COL(iv, 7, int64_t) = t;
    COL(iv, 8, uint8_t) = truncated;
    COL(iv, 9, int64_t) = t - f.start - f.children;
    iv->rows++;
    r->truncated += truncated;
    if (r->co_wait.n)
        resolve(&r->co_wait, &r->co, CO_LEAVE, f.idx, t);
    if (r->me_wait.n)
        resolve(&r->me_wait, &r->me, ME_LEAVE, f.idx, t);
    if (r->coll_open && r->coll_idx == f.idx) {
        r->coll_closed = 1;
        r->coll_leave = t;
    }
}

static OTF2_CallbackCode on_enter(OTF2_LocationRef loc, OTF2_TimeStamp time, uint64_t pos,
                                  void *ud, OTF2_AttributeList *attrs, OTF2_RegionRef region) {
    (void)loc, (void)pos, (void)attrs;
    Reader *r = ud;
    int64_t t = to_ns(r, time);
    r->events++;
    r->last_t = t;
    if (r->depth == r->stack_cap) {
        size_t cap = r->stack_cap ? 2 * r->stack_cap : 64;
        Frame *s = realloc(r->stack, cap * sizeof(Frame));
        if (s == NULL)
            return out_of_memory(r);
        r->stack = s;
        r->stack_cap = cap;
    }
    r->stack[r->depth++] = (Frame){region, r->next_idx++, t, 0};
    return OTF2_CALLBACK_SUCCESS;
}

static OTF2_CallbackCode on_leave(OTF2_LocationRef loc, OTF2_TimeStamp time, uint64_t pos,
                                  void *ud, OTF2_AttributeList *attrs, OTF2_RegionRef region) {
    (void)loc, (void)pos, (void)attrs;
    Reader *r = ud;
    int64_t t = to_ns(r, time);
    r->events++;
    r->last_t = t;
    size_t d = r->depth;
    while (d > 0 && r->stack[d - 1].region != region)
        d--;
    if (d == 0) {
        r->unmatched_leaves++;
        return OTF2_CALLBACK_SUCCESS;
    }
    /* instances above the matching one close first, truncated */
    if (table_reserve(&r->iv, r->depth - d + 1) < 0)
        return out_of_memory(r);
    while (r->depth > d)
        close_top(r, t, 1);
    close_top(r, t, 0);
    return OTF2_CALLBACK_SUCCESS;
}

static OTF2_CallbackCode on_coll_begin(OTF2_LocationRef loc, OTF2_TimeStamp time, uint64_t pos,
                                       void *ud, OTF2_AttributeList *attrs) {
    (void)loc, (void)pos, (void)attrs;
    Reader *r = ud;
    int64_t t = to_ns(r, time);
    r->events++;
    r->last_t = t;
    r->coll_open = 1;
    r->coll_idx = top_idx(r);
    r->coll_t = t;
    r->coll_closed = 0;
    if (r->depth) {
        r->coll_region = (int64_t)r->stack[r->depth - 1].region;
        r->coll_start = r->stack[r->depth - 1].start;
    } else {
        r->coll_region = -1;
        r->coll_start = t;
    }
    return OTF2_CALLBACK_SUCCESS;
}

static OTF2_CallbackCode on_coll_end(OTF2_LocationRef loc, OTF2_TimeStamp time, uint64_t pos,
                                     void *ud, OTF2_AttributeList *attrs, OTF2_CollectiveOp op,
                                     OTF2_CommRef comm, uint32_t root, uint64_t sent,
                                     uint64_t recv) {
    (void)loc, (void)pos, (void)attrs;
    Reader *r = ud;
    int64_t t = to_ns(r, time);
    r->events++;
    r->last_t = t;
    if (!r->coll_open) {
        r->unmatched_coll_ends++;
        return OTF2_CALLBACK_SUCCESS;
    }
    r->coll_open = 0;
    Table *co = &r->co;
    if (table_reserve(co, 1) < 0)
        return out_of_memory(r);
    COL(co, 0, int64_t) = (int64_t)r->locs[r->cur];
    COL(co, 1, int32_t) = r->ranks[r->cur];
    COL(co, 2, int64_t) = r->coll_idx;
    COL(co, 3, int64_t) = r->coll_t;
    COL(co, 4, int64_t) = t;
    COL(co, 5, int32_t) = (int32_t)op;
    COL(co, 6, int64_t) = (int64_t)comm;
    COL(co, 7, int64_t) = root == UNDEFINED_U32 ? -1 : (int64_t)root;
    COL(co, 8, int64_t) = (int64_t)sent;
    COL(co, 9, int64_t) = (int64_t)recv;
    COL(co, CO_REGION, int64_t) = r->coll_region;
    COL(co, CO_ENTER, int64_t) = r->coll_start;
    /* no performing instance: the records' own times */
    COL(co, CO_LEAVE, int64_t) = r->coll_idx < 0 ? t : r->coll_leave;
    if (r->coll_idx >= 0 && !r->coll_closed && wait_for(&r->co_wait, co->rows, r->coll_idx) < 0)
        return out_of_memory(r);
    co->rows++;
    return OTF2_CALLBACK_SUCCESS;
}

static OTF2_CallbackCode message(Reader *r, OTF2_TimeStamp time, int8_t direction, uint32_t peer,
                                 OTF2_CommRef comm, uint32_t tag, uint64_t length) {
    int64_t t = to_ns(r, time);
    r->events++;
    r->last_t = t;
    Table *me = &r->me;
    if (table_reserve(me, 1) < 0)
        return out_of_memory(r);
    COL(me, 0, int64_t) = (int64_t)r->locs[r->cur];
    COL(me, 1, int32_t) = r->ranks[r->cur];
    COL(me, 2, int8_t) = direction;
    COL(me, 3, int64_t) = (int64_t)peer;
    COL(me, 4, int64_t) = (int64_t)comm;
    COL(me, 5, int64_t) = (int64_t)tag;
    COL(me, 6, int64_t) = (int64_t)length;
    COL(me, 7, int64_t) = t;
    COL(me, 8, int64_t) = top_idx(r);
    COL(me, ME_ENTER, int64_t) = r->depth ? r->stack[r->depth - 1].start : t;
    COL(me, ME_LEAVE, int64_t) = t;
    if (r->depth && wait_for(&r->me_wait, me->rows, top_idx(r)) < 0)
        return out_of_memory(r);
    me->rows++;
    return OTF2_CALLBACK_SUCCESS;
}

static OTF2_CallbackCode on_send(OTF2_LocationRef loc, OTF2_TimeStamp time, uint64_t pos, void *ud,
                                 OTF2_AttributeList *attrs, uint32_t receiver, OTF2_CommRef comm,
                                 uint32_t tag, uint64_t length) {
    (void)loc, (void)pos, (void)attrs;
    return message(ud, time, 0, receiver, comm, tag, length);
}

static OTF2_CallbackCode on_isend(OTF2_LocationRef loc, OTF2_TimeStamp time, uint64_t pos, void *ud,
                                  OTF2_AttributeList *attrs, uint32_t receiver, OTF2_CommRef comm,
                                  uint32_t tag, uint64_t length, uint64_t request) {
    (void)loc, (void)pos, (void)attrs, (void)request;
    return message(ud, time, 0, receiver, comm, tag, length);
}

static OTF2_CallbackCode on_recv(OTF2_LocationRef loc, OTF2_TimeStamp time, uint64_t pos, void *ud,
                                 OTF2_AttributeList *attrs, uint32_t sender, OTF2_CommRef comm,
                                 uint32_t tag, uint64_t length) {
    (void)loc, (void)pos, (void)attrs;
    return message(ud, time, 1, sender, comm, tag, length);
}

static OTF2_CallbackCode on_irecv(OTF2_LocationRef loc, OTF2_TimeStamp time, uint64_t pos, void *ud,
                                  OTF2_AttributeList *attrs, uint32_t sender, OTF2_CommRef comm,
                                  uint32_t tag, uint64_t length, uint64_t request) {
    (void)loc, (void)pos, (void)attrs, (void)request;
    return message(ud, time, 1, sender, comm, tag, length);
}

/* One row per value (analyze.columns METRIC_COLUMNS); values as float64, INT64 and UINT64
 * converted by C's rules (round to nearest), as Python's float() converts them. */
static OTF2_CallbackCode on_metric(OTF2_LocationRef loc, OTF2_TimeStamp time, uint64_t pos,
                                   void *ud, OTF2_AttributeList *attrs, OTF2_MetricRef metric,
                                   uint8_t n, const OTF2_Type *types,
                                   const OTF2_MetricValue *values) {
    (void)loc, (void)pos, (void)attrs;
    Reader *r = ud;
    int64_t t = to_ns(r, time);
    r->events++;
    r->last_t = t;
    Table *mt = &r->mt;
    if (table_reserve(mt, n) < 0)
        return out_of_memory(r);
    for (uint8_t i = 0; i < n; i++) {
        double v;
        switch (types[i]) {
        case OTF2_TYPE_INT64:
            v = (double)values[i].signed_int;
            break;
        case OTF2_TYPE_UINT64:
            v = (double)values[i].unsigned_int;
            break;
        default:
            v = values[i].floating_point;
        }
        COL(mt, 0, int64_t) = (int64_t)r->locs[r->cur];
        COL(mt, 1, int32_t) = r->ranks[r->cur];
        COL(mt, 2, int64_t) = (int64_t)metric;
        COL(mt, 3, int32_t) = (int32_t)i;
        COL(mt, 4, int64_t) = t;
        COL(mt, 5, double) = v;
        mt->rows++;
    }
    return OTF2_CALLBACK_SUCCESS;
}

/* Any other event only counts as the location's latest activity. */
static OTF2_CallbackCode on_other(OTF2_LocationRef loc, OTF2_TimeStamp time, uint64_t pos,
                                  void *ud, OTF2_AttributeList *attrs) {
    (void)loc, (void)pos, (void)attrs;
    Reader *r = ud;
    r->events++;
    r->last_t = to_ns(r, time);
    return OTF2_CALLBACK_SUCCESS;
}

/* Decoding only (Reader(decode_only=True)): every event is counted and nothing else, to
 * measure what the OTF2 library's decoding costs by itself (bench/scale.py). */
static OTF2_CallbackCode on_count(OTF2_LocationRef loc, OTF2_TimeStamp time, uint64_t pos,
                                  void *ud, OTF2_AttributeList *attrs) {
    (void)loc, (void)time, (void)pos, (void)attrs;
    ((Reader *)ud)->events++;
    return OTF2_CALLBACK_SUCCESS;
}

/* Every event callback starts with (location, time, position, userData, attributes); on_other
 * reads only those, so it serves for all record types without per-type stubs. Calling it
 * through the per-type pointer type relies on the platform C calling convention (caller
 * passes and cleans up the extra arguments), which holds on the System V and AAPCS ABIs. */
#define OTHER_EVENTS                                                                           \
    X(BufferFlush) X(CallingContextEnter) X(CallingContextLeave) X(CallingContextSample)       \
    X(CommCreate) X(CommDestroy) X(IoAcquireLock) X(IoChangeStatusFlags) X(IoCreateHandle)     \
    X(IoDeleteFile) X(IoDestroyHandle) X(IoDuplicateHandle) X(IoOperationBegin)                \
    X(IoOperationCancelled) X(IoOperationComplete) X(IoOperationIssued) X(IoOperationTest)     \
    X(IoReleaseLock) X(IoSeek) X(IoTryLock) X(MeasurementOnOff) X(MpiIrecvRequest)             \
    X(MpiIsendComplete) X(MpiRequestCancelled) X(MpiRequestTest)                               \
    X(NonBlockingCollectiveComplete) X(NonBlockingCollectiveRequest) X(OmpAcquireLock)         \
    X(OmpFork) X(OmpJoin) X(OmpReleaseLock) X(OmpTaskComplete) X(OmpTaskCreate)                \
    X(OmpTaskSwitch) X(ParameterInt) X(ParameterString) X(ParameterUnsignedInt)                \
    X(ProgramBegin) X(ProgramEnd) X(RmaAcquireLock) X(RmaAtomic) X(RmaCollectiveBegin)         \
    X(RmaCollectiveEnd) X(RmaGet) X(RmaGroupSync) X(RmaOpCompleteBlocking)                     \
    X(RmaOpCompleteNonBlocking) X(RmaOpCompleteRemote) X(RmaOpTest) X(RmaPut)                  \
    X(RmaReleaseLock) X(RmaRequestLock) X(RmaSync) X(RmaTryLock) X(RmaWaitChange)              \
    X(RmaWinCreate) X(RmaWinDestroy) X(ThreadAcquireLock) X(ThreadBegin) X(ThreadCreate)       \
    X(ThreadEnd) X(ThreadFork) X(ThreadJoin) X(ThreadReleaseLock) X(ThreadTaskComplete)        \
    X(ThreadTaskCreate) X(ThreadTaskSwitch) X(ThreadTeamBegin) X(ThreadTeamEnd) X(ThreadWait)

#define COUNTED_EVENTS                                                                         \
    X(Enter) X(Leave) X(MpiCollectiveBegin) X(MpiCollectiveEnd) X(MpiSend) X(MpiIsend) X(MpiRecv) \
    X(MpiIrecv) X(Metric)

static void set_callbacks(OTF2_EvtReaderCallbacks *cbs, int decode_only) {
    if (decode_only) {
        OTF2_EvtReaderCallbacks_SetUnknownCallback(cbs, on_count);
#define X(name) \
    OTF2_EvtReaderCallbacks_Set##name##Callback(cbs, (OTF2_EvtReaderCallback_##name)(void (*)(void))on_count);
        COUNTED_EVENTS
        OTHER_EVENTS
#undef X
        return;
    }
    OTF2_EvtReaderCallbacks_SetEnterCallback(cbs, on_enter);
    OTF2_EvtReaderCallbacks_SetLeaveCallback(cbs, on_leave);
    OTF2_EvtReaderCallbacks_SetMpiCollectiveBeginCallback(cbs, on_coll_begin);
    OTF2_EvtReaderCallbacks_SetMpiCollectiveEndCallback(cbs, on_coll_end);
    OTF2_EvtReaderCallbacks_SetMpiSendCallback(cbs, on_send);
    OTF2_EvtReaderCallbacks_SetMpiIsendCallback(cbs, on_isend);
    OTF2_EvtReaderCallbacks_SetMpiRecvCallback(cbs, on_recv);
    OTF2_EvtReaderCallbacks_SetMpiIrecvCallback(cbs, on_irecv);
    OTF2_EvtReaderCallbacks_SetMetricCallback(cbs, on_metric);
    /* records newer than this OTF2 (MPI_Mprobe & co. in 3.1) arrive as unknown */
    OTF2_EvtReaderCallbacks_SetUnknownCallback(cbs, on_other);
#define X(name) \
    OTF2_EvtReaderCallbacks_Set##name##Callback(cbs, (OTF2_EvtReaderCallback_##name)(void (*)(void))on_other);
    OTHER_EVENTS
#undef X
}

/* ---- the Python type ------------------------------------------------------------------ */

static PyObject *otf2_error(const char *what, OTF2_ErrorCode code) {
    PyErr_Format(Otf2NativeError, "%s: %s (%s)", what, OTF2_Error_GetDescription(code),
                 OTF2_Error_GetName(code));
    return NULL;
}

static void reset_location(Reader *r) {
    r->loc_read = 0;
    r->depth = 0;
    r->next_idx = 0;
    r->coll_open = 0;
}

static int reader_init(PyObject *self, PyObject *args, PyObject *kwds) {
    Reader *r = (Reader *)self;
    static char *kwlist[] = {"anchor", "locations", "ranks", "global_offset", "resolution", "declared",
                             "decode_only", NULL};
    const char *anchor;
    PyObject *locs, *ranks;
    unsigned long long offset, resolution;
    if (r->otf2 != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Reader is already initialized");
        return -1;
    }
    PyObject *declared = NULL;
    int decode_only = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "sOOKK|Op", kwlist, &anchor, &locs, &ranks, &offset,
                                     &resolution, &declared, &decode_only))
        return -1;
    if (resolution == 0) {
        PyErr_SetString(PyExc_ValueError, "timer resolution must be positive");
        return -1;
    }
    Py_ssize_t n = PySequence_Size(locs);
    if (n < 0 || PySequence_Size(ranks) != n) {
        PyErr_SetString(PyExc_ValueError, "locations and ranks must be sequences of equal length");
        return -1;
    }
    r->nloc = (size_t)n;
    r->locs = calloc(n ? n : 1, sizeof(uint64_t));
    r->ranks = calloc(n ? n : 1, sizeof(int32_t));
    r->declared = calloc(n ? n : 1, sizeof(uint64_t));
    if (!r->locs || !r->ranks || !r->declared) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PySequence_GetItem(locs, i), *b = PySequence_GetItem(ranks, i);
        r->locs[i] = a ? PyLong_AsUnsignedLongLong(a) : 0;
        r->ranks[i] = b ? (int32_t)PyLong_AsLong(b) : 0;
        Py_XDECREF(a);
        Py_XDECREF(b);
        if (declared != NULL && declared != Py_None && !PyErr_Occurred()) {
            PyObject *c = PySequence_GetItem(declared, i);
            r->declared[i] = c ? PyLong_AsUnsignedLongLong(c) : 0;
            Py_XDECREF(c);
        }
        if (PyErr_Occurred())
            return -1;
    }
    r->offset = offset;
    r->resolution = resolution;
    table_init(&r->iv, 10, IV_WIDTHS);
    table_init(&r->co, 13, CO_WIDTHS);
    table_init(&r->me, 11, ME_WIDTHS);
    table_init(&r->mt, 6, MT_WIDTHS);

    r->otf2 = OTF2_Reader_Open(anchor);
    if (r->otf2 == NULL) {
        PyErr_Format(Otf2NativeError, "cannot open the OTF2 archive %s", anchor);
        return -1;
    }
    OTF2_ErrorCode rc = OTF2_Reader_SetSerialCollectiveCallbacks(r->otf2);
    if (rc != OTF2_SUCCESS) {
        otf2_error("cannot set up the reader", rc);
        return -1;
    }
    for (size_t i = 0; i < r->nloc; i++) {
        rc = OTF2_Reader_SelectLocation(r->otf2, r->locs[i]);
        if (rc != OTF2_SUCCESS) {
            otf2_error("cannot select a location", rc);
            return -1;
        }
    }
    /* as the otf2 package does: an archive without local definition files is valid */
    r->defs_open = OTF2_Reader_OpenDefFiles(r->otf2) == OTF2_SUCCESS;
    (void)OTF2_Reader_OpenEvtFiles(r->otf2);
    r->callbacks = OTF2_EvtReaderCallbacks_New();
    if (r->callbacks == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    set_callbacks(r->callbacks, decode_only);
    return 0;
}

/* Open the current location's event reader, after its local definitions (which carry the
 * mapping tables and ClockOffset records). Without the GIL: errors go to ``what`` and ``rc``. */
static int open_location(Reader *r, const char **what, OTF2_ErrorCode *rc) {
    OTF2_LocationRef loc = r->locs[r->cur];
    if (r->defs_open) {
        OTF2_DefReader *dr = OTF2_Reader_GetDefReader(r->otf2, loc);
        if (dr != NULL) {
            uint64_t read = 0;
            *rc = OTF2_Reader_ReadAllLocalDefinitions(r->otf2, dr, &read);
            OTF2_Reader_CloseDefReader(r->otf2, dr);
            if (*rc != OTF2_SUCCESS) {
                *what = "cannot read the local definitions";
                return -1;
            }
        }
    }
    r->evt = OTF2_Reader_GetEvtReader(r->otf2, loc);
    if (r->evt == NULL) {
        *what = "cannot open the events of location";
        *rc = OTF2_SUCCESS;
        return -1;
    }
    *rc = OTF2_Reader_RegisterEvtCallbacks(r->otf2, r->evt, r->callbacks, r);
    if (*rc != OTF2_SUCCESS) {
        *what = "cannot register the event callbacks";
        return -1;
    }
    return 0;
}

static void close_location(Reader *r) {
    if (r->evt != NULL) {
        OTF2_Reader_CloseEvtReader(r->otf2, r->evt);
        r->evt = NULL;
    }
}

static void reader_close_archive(Reader *r) {
    if (r->otf2 != NULL) {
        close_location(r);
        if (r->defs_open)
            OTF2_Reader_CloseDefFiles(r->otf2);
        OTF2_Reader_CloseEvtFiles(r->otf2);
        OTF2_Reader_Close(r->otf2);
        r->otf2 = NULL;
    }
    if (r->callbacks != NULL) {
        OTF2_EvtReaderCallbacks_Delete(r->callbacks);
        r->callbacks = NULL;
    }
}

static void reader_dealloc(PyObject *self) {
    Reader *r = (Reader *)self;
    reader_close_archive(r);
    free(r->locs);
    free(r->ranks);
    free(r->declared);
    free(r->stack);
    free(r->co_wait.row);
    free(r->co_wait.idx);
    free(r->me_wait.row);
    free(r->me_wait.idx);
    table_free(&r->iv);
    table_free(&r->co);
    table_free(&r->me);
    table_free(&r->mt);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *reader_read(PyObject *self, PyObject *args) {
    Reader *r = (Reader *)self;
    Py_ssize_t max_rows;
    if (!PyArg_ParseTuple(args, "n", &max_rows))
        return NULL;
    if (r->otf2 == NULL && r->cur < r->nloc) {
        PyErr_SetString(PyExc_ValueError, "the reader is closed");
        return NULL;
    }
    if (r->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Reader.read called from two threads at once");
        return NULL;
    }
    r->busy = 1;
    uint64_t events_before = r->events;
    uint64_t batch = max_rows > 0 && (uint64_t)max_rows < BATCH ? (uint64_t)max_rows : BATCH;
    OTF2_ErrorCode rc = OTF2_SUCCESS;
    const char *open_failed = NULL;
    int too_many = 0, too_few = 0;
    Py_BEGIN_ALLOW_THREADS
    /* The chunk's intervals get their room at once: grown by doubling from nothing, each column
       of a 500k-row chunk would be copied seven times over (and its pages faulted in anew). A
       chunk holds at most max_rows plus one batch of them, and the locations left at most one
       per event they declare, plus what is open. */
    size_t room = (size_t)max_rows + batch + r->depth, left = r->depth;
    int all_declared = 1;
    for (size_t i = r->cur; i < r->nloc; i++) {
        all_declared &= r->declared[i] != 0;
        left += r->declared[i] - (i == r->cur && r->loc_read < r->declared[i] ? r->loc_read : 0);
    }
    if (all_declared && left < room)
        room = left;
    else if (!all_declared && room > CHUNK_ROOM)
        room = CHUNK_ROOM; /* beyond: grown by doubling */
    if (room > r->iv.rows && table_reserve(&r->iv, room - r->iv.rows) < 0)
        r->out_of_memory = 1;
    /* rows waiting for their instance to close cannot be handed out yet: count only the others,
       so that every call either hands out max_rows rows or reads on */
    while (!r->out_of_memory && r->cur < r->nloc &&
           r->iv.rows + ready_rows(&r->co_wait, &r->co) + ready_rows(&r->me_wait, &r->me) + r->mt.rows <
               (size_t)max_rows) {
        if (r->evt == NULL && open_location(r, &open_failed, &rc) < 0)
            break;
        uint64_t got = 0;
        rc = OTF2_Reader_ReadLocalEvents(r->otf2, r->evt, batch, &got);
        if (rc != OTF2_SUCCESS || r->out_of_memory)
            break;
        /* The library can decode a damaged event file as an endless run of events; the
           location's definition says how many it holds. */
        r->loc_read += got;
        if (r->declared[r->cur] && r->loc_read > r->declared[r->cur]) {
            too_many = 1;
            break;
        }
        if (got < batch) {
            /* The library can also decode a truncated event file as fewer events, or none,
               without an error (whatever its chunk buffer held before: it varies from run to
               run); the definition's count tells. */
            if (r->declared[r->cur] && r->loc_read < r->declared[r->cur]) {
                too_few = 1;
                break;
            }
            /* the location's last event: what is still open closes at its time */
            if (table_reserve(&r->iv, r->depth) < 0) {
                r->out_of_memory = 1;
                break;
            }
            while (r->depth)
                close_top(r, r->last_t, 1);
            close_location(r);
            r->cur++;
            reset_location(r);
        }
    }
    Py_END_ALLOW_THREADS
    r->busy = 0;
    if (r->out_of_memory)
        return PyErr_NoMemory();
    if (too_many) {
        PyErr_Format(Otf2NativeError,
                     "location %llu holds more events than the %llu its definition declares",
                     (unsigned long long)r->locs[r->cur], (unsigned long long)r->declared[r->cur]);
        return NULL;
    }
    if (too_few) {
        PyErr_Format(Otf2NativeError,
                     "location %llu holds %llu events, fewer than the %llu its definition declares",
                     (unsigned long long)r->locs[r->cur], (unsigned long long)r->loc_read,
                     (unsigned long long)r->declared[r->cur]);
        return NULL;
    }
    if (open_failed != NULL) {
        char what[96];
        snprintf(what, sizeof what, "%s %llu", open_failed, (unsigned long long)r->locs[r->cur]);
        if (rc == OTF2_SUCCESS) {
            PyErr_Format(Otf2NativeError, "%s", what);
            return NULL;
        }
        return otf2_error(what, rc);
    }
    if (rc != OTF2_SUCCESS) {
        char what[64];
        snprintf(what, sizeof what, "cannot read the events of location %llu",
                 (unsigned long long)r->locs[r->cur]);
        return otf2_error(what, rc);
    }
    size_t co_ready = ready_rows(&r->co_wait, &r->co), me_ready = ready_rows(&r->me_wait, &r->me);
    PyObject *iv = table_take(&r->iv), *co = table_take_rows(&r->co, co_ready),
             *me = table_take_rows(&r->me, me_ready),
             *mt = table_take(&r->mt);
    waiting_handed_out(&r->co_wait, co_ready);
    waiting_handed_out(&r->me_wait, me_ready);
    if (!iv || !co || !me || !mt) {
        Py_XDECREF(iv);
        Py_XDECREF(co);
        Py_XDECREF(me);
        Py_XDECREF(mt);
        return NULL;
    }
    return Py_BuildValue("(NNNNKO)", iv, co, me, mt, (unsigned long long)(r->events - events_before),
                         r->cur == r->nloc ? Py_True : Py_False);
}

static PyObject *reader_stats(PyObject *self, PyObject *unused) {
    (void)unused;
    Reader *r = (Reader *)self;
    return Py_BuildValue("(KKKK)", (unsigned long long)r->events,
                         (unsigned long long)r->unmatched_leaves, (unsigned long long)r->truncated,
                         (unsigned long long)r->unmatched_coll_ends);
}

static PyObject *reader_close(PyObject *self, PyObject *unused) {
    (void)unused;
    Reader *r = (Reader *)self;
    if (r->busy) {
        PyErr_SetString(PyExc_RuntimeError, "cannot close a Reader while it reads");
        return NULL;
    }
    reader_close_archive(r);
    Py_RETURN_NONE;
}

static PyMethodDef reader_methods[] = {
    {"read", reader_read, METH_VARARGS,
     "read(max_rows) -> (intervals, collectives, messages, metrics, events, done)\n"
     "Read on until about max_rows rows are ready (or the locations end), without the GIL.\n"
     "Each table is a tuple of Columns in analyze.columns order."},
    {"stats", reader_stats, METH_NOARGS,
     "(events, unmatched_leaves, truncated, unmatched_collective_ends) so far"},
    {"close", reader_close, METH_NOARGS, "Close the archive (read() is done or abandoned)."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "analyze._otf2native.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_dealloc = reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(anchor, locations, ranks, global_offset, resolution, declared=None, decode_only=False)\n"
              "Events of the given locations (with their ranks) as analyze.columns rows;\n"
              "decode_only: the events are only counted (no rows), to time the OTF2 library alone.",
    .tp_methods = reader_methods,
    .tp_init = reader_init,
    .tp_new = PyType_GenericNew,
};
