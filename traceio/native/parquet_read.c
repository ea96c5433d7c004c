/* read_parquet: a Parquet file that write_parquet (parquet.c) wrote -> its columns.
 *
 * The build hands intermediate rows between its stages as Parquet files written by
 * parquet.c; reading them back into numpy through DuckDB costs several times what
 * decoding them does (DuckDB's conversion to numpy, not its Parquet reader). This reads
 * exactly what parquet.c writes: a flat schema of INT64, INT32 and BOOLEAN columns,
 * REQUIRED or OPTIONAL, row groups of one uncompressed DATA_PAGE per column, integers
 * DELTA_BINARY_PACKED, booleans PLAIN, definition levels RLE. Anything else (another
 * writer's file, another encoding, a damaged file) is declined with None, and the caller
 * reads the file with DuckDB. NULLs read as -1 (the writer's NULLs are its negative values).
 */
#include "otf2native.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAD 16 /* readable bytes past the end of the file, for whole-word loads */
#define MAX_COLS 64

typedef struct {
    const uint8_t *p, *end;
    int bad;
} In;

static uint64_t varint(In *in) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (in->p >= in->end) {
            in->bad = 1;
            return 0;
        }
        uint8_t b = *in->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    in->bad = 1;
    return 0;
}

static int64_t unzigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

/* ---- Thrift compact protocol: fields of a struct, skipping what is not needed ------------- */

enum { TC_TRUE = 1, TC_FALSE = 2, TC_BYTE = 3, TC_I16 = 4, TC_I32 = 5, TC_I64 = 6, TC_DOUBLE = 7,
       TC_BINARY = 8, TC_LIST = 9, TC_SET = 10, TC_MAP = 11, TC_STRUCT = 12 };

/* The next field of the struct being read: its type (0 at the struct's end) and id. */
static int next_field(In *in, int16_t *id) {
    if (in->p >= in->end) {
        in->bad = 1;
        return 0;
    }
    uint8_t b = *in->p++;
    if (b == 0)
        return 0;
    int delta = b >> 4;
    *id = delta ? (int16_t)(*id + delta) : (int16_t)unzigzag(varint(in));
    return b & 0x0f;
}

static void skip(In *in, int type, int depth);

static void skip_struct(In *in, int depth) {
    int16_t id = 0;
    int type;
    while (!in->bad && (type = next_field(in, &id)) != 0)
        skip(in, type, depth + 1);
}

static void list_header(In *in, int *elem, uint64_t *size) {
    *elem = 0;
    *size = 0;
    if (in->p >= in->end) {
        in->bad = 1;
        return;
    }
    uint8_t b = *in->p++;
    *elem = b & 0x0f;
    *size = (b >> 4) == 15 ? varint(in) : (uint64_t)(b >> 4);
}

static void skip(In *in, int type, int depth) {
    if (depth > 16) {
        in->bad = 1;
        return;
    }
    switch (type) {
    case TC_TRUE:
    case TC_FALSE:
        return;
    case TC_BYTE:
        in->p++;
        break;
    case TC_I16:
    case TC_I32:
    case TC_I64:
        varint(in);
        break;
    case TC_DOUBLE:
        in->p += 8;
        break;
    case TC_BINARY: {
        uint64_t n = varint(in);
        if (n > (uint64_t)(in->end - in->p))
            in->bad = 1;
        else
            in->p += n;
        break;
    }
    case TC_LIST:
    case TC_SET: {
        int elem;
        uint64_t n;
        list_header(in, &elem, &n);
        for (uint64_t i = 0; i < n && !in->bad; i++)
            skip(in, elem == TC_TRUE ? TC_BYTE : elem, depth + 1); /* list booleans are bytes */
        break;
    }
    case TC_STRUCT:
        skip_struct(in, depth);
        break;
    default: /* maps never occur in what parquet.c writes */
        in->bad = 1;
    }
    if (in->p > in->end)
        in->bad = 1;
}

/* ---- what the footer says ------------------------------------------------------------------ */

typedef struct {
    char name[128];
    int type; /* 0 BOOLEAN, 1 INT32, 2 INT64 */
    int optional;
} Schema;

typedef struct {
    int ncol;
    Schema col[MAX_COLS];
    int64_t rows;
    int created_ok;
} Footer;

static void read_schema(In *in, Footer *f, int index) {
    int16_t id = 0;
    int type;
    Schema s = {{0}, -1, 0};
    int children = -1;
    while (!in->bad && (type = next_field(in, &id)) != 0) {
        if (id == 1 && type == TC_I32)
            s.type = (int)unzigzag(varint(in));
        else if (id == 3 && type == TC_I32)
            s.optional = unzigzag(varint(in)) == 1;
        else if (id == 4 && type == TC_BINARY) {
            uint64_t n = varint(in);
            if (n >= sizeof s.name || n > (uint64_t)(in->end - in->p)) {
                in->bad = 1;
                return;
            }
            memcpy(s.name, in->p, n);
            in->p += n;
        } else if (id == 5 && type == TC_I32)
            children = (int)unzigzag(varint(in));
        else
            skip(in, type, 1);
    }
    if (index == 0) { /* the root: its children are the columns */
        if (children < 0 || children > MAX_COLS)
            in->bad = 1;
        return;
    }
    if (index > MAX_COLS || s.type < 0 || s.type > 2 || children >= 0) {
        in->bad = 1;
        return;
    }
    f->col[index - 1] = s;
}

static void read_footer(In *in, Footer *f, const char *created_by) {
    int16_t id = 0;
    int type;
    while (!in->bad && (type = next_field(in, &id)) != 0) {
        if (id == 2 && type == TC_LIST) {
            int elem;
            uint64_t n;
            list_header(in, &elem, &n);
            if (elem != TC_STRUCT || n < 1 || n > MAX_COLS + 1) {
                in->bad = 1;
                return;
            }
            for (uint64_t i = 0; i < n && !in->bad; i++)
                read_schema(in, f, (int)i);
            f->ncol = (int)n - 1;
        } else if (id == 3 && type == TC_I64) {
            f->rows = unzigzag(varint(in));
        } else if (id == 6 && type == TC_BINARY) {
            uint64_t n = varint(in);
            if (n > (uint64_t)(in->end - in->p)) {
                in->bad = 1;
                return;
            }
            f->created_ok = n == strlen(created_by) && memcmp(in->p, created_by, n) == 0;
            in->p += n;
        } else {
            skip(in, type, 1); /* the row groups are found from the pages themselves */
        }
    }
}

/* The footer's length, from a file's size, first 4 bytes and last 8; 0 where they are not a
 * Parquet file's. */
static int footer_length(const uint8_t *head, const uint8_t *tail, size_t size, uint32_t *len) {
    if (size < 12 || memcmp(head, "PAR1", 4) || memcmp(tail + 4, "PAR1", 4))
        return 0;
    memcpy(len, tail, 4);
    return (size_t)*len <= size - 12;
}

/* The footer [meta, meta + len) into f; whether this codec reads the file (read_parquet and
 * parquet_rows decline the same files). */
static int footer_accepted(const uint8_t *meta, size_t len, Footer *f, const char *created_by) {
    In in = {meta, meta + len, 0};
    f->rows = -1;
    read_footer(&in, f, created_by);
    return !in.bad && f->created_ok && f->rows >= 0 && f->ncol >= 1;
}

/* ---- pages ------------------------------------------------------------------------------- */

/* A page header: the page's size and values, and whether it is a DATA_PAGE encoded as
 * parquet.c encodes ``optional`` columns of ``type``. */
static int64_t page_header(In *in, int type, int optional, int64_t *values) {
    int16_t id = 0;
    int t, page_type = -1;
    int64_t size = -1, uncompressed = -1;
    int encoding = -1, def_encoding = -1;
    *values = -1;
    while (!in->bad && (t = next_field(in, &id)) != 0) {
        if (id == 1 && t == TC_I32)
            page_type = (int)unzigzag(varint(in));
        else if (id == 2 && t == TC_I32)
            uncompressed = unzigzag(varint(in));
        else if (id == 3 && t == TC_I32)
            size = unzigzag(varint(in));
        else if (id == 5 && t == TC_STRUCT) {
            int16_t sid = 0;
            int st;
            while (!in->bad && (st = next_field(in, &sid)) != 0) {
                if (sid == 1 && st == TC_I32)
                    *values = unzigzag(varint(in));
                else if (sid == 2 && st == TC_I32)
                    encoding = (int)unzigzag(varint(in));
                else if (sid == 3 && st == TC_I32)
                    def_encoding = (int)unzigzag(varint(in));
                else
                    skip(in, st, 2);
            }
        } else
            skip(in, t, 1);
    }
    int expected = type == 0 ? 0 /* PLAIN */ : 5 /* DELTA_BINARY_PACKED */;
    if (in->bad || page_type != 0 || size < 0 || size != uncompressed || *values < 0 ||
        encoding != expected || (optional && def_encoding != 3))
        return -1;
    return size;
}

/* Definition levels of bit width 1 (RLE/bit-packed hybrid) of ``n`` rows into ``def``;
 * returns how many are 1 (not NULL), or -1. */
static int64_t def_levels(In *in, uint8_t *def, int64_t n) {
    int64_t i = 0, present = 0;
    while (i < n && !in->bad) {
        uint64_t header = varint(in);
        if (header & 1) { /* bit-packed groups of 8 */
            uint64_t groups = header >> 1;
            if (groups > (uint64_t)(in->end - in->p)) {
                in->bad = 1;
                break;
            }
            for (uint64_t g = 0; g < groups; g++) {
                uint8_t byte = in->p[g];
                for (int b = 0; b < 8 && i < n; b++, i++) {
                    def[i] = (byte >> b) & 1;
                    present += def[i];
                }
            }
            in->p += groups;
        } else { /* a run of one value, in one byte */
            uint64_t run = header >> 1;
            if (in->p >= in->end || run > (uint64_t)(n - i)) {
                in->bad = 1;
                break;
            }
            uint8_t v = *in->p++ & 1;
            memset(def + i, v, run);
            present += v ? (int64_t)run : 0;
            i += (int64_t)run;
        }
    }
    return in->bad || i != n ? -1 : present;
}

/* DELTA_BINARY_PACKED: ``n`` values into ``out`` (as int64; ``wrap32``: 32-bit arithmetic). */
static int delta_decode(In *in, int64_t *out, int64_t n, int wrap32) {
    uint64_t block = varint(in), minis = varint(in), total = varint(in);
    int64_t v = unzigzag(varint(in));
    if (in->bad || block == 0 || block % 128 || block > 512 || minis == 0 || block % minis ||
        (block / minis) % 32 || (int64_t)total != n || minis > 64)
        return -1;
    uint64_t per_mini = block / minis;
    if (n == 0)
        return 0;
    out[0] = wrap32 ? (int32_t)v : v;
    int64_t i = 1;
    while (i < n) {
        int64_t min = unzigzag(varint(in));
        if (in->bad || (uint64_t)(in->end - in->p) < minis)
            return -1;
        const uint8_t *widths = in->p;
        in->p += minis;
        for (uint64_t k = 0; k < minis && i < n; k++) {
            int w = widths[k];
            if (w > 64)
                return -1;
            size_t bytes = (size_t)w * per_mini / 8;
            if (bytes > (size_t)(in->end - in->p))
                return -1;
            const uint8_t *src = in->p;
            uint64_t m = per_mini < (uint64_t)(n - i) ? per_mini : (uint64_t)(n - i);
            uint64_t d[512]; /* per_mini <= block <= 512 */
            if (w == 0) {
                memset(d, 0, m * sizeof *d);
            } else if (w <= 56) { /* one 8-byte load holds the value (PAD keeps it inside) */
                uint64_t mask = (1ull << w) - 1;
                for (uint64_t j = 0; j < m; j++) {
                    uint64_t bit = j * (uint64_t)w, word;
                    memcpy(&word, src + bit / 8, 8);
                    d[j] = (word >> (bit % 8)) & mask;
                }
            } else {
                for (uint64_t j = 0; j < m; j++) {
                    uint64_t bit = j * (uint64_t)w;
                    unsigned __int128 word;
                    memcpy(&word, src + bit / 8, sizeof word);
                    word >>= bit % 8;
                    d[j] = w == 64 ? (uint64_t)word : (uint64_t)word & ((1ull << w) - 1);
                }
            }
            if (wrap32) {
                uint32_t x = (uint32_t)out[i - 1];
                for (uint64_t j = 0; j < m; j++, i++) {
                    x += (uint32_t)min + (uint32_t)d[j];
                    out[i] = (int32_t)x;
                }
            } else {
                uint64_t x = (uint64_t)out[i - 1];
                for (uint64_t j = 0; j < m; j++, i++) {
                    x += (uint64_t)min + d[j];
                    out[i] = (int64_t)x;
                }
            }
            in->p += bytes;
        }
    }
    return 0;
}

/* One column's page at ``*at`` of ``rows`` rows into ``dst``; ``*at`` moves past it. */
static int read_page(const uint8_t *file, size_t size, size_t *at, const Schema *s, int64_t rows, char *dst,
                     int64_t *scratch, uint8_t *def) {
    if (*at >= size)
        return -1;
    In in = {file + *at, file + size, 0};
    int64_t values;
    int64_t page = page_header(&in, s->type, s->optional, &values);
    if (page < 0 || values != rows || page > in.end - in.p)
        return -1;
    *at = (size_t)(in.p - file) + (size_t)page; /* the next page */
    In body = {in.p, in.p + page, 0};
    int64_t present = rows;
    if (s->optional) {
        if (body.end - body.p < 4)
            return -1;
        uint32_t len;
        memcpy(&len, body.p, 4);
        body.p += 4;
        if (len > (uint64_t)(body.end - body.p))
            return -1;
        In levels = {body.p, body.p + len, 0};
        present = def_levels(&levels, def, rows);
        if (present < 0)
            return -1;
        body.p += len;
    }
    if (s->type == 2 && !s->optional) /* straight into the column */
        return delta_decode(&body, (int64_t *)dst, rows, 0);
    if (s->type == 0) { /* PLAIN booleans, one bit each */
        if ((present + 7) / 8 > body.end - body.p)
            return -1;
        for (int64_t i = 0; i < present; i++)
            scratch[i] = (body.p[i / 8] >> (i % 8)) & 1;
    } else if (delta_decode(&body, scratch, present, s->type == 1) < 0) {
        return -1;
    }
    for (int64_t i = 0, k = 0; i < rows; i++) {
        int64_t x = s->optional && !def[i] ? -1 : scratch[k++];
        if (s->type == 2)
            ((int64_t *)dst)[i] = x;
        else if (s->type == 1)
            ((int32_t *)dst)[i] = (int32_t)x;
        else
            ((uint8_t *)dst)[i] = (uint8_t)(x != 0); /* a NULL boolean reads as true: never written */
    }
    return 0;
}

/* Decode every row group (found by walking the pages after the magic: each group is one page
 * per column, in schema order). */
static int decode(const uint8_t *file, size_t size, size_t meta_start, const Footer *f, char **dst) {
    static const size_t item[3] = {1, 4, 8};
    int64_t done = 0;
    size_t at = 4;
    int64_t *scratch = NULL;
    uint8_t *def = NULL;
    int rc = 0;
    while (done < f->rows && rc == 0) {
        /* the group's rows: from the first column's page header */
        In peek = {file + at, file + meta_start, 0};
        int64_t rows;
        if (at >= meta_start || page_header(&peek, f->col[0].type, f->col[0].optional, &rows) < 0 ||
            rows <= 0 || rows > f->rows - done)
            return -1;
        free(scratch);
        free(def);
        scratch = malloc((size_t)rows * sizeof(int64_t) + 8);
        def = malloc((size_t)rows + 8);
        if (scratch == NULL || def == NULL) {
            rc = -2;
            break;
        }
        for (int k = 0; k < f->ncol && rc == 0; k++)
            if (read_page(file, meta_start, &at, &f->col[k], rows, dst[k] + (size_t)done * item[f->col[k].type],
                          scratch, def) < 0)
                rc = -1;
        done += rows;
    }
    free(scratch);
    free(def);
    return rc == 0 && at == meta_start ? 0 : rc ? rc : -1;
}

PyObject *native_read_parquet(PyObject *self, PyObject *args) {
    const char *path, *created_by;
    if (!PyArg_ParseTuple(args, "ss", &path, &created_by))
        return NULL;
    uint8_t *file = NULL;
    size_t size = 0;
    int io_error = 0, declined = 0, oom = 0;
    Footer f;
    memset(&f, 0, sizeof f);
    size_t meta_start = 0;
    Py_BEGIN_ALLOW_THREADS
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        io_error = errno;
    } else {
        if (fseek(fp, 0, SEEK_END) == 0) {
            long end = ftell(fp);
            size = end > 0 ? (size_t)end : 0;
            file = malloc(size + PAD);
            if (file == NULL)
                oom = 1;
            else if (fseek(fp, 0, SEEK_SET) != 0 || fread(file, 1, size, fp) != size)
                io_error = errno ? errno : EIO;
            else
                memset(file + size, 0, PAD);
        } else {
            io_error = errno;
        }
        fclose(fp);
    }
    if (!io_error && !oom) {
        uint32_t len = 0;
        if (!footer_length(file, file + size - 8, size, &len)) {
            declined = 1;
        } else {
            meta_start = size - 8 - len;
            declined = !footer_accepted(file + meta_start, len, &f, created_by);
        }
    }
    Py_END_ALLOW_THREADS
    if (io_error || oom) {
        free(file);
        if (oom)
            return PyErr_NoMemory();
        errno = io_error;
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
    }
    if (declined) {
        free(file);
        Py_RETURN_NONE;
    }
    static const size_t item[3] = {1, 4, 8};
    char *dst[MAX_COLS] = {0};
    for (int k = 0; k < f.ncol; k++) {
        dst[k] = malloc((size_t)f.rows * item[f.col[k].type] + 1);
        if (dst[k] == NULL)
            oom = 1;
    }
    int rc = -2;
    if (!oom) {
        Py_BEGIN_ALLOW_THREADS
        rc = decode(file, size, meta_start, &f, dst);
        Py_END_ALLOW_THREADS
    }
    free(file);
    PyObject *out = NULL;
    if (rc == 0)
        out = PyList_New(0);
    for (int k = 0; k < f.ncol; k++) {
        if (out == NULL) {
            free(dst[k]);
            continue;
        }
        static const char *kinds[3] = {"bool", "int32", "int64"};
        PyObject *col = column_new(dst[k], (size_t)f.rows * item[f.col[k].type]);
        PyObject *entry = col == NULL ? NULL : Py_BuildValue("(ssN)", f.col[k].name, kinds[f.col[k].type], col);
        if (entry == NULL || PyList_Append(out, entry) < 0) {
            Py_XDECREF(entry);
            Py_CLEAR(out);
            for (int j = k + 1; j < f.ncol; j++)
                free(dst[j]);
            return NULL;
        }
        Py_DECREF(entry);
    }
    if (rc == -2 || oom)
        return PyErr_NoMemory();
    if (rc != 0)
        Py_RETURN_NONE;
    return out;
}

/* parquet_rows(path, created_by) -> rows, or None: only the footer read, to choose how to
 * read a file before reading it (the codec whole, or DuckDB a part at a time). */
PyObject *native_parquet_rows(PyObject *self, PyObject *args) {
    const char *path, *created_by;
    if (!PyArg_ParseTuple(args, "ss", &path, &created_by))
        return NULL;
    int io_error = 0, declined = 0, oom = 0;
    Footer f;
    memset(&f, 0, sizeof f);
    Py_BEGIN_ALLOW_THREADS
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        io_error = errno;
    } else {
        uint8_t head[4], tail[8];
        uint32_t len = 0;
        long size = -1;
        if (fseek(fp, 0, SEEK_END) != 0 || (size = ftell(fp)) < 0) {
            io_error = errno ? errno : EIO;
        } else if (size < 12) {
            declined = 1;
        } else if (fseek(fp, 0, SEEK_SET) != 0 || fread(head, 1, 4, fp) != 4 || fseek(fp, size - 8, SEEK_SET) != 0 ||
                   fread(tail, 1, 8, fp) != 8) {
            io_error = errno ? errno : EIO;
        } else if (!footer_length(head, tail, (size_t)size, &len)) {
            declined = 1;
        } else {
            uint8_t *meta = malloc((size_t)len + PAD);
            if (meta == NULL) {
                oom = 1;
            } else if (fseek(fp, size - 8 - (long)len, SEEK_SET) != 0 || fread(meta, 1, len, fp) != len) {
                io_error = errno ? errno : EIO;
            } else {
                memset(meta + len, 0, PAD);
                declined = !footer_accepted(meta, len, &f, created_by);
            }
            free(meta);
        }
        fclose(fp);
    }
    Py_END_ALLOW_THREADS
    if (oom)
        return PyErr_NoMemory();
    if (io_error) {
        errno = io_error;
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
    }
    if (declined)
        Py_RETURN_NONE;
    return PyLong_FromLongLong((long long)f.rows);
}
