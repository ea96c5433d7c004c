/* Shared declarations of the native OTF2 codec (module analyze._otf2native).
 *
 * The module has five parts, one file each: reader.c (OTF2 events -> interval, collective
 * and message columns, the rules of analyze/columns.py), writer.c (an ArchiveSpec -> an OTF2
 * archive, as instrument/otf2_writer.py writes it), replay.c (the merge's per-thread
 * normalization and lane assignment, as instrument/merge.py does it), parquet.c (columns
 * -> a Parquet file, for the analysis' tables) and sweep.c (the phase sweep's inner loop). Results cross into
 * Python as Column objects: malloc'd memory exposed through the buffer protocol, so numpy
 * wraps them without a copy.
 */
#ifndef DLTRACE_OTF2NATIVE_H
#define DLTRACE_OTF2NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

/* One tracer record (instrument/events.py EVENT_DTYPE): 48 bytes, little endian, packed. */
typedef struct __attribute__((packed)) {
    int64_t time;
    int64_t aux;
    uint64_t bytes_sent;
    uint64_t bytes_recv;
    uint32_t region;
    int32_t comm;
    int32_t root;
    uint16_t loc;
    uint8_t kind;
    uint8_t op;
} Record;
_Static_assert(sizeof(Record) == 48, "Record must match instrument.events.EVENT_DTYPE");

enum { K_ENTER = 1, K_LEAVE = 2, K_COLL_END = 3, K_ASYNC_COLL = 4, K_STEP_DISCARD = 5,
       K_COLL_BEGIN = 6, K_SEND = 7, K_RECV = 8, K_METRIC = 9 };

/* Growable columns of fixed-width values, all with the same number of rows. */
#define MAX_COLUMNS 16
typedef struct {
    int ncols;
    size_t width[MAX_COLUMNS];
    char *data[MAX_COLUMNS];
    size_t rows;
    size_t cap;
} Table;

void table_init(Table *t, int ncols, const size_t *widths);
/* Room for ``extra`` more rows; 0 on success, -1 when out of memory (the table is unchanged). */
int table_reserve(Table *t, size_t extra);
void table_free(Table *t);
/* A tuple of Column objects taking over the table's memory; the table is left empty. */
PyObject *table_take(Table *t);
/* The same for the first ``rows`` rows; the rest stay in the table (copied to its start). */
PyObject *table_take_rows(Table *t, size_t rows);

/* A Column over ``data`` (``size`` bytes), which it frees; NULL and ``data`` freed on error. */
PyObject *column_new(char *data, size_t size);

extern PyObject *Otf2NativeError;
extern PyTypeObject ReaderType;

PyObject *native_write_archive(PyObject *self, PyObject *args);
PyObject *native_replay_thread(PyObject *self, PyObject *args);
PyObject *native_lanes(PyObject *self, PyObject *args);
PyObject *native_write_parquet(PyObject *self, PyObject *args);
PyObject *native_read_parquet(PyObject *self, PyObject *args);
PyObject *native_parquet_rows(PyObject *self, PyObject *args);
PyObject *native_phase_sweep(PyObject *self, PyObject *args);

#endif
