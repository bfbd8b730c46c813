/* handoff_spark.decode._json_arrow: flat JSON objects (one per Kafka value) straight into Arrow column buffers.
 *
 * Why: pyarrow's JSON reader needs the values joined by newlines (a copy, and a count of newlines to be sure no
 * value holds one), then parses at ~125 MB/s here, most of a write task's CPU (docs/benchmarks.md, "Throughput").
 * The records a hand-off carries are mostly flat objects of a few primitive fields, which a direct parser turns
 * into columns several times faster. It also checks what the newline framing could not: that each value is
 * exactly one object, so no value's fields can end up in another value's row.
 *
 * The contract is "same result or decline": `decode` accepts only strict JSON (RFC 8259) objects whose declared
 * fields hold a JSON null or a value of the column's own JSON type (long: an integer that fits int64; double:
 * any number that is finite and in range; boolean: true/false; string: a string, escapes decoded, UTF-8
 * checked; text (decimal columns): a number, as its literal text, or a string, decoded). Anything else -- a value that is not one object, a duplicate declared field, a field of another
 * type, an undeclared field when they are not ignored, an escape in a field name, nesting deeper than the
 * caller's limit (`max_depth`: containers enclosing one another, the record's own object counting as 1, the same
 * measure as decode.py's `schema.limits.maxDepth`, at most MAX_DEPTH) -- makes it return None, and the caller
 * decodes the batch as it did before (decode.py), which yields the same rows, dead letters or errors as always.
 * Required fields and type conversions (timestamps, dates) are the caller's. `one_object_each` tells the caller
 * whether pyarrow's newline-framed reader may have the batch then, or only the per-record path. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* K_TEXT: a decimal column's value as its JSON text -- a number's literal spelling or a string's decoded content --
 * which the caller converts exactly (decode.py: pyarrow's own JSON decimal conversion is not safe). */
enum { K_LONG = 0, K_DOUBLE = 1, K_STRING = 2, K_BOOL = 3, K_TEXT = 4 };
#define HAS_TEXT(kind) ((kind) == K_STRING || (kind) == K_TEXT)
#define MAX_COLUMNS 64
/* The deepest nesting a caller may allow: bounds skip()'s recursion (a few dozen bytes of stack a level). */
#define MAX_DEPTH 512

typedef struct {
    int kind;
    const char *name;
    Py_ssize_t name_len;
    uint8_t *valid;      /* bitmap, 1 = value (PyBytes buffer) */
    int has_null;
    uint8_t *values;     /* long/double: 8 bytes a row; bool: a bit a row; string: int32 offsets (n + 1) */
    char *sdata;         /* string bytes (malloc) */
    size_t slen, scap;
} Col;

typedef struct {
    const unsigned char *p, *end;
    int max_depth; /* containers allowed to enclose one another, the record's own object included */
} Cur;

static locale_t c_locale;

static inline void ws(Cur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static inline int lit(Cur *c, const char *word, size_t len) {
    if ((size_t)(c->end - c->p) < len || memcmp(c->p, word, len) != 0)
        return 0;
    c->p += len;
    return 1;
}

/* A JSON number's extent; *integral says it had no fraction or exponent. 0 when it is not a JSON number. */
static int number(Cur *c, const unsigned char **start, int *integral) {
    const unsigned char *p = c->p, *e = c->end;
    *start = p;
    *integral = 1;
    if (p < e && *p == '-')
        p++;
    if (p >= e)
        return 0;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (p < e && *p >= '0' && *p <= '9')
            p++;
    else
        return 0;
    if (p < e && *p == '.') {
        *integral = 0;
        p++;
        if (p >= e || *p < '0' || *p > '9')
            return 0;
        while (p < e && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        *integral = 0;
        p++;
        if (p < e && (*p == '+' || *p == '-'))
            p++;
        if (p >= e || *p < '0' || *p > '9')
            return 0;
        while (p < e && *p >= '0' && *p <= '9')
            p++;
    }
    c->p = p;
    return 1;
}

static int parse_long(Cur *c, int64_t *out) {
    const unsigned char *s;
    int integral;
    if (!number(c, &s, &integral) || !integral)
        return 0;
    int neg = *s == '-';
    const unsigned char *q = s + neg;
    uint64_t v = 0;
    if (c->p - q <= 18) { /* below 10^18: cannot overflow */
        for (; q < c->p; q++)
            v = v * 10 + (uint64_t)(*q - '0');
    } else {
        uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        for (; q < c->p; q++) {
            uint64_t d = (uint64_t)(*q - '0');
            if (v > (limit - d) / 10)
                return 0;
            v = v * 10 + d;
        }
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A number as a double: exactly when its digits fit 2^53 and its decimal exponent is within 22 (both operands
 * of the one multiplication or division are then exact doubles, so IEEE rounding makes it the correctly rounded
 * value, as strtod's); otherwise strtod in the C locale. Infinite or out of range: declined. */
static int parse_double(Cur *c, double *out) {
    const unsigned char *s;
    int integral;
    if (!number(c, &s, &integral))
        return 0;
    const unsigned char *q = s + (*s == '-'), *e = c->p;
    uint64_t m = 0;
    int digits = 0, exp10 = 0, fast = 1;
    for (; q < e && *q >= '0' && *q <= '9'; q++, digits++)
        m = m * 10 + (uint64_t)(*q - '0');
    if (q < e && *q == '.')
        for (q++; q < e && *q >= '0' && *q <= '9'; q++, digits++, exp10--)
            m = m * 10 + (uint64_t)(*q - '0');
    if (q < e) { /* exponent: rare in events; strtod takes it */
        fast = 0;
    }
    if (fast && digits <= 15 && exp10 >= -22) {
        double v = (double)m;
        v = exp10 ? v / POW10[-exp10] : v;
        /* The integer -0 is 0 (JSON, and Python's int): +0.0, as the per-record path has it; -0.0 is -0.0. */
        *out = *s == '-' && !(integral && m == 0) ? -v : v;
        return 1;
    }
    char buf[64];
    size_t len = (size_t)(e - s);
    if (len >= sizeof buf)
        return 0;
    memcpy(buf, s, len);
    buf[len] = 0;
    errno = 0;
    char *endp;
    double v = strtod_l(buf, &endp, c_locale);
    if (errno || endp != buf + len || !isfinite(v))
        return 0;
    *out = v;
    return 1;
}

static int hex4(const unsigned char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char h = p[i];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= (unsigned)(h - '0');
        else if (h >= 'a' && h <= 'f') v |= (unsigned)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') v |= (unsigned)(h - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

static int grow(Col *col, size_t more) {
    if (col->slen + more <= col->scap)
        return 1;
    size_t cap = col->scap ? col->scap : 4096;
    while (cap < col->slen + more)
        cap *= 2;
    char *d = realloc(col->sdata, cap);
    if (!d)
        return 0;
    col->sdata = d;
    col->scap = cap;
    return 1;
}

/* The length of a valid UTF-8 sequence starting at p (2-4 bytes; no overlong forms, surrogates or code points
 * above U+10FFFF), or 0. */
static int utf8_seq(const unsigned char *p, const unsigned char *e) {
    unsigned char b = p[0];
    int n;
    unsigned cp;
    if (b >= 0xC2 && b <= 0xDF) { n = 2; cp = b & 0x1F; }
    else if (b >= 0xE0 && b <= 0xEF) { n = 3; cp = b & 0x0F; }
    else if (b >= 0xF0 && b <= 0xF4) { n = 4; cp = b & 0x07; }
    else return 0;
    if (e - p < n)
        return 0;
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return n;
}

static char *put_utf8(char *d, unsigned cp) {
    if (cp < 0x80) { *d++ = (char)cp; }
    else if (cp < 0x800) { *d++ = (char)(0xC0 | (cp >> 6)); *d++ = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        *d++ = (char)(0xE0 | (cp >> 12)); *d++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *d++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *d++ = (char)(0xF0 | (cp >> 18)); *d++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *d++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *d++ = (char)(0x80 | (cp & 0x3F));
    }
    return d;
}

#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull

/* Whether any of eight bytes is '"', '\\', below 0x20 or above 0x7F (the classic exact "has zero / has less" word
 * tests; each says whether any byte matches, not which). */
static inline uint64_t special8(uint64_t w) {
    uint64_t quote = w ^ (ONES * '"'), slash = w ^ (ONES * '\\');
    return (((quote - ONES) & ~quote) | ((slash - ONES) & ~slash) | ((w - ONES * 0x20) & ~w) | w) & HIGHS;
}

/* A JSON string at c->p (on its opening quote), decoded into col's data when col is not NULL. Decoded text is
 * never longer than its JSON spelling, so one grow() of the spelling's length covers it. */
static int string(Cur *c, Col *col) {
    const unsigned char *p = c->p + 1, *e = c->end;
    char *d = NULL;
    if (col) {
        if (!grow(col, (size_t)(e - p)))
            return 0;
        d = col->sdata + col->slen;
    }
    while (p < e) {
        /* Eight plain bytes at a time: none is a quote, a backslash, a control character or non-ASCII. */
        while (e - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            if (special8(w))
                break;
            if (d) {
                memcpy(d, p, 8);
                d += 8;
            }
            p += 8;
        }
        if (p >= e)
            break;
        unsigned char b = *p;
        if (b == '"') {
            if (col)
                col->slen = (size_t)(d - col->sdata);
            c->p = p + 1;
            return 1;
        }
        if (b < 0x20)
            return 0;
        if (b < 0x80) {
            if (b != '\\') {
                if (d) *d++ = (char)b;
                p++;
                continue;
            }
            if (e - p < 2)
                return 0;
            unsigned char x = p[1];
            char out;
            switch (x) {
            case '"': out = '"'; break;
            case '\\': out = '\\'; break;
            case '/': out = '/'; break;
            case 'b': out = '\b'; break;
            case 'f': out = '\f'; break;
            case 'n': out = '\n'; break;
            case 'r': out = '\r'; break;
            case 't': out = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (e - p < 6 || !hex4(p + 2, &cp))
                    return 0;
                p += 6;
                if (cp >= 0xDC00 && cp <= 0xDFFF)
                    return 0;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (e - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                        return 0;
                    p += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (d) d = put_utf8(d, cp);
                continue;
            }
            default:
                return 0;
            }
            if (d) *d++ = out;
            p += 2;
            continue;
        }
        int n = utf8_seq(p, e);
        if (!n)
            return 0;
        if (d) {
            memcpy(d, p, (size_t)n);
            d += n;
        }
        p += n;
    }
    return 0;
}

/* Any JSON value, checked and skipped (an undeclared field's). `depth`: the containers enclosing it; a container
 * opened here is at level depth + 1, declined past c->max_depth. */
static int skip(Cur *c, int depth) {
    const unsigned char *s;
    int integral;
    if (c->p >= c->end)
        return 0;
    switch (*c->p) {
    case '"': return string(c, NULL);
    case 't': return lit(c, "true", 4);
    case 'f': return lit(c, "false", 5);
    case 'n': return lit(c, "null", 4);
    case '{':
    case '[': {
        if (depth + 1 > c->max_depth)
            return 0;
        unsigned char close = *c->p == '{' ? '}' : ']';
        c->p++;
        ws(c);
        if (c->p < c->end && *c->p == close) {
            c->p++;
            return 1;
        }
        for (;;) {
            if (close == '}') {
                if (c->p >= c->end || *c->p != '"' || !string(c, NULL))
                    return 0;
                ws(c);
                if (c->p >= c->end || *c->p != ':')
                    return 0;
                c->p++;
                ws(c);
            }
            if (!skip(c, depth + 1))
                return 0;
            ws(c);
            if (c->p >= c->end)
                return 0;
            if (*c->p == close) {
                c->p++;
                return 1;
            }
            if (*c->p != ',')
                return 0;
            c->p++;
            ws(c);
        }
    }
    default:
        return number(c, &s, &integral);
    }
}

static inline void set_null(Col *col, Py_ssize_t i) {
    col->valid[i / 8] &= (uint8_t)~(1u << (i % 8));
    col->has_null = 1;
}

/* One declared field's value for row i. */
static int field(Cur *c, Col *col, Py_ssize_t i) {
    if (c->p < c->end && *c->p == 'n') {
        if (!lit(c, "null", 4))
            return 0;
        set_null(col, i);
        if (HAS_TEXT(col->kind))
            ((int32_t *)col->values)[i + 1] = (int32_t)col->slen;
        return 1;
    }
    switch (col->kind) {
    case K_LONG:
        return parse_long(c, (int64_t *)col->values + i);
    case K_DOUBLE:
        return parse_double(c, (double *)col->values + i);
    case K_BOOL:
        if (lit(c, "true", 4)) {
            col->values[i / 8] |= (uint8_t)(1u << (i % 8));
            return 1;
        }
        return lit(c, "false", 5);
    case K_TEXT:
        if (c->p < c->end && *c->p != '"') {
            const unsigned char *s;
            int integral;
            if (!number(c, &s, &integral) || !grow(col, (size_t)(c->p - s)))
                return 0;
            memcpy(col->sdata + col->slen, s, (size_t)(c->p - s));
            col->slen += (size_t)(c->p - s);
            if (col->slen > INT32_MAX)
                return 0;
            ((int32_t *)col->values)[i + 1] = (int32_t)col->slen;
            return 1;
        }
        /* fall through: a string */
    default:
        if (c->p >= c->end || *c->p != '"' || !string(c, col) || col->slen > INT32_MAX)
            return 0;
        ((int32_t *)col->values)[i + 1] = (int32_t)col->slen;
        return 1;
    }
}

static int row(Cur *c, Col *cols, int ncols, Py_ssize_t i, int ignore_unknown) {
    uint64_t seen = 0;
    ws(c);
    if (c->p >= c->end || *c->p != '{')
        return 0;
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
    } else {
        for (;;) {
            if (c->p >= c->end || *c->p != '"')
                return 0;
            const unsigned char *k = c->p + 1, *q = k;
            while (q < c->end && *q != '"' && *q != '\\' && *q >= 0x20)
                q++;
            if (q >= c->end || *q != '"')
                return 0; /* an escape or control character in a field name: decline */
            Py_ssize_t klen = q - k;
            int j = -1;
            for (int t = 0; t < ncols; t++)
                if (cols[t].name_len == klen && memcmp(cols[t].name, k, (size_t)klen) == 0) {
                    j = t;
                    break;
                }
            if (j < 0) {
                /* Undeclared: its name must still be valid UTF-8, as the whole document must be. */
                if (!ignore_unknown || !string(c, NULL))
                    return 0;
            } else {
                c->p = q + 1;
            }
            ws(c);
            if (c->p >= c->end || *c->p != ':')
                return 0;
            c->p++;
            ws(c);
            if (j < 0) {
                if (!skip(c, 1))
                    return 0;
            } else {
                if (seen & (1ull << j))
                    return 0;
                seen |= 1ull << j;
                if (!field(c, &cols[j], i))
                    return 0;
            }
            ws(c);
            if (c->p >= c->end)
                return 0;
            if (*c->p == '}') {
                c->p++;
                break;
            }
            if (*c->p != ',')
                return 0;
            c->p++;
            ws(c);
        }
    }
    ws(c);
    if (c->p != c->end)
        return 0; /* more than one value in the record */
    for (int t = 0; t < ncols; t++)
        if (!(seen & (1ull << t))) {
            set_null(&cols[t], i);
            if (HAS_TEXT(cols[t].kind))
                ((int32_t *)cols[t].values)[i + 1] = (int32_t)cols[t].slen;
        }
    return 1;
}

/* Whether an offsets buffer of `len` bytes holds the n + 1 offsets of rows first..first+n, computed without
 * overflow: (first + n + 1) * 4 overflowed Py_ssize_t for a huge first or n (found by UBSan). */
static int rows_fit(Py_ssize_t len, Py_ssize_t first, Py_ssize_t n) {
    Py_ssize_t offsets = len / 4;
    return first >= 0 && n >= 0 && first < offsets && n <= offsets - first - 1;
}

static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer offs, data;
    Py_ssize_t first, n;
    PyObject *names, *kinds;
    int ignore_unknown, max_depth;
    if (!PyArg_ParseTuple(args, "y*y*nnO!O!pi", &offs, &data, &first, &n, &PyTuple_Type, &names, &PyTuple_Type,
                          &kinds, &ignore_unknown, &max_depth))
        return NULL;
    PyObject *result = NULL;
    Col cols[MAX_COLUMNS];
    PyObject *valid[MAX_COLUMNS] = {0}, *values[MAX_COLUMNS] = {0};
    Py_ssize_t ncols = PyTuple_GET_SIZE(names);
    memset(cols, 0, sizeof cols);
    if (!rows_fit(offs.len, first, n) || ncols > MAX_COLUMNS ||
        ncols != PyTuple_GET_SIZE(kinds) || max_depth < 1 || max_depth > MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "decode: offsets, rows, columns or max_depth out of range");
        goto done;
    }
    const int32_t *off = (const int32_t *)offs.buf + first;
    if (n && (off[0] < 0 || off[n] > data.len || off[0] > off[n])) {
        PyErr_SetString(PyExc_ValueError, "decode: offsets outside the data");
        goto done;
    }
    for (Py_ssize_t t = 0; t < ncols; t++) {
        Col *col = &cols[t];
        PyObject *name = PyTuple_GET_ITEM(names, t);
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "decode: column names must be bytes");
            goto done;
        }
        col->name = PyBytes_AS_STRING(name);
        col->name_len = PyBytes_GET_SIZE(name);
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(kinds, t)); /* checked as a long: (int)2**40 was 0, LONG */
        if (kind < K_LONG || kind > K_TEXT) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "decode: unknown column kind");
            goto done;
        }
        col->kind = (int)kind;
        Py_ssize_t vsize = HAS_TEXT(col->kind) ? (n + 1) * 4 : col->kind == K_BOOL ? (n + 7) / 8 : n * 8;
        valid[t] = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        values[t] = PyBytes_FromStringAndSize(NULL, vsize);
        if (!valid[t] || !values[t])
            goto done;
        col->valid = (uint8_t *)PyBytes_AS_STRING(valid[t]);
        col->values = (uint8_t *)PyBytes_AS_STRING(values[t]);
        memset(col->valid, 0xff, (size_t)(n + 7) / 8);
        memset(col->values, 0, (size_t)vsize); /* nulls read as 0 / false / empty */
    }
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        /* Offsets are checked row by row (a malformed array is declined, never read past its data). */
        ok = off[i] <= off[i + 1] && off[i + 1] <= off[n];
        Cur c = {(const unsigned char *)data.buf + off[i], (const unsigned char *)data.buf + off[i + 1], max_depth};
        ok = ok && row(&c, cols, (int)ncols, i, ignore_unknown);
    }
    Py_END_ALLOW_THREADS
    if (!ok) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = PyList_New(ncols);
    if (!result)
        goto done;
    for (Py_ssize_t t = 0; t < ncols; t++) {
        PyObject *sdata = NULL;
        if (HAS_TEXT(cols[t].kind)) {
            sdata = PyBytes_FromStringAndSize(cols[t].sdata ? cols[t].sdata : "", (Py_ssize_t)cols[t].slen);
            if (!sdata) {
                Py_CLEAR(result);
                goto done;
            }
        }
        PyObject *item = Py_BuildValue("(OON)", cols[t].has_null ? valid[t] : Py_None, values[t],
                                       sdata ? sdata : Py_NewRef(Py_None));
        if (!item) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, t, item);
    }
done:
    for (Py_ssize_t t = 0; t < MAX_COLUMNS; t++) {
        free(cols[t].sdata);
        Py_XDECREF(valid[t]);
        Py_XDECREF(values[t]);
    }
    PyBuffer_Release(&offs);
    PyBuffer_Release(&data);
    return result;
}

/* one_object_each(offsets, data, first, rows, max_depth) -> bool: whether every value is exactly one well-formed
 * JSON object (surrounding whitespace allowed) nested no deeper than max_depth. What makes newline framing safe
 * for pyarrow's reader: a value holding two objects and another holding none would otherwise shift fields into the
 * wrong rows; and pyarrow's reader has no depth limit of its own. */
static PyObject *one_object_each(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer offs, data;
    Py_ssize_t first, n;
    int max_depth;
    if (!PyArg_ParseTuple(args, "y*y*nni", &offs, &data, &first, &n, &max_depth))
        return NULL;
    int ok = 1;
    if (!rows_fit(offs.len, first, n) || max_depth < 1 || max_depth > MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "one_object_each: offsets, rows or max_depth out of range");
        ok = -1;
    } else {
        const int32_t *off = (const int32_t *)offs.buf + first;
        if (n && (off[0] < 0 || off[n] > data.len || off[0] > off[n])) {
            PyErr_SetString(PyExc_ValueError, "one_object_each: offsets outside the data");
            ok = -1;
        } else {
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t i = 0; i < n && ok; i++) {
                if (off[i] > off[i + 1] || off[i + 1] > off[n]) {
                    ok = 0;
                    break;
                }
                Cur c = {(const unsigned char *)data.buf + off[i], (const unsigned char *)data.buf + off[i + 1],
                         max_depth};
                ws(&c);
                ok = c.p < c.end && *c.p == '{' && skip(&c, 0);
                ws(&c);
                ok = ok && c.p == c.end;
            }
            Py_END_ALLOW_THREADS
        }
    }
    PyBuffer_Release(&offs);
    PyBuffer_Release(&data);
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(offsets, data, first, rows, names, kinds, ignore_unknown, max_depth) -> [(validity|None, values, "
     "data|None)] "
     "per column, or None when a value is outside what this parser takes (the caller then decodes as before)."},
    {"one_object_each", one_object_each, METH_VARARGS,
     "one_object_each(offsets, data, first, rows, max_depth) -> whether every value is exactly one well-formed JSON "
     "object nested no deeper than max_depth."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_json_arrow", NULL, -1, methods};

PyMODINIT_FUNC PyInit__json_arrow(void) {
    c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    if (!c_locale)
        return PyErr_NoMemory();
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "LONG", K_LONG) || PyModule_AddIntConstant(m, "DOUBLE", K_DOUBLE) ||
              PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) ||
              PyModule_AddIntConstant(m, "STRING", K_STRING) || PyModule_AddIntConstant(m, "BOOL", K_BOOL) ||
              PyModule_AddIntConstant(m, "TEXT", K_TEXT))) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
