/* engine.records._kernels: the compiled loops of the records codec, a plain CPython C extension.
 *
 * Each function is the C twin of a Python path that produces the same bytes
 * (engine.records.kernels documents each; the hypothesis tests of
 * tests/test_kernels.py hold them equal).  Every byte relied on is checked:
 * a walk that meets anything other than what it expects answers -1 (or None)
 * and the caller's Python loop decodes it and names what is wrong.  The loops
 * run without the GIL, on buffers held for the call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* A zigzag varint at *p whose last byte starts at most at bit max_shift (28: a varint, 5 bytes; 63: a varlong,
 * 10 bytes, no bit past the 64th), before end: its value, *p moved past it; *p = -1 if not. */
static inline int64_t zigzag_at(const uint8_t *data, Py_ssize_t *p, Py_ssize_t end, int max_shift)
{
    Py_ssize_t q = *p;
    uint64_t raw = 0;
    int shift = 0;
    for (;;) {
        if (q >= end || shift > max_shift || (shift == 63 && data[q] > 1)) {
            *p = -1;
            return 0;
        }
        uint8_t b = data[q++];
        raw |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80)
            break;
        shift += 7;
    }
    *p = q;
    return (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
}

/* Kafka's zigzag varint at *p (at most 5 bytes, before end): its value, *p moved past it; *p = -1 if not. */
static inline int64_t varint(const uint8_t *data, Py_ssize_t *p, Py_ssize_t end)
{
    return zigzag_at(data, p, end, 28);
}

static inline int varint_size(uint64_t zigzagged)
{
    int n = 1;
    while (zigzagged >= 0x80) {
        zigzagged >>= 7;
        n++;
    }
    return n;
}

static inline Py_ssize_t put_varint(uint8_t *out, Py_ssize_t o, uint64_t zigzagged)
{
    while (zigzagged >= 0x80) {
        out[o++] = (uint8_t)((zigzagged & 0x7F) | 0x80);
        zigzagged >>= 7;
    }
    out[o++] = (uint8_t)zigzagged;
    return o;
}

/* -- records_text / records_jsonl: the general walk of a records section, every producer's layout ---------- */

/* Kafka's zigzag varlong at *p (at most 10 bytes, no bit past the 64th, before end); *p = -1 if not. */
static inline int64_t varlong(const uint8_t *data, Py_ssize_t *p, Py_ssize_t end)
{
    return zigzag_at(data, p, end, 63);
}

/* One record of a records section, as the general decoder reads it. */
typedef struct {
    int64_t timestamp_delta, offset_delta;
    Py_ssize_t key, value, headers;     /* positions of the key, the value, the first header */
    int64_t key_length, value_length;   /* -1: null */
    int64_t header_count;
    Py_ssize_t end;                     /* position after the record */
} record_t;

/* Parse the record at *p into r, every field bounds-checked inside the record and the record inside n:
 * length, attributes, timestamp delta, offset delta, key, value, headers (each key and value, null
 * values allowed), and nothing left inside the record after them.  0 and *p at its end, or -1. */
static int parse_record(const uint8_t *data, Py_ssize_t n, Py_ssize_t *p, record_t *r)
{
    Py_ssize_t q = *p;
    int64_t length = varint(data, &q, n);
    if (q < 0 || length < 0 || length > n - q)
        return -1;
    Py_ssize_t end = q + (Py_ssize_t)length;
    if (q >= end)
        return -1;
    q += 1;                                                 /* attributes (unused by any version) */
    r->timestamp_delta = varlong(data, &q, end);
    if (q < 0)
        return -1;
    r->offset_delta = varint(data, &q, end);
    if (q < 0)
        return -1;
    int64_t k = varint(data, &q, end);
    if (q < 0 || k < -1 || (k > 0 && k > end - q))
        return -1;
    r->key = q;
    r->key_length = k;
    if (k > 0)
        q += (Py_ssize_t)k;
    int64_t v = varint(data, &q, end);
    if (q < 0 || v < -1 || (v > 0 && v > end - q))
        return -1;
    r->value = q;
    r->value_length = v;
    if (v > 0)
        q += (Py_ssize_t)v;
    int64_t h = varint(data, &q, end);
    if (q < 0 || h < 0)
        return -1;
    r->header_count = h;
    r->headers = q;
    for (int64_t i = 0; i < h; i++) {
        int64_t hk = varint(data, &q, end);
        if (q < 0 || hk < 0 || hk > end - q)
            return -1;
        q += (Py_ssize_t)hk;
        int64_t hv = varint(data, &q, end);
        if (q < 0 || hv < -1 || (hv > 0 && hv > end - q))
            return -1;
        if (hv > 0)
            q += (Py_ssize_t)hv;
    }
    if (q != end)
        return -1;
    r->end = end;
    *p = end;
    return 0;
}

static Py_ssize_t records_text_loop(const uint8_t *data, Py_ssize_t n, Py_ssize_t count, uint8_t *out)
{
    Py_ssize_t p = 0, o = 0;
    record_t r;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (parse_record(data, n, &p, &r) < 0)
            return -1;
        if (r.value_length > 0) {                   /* a record's value is shorter than the record: fits */
            memcpy(out + o, data + r.value, (size_t)r.value_length);
            o += (Py_ssize_t)r.value_length;
        }
        out[o++] = '\n';
    }
    if (p != n)
        return -1;
    return o;
}

static PyObject *records_text(PyObject *self, PyObject *args)
{
    Py_buffer data;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*n:records_text", &data, &count))
        return NULL;
    if (count < 0) {
        PyBuffer_Release(&data);
        Py_RETURN_NONE;
    }
    /* every record is at least 7 bytes and renders at most its value and a newline: never more than data */
    PyObject *out = PyByteArray_FromStringAndSize(NULL, data.len);
    if (out == NULL) {
        PyBuffer_Release(&data);
        return NULL;
    }
    Py_ssize_t size;
    Py_BEGIN_ALLOW_THREADS
    size = records_text_loop((const uint8_t *)data.buf, data.len, count, (uint8_t *)PyByteArray_AS_STRING(out));
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (size < 0) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    if (PyByteArray_Resize(out, size) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* -- JSON lines: what engine.views.render writes for each record, compiled -------------------------------- */

/* Where rendered bytes go: out is NULL for a sizing pass, which only counts.  A rendering pass reserves
 * room for a whole record before writing it (reserve), so the puts need no check of their own. */
typedef struct {
    uint8_t *out;
    Py_ssize_t o;
    Py_ssize_t capacity;
} sink_t;

/* Room for `more` bytes after s->o: the buffer (malloc'ed, grown by doubling); -1 when out of memory. */
static int reserve(sink_t *s, Py_ssize_t more)
{
    if (s->out == NULL || more <= s->capacity - s->o)
        return 0;
    Py_ssize_t capacity = s->capacity * 2;
    if (capacity < s->o + more)
        capacity = s->o + more;
    uint8_t *grown = realloc(s->out, (size_t)capacity);
    if (grown == NULL)
        return -1;
    s->out = grown;
    s->capacity = capacity;
    return 0;
}

static inline void put(sink_t *s, const void *bytes, Py_ssize_t length)
{
    if (s->out != NULL)
        memcpy(s->out + s->o, bytes, (size_t)length);
    s->o += length;
}

static inline void put_byte(sink_t *s, uint8_t b)
{
    if (s->out != NULL)
        s->out[s->o] = b;
    s->o += 1;
}

static const uint64_t POW10[20] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL, 100000000ULL, 1000000000ULL,
    10000000000ULL, 100000000000ULL, 1000000000000ULL, 10000000000000ULL, 100000000000000ULL,
    1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL, 1000000000000000000ULL,
    10000000000000000000ULL,
};

static const char DIGIT_PAIRS[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* "%d" of v: its digits counted by comparisons (a sizing pass writes nothing), written two at a time */
static inline void put_int(sink_t *s, int64_t v)
{
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    int n = 1;
    while (n < 20 && u >= POW10[n])
        n++;
    n += v < 0;
    if (s->out != NULL) {
        uint8_t *at = s->out + s->o + n;
        while (u >= 100) {
            unsigned pair = (unsigned)(u % 100);
            u /= 100;
            at -= 2;
            memcpy(at, DIGIT_PAIRS + 2 * pair, 2);
        }
        if (u >= 10) {
            at -= 2;
            memcpy(at, DIGIT_PAIRS + 2 * u, 2);
        } else {
            *--at = (uint8_t)('0' + u);
        }
        if (v < 0)
            *--at = '-';
    }
    s->o += n;
}

/* Whether d[0:n] is UTF-8 as Python's strict decoder accepts it (no overlong forms, no surrogates,
 * nothing above U+10FFFF, no cut sequence). */
static int utf8_valid(const uint8_t *d, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = d[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (n - i < 2 || (d[i + 1] & 0xC0) != 0x80)
                return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (n - i < 3 || (d[i + 1] & 0xC0) != 0x80 || (d[i + 2] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xE0 && d[i + 1] < 0xA0) || (c == 0xED && d[i + 1] > 0x9F))
                return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (n - i < 4 || (d[i + 1] & 0xC0) != 0x80 || (d[i + 2] & 0xC0) != 0x80 || (d[i + 3] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xF0 && d[i + 1] < 0x90) || (c == 0xF4 && d[i + 1] > 0x8F))
                return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

static const char HEX[] = "0123456789abcdef";

/* Whether every byte of d[0:n] is printable ASCII other than '"' and '\\' (0x20-0x7F): what orjson writes
 * as itself.  Eight bytes at a time: a byte with its top bit set, below 0x20 (the subtraction borrows into
 * the top bit), or equal to '"' or '\\' (a zero byte after the xor) marks the word; a borrow only ever
 * spreads from a byte that marks it already. */
static inline int plain_ascii(const uint8_t *d, Py_ssize_t n)
{
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, d + i, 8);
        uint64_t quote = w ^ (ones * '"'), backslash = w ^ (ones * '\\');
        uint64_t bad = w | (w - ones * 0x20) | ((quote - ones) & ~quote) | ((backslash - ones) & ~backslash);
        if (bad & high)
            return 0;
    }
    for (; i < n; i++)
        if (d[i] < 0x20 || d[i] >= 0x80 || d[i] == '"' || d[i] == '\\')
            return 0;
    return 1;
}

/* orjson.dumps of valid UTF-8 text: quoted, '"' '\\' and control characters escaped, the rest as is. */
static void put_json_string(sink_t *s, const uint8_t *d, Py_ssize_t n)
{
    put_byte(s, '"');
    Py_ssize_t run = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t c = d[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        put(s, d + run, i - run);
        run = i + 1;
        uint8_t esc[6] = {'\\', 0, 0, 0, 0, 0};
        int len = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\t': esc[1] = 't'; break;
        case '\n': esc[1] = 'n'; break;
        case '\f': esc[1] = 'f'; break;
        case '\r': esc[1] = 'r'; break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = (uint8_t)HEX[c >> 4];
            esc[5] = (uint8_t)HEX[c & 15];
            len = 6;
        }
        put(s, esc, len);
    }
    put(s, d + run, n - run);
    put_byte(s, '"');
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* '"' + base64.b64encode(d) + '"' */
static void put_base64(sink_t *s, const uint8_t *d, Py_ssize_t n)
{
    put_byte(s, '"');
    Py_ssize_t size = 4 * ((n + 2) / 3);
    if (s->out == NULL) {
        s->o += size + 1;
        return;
    }
    uint8_t *o = s->out + s->o;
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = ((uint32_t)d[i] << 16) | ((uint32_t)d[i + 1] << 8) | d[i + 2];
        *o++ = (uint8_t)B64[v >> 18];
        *o++ = (uint8_t)B64[(v >> 12) & 63];
        *o++ = (uint8_t)B64[(v >> 6) & 63];
        *o++ = (uint8_t)B64[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)d[i] << 16;
        *o++ = (uint8_t)B64[v >> 18];
        *o++ = (uint8_t)B64[(v >> 12) & 63];
        *o++ = '=';
        *o++ = '=';
    } else if (n - i == 2) {
        uint32_t v = ((uint32_t)d[i] << 16) | ((uint32_t)d[i + 1] << 8);
        *o++ = (uint8_t)B64[v >> 18];
        *o++ = (uint8_t)B64[(v >> 12) & 63];
        *o++ = (uint8_t)B64[(v >> 6) & 63];
        *o++ = '=';
    }
    s->o += size;
    put_byte(s, '"');
}

/* The constant pieces of a JSON line, in the order they are written (engine.views.render._c_pieces). */
enum {
    P_HEAD, P_TIMESTAMP, P_KEY, P_KEY_NULL, P_KEY_TEXT, P_KEY_BASE64, P_VALUE, P_VALUE_NULL, P_VALUE_TEXT,
    P_VALUE_BASE64, P_NO_HEADERS, P_HEADERS_OPEN, P_HEADER_KEY, P_HEADER_VALUE, P_HEADER_VALUE_NULL,
    P_HEADER_VALUE_TEXT, P_HEADER_VALUE_BASE64, P_HEADER_CLOSE, P_HEADER_SEPARATOR, P_HEADERS_CLOSE, P_LINE_END,
    P_COUNT
};

typedef struct {
    const uint8_t *bytes[P_COUNT];
    Py_ssize_t length[P_COUNT];
    Py_ssize_t total;                   /* all the pieces: more than any record or header writes of them */
} pieces_t;

static inline void put_piece(sink_t *s, const pieces_t *pieces, int which)
{
    put(s, pieces->bytes[which], pieces->length[which]);
}

/* A key, value or header value: null, UTF-8 text as orjson writes it, or base64; then its kind's piece. */
static inline void put_field(sink_t *s, const pieces_t *pieces, const uint8_t *d, int64_t n, int null_piece)
{
    if (n < 0) {
        put(s, "null", 4);
        put_piece(s, pieces, null_piece);
    } else if (plain_ascii(d, (Py_ssize_t)n)) {           /* nearly every value: one scan and a copy */
        put_byte(s, '"');
        put(s, d, (Py_ssize_t)n);
        put_byte(s, '"');
        put_piece(s, pieces, null_piece + 1);
    } else if (utf8_valid(d, (Py_ssize_t)n)) {
        put_json_string(s, d, (Py_ssize_t)n);
        put_piece(s, pieces, null_piece + 1);
    } else {
        put_base64(s, d, (Py_ssize_t)n);
        put_piece(s, pieces, null_piece + 2);
    }
}

typedef struct {
    int64_t base_offset, base_timestamp, max_timestamp;
    int log_append_time;
} batch_t;

/* The JSON lines of count records into s (or only their size); the text view's size into *text.
 * 0, or -1 when anything differs from what the general decoder reads without error (then the caller
 * decodes in Python, which renders the same bytes or names what is wrong). */
static int records_jsonl_loop(const uint8_t *data, Py_ssize_t n, Py_ssize_t count, const batch_t *batch,
                              const pieces_t *pieces, sink_t *s, Py_ssize_t *text)
{
    Py_ssize_t p = 0, text_size = 0;
    record_t r;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (parse_record(data, n, &p, &r) < 0)
            return -1;
        int64_t offset, timestamp;
        if (__builtin_add_overflow(batch->base_offset, r.offset_delta, &offset))
            return -1;
        if (batch->log_append_time)
            timestamp = batch->max_timestamp;
        else if (__builtin_add_overflow(batch->base_timestamp, r.timestamp_delta, &timestamp))
            return -1;
        text_size += (r.value_length > 0 ? (Py_ssize_t)r.value_length : 0) + 1;
        /* the most a record can write: its pieces, two numbers, each byte of its key, value and headers
         * escaped (\u00XX: 6 bytes; base64 and quotes less), and each header's pieces and quotes */
        Py_ssize_t length = r.end - r.key;
        if (reserve(s, pieces->total + 64 + 6 * length + (Py_ssize_t)r.header_count * (pieces->total + 16)) < 0)
            return -2;
        put_piece(s, pieces, P_HEAD);
        put_int(s, offset);
        put_piece(s, pieces, P_TIMESTAMP);
        put_int(s, timestamp);
        put_piece(s, pieces, P_KEY);
        put_field(s, pieces, data + r.key, r.key_length, P_KEY_NULL);
        put_piece(s, pieces, P_VALUE);
        put_field(s, pieces, data + r.value, r.value_length, P_VALUE_NULL);
        if (r.header_count == 0) {
            put_piece(s, pieces, P_NO_HEADERS);
        } else {
            put_piece(s, pieces, P_HEADERS_OPEN);
            Py_ssize_t q = r.headers;           /* parse_record checked every header within the record */
            for (int64_t h = 0; h < r.header_count; h++) {
                if (h > 0)
                    put_piece(s, pieces, P_HEADER_SEPARATOR);
                put_piece(s, pieces, P_HEADER_KEY);
                int64_t key_length = varint(data, &q, r.end);
                if (!utf8_valid(data + q, (Py_ssize_t)key_length))
                    return -1;                  /* a header key is a string: the decoder refuses it */
                put_json_string(s, data + q, (Py_ssize_t)key_length);
                q += (Py_ssize_t)key_length;
                put_piece(s, pieces, P_HEADER_VALUE);
                int64_t value_length = varint(data, &q, r.end);
                put_field(s, pieces, data + q, value_length, P_HEADER_VALUE_NULL);
                if (value_length > 0)
                    q += (Py_ssize_t)value_length;
                put_piece(s, pieces, P_HEADER_CLOSE);
            }
            put_piece(s, pieces, P_HEADERS_CLOSE);
        }
        put_piece(s, pieces, P_LINE_END);
    }
    if (p != n)
        return -1;
    *text = text_size;
    return 0;
}

static int pieces_of(PyObject *tuple, pieces_t *pieces)
{
    pieces->total = 0;
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != P_COUNT) {
        PyErr_Format(PyExc_ValueError, "pieces must be a tuple of %d bytes", P_COUNT);
        return -1;
    }
    for (int i = 0; i < P_COUNT; i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (!PyBytes_Check(item)) {
            PyErr_Format(PyExc_TypeError, "piece %d is not bytes", i);
            return -1;
        }
        pieces->bytes[i] = (const uint8_t *)PyBytes_AS_STRING(item);
        pieces->length[i] = PyBytes_GET_SIZE(item);
        pieces->total += pieces->length[i];
    }
    return 0;
}

/* records_jsonl(data, count, base_offset, base_timestamp, log_append_time, max_timestamp, pieces, render):
 * the JSON lines (bytes) when render, else (text size, JSON size); None when the walk fails.  The lines
 * are written in one pass into a buffer of this call's (grown as records need), then copied once. */
static PyObject *records_jsonl(PyObject *self, PyObject *args)
{
    Py_buffer data;
    Py_ssize_t count;
    batch_t batch;
    PyObject *pieces_obj;
    int render;
    if (!PyArg_ParseTuple(args, "y*nLLpLOp:records_jsonl", &data, &count, &batch.base_offset,
                          &batch.base_timestamp, &batch.log_append_time, &batch.max_timestamp, &pieces_obj, &render))
        return NULL;
    PyObject *result = NULL;
    pieces_t pieces;
    sink_t sink = {NULL, 0, 0};
    if (pieces_of(pieces_obj, &pieces) < 0)
        goto done;
    if (count < 0) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    if (render) {
        sink.capacity = data.len + data.len / 2 + 4096;
        sink.out = malloc((size_t)sink.capacity);
        if (sink.out == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    Py_ssize_t text = 0;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = records_jsonl_loop((const uint8_t *)data.buf, data.len, count, &batch, &pieces, &sink, &text);
    Py_END_ALLOW_THREADS
    if (ok == -2) {
        PyErr_NoMemory();
    } else if (ok < 0) {
        result = Py_None;
        Py_INCREF(result);
    } else if (render) {
        result = PyBytes_FromStringAndSize((const char *)sink.out, sink.o);
    } else {
        result = Py_BuildValue("nn", text, sink.o);
    }
done:
    free(sink.out);
    PyBuffer_Release(&data);
    return result;
}

/* -- records_columns: the records of a section as Python columns (the readers that need objects) ---------- */

/* Every record parsed, offsets and timestamps inside 64 bits; whether any key is present, any header. */
static int columns_check(const uint8_t *data, Py_ssize_t n, Py_ssize_t count, const batch_t *batch, int *any_key,
                         int *any_headers, int *contiguous)
{
    Py_ssize_t p = 0;
    int64_t first = 0;
    record_t r;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t value;
        if (parse_record(data, n, &p, &r) < 0 || __builtin_add_overflow(batch->base_offset, r.offset_delta, &value))
            return 0;
        if (!batch->log_append_time && __builtin_add_overflow(batch->base_timestamp, r.timestamp_delta, &value))
            return 0;
        *any_key |= r.key_length >= 0;
        *any_headers |= r.header_count > 0;
        if (i == 0)
            first = r.offset_delta;
        *contiguous &= r.offset_delta == first + i;
    }
    return p == n;
}

static inline PyObject *bytes_or_none(const uint8_t *d, int64_t n)
{
    if (n < 0)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)d, (Py_ssize_t)n);
}

/* (name, value) tuples of a record's headers; NULL with an exception set, or NULL and *refused when a
 * name is not UTF-8 (the caller's Python loop raises what the decoder raises). */
static PyObject *headers_of(const uint8_t *data, const record_t *r, int *refused)
{
    PyObject *headers = PyTuple_New((Py_ssize_t)r->header_count);
    if (headers == NULL)
        return NULL;
    Py_ssize_t q = r->headers;                  /* parse_record checked every header within the record */
    for (int64_t h = 0; h < r->header_count; h++) {
        int64_t key_length = varint(data, &q, r->end);
        if (!utf8_valid(data + q, (Py_ssize_t)key_length)) {
            *refused = 1;
            Py_DECREF(headers);
            return NULL;
        }
        PyObject *name = PyUnicode_DecodeUTF8((const char *)data + q, (Py_ssize_t)key_length, "strict");
        q += (Py_ssize_t)key_length;
        int64_t value_length = varint(data, &q, r->end);
        PyObject *value = name == NULL ? NULL : bytes_or_none(data + q, value_length);
        if (value_length > 0)
            q += (Py_ssize_t)value_length;
        PyObject *pair = value == NULL ? NULL : PyTuple_Pack(2, name, value);
        Py_XDECREF(name);
        Py_XDECREF(value);
        if (pair == NULL) {
            Py_DECREF(headers);
            return NULL;
        }
        PyTuple_SET_ITEM(headers, (Py_ssize_t)h, pair);
    }
    return headers;
}

/* records_columns(data, count, base_offset, base_timestamp, log_append_time, max_timestamp):
 * (offsets, timestamps, keys or None when every key is null, values, headers or None when no record has
 * one, whether the offsets count up by one) as lists, or None when the walk refuses the section. */
static PyObject *records_columns(PyObject *self, PyObject *args)
{
    Py_buffer data;
    Py_ssize_t count;
    batch_t batch;
    if (!PyArg_ParseTuple(args, "y*nLLpL:records_columns", &data, &count, &batch.base_offset, &batch.base_timestamp,
                          &batch.log_append_time, &batch.max_timestamp))
        return NULL;
    const uint8_t *d = (const uint8_t *)data.buf;
    int any_key = 0, any_headers = 0, contiguous = 1, ok = 0, refused = 0;
    if (count >= 0) {
        Py_BEGIN_ALLOW_THREADS
        ok = columns_check(d, data.len, count, &batch, &any_key, &any_headers, &contiguous);
        Py_END_ALLOW_THREADS
    }
    if (!ok) {
        PyBuffer_Release(&data);
        Py_RETURN_NONE;
    }
    PyObject *offsets = PyList_New(count), *timestamps = PyList_New(count), *values = PyList_New(count);
    PyObject *keys = any_key ? PyList_New(count) : NULL, *headers = any_headers ? PyList_New(count) : NULL;
    PyObject *result = NULL, *last_timestamp = NULL;
    int64_t last = 0;
    if (offsets == NULL || timestamps == NULL || values == NULL || (any_key && keys == NULL)
        || (any_headers && headers == NULL))
        goto done;
    Py_ssize_t p = 0;
    record_t r;
    for (Py_ssize_t i = 0; i < count; i++) {
        parse_record(d, data.len, &p, &r);     /* checked above, on the same bytes held for the call */
        PyObject *item = PyLong_FromLongLong(batch.base_offset + r.offset_delta);
        if (item == NULL)
            goto done;
        PyList_SET_ITEM(offsets, i, item);
        int64_t timestamp = batch.log_append_time ? batch.max_timestamp : batch.base_timestamp + r.timestamp_delta;
        if (last_timestamp == NULL || timestamp != last) {   /* records of one time share their int */
            Py_XDECREF(last_timestamp);
            last_timestamp = PyLong_FromLongLong(timestamp);
            if (last_timestamp == NULL)
                goto done;
            last = timestamp;
        }
        Py_INCREF(last_timestamp);
        PyList_SET_ITEM(timestamps, i, last_timestamp);
        if ((item = bytes_or_none(d + r.value, r.value_length)) == NULL)
            goto done;
        PyList_SET_ITEM(values, i, item);
        if (keys != NULL) {
            if ((item = bytes_or_none(d + r.key, r.key_length)) == NULL)
                goto done;
            PyList_SET_ITEM(keys, i, item);
        }
        if (headers != NULL) {
            if ((item = headers_of(d, &r, &refused)) == NULL)
                goto done;
            PyList_SET_ITEM(headers, i, item);
        }
    }
    result = Py_BuildValue("OOOOON", offsets, timestamps, keys != NULL ? keys : Py_None, values,
                           headers != NULL ? headers : Py_None, PyBool_FromLong(contiguous));
done:
    if (refused && result == NULL) {
        result = Py_None;
        Py_INCREF(result);
    }
    Py_XDECREF(last_timestamp);
    Py_XDECREF(offsets);
    Py_XDECREF(timestamps);
    Py_XDECREF(values);
    Py_XDECREF(keys);
    Py_XDECREF(headers);
    PyBuffer_Release(&data);
    return result;
}

/* -- key_columns: the cleaner's offset-map pass over uncompressed batches ------------------------------- */

static Py_ssize_t key_columns_loop(const uint8_t *buf, Py_ssize_t n, const int64_t *batches, Py_ssize_t rows,
                                   Py_ssize_t width, int64_t *offsets, int64_t *key_starts, int64_t *key_lengths,
                                   uint8_t *null_values, Py_ssize_t capacity)
{
    Py_ssize_t r = 0;
    for (Py_ssize_t b = 0; b < rows; b++) {
        const int64_t *row = batches + b * width;    /* position, base offset, batch length, record count */
        if (row[0] < 0 || row[0] > n || row[2] > n)
            return -1 - b;
        Py_ssize_t p = (Py_ssize_t)row[0] + 61;      /* past the batch header */
        int64_t base = row[1];
        Py_ssize_t stop = (Py_ssize_t)(row[0] + row[2] + 12);
        if (stop > n || row[3] > capacity - r)      /* (a negative count reads nothing, as before) */
            return -1 - b;
        for (int64_t k = 0; k < row[3]; k++) {
            int64_t length = varint(buf, &p, stop);
            if (p < 0 || length < 0 || length > stop - p)
                return -1 - b;
            Py_ssize_t end = p + (Py_ssize_t)length;
            p += 1;                                         /* attributes */
            while (p < end && buf[p] >= 0x80)               /* timestamp delta (a varlong): not needed */
                p++;
            p += 1;
            int64_t delta = varint(buf, &p, end);
            if (p < 0)
                return -1 - b;
            offsets[r] = base + delta;
            int64_t key_length = varint(buf, &p, end);
            if (p < 0 || key_length < -1 || p + (key_length > 0 ? key_length : 0) >= end)
                return -1 - b;
            key_starts[r] = p;
            key_lengths[r] = key_length;
            if (key_length > 0)
                p += (Py_ssize_t)key_length;
            null_values[r] = buf[p] == 1;                   /* value length -1: a tombstone */
            p = end;
            r++;
        }
        if (p != stop)
            return -1 - b;
    }
    return r;
}

static int writable_of(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t count, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len < itemsize * count) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, %zd needed", what, view->len, itemsize * count);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *key_columns(PyObject *self, PyObject *args)
{
    Py_buffer buf, batches;
    Py_ssize_t width, records;
    PyObject *offsets_obj, *starts_obj, *lengths_obj, *nulls_obj;
    if (!PyArg_ParseTuple(args, "y*y*nnOOOO:key_columns", &buf, &batches, &width, &records, &offsets_obj,
                          &starts_obj, &lengths_obj, &nulls_obj))
        return NULL;
    Py_buffer offsets, starts, lengths, nulls;
    int held = 0;
    PyObject *result = NULL;
    if (width < 4 || batches.len % (8 * width) != 0) {
        PyErr_SetString(PyExc_ValueError, "batches must be rows of at least 4 int64 columns");
        goto done;
    }
    if (writable_of(offsets_obj, &offsets, 8, records, "offsets") < 0)
        goto done;
    held = 1;
    if (writable_of(starts_obj, &starts, 8, records, "key_starts") < 0)
        goto done;
    held = 2;
    if (writable_of(lengths_obj, &lengths, 8, records, "key_lengths") < 0)
        goto done;
    held = 3;
    if (writable_of(nulls_obj, &nulls, 1, records, "null_values") < 0)
        goto done;
    held = 4;
    Py_ssize_t done_records;
    Py_BEGIN_ALLOW_THREADS
    done_records = key_columns_loop((const uint8_t *)buf.buf, buf.len, (const int64_t *)batches.buf,
                                    batches.len / (8 * width), width, (int64_t *)offsets.buf, (int64_t *)starts.buf,
                                    (int64_t *)lengths.buf, (uint8_t *)nulls.buf, records);
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(done_records);
done:
    if (held >= 4) PyBuffer_Release(&nulls);
    if (held >= 3) PyBuffer_Release(&lengths);
    if (held >= 2) PyBuffer_Release(&starts);
    if (held >= 1) PyBuffer_Release(&offsets);
    PyBuffer_Release(&batches);
    PyBuffer_Release(&buf);
    return result;
}

/* -- records_spans / header_spans / gather_spans: a section's records as arrays of positions ------------- */

/* Row i of the (SPAN_ROWS, count) int64 table records_spans writes (the Spark source's Arrow columns). */
enum { S_OFFSET, S_TIMESTAMP, S_KEY, S_KEY_LENGTH, S_VALUE, S_VALUE_LENGTH, S_HEADERS, S_HEADER_COUNT, SPAN_ROWS };

/* What records_columns reads, as positions: every record parsed (parse_record), offsets and timestamps inside
 * 64 bits, every header key UTF-8.  The total number of headers, or -1 when the walk refuses the section. */
static int64_t records_spans_loop(const uint8_t *data, Py_ssize_t n, Py_ssize_t count, const batch_t *batch,
                                  int64_t *out)
{
    Py_ssize_t p = 0;
    int64_t headers = 0;
    record_t r;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t offset, timestamp = batch->max_timestamp;
        if (parse_record(data, n, &p, &r) < 0 || __builtin_add_overflow(batch->base_offset, r.offset_delta, &offset))
            return -1;
        if (!batch->log_append_time && __builtin_add_overflow(batch->base_timestamp, r.timestamp_delta, &timestamp))
            return -1;
        Py_ssize_t q = r.headers;
        for (int64_t h = 0; h < r.header_count; h++) {      /* bounds checked by parse_record */
            int64_t key_length = varint(data, &q, r.end);
            if (!utf8_valid(data + q, (Py_ssize_t)key_length))
                return -1;
            q += (Py_ssize_t)key_length;
            int64_t value_length = varint(data, &q, r.end);
            if (value_length > 0)
                q += (Py_ssize_t)value_length;
        }
        out[S_OFFSET * count + i] = offset;
        out[S_TIMESTAMP * count + i] = timestamp;
        out[S_KEY * count + i] = r.key;
        out[S_KEY_LENGTH * count + i] = r.key_length;
        out[S_VALUE * count + i] = r.value;
        out[S_VALUE_LENGTH * count + i] = r.value_length;
        out[S_HEADERS * count + i] = r.headers;
        out[S_HEADER_COUNT * count + i] = r.header_count;
        headers += r.header_count;
    }
    return p == n ? headers : -1;
}

/* records_spans(data, count, base_offset, base_timestamp, log_append_time, max_timestamp, out) -> headers | -1 */
static PyObject *records_spans(PyObject *self, PyObject *args)
{
    Py_buffer data, out;
    Py_ssize_t count;
    batch_t batch;
    PyObject *out_obj;
    if (!PyArg_ParseTuple(args, "y*nLLpLO:records_spans", &data, &count, &batch.base_offset, &batch.base_timestamp,
                          &batch.log_append_time, &batch.max_timestamp, &out_obj))
        return NULL;
    if (count < 0 || count > PY_SSIZE_T_MAX / (8 * SPAN_ROWS)) {
        PyBuffer_Release(&data);
        return PyLong_FromLong(-1);
    }
    if (writable_of(out_obj, &out, 8, SPAN_ROWS * count, "out") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    int64_t headers;
    Py_BEGIN_ALLOW_THREADS
    headers = records_spans_loop((const uint8_t *)data.buf, data.len, count, &batch, (int64_t *)out.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    PyBuffer_Release(&data);
    return PyLong_FromLongLong(headers);
}

/* The (4, total) table of header spans (key, key length, value, value length: -1 a null value) of the records
 * whose first headers are at starts[i], counts[i] of them; 0, or -1 when they are not headers inside data. */
static int header_spans_loop(const uint8_t *data, Py_ssize_t n, const int64_t *starts, const int64_t *counts,
                             Py_ssize_t records, int64_t *out, Py_ssize_t total)
{
    Py_ssize_t h = 0;
    for (Py_ssize_t i = 0; i < records; i++) {
        if (starts[i] < 0 || starts[i] > n || counts[i] < 0 || counts[i] > total - h)
            return -1;
        Py_ssize_t q = (Py_ssize_t)starts[i];
        for (int64_t k = 0; k < counts[i]; k++, h++) {
            int64_t key_length = varint(data, &q, n);
            if (q < 0 || key_length < 0 || key_length > n - q)
                return -1;
            out[h] = q;
            out[total + h] = key_length;
            q += (Py_ssize_t)key_length;
            int64_t value_length = varint(data, &q, n);
            if (q < 0 || value_length < -1 || value_length > n - q)
                return -1;
            out[2 * total + h] = q;
            out[3 * total + h] = value_length;
            if (value_length > 0)
                q += (Py_ssize_t)value_length;
        }
    }
    return h == total ? 0 : -1;
}

/* header_spans(data, starts, counts, out, total) -> True | False (not headers inside data) */
static PyObject *header_spans(PyObject *self, PyObject *args)
{
    Py_buffer data, starts, counts, out;
    Py_ssize_t total;
    PyObject *out_obj;
    if (!PyArg_ParseTuple(args, "y*y*y*On:header_spans", &data, &starts, &counts, &out_obj, &total))
        return NULL;
    PyObject *result = NULL;
    if (starts.len != counts.len || starts.len % 8 != 0 || total < 0 || total > PY_SSIZE_T_MAX / 32) {
        PyErr_SetString(PyExc_ValueError, "starts and counts must be int64 arrays of one length");
    } else if (writable_of(out_obj, &out, 8, 4 * total, "out") == 0) {
        int found;
        Py_BEGIN_ALLOW_THREADS
        found = header_spans_loop((const uint8_t *)data.buf, data.len, (const int64_t *)starts.buf,
                                  (const int64_t *)counts.buf, starts.len / 8, (int64_t *)out.buf, total);
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&out);
        result = PyBool_FromLong(found == 0);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&counts);
    PyBuffer_Release(&starts);
    return result;
}

/* gather_spans(data, starts, lengths, out, position) -> end: data[s:s + n] for each span with n >= 0, one after
 * the other into out from position (memcpy); -1 when a span is not inside data or out is too small. */
static PyObject *gather_spans(PyObject *self, PyObject *args)
{
    Py_buffer data, starts, lengths, out;
    Py_ssize_t position;
    PyObject *out_obj;
    if (!PyArg_ParseTuple(args, "y*y*y*On:gather_spans", &data, &starts, &lengths, &out_obj, &position))
        return NULL;
    PyObject *result = NULL;
    if (starts.len != lengths.len || starts.len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "starts and lengths must be int64 arrays of one length");
    } else if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) == 0) {
        const uint8_t *d = (const uint8_t *)data.buf;
        const int64_t *s = (const int64_t *)starts.buf, *l = (const int64_t *)lengths.buf;
        uint8_t *o = (uint8_t *)out.buf;
        Py_ssize_t spans = starts.len / 8, at = position;
        Py_BEGIN_ALLOW_THREADS
        if (at < 0 || at > out.len)
            at = -1;
        for (Py_ssize_t i = 0; i < spans && at >= 0; i++) {
            if (l[i] < 0)
                continue;
            if (s[i] < 0 || s[i] > data.len || l[i] > data.len - s[i] || l[i] > out.len - at) {
                at = -1;
                break;
            }
            memcpy(o + at, d + s[i], (size_t)l[i]);
            at += (Py_ssize_t)l[i];
        }
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&out);
        result = PyLong_FromSsize_t(at);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&starts);
    return result;
}

/* -- transactional_batches: a header-only walk of whole batches ---------------------------------------- */

static PyObject *transactional_batches(PyObject *self, PyObject *args)
{
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*:transactional_batches", &view))
        return NULL;
    const uint8_t *buf = (const uint8_t *)view.buf;
    Py_ssize_t n = view.len, p = 0, last = -1;
    PyObject *found = PyList_New(0);
    if (found == NULL)
        goto fail;
    while (p + 61 <= n) {
        int64_t length = ((int64_t)buf[p + 8] << 24) | ((int64_t)buf[p + 9] << 16) | ((int64_t)buf[p + 10] << 8)
                         | (int64_t)buf[p + 11];
        if (length < 49 || length > n - p - 12)      /* shorter than a v2 header, or not whole here */
            break;
        if (buf[p + 22] & 0x10) {                    /* attributes (int16 at 21): transactional */
            PyObject *at = PyLong_FromSsize_t(p);
            if (at == NULL || PyList_Append(found, at) < 0) {
                Py_XDECREF(at);
                goto fail;
            }
            Py_DECREF(at);
        }
        last = p;
        p += 12 + (Py_ssize_t)length;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("Nnn", found, last, p);
fail:
    Py_XDECREF(found);
    PyBuffer_Release(&view);
    return NULL;
}

/* -- json_plain: whether a block of lines is written as itself in a JSON string -------------------------- */

/* Every byte a newline, or printable ASCII other than '"' and '\\' (0x20-0x7F): what orjson writes as
 * itself.  A byte loop without a branch over 4 KiB at a time, which the compiler turns into 16-byte
 * compares (SSE2): 0.11 ms per MiB, against 0.26-0.32 for orjson's dump of the block. */
static int json_plain_loop(const uint8_t *data, Py_ssize_t n)
{
    uint8_t bad = 0;
    for (Py_ssize_t p = 0; p < n && bad == 0;) {
        Py_ssize_t stop = n - p < 4096 ? n : p + 4096;
        for (; p < stop; p++) {
            int8_t c = (int8_t)data[p];      /* bytes from 0x80 are negative: below 0x20 too */
            bad |= (uint8_t)((c < 0x20) & (c != '\n')) | (uint8_t)(c == '"') | (uint8_t)(c == '\\');
        }
    }
    return bad == 0;
}

static PyObject *json_plain(PyObject *self, PyObject *args)
{
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*:json_plain", &view))
        return NULL;
    /* with the GIL held: 0.11 ms per MiB is less than a thread switch costs the trio thread */
    int plain = json_plain_loop((const uint8_t *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyBool_FromLong(plain);
}

/* -- lines_layout / encode_lines: a block of text lines as a records section ---------------------------- */

static PyObject *lines_layout(PyObject *self, PyObject *args)
{
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*:lines_layout", &view))
        return NULL;
    const uint8_t *data = (const uint8_t *)view.buf;
    Py_ssize_t end = view.len, p = 0, lines = 0, size = 0, longest = 0;
    int whole = 1;
    Py_BEGIN_ALLOW_THREADS
    while (p < end) {
        const uint8_t *nl = memchr(data + p, '\n', (size_t)(end - p));
        if (nl == NULL) {
            whole = 0;
            break;
        }
        Py_ssize_t length = (nl - data) - p;
        Py_ssize_t body = 4 + varint_size((uint64_t)lines << 1) + varint_size((uint64_t)length << 1) + length;
        size += varint_size((uint64_t)body << 1) + body;
        if (length > longest)
            longest = length;
        lines++;
        p += length + 1;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (!whole)
        Py_RETURN_NONE;
    return Py_BuildValue("nnn", lines, size, longest);
}

static Py_ssize_t encode_lines_loop(const uint8_t *data, Py_ssize_t end, uint8_t *out, Py_ssize_t o,
                                    Py_ssize_t limit)
{
    Py_ssize_t p = 0, i = 0;
    while (p < end) {
        const uint8_t *nl = memchr(data + p, '\n', (size_t)(end - p));
        if (nl == NULL)
            return -2;
        Py_ssize_t length = (nl - data) - p;
        Py_ssize_t body = 4 + varint_size((uint64_t)i << 1) + varint_size((uint64_t)length << 1) + length;
        if (varint_size((uint64_t)body << 1) + body > limit - o)
            return -1;
        o = put_varint(out, o, (uint64_t)body << 1);
        out[o] = 0;                                     /* attributes */
        out[o + 1] = 0;                                 /* timestamp delta */
        o = put_varint(out, o + 2, (uint64_t)i << 1);  /* offset delta */
        out[o] = 1;                                     /* null key (varint -1) */
        o = put_varint(out, o + 1, (uint64_t)length << 1);
        memcpy(out + o, data + p, (size_t)length);
        o += length;
        out[o++] = 0;                                   /* no headers */
        i++;
        p += length + 1;
    }
    return o;
}

static PyObject *encode_lines(PyObject *self, PyObject *args)
{
    Py_buffer block, out;
    Py_ssize_t position;
    if (!PyArg_ParseTuple(args, "y*w*n:encode_lines", &block, &out, &position))
        return NULL;
    Py_ssize_t end = -3;
    if (position >= 0 && position <= out.len) {
        Py_BEGIN_ALLOW_THREADS
        end = encode_lines_loop((const uint8_t *)block.buf, block.len, (uint8_t *)out.buf, position, out.len);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&block);
    PyBuffer_Release(&out);
    if (end == -2) {
        PyErr_SetString(PyExc_ValueError, "the block's last line has no newline");
        return NULL;
    }
    if (end < 0) {
        PyErr_SetString(PyExc_ValueError, "the output buffer is too small for the block's records");
        return NULL;
    }
    return PyLong_FromSsize_t(end);
}

/* -- key_digests: MD5 (RFC 1321) of each key, as hashlib.md5(key).digest() ------------------------------ */

static const uint32_t MD5_K[64] = {
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
};
static const uint8_t MD5_SHIFT[64] = {
    7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14, 20,
    4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21,
};

static void md5_compress(uint32_t state[4], const uint8_t *block)
{
    uint32_t w[16];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)block[4 * i] | ((uint32_t)block[4 * i + 1] << 8) | ((uint32_t)block[4 * i + 2] << 16)
               | ((uint32_t)block[4 * i + 3] << 24);
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    for (int i = 0; i < 64; i++) {
        uint32_t f;
        int g;
        if (i < 16) {
            f = (b & c) | (~b & d);
            g = i;
        } else if (i < 32) {
            f = (d & b) | (~d & c);
            g = (5 * i + 1) & 15;
        } else if (i < 48) {
            f = b ^ c ^ d;
            g = (3 * i + 5) & 15;
        } else {
            f = c ^ (b | ~d);
            g = (7 * i) & 15;
        }
        f = f + a + MD5_K[i] + w[g];
        a = d;
        d = c;
        c = b;
        b = b + ((f << MD5_SHIFT[i]) | (f >> (32 - MD5_SHIFT[i])));
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
}

static void md5(const uint8_t *data, size_t length, uint8_t *out)
{
    uint32_t state[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
    size_t p = 0;
    for (; p + 64 <= length; p += 64)
        md5_compress(state, data + p);
    uint8_t tail[128] = {0};
    size_t rest = length - p;
    memcpy(tail, data + p, rest);
    tail[rest] = 0x80;
    int blocks = rest < 56 ? 1 : 2;
    uint64_t bits = (uint64_t)length << 3;
    for (int i = 0; i < 8; i++)
        tail[blocks * 64 - 8 + i] = (uint8_t)(bits >> (8 * i));
    for (int b = 0; b < blocks; b++)
        md5_compress(state, tail + 64 * b);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            out[4 * i + j] = (uint8_t)(state[i] >> (8 * j));
}

static PyObject *key_digests(PyObject *self, PyObject *args)
{
    Py_buffer buf, starts, lengths;
    PyObject *out_obj;
    if (!PyArg_ParseTuple(args, "y*y*y*O:key_digests", &buf, &starts, &lengths, &out_obj))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t count = starts.len / 8;
    Py_buffer out;
    if (lengths.len != starts.len) {
        PyErr_SetString(PyExc_ValueError, "starts and lengths differ in length");
        goto done;
    }
    const int64_t *s = (const int64_t *)starts.buf, *l = (const int64_t *)lengths.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (s[i] < 0 || l[i] < 0 || s[i] > buf.len || l[i] > buf.len - s[i]) {
            PyErr_Format(PyExc_ValueError, "key %zd (at %lld, %lld bytes) is outside the buffer", i,
                         (long long)s[i], (long long)l[i]);
            goto done;
        }
    }
    if (writable_of(out_obj, &out, 16, count, "out") < 0)
        goto done;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        md5((const uint8_t *)buf.buf + s[i], (size_t)l[i], (uint8_t *)out.buf + 16 * i);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&buf);
    return result;
}

/* -- put_digests: Kafka's SkimpyOffsetMap.put of each (digest, offset) pair ------------------------------ */

/* The slot of a digest at a probe attempt: Kafka's positionOf (Utils.abs of a Java int, modulo slots). */
static inline int64_t probe_position(const uint8_t *digest, int64_t attempt, int64_t slots)
{
    int at = attempt < 12 ? (int)attempt : 12;
    uint32_t probe = ((uint32_t)digest[at] << 24) | ((uint32_t)digest[at + 1] << 16) | ((uint32_t)digest[at + 2] << 8)
                     | (uint32_t)digest[at + 3];
    if (attempt > 12)
        probe += (uint32_t)(attempt - 12);                     /* Java's wrapping int add */
    int32_t signed_probe = (int32_t)probe;
    if (signed_probe == INT32_MIN)
        return 0;                                               /* Utils.abs(Integer.MIN_VALUE) */
    int64_t magnitude = signed_probe < 0 ? -(int64_t)signed_probe : (int64_t)signed_probe;
    return magnitude % slots;
}

static PyObject *put_digests(PyObject *self, PyObject *args)
{
    Py_buffer table, digests, offsets;
    Py_ssize_t slots, limit, entries;
    if (!PyArg_ParseTuple(args, "w*ny*y*nn:put_digests", &table, &slots, &digests, &offsets, &limit, &entries))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t count = offsets.len / 8, done = 0;
    long long probes = 0;
    if (slots <= 0 || table.len < 24 * slots || digests.len != 16 * count) {
        PyErr_SetString(PyExc_ValueError, "the table must hold 24-byte slots, and a digest is needed per offset");
        goto out;
    }
    if (limit > slots)
        limit = slots;                  /* a full map takes no new key: never probe for an empty slot forever */
    Py_BEGIN_ALLOW_THREADS
    /* A slot is 24 bytes: the digest, then the offset big-endian; empty when all zero. */
    uint8_t *base = (uint8_t *)table.buf;
    const uint8_t *d = (const uint8_t *)digests.buf;
    const int64_t *o = (const int64_t *)offsets.buf;
    for (done = 0; done < count; done++) {
        if (entries >= limit)
            break;
        const uint8_t *digest = d + 16 * done;
        uint64_t w0, w1;
        memcpy(&w0, digest, 8);
        memcpy(&w1, digest + 8, 8);
        uint8_t *slot;
        for (int64_t attempt = 0;; attempt++) {
            slot = base + 24 * probe_position(digest, attempt, slots);
            probes++;
            uint64_t t0, t1, t2;
            memcpy(&t0, slot, 8);
            memcpy(&t1, slot + 8, 8);
            if (t0 == w0 && t1 == w1)
                break;                                          /* the key's slot: overwrite its offset */
            memcpy(&t2, slot + 16, 8);
            if (t0 == 0 && t1 == 0 && t2 == 0) {
                memcpy(slot, digest, 16);                       /* an empty slot: the key is new */
                entries++;
                break;
            }
        }
        uint64_t offset = (uint64_t)o[done];
        for (int i = 0; i < 8; i++)
            slot[16 + i] = (uint8_t)(offset >> (56 - 8 * i));
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("nnL", done, entries, probes);
out:
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&digests);
    PyBuffer_Release(&table);
    return result;
}

static PyMethodDef methods[] = {
    {"records_text", records_text, METH_VARARGS,
     "records_text(data, count) -> bytearray | None: the text view of a records section of any layout"},
    {"records_jsonl", records_jsonl, METH_VARARGS,
     "records_jsonl(data, count, base_offset, base_timestamp, log_append_time, max_timestamp, pieces, render) "
     "-> JSON lines (render) | (text size, JSON size) | None"},
    {"records_columns", records_columns, METH_VARARGS,
     "records_columns(data, count, base_offset, base_timestamp, log_append_time, max_timestamp) -> "
     "(offsets, timestamps, keys | None, values, headers | None, contiguous) | None"},
    {"records_spans", records_spans, METH_VARARGS,
     "records_spans(data, count, base_offset, base_timestamp, log_append_time, max_timestamp, out) -> headers, or "
     "-1 when the walk refuses the section: each record's offset, timestamp, key, value and headers as positions"},
    {"header_spans", header_spans, METH_VARARGS,
     "header_spans(data, starts, counts, out, total) -> bool: each header's key and value as positions"},
    {"gather_spans", gather_spans, METH_VARARGS,
     "gather_spans(data, starts, lengths, out, position) -> end, or -1: the spans one after the other into out"},
    {"key_columns", key_columns, METH_VARARGS,
     "key_columns(buf, batches, width, records, offsets, key_starts, key_lengths, null_values) -> records read, "
     "or -1 - the index of the first malformed batch"},
    {"transactional_batches", transactional_batches, METH_VARARGS,
     "transactional_batches(buf) -> (positions of transactional batches, last whole batch or -1, end)"},
    {"json_plain", json_plain, METH_VARARGS,
     "json_plain(block) -> bool: every byte a newline or printable ASCII other than '\"' and '\\\\'"},
    {"lines_layout", lines_layout, METH_VARARGS,
     "lines_layout(block) -> (lines, records section size, longest line) | None when the last line has no newline"},
    {"encode_lines", encode_lines, METH_VARARGS,
     "encode_lines(block, out, position) -> end: the records section of the block's lines into out"},
    {"key_digests", key_digests, METH_VARARGS,
     "key_digests(buf, starts, lengths, out): the MD5 digest of each key buf[s:s + n] into out"},
    {"put_digests", put_digests, METH_VARARGS,
     "put_digests(table, slots, digests, offsets, limit, entries) -> (pairs put, entries, probes)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "engine.records._kernels",
    "The compiled loops of the records codec (engine.records.kernels wraps them).", -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void)
{
    return PyModule_Create(&module);
}
