/* analyze._otf2native: module definition, the Column type and growable tables. */
#include "otf2native.h"

#include <stdlib.h>
#include <string.h>

PyObject *Otf2NativeError;

/* ---- Column: memory owned by C, readable by numpy through the buffer protocol ---------- */

typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t size;
} Column;

/* A view holds a reference to the Column (view->obj), so the memory outlives every array. */
static int column_getbuffer(PyObject *obj, Py_buffer *view, int flags) {
    Column *c = (Column *)obj;
    static char empty; /* a zero-length column still needs a valid pointer for numpy */
    return PyBuffer_FillInfo(view, obj, c->data ? c->data : &empty, c->size, 0, flags);
}

static PyBufferProcs column_as_buffer = {column_getbuffer, NULL};

static void column_dealloc(PyObject *obj) {
    free(((Column *)obj)->data);
    Py_TYPE(obj)->tp_free(obj);
}

static Py_ssize_t column_len(PyObject *obj) { return ((Column *)obj)->size; }

static PySequenceMethods column_as_sequence = {.sq_length = column_len};

static PyTypeObject ColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "analyze._otf2native.Column",
    .tp_basicsize = sizeof(Column),
    .tp_dealloc = column_dealloc,
    .tp_as_buffer = &column_as_buffer,
    .tp_as_sequence = &column_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bytes of one result column (wrap with numpy.frombuffer).",
};

PyObject *column_new(char *data, size_t size) {
    Column *c = PyObject_New(Column, &ColumnType);
    if (c == NULL) {
        free(data);
        return NULL;
    }
    c->data = data;
    c->size = (Py_ssize_t)size;
    return (PyObject *)c;
}

/* ---- Table ------------------------------------------------------------------------------ */

void table_init(Table *t, int ncols, const size_t *widths) {
    memset(t, 0, sizeof(*t));
    t->ncols = ncols;
    for (int i = 0; i < ncols; i++)
        t->width[i] = widths[i];
}

int table_reserve(Table *t, size_t extra) {
    if (t->rows + extra <= t->cap)
        return 0;
    size_t cap = t->cap ? t->cap : 4096;
    while (cap < t->rows + extra)
        cap *= 2;
    for (int i = 0; i < t->ncols; i++) {
        char *p = realloc(t->data[i], cap * t->width[i]);
        if (p == NULL)
            return -1; /* columns grown so far keep their data; cap stays valid for all */
        t->data[i] = p;
    }
    t->cap = cap;
    return 0;
}

void table_free(Table *t) {
    for (int i = 0; i < t->ncols; i++) {
        free(t->data[i]);
        t->data[i] = NULL;
    }
    t->rows = t->cap = 0;
}

PyObject *table_take(Table *t) {
    PyObject *out = PyTuple_New(t->ncols);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < t->ncols; i++) {
        char *data = t->data[i];
        t->data[i] = NULL;
        PyObject *col = column_new(data, t->rows * t->width[i]);
        if (col == NULL) {
            for (int j = i + 1; j < t->ncols; j++) {
                free(t->data[j]);
                t->data[j] = NULL;
            }
            t->rows = t->cap = 0;
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, col);
    }
    t->rows = t->cap = 0;
    return out;
}

PyObject *table_take_rows(Table *t, size_t rows) {
    if (rows >= t->rows)
        return table_take(t);
    Table rest;
    table_init(&rest, t->ncols, t->width);
    if (table_reserve(&rest, t->rows - rows) < 0)
        return PyErr_NoMemory();
    for (int i = 0; i < t->ncols; i++)
        memcpy(rest.data[i], t->data[i] + rows * t->width[i], (t->rows - rows) * t->width[i]);
    rest.rows = t->rows - rows;
    t->rows = rows;
    PyObject *out = table_take(t);
    if (out == NULL) {
        table_free(&rest);
        return NULL;
    }
    *t = rest;
    return out;
}

/* ---- module ----------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"write_archive", native_write_archive, METH_VARARGS,
     "write_archive(directory, name, creator, clock, strings, nodes, groups, locations,\n"
     "              location_properties, regions, comm_groups, comms, comm_refs, op_map,\n"
     "              metric_members, metrics, metric_refs[, defs_only])\n"
     "Write an OTF2 archive (defs_only: only its definitions, with per-location event counts\n"
     "and mapping tables); see traceio/native_writer.py for the argument layout."},
    {"replay_thread", native_replay_thread, METH_VARARGS,
     "replay_thread(records, loc, step, tail, discard, end_t, region_map, comm_map)\n"
     "    -> (records, steps, closed, bad)\n"
     "The merge's per-thread normalization (instrument.merge._replay_thread)."},
    {"write_parquet", native_write_parquet, METH_VARARGS,
     "write_parquet(path, columns, created_by) -> bytes written\n"
     "columns: [(name, 'int64'|'int32'|'bool', buffer, negative_is_null)], equal rows.\n"
     "One Parquet file, integers DELTA_BINARY_PACKED, uncompressed (see parquet.c)."},
    {"read_parquet", native_read_parquet, METH_VARARGS,
     "read_parquet(path, created_by) -> [(name, 'int64'|'int32'|'bool', Column)] or None\n"
     "The columns of a file write_parquet wrote with created_by (NULL as -1); None for any\n"
     "other file, which the caller reads otherwise (see parquet_read.c)."},
    {"parquet_rows", native_parquet_rows, METH_VARARGS,
     "parquet_rows(path, created_by) -> rows, or None for a file read_parquet declines\n"
     "Only the footer is read."},
    {"lanes", native_lanes, METH_VARARGS,
     "lanes(records, first_index) -> [(index, records)]\n"
     "First-fit lanes for time-sorted asynchronous collectives (instrument.merge._lanes)."},
    {"phase_sweep", native_phase_sweep, METH_VARARGS,
     "phase_sweep(seg_start, seg_end, seg_level, step_start, step_end, table, codes)\n"
     "    -> Column of len(step_start) x codes int64, or None (overlapping steps, a span over 2^58 ns)\n"
     "ns per step and phase code; table[mask] is the code of a set of covering levels\n"
     "(analyze.tables.phases.sweep; see sweep.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "analyze._otf2native",
    "Native OTF2 reading and writing for dltrace (see analyze/native/otf2native.h).", -1, methods,
};

PyMODINIT_FUNC PyInit__otf2native(void) {
    if (PyType_Ready(&ColumnType) < 0 || PyType_Ready(&ReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    Otf2NativeError = PyErr_NewException("analyze._otf2native.Error", NULL, NULL);
    if (Otf2NativeError == NULL || PyModule_AddObjectRef(m, "Error", Otf2NativeError) < 0 ||
        PyModule_AddObjectRef(m, "Reader", (PyObject *)&ReaderType) < 0 ||
        PyModule_AddObjectRef(m, "Column", (PyObject *)&ColumnType) < 0 ||
        PyModule_AddIntConstant(m, "RECORD_SIZE", (long)sizeof(Record)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
