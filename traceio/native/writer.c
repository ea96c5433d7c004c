/* write_archive: definitions and per-location record arrays -> an OTF2 archive.
 *
 * instrument/native_writer.py lays out the definitions exactly as the ``otf2`` package's
 * writer registers them for instrument/otf2_writer.py, so both writers give the same
 * references; this file only writes them, then translates records into OTF2 events the way
 * otf2_writer._write_events does. The event loop runs without the GIL.
 */
#include "otf2native.h"

#include <otf2/otf2.h>
#include <stdlib.h>
#include <string.h>

#if OTF2_VERSION_MAJOR < 3
#error "dltrace's native writer needs OTF2 >= 3.0"
#endif

#define EVENT_CHUNK (1024 * 1024)
#define DEF_CHUNK (4 * 1024 * 1024)

typedef struct {
    uint64_t time;
    int64_t offset;
    double stddev;
} Offset;

typedef struct {
    uint32_t name, group;
    uint8_t type;
    Py_buffer records;
    int has_records;
    Offset *offsets;
    Py_ssize_t noffsets;
    uint64_t events;
} Loc;

typedef struct {
    const uint32_t *comm_refs;
    Py_ssize_t ncomms;
    const uint8_t *op_map;
    const uint32_t *metric_refs; /* a METRIC record's member index -> its metric (instance) */
    Py_ssize_t nmetrics;
    char error[256];
} EventContext;

static OTF2_FlushType pre_flush(void *ud, OTF2_FileType ft, OTF2_LocationRef loc, void *cd,
                                bool final) {
    (void)ud, (void)ft, (void)loc, (void)cd, (void)final;
    return OTF2_FLUSH;
}

static OTF2_FlushCallbacks flush_callbacks = {pre_flush, NULL};

#define CHECK(call, what)                                                                      \
    do {                                                                                       \
        OTF2_ErrorCode rc_ = (call);                                                           \
        if (rc_ != OTF2_SUCCESS) {                                                             \
            PyErr_Format(Otf2NativeError, "%s: %s (%s)", what, OTF2_Error_GetDescription(rc_), \
                         OTF2_Error_GetName(rc_));                                             \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

/* Python's list indexing for a record's communicator: -1 is the last one. */
static int comm_ref(const EventContext *c, int32_t comm, OTF2_CommRef *out) {
    Py_ssize_t i = comm < 0 ? c->ncomms + comm : comm;
    if (i < 0 || i >= c->ncomms)
        return -1;
    *out = c->comm_refs[i];
    return 0;
}

static int bad_comm(EventContext *ctx, const Record *r) {
    snprintf(ctx->error, sizeof ctx->error, "a record at %lld refers to communicator %d of %zd",
             (long long)r->time, (int)r->comm, ctx->ncomms);
    return -1;
}

/* One location's records -> events; returns -1 with ctx->error set on failure. */
static int write_events(OTF2_EvtWriter *w, const Record *rec, size_t n, EventContext *ctx,
                        uint64_t *written) {
    OTF2_ErrorCode rc = OTF2_SUCCESS;
    OTF2_CommRef comm;
    uint64_t count = 0;
    for (size_t i = 0; i < n && rc == OTF2_SUCCESS; i++) {
        const Record *r = &rec[i];
        OTF2_TimeStamp t = (OTF2_TimeStamp)r->time;
        switch (r->kind) {
        case K_ENTER:
            rc = OTF2_EvtWriter_Enter(w, NULL, t, r->region);
            break;
        case K_LEAVE:
            rc = OTF2_EvtWriter_Leave(w, NULL, t, r->region);
            break;
        case K_COLL_BEGIN:
            rc = OTF2_EvtWriter_MpiCollectiveBegin(w, NULL, t);
            break;
        case K_COLL_END:
            if (comm_ref(ctx, r->comm, &comm) < 0)
                return bad_comm(ctx, r);
            rc = OTF2_EvtWriter_MpiCollectiveEnd(w, NULL, t, ctx->op_map[r->op], comm,
                                                 r->root < 0 ? OTF2_UNDEFINED_UINT32
                                                             : (uint32_t)r->root,
                                                 r->bytes_sent, r->bytes_recv);
            break;
        case K_SEND:
        case K_RECV:
            if (comm_ref(ctx, r->comm, &comm) < 0)
                return bad_comm(ctx, r);
            rc = r->kind == K_SEND
                     ? OTF2_EvtWriter_MpiSend(w, NULL, t, (uint32_t)r->root, comm,
                                              (uint32_t)r->aux, r->bytes_sent)
                     : OTF2_EvtWriter_MpiRecv(w, NULL, t, (uint32_t)r->root, comm,
                                              (uint32_t)r->aux, r->bytes_sent);
            break;
        case K_METRIC: {
            if (r->region >= (uint64_t)ctx->nmetrics) {
                snprintf(ctx->error, sizeof ctx->error,
                         "a metric record at %lld refers to channel %u of %zd", (long long)r->time,
                         (unsigned)r->region, ctx->nmetrics);
                return -1;
            }
            OTF2_Type type = OTF2_TYPE_INT64;
            OTF2_MetricValue value;
            value.signed_int = r->aux;
            rc = OTF2_EvtWriter_Metric(w, NULL, t, ctx->metric_refs[r->region], 1, &type, &value);
            break;
        }
        default:
            continue; /* not an event (the Python writer skips these too) */
        }
        count++;
    }
    *written = count;
    if (rc != OTF2_SUCCESS) {
        snprintf(ctx->error, sizeof ctx->error, "cannot write an event: %s (%s)",
                 OTF2_Error_GetDescription(rc), OTF2_Error_GetName(rc));
        return -1;
    }
    return 0;
}

static int parse_offsets(PyObject *list, Loc *loc) {
    PyObject *seq = PySequence_Fast(list, "clock offsets must be a sequence");
    if (seq == NULL)
        return -1;
    loc->noffsets = PySequence_Fast_GET_SIZE(seq);
    loc->offsets = calloc(loc->noffsets ? loc->noffsets : 1, sizeof(Offset));
    if (loc->offsets == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < loc->noffsets; i++) {
        Offset *o = &loc->offsets[i];
        unsigned long long t;
        long long off;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KLd", &t, &off, &o->stddev)) {
            Py_DECREF(seq);
            return -1;
        }
        o->time = t;
        o->offset = off;
    }
    Py_DECREF(seq);
    return 0;
}

/* Strings go out just before the first definition that uses them, as the otf2 package writes
 * them (its string references are numbered in that order, so ``upto`` is the largest). */
static int write_strings(OTF2_GlobalDefWriter *g, PyObject *strings, Py_ssize_t *next,
                         Py_ssize_t n_refs, const uint32_t *refs) {
    Py_ssize_t upto = -1;
    for (Py_ssize_t k = 0; k < n_refs; k++)
        if (refs[k] != OTF2_UNDEFINED_STRING && (Py_ssize_t)refs[k] > upto)
            upto = refs[k];
    for (; *next <= upto && *next < PySequence_Fast_GET_SIZE(strings); (*next)++) {
        const char *s = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(strings, *next));
        if (s == NULL)
            return -1;
        OTF2_ErrorCode rc = OTF2_GlobalDefWriter_WriteString(g, (OTF2_StringRef)*next, s);
        if (rc != OTF2_SUCCESS) {
            PyErr_Format(Otf2NativeError, "cannot write a string: %s", OTF2_Error_GetDescription(rc));
            return -1;
        }
    }
    return 0;
}

#define STRINGS(...)                                                                           \
    do {                                                                                       \
        uint32_t refs_[] = {__VA_ARGS__};                                                      \
        if (write_strings(g, s_strings, &next_string, sizeof refs_ / sizeof refs_[0], refs_) < 0) \
            goto fail;                                                                         \
    } while (0)

PyObject *native_write_archive(PyObject *self, PyObject *args) {
    (void)self;
    const char *directory, *name, *creator;
    unsigned long long resolution, global_offset, length, realtime;
    PyObject *strings, *nodes, *lgroups, *locations, *props, *regions, *groups, *comms;
    PyObject *comm_refs_obj, *members, *metrics, *metric_refs_obj;
    Py_buffer op_map = {0};
    if (!PyArg_ParseTuple(args, "sss(KKKK)OOOOOOOOOy*OOO", &directory, &name, &creator,
                          &resolution, &global_offset, &length, &realtime, &strings, &nodes,
                          &lgroups, &locations, &props, &regions, &groups, &comms, &comm_refs_obj,
                          &op_map, &members, &metrics, &metric_refs_obj))
        return NULL;
    OTF2_Archive *archive = NULL;
    Loc *locs = NULL;
    uint32_t *comm_refs = NULL, *metric_refs = NULL;
    Py_ssize_t nloc = 0, ncomm_refs = 0, nmetric_refs = 0;
    PyObject *s_strings = NULL, *s_nodes = NULL, *s_lgroups = NULL, *s_locs = NULL,
             *s_props = NULL, *s_regions = NULL, *s_groups = NULL, *s_comms = NULL,
             *s_comm_refs = NULL, *s_members = NULL, *s_metrics = NULL, *s_metric_refs = NULL;
    PyObject *result = NULL;
    if (op_map.len != 256) {
        PyErr_SetString(PyExc_ValueError, "op_map must have 256 entries");
        goto fail;
    }
    if (!(s_strings = PySequence_Fast(strings, "strings")) || !(s_nodes = PySequence_Fast(nodes, "nodes")) ||
        !(s_lgroups = PySequence_Fast(lgroups, "location groups")) || !(s_locs = PySequence_Fast(locations, "locations")) ||
        !(s_props = PySequence_Fast(props, "location properties")) || !(s_regions = PySequence_Fast(regions, "regions")) ||
        !(s_groups = PySequence_Fast(groups, "groups")) || !(s_comms = PySequence_Fast(comms, "comms")) ||
        !(s_comm_refs = PySequence_Fast(comm_refs_obj, "comm refs")) ||
        !(s_members = PySequence_Fast(members, "metric members")) ||
        !(s_metrics = PySequence_Fast(metrics, "metrics")) ||
        !(s_metric_refs = PySequence_Fast(metric_refs_obj, "metric refs")))
        goto fail;

    /* parse locations and their record buffers up front: the event loop runs without the GIL */
    nloc = PySequence_Fast_GET_SIZE(s_locs);
    locs = calloc(nloc ? nloc : 1, sizeof(Loc));
    ncomm_refs = PySequence_Fast_GET_SIZE(s_comm_refs);
    comm_refs = calloc(ncomm_refs ? ncomm_refs : 1, sizeof(uint32_t));
    nmetric_refs = PySequence_Fast_GET_SIZE(s_metric_refs);
    metric_refs = calloc(nmetric_refs ? nmetric_refs : 1, sizeof(uint32_t));
    if (locs == NULL || comm_refs == NULL || metric_refs == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < ncomm_refs; i++) {
        comm_refs[i] = (uint32_t)PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(s_comm_refs, i));
        if (PyErr_Occurred())
            goto fail;
    }
    for (Py_ssize_t i = 0; i < nmetric_refs; i++) {
        metric_refs[i] = (uint32_t)PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(s_metric_refs, i));
        if (PyErr_Occurred())
            goto fail;
    }
    for (Py_ssize_t i = 0; i < nloc; i++) {
        PyObject *recs, *offsets;
        unsigned int lname, lgroup;
        unsigned char ltype;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(s_locs, i), "IbIOO", &lname, &ltype,
                              &lgroup, &recs, &offsets))
            goto fail;
        locs[i].name = lname;
        locs[i].type = ltype;
        locs[i].group = lgroup;
        if (PyObject_GetBuffer(recs, &locs[i].records, PyBUF_SIMPLE) < 0)
            goto fail;
        locs[i].has_records = 1;
        if (locs[i].records.len % (Py_ssize_t)sizeof(Record) != 0) {
            PyErr_SetString(PyExc_ValueError, "records must be whole 48-byte EVENT_DTYPE records");
            goto fail;
        }
        if (parse_offsets(offsets, &locs[i]) < 0)
            goto fail;
    }

    archive = OTF2_Archive_Open(directory, name, OTF2_FILEMODE_WRITE, EVENT_CHUNK, DEF_CHUNK,
                                OTF2_SUBSTRATE_POSIX, OTF2_COMPRESSION_NONE);
    if (archive == NULL) {
        PyErr_Format(Otf2NativeError, "cannot create the OTF2 archive %s/%s", directory, name);
        goto fail;
    }
    CHECK(OTF2_Archive_SetFlushCallbacks(archive, &flush_callbacks, NULL), "flush callbacks");
    CHECK(OTF2_Archive_SetSerialCollectiveCallbacks(archive), "collective callbacks");
    CHECK(OTF2_Archive_OpenDefFiles(archive), "cannot open the definition files");
    CHECK(OTF2_Archive_OpenEvtFiles(archive), "cannot open the event files");

    EventContext ctx = {comm_refs, ncomm_refs, op_map.buf, metric_refs, nmetric_refs, {0}};
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < nloc && !failed; i++) {
        Loc *l = &locs[i];
        OTF2_DefWriter *dw = OTF2_Archive_GetDefWriter(archive, (OTF2_LocationRef)i);
        OTF2_EvtWriter *ew = OTF2_Archive_GetEvtWriter(archive, (OTF2_LocationRef)i);
        if (dw == NULL || ew == NULL) {
            snprintf(ctx.error, sizeof ctx.error, "cannot open the writers of location %zd", i);
            failed = 1;
            break;
        }
        failed = write_events(ew, l->records.buf, (size_t)l->records.len / sizeof(Record), &ctx,
                              &l->events) < 0;
        for (Py_ssize_t k = 0; k < l->noffsets && !failed; k++) {
            OTF2_ErrorCode rc = OTF2_DefWriter_WriteClockOffset(dw, l->offsets[k].time,
                                                                l->offsets[k].offset,
                                                                l->offsets[k].stddev);
            if (rc != OTF2_SUCCESS) {
                snprintf(ctx.error, sizeof ctx.error, "cannot write a clock offset: %s",
                         OTF2_Error_GetDescription(rc));
                failed = 1;
            }
        }
        OTF2_Archive_CloseDefWriter(archive, dw);
        OTF2_Archive_CloseEvtWriter(archive, ew);
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_SetString(Otf2NativeError, ctx.error);
        goto fail;
    }
    CHECK(OTF2_Archive_CloseEvtFiles(archive), "cannot close the event files");
    CHECK(OTF2_Archive_CloseDefFiles(archive), "cannot close the definition files");

    OTF2_GlobalDefWriter *g = OTF2_Archive_GetGlobalDefWriter(archive);
    if (g == NULL) {
        PyErr_SetString(Otf2NativeError, "cannot open the global definition writer");
        goto fail;
    }
    CHECK(OTF2_GlobalDefWriter_WriteClockProperties(g, resolution, global_offset, length, realtime),
          "clock properties");
    Py_ssize_t next_string = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(s_nodes); i++) {
        unsigned int nm, cls, parent;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(s_nodes, i), "III", &nm, &cls, &parent))
            goto fail;
        STRINGS(nm, cls);
        CHECK(OTF2_GlobalDefWriter_WriteSystemTreeNode(g, (uint32_t)i, nm, cls, parent),
              "system tree node");
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(s_lgroups); i++) {
        unsigned int nm, node, creating;
        unsigned char type;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(s_lgroups, i), "IbII", &nm, &type, &node,
                              &creating))
            goto fail;
        STRINGS(nm);
        CHECK(OTF2_GlobalDefWriter_WriteLocationGroup(g, (uint32_t)i, nm, type, node, creating),
              "location group");
    }
    for (Py_ssize_t i = 0; i < nloc; i++) {
        STRINGS(locs[i].name);
        CHECK(OTF2_GlobalDefWriter_WriteLocation(g, (OTF2_LocationRef)i, locs[i].name,
                                                 locs[i].type, locs[i].events, locs[i].group),
              "location");
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(s_props); i++) {
        unsigned long long loc;
        unsigned int nm, value;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(s_props, i), "KII", &loc, &nm, &value))
            goto fail;
        STRINGS(nm, value);
        OTF2_AttributeValue v;
        v.stringRef = value;
        CHECK(OTF2_GlobalDefWriter_WriteLocationProperty(g, loc, nm, OTF2_TYPE_STRING, v),
              "location property");
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(s_regions); i++) {
        unsigned int nm, canonical, descr, source, begin, end;
        unsigned char role, paradigm;
        unsigned int flags;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(s_regions, i), "IIIbbIIII", &nm,
                              &canonical, &descr, &role, &paradigm, &flags, &source, &begin, &end))
            goto fail;
        STRINGS(nm, canonical, descr, source);
        CHECK(OTF2_GlobalDefWriter_WriteRegion(g, (uint32_t)i, nm, canonical, descr, role,
                                               paradigm, flags, source, begin, end),
              "region");
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(s_groups); i++) {
        unsigned int nm, flags;
        unsigned char type, paradigm;
        PyObject *members;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(s_groups, i), "IbbIO", &nm, &type,
                              &paradigm, &flags, &members))
            goto fail;
        STRINGS(nm);
        PyObject *m = PySequence_Fast(members, "group members");
        if (m == NULL)
            goto fail;
        Py_ssize_t nm_ = PySequence_Fast_GET_SIZE(m);
        uint64_t *ids = calloc(nm_ ? nm_ : 1, sizeof(uint64_t));
        for (Py_ssize_t k = 0; ids && k < nm_; k++)
            ids[k] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(m, k));
        Py_DECREF(m);
        if (ids == NULL || PyErr_Occurred()) {
            free(ids);
            if (!PyErr_Occurred())
                PyErr_NoMemory();
            goto fail;
        }
        OTF2_ErrorCode rc = OTF2_GlobalDefWriter_WriteGroup(g, (uint32_t)i, nm, type, paradigm,
                                                            flags, (uint32_t)nm_, ids);
        free(ids);
        CHECK(rc, "group");
    }
    /* metric members, then classes and instances (in reference order), as the otf2 package */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(s_members); i++) {
        unsigned int nm, descr, unit;
        unsigned char mtype, mode, vtype, base;
        long long exponent;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(s_members, i), "IIBBBBLI", &nm, &descr,
                              &mtype, &mode, &vtype, &base, &exponent, &unit))
            goto fail;
        STRINGS(nm, descr, unit);
        CHECK(OTF2_GlobalDefWriter_WriteMetricMember(g, (uint32_t)i, nm, descr, mtype, mode, vtype,
                                                     base, (int64_t)exponent, unit),
              "metric member");
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(s_metrics); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(s_metrics, i);
        PyObject *first = PySequence_GetItem(item, 0); /* 0: a class, 1: an instance */
        unsigned int kind = first ? (unsigned int)PyLong_AsUnsignedLong(first) : 0;
        Py_XDECREF(first);
        if (PyErr_Occurred())
            goto fail;
        if (kind == 0) {
            PyObject *mlist;
            unsigned char occurrence;
            unsigned int recorder_kind;
            if (!PyArg_ParseTuple(item, "IObI", &kind, &mlist, &occurrence, &recorder_kind))
                goto fail;
            PyObject *m = PySequence_Fast(mlist, "metric class members");
            if (m == NULL)
                goto fail;
            Py_ssize_t n = PySequence_Fast_GET_SIZE(m);
            uint32_t *refs = calloc(n ? n : 1, sizeof(uint32_t));
            for (Py_ssize_t k = 0; refs && k < n; k++)
                refs[k] = (uint32_t)PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(m, k));
            Py_DECREF(m);
            if (refs == NULL || PyErr_Occurred()) {
                free(refs);
                if (!PyErr_Occurred())
                    PyErr_NoMemory();
                goto fail;
            }
            OTF2_ErrorCode rc = OTF2_GlobalDefWriter_WriteMetricClass(
                g, (uint32_t)i, (uint8_t)n, refs, occurrence, (OTF2_RecorderKind)recorder_kind);
            free(refs);
            CHECK(rc, "metric class");
        } else {
            unsigned int cls, scope_type;
            unsigned long long recorder, scope;
            if (!PyArg_ParseTuple(item, "IIKIK", &kind, &cls, &recorder, &scope_type, &scope))
                goto fail;
            CHECK(OTF2_GlobalDefWriter_WriteMetricInstance(g, (uint32_t)i, cls, recorder,
                                                           (OTF2_MetricScope)scope_type, scope),
                  "metric instance");
        }
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(s_comms); i++) {
        unsigned int nm, group, parent, flags;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(s_comms, i), "IIII", &nm, &group, &parent,
                              &flags))
            goto fail;
        STRINGS(nm);
        CHECK(OTF2_GlobalDefWriter_WriteComm(g, (uint32_t)i, nm, group, parent, flags), "comm");
    }
    CHECK(OTF2_Archive_SetCreator(archive, creator), "creator");
    OTF2_ErrorCode rc = OTF2_Archive_Close(archive);
    archive = NULL;
    CHECK(rc, "cannot close the archive");
    uint64_t total = 0;
    for (Py_ssize_t i = 0; i < nloc; i++)
        total += locs[i].events;
    result = PyLong_FromUnsignedLongLong(total);
fail:
    if (archive != NULL)
        OTF2_Archive_Close(archive);
    for (Py_ssize_t i = 0; locs && i < nloc; i++) {
        if (locs[i].has_records)
            PyBuffer_Release(&locs[i].records);
        free(locs[i].offsets);
    }
    free(locs);
    free(comm_refs);
    free(metric_refs);
    if (op_map.obj)
        PyBuffer_Release(&op_map);
    Py_XDECREF(s_strings);
    Py_XDECREF(s_nodes);
    Py_XDECREF(s_lgroups);
    Py_XDECREF(s_locs);
    Py_XDECREF(s_props);
    Py_XDECREF(s_regions);
    Py_XDECREF(s_groups);
    Py_XDECREF(s_comms);
    Py_XDECREF(s_comm_refs);
    Py_XDECREF(s_members);
    Py_XDECREF(s_metrics);
    Py_XDECREF(s_metric_refs);
    return result;
}
