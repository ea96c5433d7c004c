/* write_parquet: numpy-like columns -> one Parquet file, without the GIL.
 *
 * What the analysis writes per chunk of the reader (intervals: ten integer and boolean
 * columns, up to half a million rows): flat schema, one row group per million rows, one
 * data page per column chunk, no compression. Integers are DELTA_BINARY_PACKED (Parquet 2:
 * times, indices and ids that change a little from row to row take a few bits each),
 * booleans PLAIN (one bit each), text (given as codes into a tuple of names; JSON text
 * alike) RLE_DICTIONARY after a dictionary page of the names, doubles PLAIN (never NULL: no
 * value marks it; an empty column may still be declared nullable, as the empty files of the
 * tables without rows are); a column may map negative values to NULL (definition levels,
 * RLE/bit-packed hybrid). Row-group statistics (min, max, null count; for doubles the null
 * count only) let readers skip row groups. Metadata is Thrift's compact protocol. The
 * format: https://parquet.apache.org/docs/ (file format, encodings, parquet.thrift); every
 * file is read back by DuckDB in the tests.
 */
#include "otf2native.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROW_GROUP 1000000
#define BLOCK 128
#define MINIBLOCKS 4
#define MINI (BLOCK / MINIBLOCKS)

/* The hot loops in a second version for AVX2 where the compiler can make one, chosen when
 * the module loads: baseline x86-64 has no 64-bit compare, so each minimum and maximum is a
 * chain of conditional moves (the intervals' columns: 155 -> 90 ms per 2.3M rows). */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define HOT __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef HOT
#define HOT
#endif

enum { K_INT64, K_INT32, K_BOOL, K_TEXT, K_DOUBLE };
/* Parquet enums */
enum { T_BOOLEAN = 0, T_INT32 = 1, T_INT64 = 2, T_DOUBLE = 5, T_BYTE_ARRAY = 6 };
enum { UTF8 = 0, JSON = 19 }; /* ConvertedType */
enum { E_PLAIN = 0, E_RLE = 3, E_DELTA = 5, E_RLE_DICTIONARY = 8 };

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int failed;
} Buf;

static void reserve(Buf *b, size_t extra) {
    if (b->failed || b->n + extra <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + extra)
        cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (p == NULL) {
        b->failed = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

static void put(Buf *b, const void *data, size_t n) {
    reserve(b, n);
    if (b->failed)
        return;
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_byte(Buf *b, uint8_t v) { put(b, &v, 1); }

static void put_varint(Buf *b, uint64_t v) {
    uint8_t tmp[10];
    int n = 0;
    do {
        uint8_t byte = v & 0x7f;
        v >>= 7;
        tmp[n++] = byte | (v ? 0x80 : 0);
    } while (v);
    put(b, tmp, n);
}

static uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

/* ---- Thrift compact protocol ----------------------------------------------------------- */

enum { TC_I32 = 5, TC_I64 = 6, TC_BINARY = 8, TC_LIST = 9, TC_STRUCT = 12 };

typedef struct {
    Buf *b;
    int16_t last[8]; /* last field id written, per open struct */
    int depth;
} Thrift;

static void field(Thrift *t, int type, int16_t id) {
    int16_t delta = id - t->last[t->depth];
    if (delta > 0 && delta <= 15) {
        put_byte(t->b, (uint8_t)(delta << 4 | type));
    } else {
        put_byte(t->b, (uint8_t)type);
        put_varint(t->b, zigzag(id));
    }
    t->last[t->depth] = id;
}

static void begin(Thrift *t) { t->last[++t->depth] = 0; }
static void end(Thrift *t) {
    put_byte(t->b, 0);
    t->depth--;
}
static void t_i32(Thrift *t, int16_t id, int32_t v) {
    field(t, TC_I32, id);
    put_varint(t->b, zigzag(v));
}
static void t_i64(Thrift *t, int16_t id, int64_t v) {
    field(t, TC_I64, id);
    put_varint(t->b, zigzag(v));
}
static void t_binary(Thrift *t, int16_t id, const void *data, size_t n) {
    field(t, TC_BINARY, id);
    put_varint(t->b, n);
    put(t->b, data, n);
}
static void t_struct(Thrift *t, int16_t id) {
    field(t, TC_STRUCT, id);
    begin(t);
}
static void t_list(Thrift *t, int16_t id, int elem, size_t size) {
    field(t, TC_LIST, id);
    if (size < 15) {
        put_byte(t->b, (uint8_t)(size << 4 | elem));
    } else {
        put_byte(t->b, (uint8_t)(0xf0 | elem));
        put_varint(t->b, size);
    }
}

/* ---- encodings ------------------------------------------------------------------------- */

/* 32 values of ``W`` bits each, least significant bit first: 4 * W bytes. One function per
 * width: with W a constant the loop unrolls and every shift is known (the general loop with
 * the width a variable took a fifth of a chunk's write). The values fit in W bits (the caller
 * subtracted the block's minimum and measured the widest), so no mask; a 64-bit accumulator,
 * each value split where a word fills. */
#define PACK(W)                                                                             \
    static void pack_##W(uint8_t *out, const uint64_t *v) {                                 \
        uint64_t acc = 0;                                                                   \
        int bits = 0;                                                                       \
        _Pragma("GCC unroll 32") for (int i = 0; i < 32; i++) {                             \
            acc |= v[i] << bits;                                                            \
            bits += W;                                                                      \
            if (bits >= 64) {                                                               \
                memcpy(out, &acc, 8);                                                       \
                out += 8;                                                                   \
                bits -= 64;                                                                 \
                acc = bits ? v[i] >> (W - bits) : 0;                                        \
            }                                                                               \
        }                                                                                   \
        memcpy(out, &acc, (size_t)bits / 8); /* 32 * W bits in all: 0 or 32 bits left */    \
    }
#define WIDTHS(X)                                                                           \
    X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16)   \
    X(17) X(18) X(19) X(20) X(21) X(22) X(23) X(24) X(25) X(26) X(27) X(28) X(29) X(30)      \
    X(31) X(32) X(33) X(34) X(35) X(36) X(37) X(38) X(39) X(40) X(41) X(42) X(43) X(44)      \
    X(45) X(46) X(47) X(48) X(49) X(50) X(51) X(52) X(53) X(54) X(55) X(56) X(57) X(58)      \
    X(59) X(60) X(61) X(62) X(63)
WIDTHS(PACK)
#define PACK_ENTRY(W) pack_##W,
static void (*const PACKERS[64])(uint8_t *, const uint64_t *) = {NULL, WIDTHS(PACK_ENTRY)};

static void pack32(Buf *b, const uint64_t *v, int w) {
    if (w == 0)
        return;
    reserve(b, 4 * (size_t)w);
    if (b->failed)
        return;
    uint8_t *out = b->p + b->n;
    b->n += 4 * (size_t)w;
    if (w == 64)
        memcpy(out, v, 32 * 8); /* little endian, as everywhere we build */
    else
        PACKERS[w](out, v);
}

static int width(uint64_t v) { return v ? 64 - __builtin_clzll(v) : 0; }

/* DELTA_BINARY_PACKED: blocks of 128 deltas in 4 miniblocks of 32, each bit-packed after
 * subtracting the block's smallest delta. ``wrap32``: deltas in 32-bit arithmetic (INT32).
 * ``stats``, when given: the smallest and the largest value, found while the values are at
 * hand (a pass of their own over a chunk's columns cost a tenth of its write). */
HOT static void delta_encode(Buf *b, const int64_t *v, size_t n, int wrap32, int64_t *stats) {
    put_varint(b, BLOCK);
    put_varint(b, MINIBLOCKS);
    put_varint(b, n);
    put_varint(b, zigzag(n ? v[0] : 0));
    int64_t lo = n ? v[0] : INT64_MAX, hi = n ? v[0] : INT64_MIN;
    uint64_t d[BLOCK];
    for (size_t start = 1; start < n; start += BLOCK) {
        size_t m = n - start < BLOCK ? n - start : BLOCK;
        const int64_t *x = v + start;
        int64_t min = INT64_MAX;
        if (wrap32) {
            for (size_t i = 0; i < m; i++) {
                int64_t delta = (int32_t)((uint32_t)x[i] - (uint32_t)x[i - 1]);
                d[i] = (uint64_t)delta;
                min = delta < min ? delta : min;
            }
            for (size_t i = 0; i < m; i++)
                d[i] = (uint32_t)((uint32_t)d[i] - (uint32_t)min);
        } else {
            for (size_t i = 0; i < m; i++) {
                int64_t delta = (int64_t)((uint64_t)x[i] - (uint64_t)x[i - 1]);
                d[i] = (uint64_t)delta;
                min = delta < min ? delta : min;
            }
            for (size_t i = 0; i < m; i++)
                d[i] -= (uint64_t)min;
        }
        if (stats)
            for (size_t i = 0; i < m; i++) {
                lo = x[i] < lo ? x[i] : lo;
                hi = x[i] > hi ? x[i] : hi;
            }
        for (size_t i = m; i < BLOCK; i++)
            d[i] = 0;
        uint8_t widths[MINIBLOCKS];
        for (int k = 0; k < MINIBLOCKS; k++) {
            uint64_t any = 0; /* the widest value decides the miniblock's width */
            for (int i = 0; i < MINI; i++)
                any |= d[k * MINI + i];
            widths[k] = (uint8_t)width(any);
        }
        put_varint(b, zigzag(min));
        put(b, widths, MINIBLOCKS);
        for (size_t k = 0; k < MINIBLOCKS && k * MINI < m; k++)
            pack32(b, d + k * MINI, widths[k]);
    }
    if (stats) {
        stats[0] = lo;
        stats[1] = hi;
    }
}

/* ---- columns --------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int kind;
    const void *data; /* K_TEXT: int32 codes into text (negative: NULL) */
    int null_below_zero;
    const char **text;
    const Py_ssize_t *text_len;
    Py_ssize_t ntext;
    /* per row group, filled while encoding */
    int64_t start, offset, dictionary, size, nulls, min, max; /* chunk, data page, dictionary page */
    int has_stats;
    int json; /* K_TEXT whose names are JSON documents (converted type JSON) */
} Col;

/* ``rows`` values ``src[i]`` as int64 into ``scratch[i]``, the smallest and the largest into
 * ``min`` and ``max``: in 16 lanes (four vectors; one would wait on its own previous blend at
 * every step). */
#define COPY_MIN_MAX()                                                                      \
    do {                                                                                    \
        int64_t lo[16], hi[16];                                                             \
        for (int k = 0; k < 16; k++) {                                                      \
            lo[k] = INT64_MAX;                                                              \
            hi[k] = INT64_MIN;                                                              \
        }                                                                                   \
        size_t i = 0;                                                                       \
        for (; i + 16 <= rows; i += 16)                                                     \
            for (int k = 0; k < 16; k++) {                                                  \
                int64_t x = (int64_t)src[i + k];                                            \
                scratch[i + k] = x;                                                         \
                lo[k] = x < lo[k] ? x : lo[k];                                              \
                hi[k] = x > hi[k] ? x : hi[k];                                              \
            }                                                                               \
        for (; i < rows; i++) {                                                             \
            int64_t x = (int64_t)src[i];                                                    \
            scratch[i] = x;                                                                 \
            min = x < min ? x : min;                                                        \
            max = x > max ? x : max;                                                        \
        }                                                                                   \
        for (int k = 0; k < 16; k++) {                                                      \
            min = lo[k] < min ? lo[k] : min;                                                \
            max = hi[k] > max ? hi[k] : max;                                                \
        }                                                                                   \
    } while (0)

/* Gather the non-NULL values of rows [a, a + rows) into ``scratch`` (as int64) and their
 * statistics; returns how many. Without NULLs, a copy; with them, each value is stored and
 * kept (the count moves on) only if it is not NULL, without a branch to mispredict. */
#define GATHER(type)                                                                        \
    do {                                                                                    \
        const type *src = (const type *)c->data + a;                                        \
        if (!c->null_below_zero) {                                                          \
            COPY_MIN_MAX();                                                                 \
            n = rows;                                                                       \
            break;                                                                          \
        }                                                                                   \
        for (size_t i = 0; i < rows; i++) {                                                 \
            int64_t x = (int64_t)src[i];                                                    \
            int keep = x >= 0;                                                              \
            scratch[n] = x;                                                                 \
            min = keep && x < min ? x : min;                                                \
            max = keep && x > max ? x : max;                                                \
            n += (size_t)keep;                                                              \
        }                                                                                   \
    } while (0)

HOT static size_t gather(Col *c, size_t a, size_t rows, int64_t *scratch) {
    size_t n = 0;
    int64_t min = INT64_MAX, max = INT64_MIN;
    if (c->kind == K_DOUBLE) {
        /* encoded where they are, never NULL; no statistics (optional in Parquet: a NaN
           would need rules of its own) */
        c->nulls = 0;
        c->has_stats = 0;
        return rows;
    }
    if (c->kind == K_INT64 && !c->null_below_zero) {
        /* nothing to gather: the values are encoded where they are, and delta_encode finds
           their statistics */
        c->nulls = 0;
        c->has_stats = rows > 0;
        return rows;
    }
    if (c->kind == K_INT64)
        GATHER(int64_t);
    else if (c->kind == K_INT32 || c->kind == K_TEXT)
        GATHER(int32_t);
    else
        GATHER(uint8_t);
    if (c->kind == K_BOOL)
        for (size_t i = 0; i < n; i++)
            scratch[i] = scratch[i] != 0;
    c->nulls = (int64_t)(rows - n);
    c->has_stats = n > 0 && c->kind != K_TEXT; /* text: only the null count */
    c->min = c->kind == K_BOOL ? min != 0 : min;
    c->max = c->kind == K_BOOL ? max != 0 : max;
    return n;
}

/* The encoding of a column's values (its data page and its column metadata say the same). */
static int encoding(const Col *c) {
    return c->kind == K_TEXT ? E_RLE_DICTIONARY : c->kind == K_BOOL || c->kind == K_DOUBLE ? E_PLAIN : E_DELTA;
}

/* Bit r of the bytes from ``o`` on (least significant first): ``test`` of row r of ``rows``,
 * whose values ``decl`` declares; eight rows a byte, without a branch. */
#define BITS(decl, test)                                                                    \
    do {                                                                                    \
        decl;                                                                               \
        for (size_t g = 0; g < rows; g += 8) {                                              \
            uint8_t byte = 0;                                                               \
            size_t end = rows - g < 8 ? rows : g + 8;                                       \
            for (size_t r = g; r < end; r++)                                                \
                byte |= (uint8_t)((test) << (r - g));                                       \
            *o++ = byte;                                                                    \
        }                                                                                   \
    } while (0)

/* One column chunk (page header + page) of rows [a, b) into ``out``; sets offset and size. */
static void column_chunk(Buf *out, Col *c, size_t a, size_t rows, int64_t *scratch, Buf *scratch_page) {
    Buf page = *scratch_page; /* one buffer for every column: its pages are touched once */
    page.n = 0;
    reserve(&page, rows * 9 + rows / 8 + 64); /* at most: values, levels, headers */
    size_t n = gather(c, a, rows, scratch);
    if (c->null_below_zero) {
        /* definition levels (bit width 1), as a 4-byte length and the RLE/bit-packed hybrid:
           one run of ones when nothing is NULL, else bit-packed groups of 8 */
        Buf levels = {0};
        if (c->nulls == 0) {
            put_varint(&levels, (uint64_t)rows << 1);
            put_byte(&levels, 1);
        } else {
            size_t groups = (rows + 7) / 8;
            put_varint(&levels, (uint64_t)groups << 1 | 1);
            reserve(&levels, groups);
            if (!levels.failed) {
                uint8_t *o = levels.p + levels.n;
                if (c->kind == K_INT64)
                    BITS(const int64_t *src = (const int64_t *)c->data + a, src[r] >= 0);
                else /* K_INT32, K_TEXT (nullable booleans are not written) */
                    BITS(const int32_t *src = (const int32_t *)c->data + a, src[r] >= 0);
                levels.n += groups;
            }
        }
        uint32_t len = (uint32_t)levels.n;
        put(&page, &len, 4);
        put(&page, levels.p, levels.n);
        page.failed |= levels.failed;
        free(levels.p);
    }
    if (c->kind == K_TEXT) {
        /* RLE_DICTIONARY: the codes, bit-packed in one run of groups of 8 after their width */
        int w = width((uint64_t)(c->ntext > 1 ? c->ntext - 1 : 1));
        size_t groups = (n + 7) / 8;
        put_byte(&page, (uint8_t)w);
        put_varint(&page, (uint64_t)groups << 1 | 1);
        reserve(&page, groups * (size_t)w + 8);
        if (!page.failed) {
            uint8_t *o = page.p + page.n;
            uint64_t acc = 0;
            int bits = 0;
            for (size_t i = 0; i < groups * 8; i++) {
                acc |= (uint64_t)(i < n ? scratch[i] : 0) << bits;
                bits += w;
                while (bits >= 8) {
                    *o++ = (uint8_t)acc;
                    acc >>= 8;
                    bits -= 8;
                }
            }
            page.n += groups * (size_t)w; /* 8 values of w bits: w bytes a group, nothing left over */
        }
    } else if (c->kind == K_BOOL) {
        size_t bytes = (n + 7) / 8;
        reserve(&page, bytes);
        if (!page.failed) {
            uint8_t *o = page.p + page.n;
            size_t rows = n;
            BITS(const int64_t *src = scratch, src[r] != 0);
            page.n += bytes;
        }
    } else if (c->kind == K_DOUBLE) { /* PLAIN: the values as they are (little endian) */
        put(&page, (const double *)c->data + a, n * sizeof(double));
    } else if (c->kind == K_INT64 && !c->null_below_zero) {
        int64_t stats[2];
        delta_encode(&page, (const int64_t *)c->data + a, n, 0, stats);
        c->min = stats[0];
        c->max = stats[1];
    } else {
        delta_encode(&page, scratch, n, c->kind == K_INT32, NULL);
    }
    Thrift t = {out, {0}, 0};
    c->start = (int64_t)out->n;
    if (c->kind == K_TEXT) { /* the dictionary page first: every name, PLAIN */
        Buf names = {0};
        for (Py_ssize_t k = 0; k < c->ntext; k++) {
            uint32_t len = (uint32_t)c->text_len[k];
            put(&names, &len, 4);
            put(&names, c->text[k], len);
        }
        c->dictionary = (int64_t)out->n;
        t_i32(&t, 1, 2); /* DICTIONARY_PAGE */
        t_i32(&t, 2, (int32_t)names.n);
        t_i32(&t, 3, (int32_t)names.n);
        t_struct(&t, 7);
        t_i32(&t, 1, (int32_t)c->ntext);
        t_i32(&t, 2, E_PLAIN);
        end(&t);
        put_byte(out, 0);
        put(out, names.p, names.n);
        out->failed |= names.failed;
        free(names.p);
        t.last[0] = 0; /* a new PageHeader */
    }
    c->offset = (int64_t)out->n;
    t_i32(&t, 1, 0); /* DATA_PAGE */
    t_i32(&t, 2, (int32_t)page.n);
    t_i32(&t, 3, (int32_t)page.n);
    t_struct(&t, 5);
    t_i32(&t, 1, (int32_t)rows);
    t_i32(&t, 2, encoding(c));
    t_i32(&t, 3, E_RLE);
    t_i32(&t, 4, E_RLE);
    end(&t);
    put_byte(out, 0);
    put(out, page.p, page.n);
    out->failed |= page.failed;
    c->size = (int64_t)out->n - c->start;
    *scratch_page = page;
}

static int physical(const Col *c) {
    return c->kind == K_INT64    ? T_INT64
           : c->kind == K_INT32  ? T_INT32
           : c->kind == K_TEXT   ? T_BYTE_ARRAY
           : c->kind == K_DOUBLE ? T_DOUBLE
                                 : T_BOOLEAN;
}

static void stat_value(Thrift *t, int16_t id, const Col *c, int64_t v) {
    if (c->kind == K_INT64) {
        t_binary(t, id, &v, 8);
    } else if (c->kind == K_INT32) {
        int32_t x = (int32_t)v;
        t_binary(t, id, &x, 4);
    } else {
        uint8_t x = (uint8_t)v;
        t_binary(t, id, &x, 1);
    }
}

/* The whole file into ``out``: ``ncol`` columns of ``rows`` rows. */
static void encode_file(Buf *out, Col *cols, int ncol, size_t rows, const char *created_by) {
    int64_t *scratch = malloc((rows < ROW_GROUP ? rows : ROW_GROUP) * sizeof(int64_t) + 8);
    size_t groups = rows ? (rows + ROW_GROUP - 1) / ROW_GROUP : 0;
    Buf meta = {0}, page = {0};
    Thrift t = {&meta, {0}, 0};
    if (scratch == NULL) {
        out->failed = 1;
        return;
    }
    size_t guess = rows * (size_t)ncol * 5 + 4096; /* most files fit: no copies while growing */
    reserve(out, guess < ((size_t)256 << 20) ? guess : ((size_t)256 << 20));
    put(out, "PAR1", 4);
    t_i32(&t, 1, 1); /* version */
    t_list(&t, 2, TC_STRUCT, (size_t)ncol + 1);
    begin(&t);
    t_binary(&t, 4, "schema", 6);
    t_i32(&t, 5, ncol);
    end(&t);
    for (int k = 0; k < ncol; k++) {
        begin(&t);
        t_i32(&t, 1, physical(&cols[k]));
        t_i32(&t, 3, cols[k].null_below_zero ? 1 : 0); /* OPTIONAL : REQUIRED */
        t_binary(&t, 4, cols[k].name, strlen(cols[k].name));
        if (cols[k].kind == K_TEXT) /* converted_type: readers take the bytes for text (or JSON) */
            t_i32(&t, 6, cols[k].json ? JSON : UTF8);
        end(&t);
    }
    t_i64(&t, 3, (int64_t)rows);
    t_list(&t, 4, TC_STRUCT, groups);
    for (size_t g = 0; g < groups; g++) {
        size_t a = g * ROW_GROUP, n = rows - a < ROW_GROUP ? rows - a : ROW_GROUP;
        int64_t total = 0;
        begin(&t); /* RowGroup */
        t_list(&t, 1, TC_STRUCT, (size_t)ncol);
        for (int k = 0; k < ncol; k++) {
            Col *c = &cols[k];
            column_chunk(out, c, a, n, scratch, &page);
            total += c->size;
            begin(&t); /* ColumnChunk */
            t_i64(&t, 2, c->start);
            t_struct(&t, 3); /* ColumnMetaData */
            t_i32(&t, 1, physical(c));
            int text = c->kind == K_TEXT;
            t_list(&t, 2, TC_I32, (size_t)(1 + text + (c->null_below_zero || text)));
            if (text)
                put_varint(&meta, zigzag(E_PLAIN)); /* the dictionary page */
            put_varint(&meta, zigzag(encoding(c)));
            if (c->null_below_zero || text)
                put_varint(&meta, zigzag(E_RLE));
            t_list(&t, 3, TC_BINARY, 1);
            put_varint(&meta, strlen(c->name));
            put(&meta, c->name, strlen(c->name));
            t_i32(&t, 4, 0); /* UNCOMPRESSED */
            t_i64(&t, 5, (int64_t)n);
            t_i64(&t, 6, c->size);
            t_i64(&t, 7, c->size);
            t_i64(&t, 9, c->offset);
            if (text)
                t_i64(&t, 11, c->dictionary);
            t_struct(&t, 12); /* Statistics */
            t_i64(&t, 3, c->nulls);
            if (c->has_stats) {
                stat_value(&t, 5, c, c->max);
                stat_value(&t, 6, c, c->min);
            }
            end(&t);
            end(&t); /* ColumnMetaData */
            end(&t); /* ColumnChunk */
        }
        t_i64(&t, 2, total);
        t_i64(&t, 3, (int64_t)n);
        end(&t); /* RowGroup */
    }
    t_binary(&t, 6, created_by, strlen(created_by));
    /* column_orders: TypeDefinedOrder (signed for integers), which readers need to trust
       the statistics' min_value and max_value */
    t_list(&t, 7, TC_STRUCT, (size_t)ncol);
    for (int k = 0; k < ncol; k++) {
        begin(&t);
        t_struct(&t, 1);
        end(&t);
        end(&t);
    }
    put_byte(&meta, 0); /* end of FileMetaData */
    uint32_t len = (uint32_t)meta.n;
    put(out, meta.p, meta.n);
    put(out, &len, 4);
    put(out, "PAR1", 4);
    out->failed |= meta.failed;
    free(meta.p);
    out->failed |= page.failed;
    free(page.p);
    free(scratch);
}

/* ---- Python ---------------------------------------------------------------------------- */

/* A text column's names (strings: held by the caller's sequence while the file is written),
 * after checking that its codes name them. */
static int texts_of(Col *c, PyObject *names, Py_ssize_t rows) {
    if (names == NULL || !PyTuple_Check(names)) {
        PyErr_SetString(PyExc_ValueError, "a text column needs a tuple of names");
        return -1;
    }
    c->ntext = PyTuple_GET_SIZE(names);
    const char **text = calloc(c->ntext ? c->ntext : 1, sizeof *text);
    Py_ssize_t *len = calloc(c->ntext ? c->ntext : 1, sizeof *len);
    c->text = text;
    c->text_len = len;
    if (text == NULL || len == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < c->ntext; k++) {
        text[k] = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(names, k), &len[k]);
        if (text[k] == NULL)
            return -1;
    }
    const int32_t *codes = c->data;
    for (Py_ssize_t i = 0; i < rows; i++)
        if (codes[i] >= c->ntext || (codes[i] < 0 && !c->null_below_zero)) {
            PyErr_Format(PyExc_ValueError, "text column %s has code %d, not one of its %zd names%s", c->name,
                         codes[i], c->ntext, codes[i] < 0 ? " (and is not nullable)" : "");
            return -1;
        }
    return 0;
}

PyObject *native_write_parquet(PyObject *self, PyObject *args) {
    const char *path, *created_by;
    PyObject *columns;
    if (!PyArg_ParseTuple(args, "sOs", &path, &columns, &created_by))
        return NULL;
    PyObject *seq = PySequence_Fast(columns, "columns must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t ncol = PySequence_Fast_GET_SIZE(seq);
    Col *cols = calloc(ncol ? ncol : 1, sizeof(Col));
    Py_buffer *views = calloc(ncol ? ncol : 1, sizeof(Py_buffer));
    Py_ssize_t held = 0, rows = -1;
    PyObject *result = NULL;
    if (cols == NULL || views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < ncol; k++) {
        const char *kind;
        PyObject *data, *names = NULL;
        int nullable;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "ssOp|O", &cols[k].name, &kind, &data, &nullable,
                              &names))
            goto done;
        if (PyObject_GetBuffer(data, &views[k], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        held++;
        int json = strcmp(kind, "json") == 0, text = json || strcmp(kind, "text") == 0,
            real = strcmp(kind, "float64") == 0;
        Py_ssize_t item = strcmp(kind, "int64") == 0 || real ? 8 : strcmp(kind, "int32") == 0 || text ? 4
                        : strcmp(kind, "bool") == 0 ? 1 : 0;
        if (item == 0) {
            PyErr_Format(PyExc_ValueError, "unknown column kind %s (int64, int32, bool, float64, text or json)", kind);
            goto done;
        }
        if (real && nullable && views[k].len) { /* (an empty one may say it could be) */
            PyErr_Format(PyExc_ValueError, "float64 column %s cannot be nullable (no value marks NULL)", cols[k].name);
            goto done;
        }
        cols[k].kind = real ? K_DOUBLE : item == 8 ? K_INT64 : text ? K_TEXT : item == 4 ? K_INT32 : K_BOOL;
        cols[k].json = json;
        cols[k].data = views[k].buf;
        cols[k].null_below_zero = nullable;
        if (views[k].len % item || (rows >= 0 && views[k].len / item != rows)) {
            PyErr_SetString(PyExc_ValueError, "columns must have equal numbers of rows of their kind's size");
            goto done;
        }
        rows = views[k].len / item;
        if (text && texts_of(&cols[k], names, rows) < 0)
            goto done;
    }
    Buf out = {0};
    int io_error = 0;
    Py_BEGIN_ALLOW_THREADS
    encode_file(&out, cols, (int)ncol, rows < 0 ? 0 : (size_t)rows, created_by);
    if (!out.failed) {
        FILE *f = fopen(path, "wb");
        if (f == NULL || fwrite(out.p, 1, out.n, f) != out.n)
            io_error = errno ? errno : EIO;
        if (f != NULL && fclose(f) != 0 && !io_error)
            io_error = errno ? errno : EIO;
    }
    Py_END_ALLOW_THREADS
    if (out.failed) {
        PyErr_NoMemory();
    } else if (io_error) {
        errno = io_error;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
    } else {
        result = PyLong_FromSize_t(out.n);
    }
    free(out.p);
done:
    for (Py_ssize_t k = 0; k < held; k++)
        PyBuffer_Release(&views[k]);
    for (Py_ssize_t k = 0; cols != NULL && k < ncol; k++) {
        free((void *)cols[k].text);
        free((void *)cols[k].text_len);
    }
    free(cols);
    free(views);
    Py_DECREF(seq);
    return result;
}
