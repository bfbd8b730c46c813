/* handoff_spark._kafka_native: a range reader's Kafka fetches straight into Arrow-layout buffers.
 *
 * Why (docs/benchmarks.md "Throughput"): confluent-kafka's `consume()` builds a Python `Message` per record, and
 * the reader then called five methods per record to build its columns. For 1M records that was ~1.2-1.7 s of a
 * worker's main thread in `consume()` and ~0.8 s in building the columns, most of what the workers spent besides
 * decoding and writing. Here one C loop copies each record's offset, timestamp, key and value into the buffers of
 * an Arrow batch, with no Python object per record (headers, rare, are the one exception).
 *
 * The librdkafka used is confluent-kafka's own (its wheel's bundled library, already loaded): `load(path)` opens
 * it and looks up the functions below, so the process has one librdkafka whatever this module was compiled
 * against (Debian's librdkafka-dev headers: only the types and the function signatures, stable across 2.x).
 * The decisions (end of range, errors, transaction markers) stay in Python: `kafka_native.py`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <string.h>
#include <librdkafka/rdkafka.h>

#define FUNCS(X)                                                                                      \
    X(rd_kafka_conf_new) X(rd_kafka_conf_set) X(rd_kafka_conf_set_error_cb) X(rd_kafka_conf_destroy)  \
    X(rd_kafka_new) X(rd_kafka_destroy) X(rd_kafka_poll_set_consumer) X(rd_kafka_queue_get_consumer)  \
    X(rd_kafka_queue_destroy) X(rd_kafka_consume_batch_queue) X(rd_kafka_message_destroy)             \
    X(rd_kafka_message_timestamp) X(rd_kafka_message_headers) X(rd_kafka_header_get_all)              \
    X(rd_kafka_header_cnt) X(rd_kafka_err2str) X(rd_kafka_last_error)                                 \
    X(rd_kafka_topic_partition_list_new) X(rd_kafka_topic_partition_list_add)                         \
    X(rd_kafka_topic_partition_list_destroy) X(rd_kafka_assign) X(rd_kafka_assignment)                \
    X(rd_kafka_position) X(rd_kafka_consumer_close) X(rd_kafka_topic_new) X(rd_kafka_topic_destroy)   \
    X(rd_kafka_metadata) X(rd_kafka_metadata_destroy)

#define DECLARE(name) static __typeof__(name) *p_##name;
FUNCS(DECLARE)

static int loaded = 0;

/* By default at most this many key + value bytes per batch returned, so that Arrow's 32-bit binary offsets always
 * hold it; records past it stay pending for the next call. */
#define MAX_BATCH_BYTES (256LL << 20)

static PyObject *load(PyObject *Py_UNUSED(self), PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    if (loaded) Py_RETURN_NONE;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) return PyErr_Format(PyExc_ImportError, "cannot open %s: %s", path, dlerror());
#define LOOKUP(name)                                                                                  \
    p_##name = (__typeof__(name) *)dlsym(lib, #name);                                                 \
    if (p_##name == NULL) return PyErr_Format(PyExc_ImportError, "%s has no %s", path, #name);
    FUNCS(LOOKUP)
    loaded = 1;
    Py_RETURN_NONE;
}

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    rd_kafka_queue_t *queue;
    rd_kafka_message_t **msgs; /* the last fetched batch; [pos, count) not handed out yet */
    Py_ssize_t cap, count, pos;
    long long max_bytes;
} Reader;

static void drop_pending(Reader *r) {
    for (Py_ssize_t i = r->pos; i < r->count; i++) p_rd_kafka_message_destroy(r->msgs[i]);
    r->pos = r->count = 0;
}

static void reader_close_handle(Reader *r) {
    if (r->rk == NULL) return;
    drop_pending(r);
    rd_kafka_t *rk = r->rk;
    rd_kafka_queue_t *queue = r->queue;
    r->rk = NULL;
    r->queue = NULL;
    Py_BEGIN_ALLOW_THREADS
    p_rd_kafka_queue_destroy(queue);
    p_rd_kafka_consumer_close(rk);
    p_rd_kafka_destroy(rk);
    Py_END_ALLOW_THREADS
}

/* Client-level errors (a broker's connection lost, all brokers down) go where confluent-kafka's `Consumer` sends
 * them without an `error_cb`: nowhere. librdkafka has logged the failure and retries on its own; a range whose
 * reads make no progress still fails after `readTimeoutSeconds` (read_range). They are never error records. */
static void client_error(rd_kafka_t *Py_UNUSED(rk), int Py_UNUSED(err), const char *Py_UNUSED(reason),
                         void *Py_UNUSED(opaque)) {}

static int reader_init(Reader *r, PyObject *args, PyObject *Py_UNUSED(kwds)) {
    PyObject *conf_dict, *key, *value;
    Py_ssize_t i = 0;
    char errstr[512];
    r->max_bytes = MAX_BATCH_BYTES;
    if (!PyArg_ParseTuple(args, "O!|nL", &PyDict_Type, &conf_dict, &r->cap, &r->max_bytes)) return -1;
    if (!loaded) {
        PyErr_SetString(PyExc_RuntimeError, "_kafka_native.load() was not called");
        return -1;
    }
    if (r->cap <= 0) r->cap = 10000;
    if (r->max_bytes <= 0 || r->max_bytes > MAX_BATCH_BYTES) r->max_bytes = MAX_BATCH_BYTES;
    rd_kafka_conf_t *conf = p_rd_kafka_conf_new();
    while (PyDict_Next(conf_dict, &i, &key, &value)) {
        const char *k = PyUnicode_AsUTF8(key), *v = PyUnicode_AsUTF8(value);
        if (k == NULL || v == NULL) {
            p_rd_kafka_conf_destroy(conf);
            return -1;
        }
        if (p_rd_kafka_conf_set(conf, k, v, errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
            p_rd_kafka_conf_destroy(conf);
            PyErr_Format(PyExc_ValueError, "%s: %s", k, errstr);
            return -1;
        }
    }
    p_rd_kafka_conf_set_error_cb(conf, client_error);
    rd_kafka_t *rk = p_rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
    if (rk == NULL) { /* rd_kafka_new keeps conf only when it succeeds */
        p_rd_kafka_conf_destroy(conf);
        PyErr_Format(PyExc_ValueError, "%s", errstr);
        return -1;
    }
    p_rd_kafka_poll_set_consumer(rk);
    r->rk = rk;
    r->queue = p_rd_kafka_queue_get_consumer(rk);
    r->msgs = PyMem_Calloc((size_t)r->cap, sizeof(rd_kafka_message_t *));
    if (r->msgs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void reader_dealloc(Reader *r) {
    reader_close_handle(r);
    PyMem_Free(r->msgs);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static int check_open(Reader *r) {
    if (r->rk != NULL) return 0;
    PyErr_SetString(PyExc_RuntimeError, "the reader is closed");
    return -1;
}

static PyObject *KafkaError; /* _kafka_native.KafkaError(code, reason): the wrapper raises confluent-kafka's */

static PyObject *raise_kafka(rd_kafka_resp_err_t err) {
    PyObject *e = Py_BuildValue("(is)", (int)err, p_rd_kafka_err2str(err));
    if (e != NULL) {
        PyErr_SetObject(KafkaError, e);
        Py_DECREF(e);
    }
    return NULL;
}

/* assign(topic, partition, offset): this one partition from `offset`, or nothing with topic None. */
static PyObject *reader_assign(Reader *r, PyObject *args) {
    const char *topic = NULL;
    int partition = 0;
    long long offset = 0;
    if (!PyArg_ParseTuple(args, "|ziL", &topic, &partition, &offset) || check_open(r)) return NULL;
    drop_pending(r);
    rd_kafka_topic_partition_list_t *parts = NULL;
    if (topic != NULL) {
        parts = p_rd_kafka_topic_partition_list_new(1);
        p_rd_kafka_topic_partition_list_add(parts, topic, partition)->offset = offset;
    }
    rd_kafka_resp_err_t err;
    Py_BEGIN_ALLOW_THREADS
    err = p_rd_kafka_assign(r->rk, parts);
    Py_END_ALLOW_THREADS
    if (parts != NULL) p_rd_kafka_topic_partition_list_destroy(parts);
    if (err) return raise_kafka(err);
    Py_RETURN_NONE;
}

/* position(topic, partition) -> the consumer's position (-1001 when it has none yet). */
static PyObject *reader_position(Reader *r, PyObject *args) {
    const char *topic;
    int partition;
    if (!PyArg_ParseTuple(args, "si", &topic, &partition) || check_open(r)) return NULL;
    rd_kafka_topic_partition_list_t *parts = p_rd_kafka_topic_partition_list_new(1);
    p_rd_kafka_topic_partition_list_add(parts, topic, partition);
    rd_kafka_resp_err_t err = p_rd_kafka_position(r->rk, parts);
    long long offset = parts->elems[0].offset;
    p_rd_kafka_topic_partition_list_destroy(parts);
    if (err) return raise_kafka(err);
    return PyLong_FromLongLong(offset);
}

/* assignment() -> [(topic, partition)] the consumer fetches for. */
static PyObject *reader_assignment(Reader *r, PyObject *Py_UNUSED(unused)) {
    if (check_open(r)) return NULL;
    rd_kafka_topic_partition_list_t *parts = NULL;
    rd_kafka_resp_err_t err = p_rd_kafka_assignment(r->rk, &parts);
    if (err) return raise_kafka(err);
    PyObject *list = PyList_New(0);
    for (int i = 0; list != NULL && i < parts->cnt; i++) {
        PyObject *item = Py_BuildValue("(si)", parts->elems[i].topic, (int)parts->elems[i].partition);
        if (item == NULL || PyList_Append(list, item) < 0) Py_CLEAR(list);
        Py_XDECREF(item);
    }
    p_rd_kafka_topic_partition_list_destroy(parts);
    return list;
}

/* metadata(topic, timeout_ms): asks the brokers for one topic's metadata (leaders), so that a later assign
 * fetches at once. Raises on timeout. */
static PyObject *reader_metadata(Reader *r, PyObject *args) {
    const char *topic;
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "si", &topic, &timeout_ms) || check_open(r)) return NULL;
    rd_kafka_topic_t *rkt = p_rd_kafka_topic_new(r->rk, topic, NULL);
    if (rkt == NULL) return PyErr_Format(PyExc_RuntimeError, "topic %s: cannot create its handle", topic);
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err;
    Py_BEGIN_ALLOW_THREADS
    err = p_rd_kafka_metadata(r->rk, 0, rkt, &md, timeout_ms);
    Py_END_ALLOW_THREADS
    if (md != NULL) p_rd_kafka_metadata_destroy(md);
    p_rd_kafka_topic_destroy(rkt);
    if (err) return raise_kafka(err);
    Py_RETURN_NONE;
}

static PyObject *reader_close(Reader *r, PyObject *Py_UNUSED(unused)) {
    reader_close_handle(r);
    Py_RETURN_NONE;
}

/* Sets bit i of a validity bitmap, allocating it (all valid so far) on the first null. */
static int set_null(PyObject **bitmap, Py_ssize_t n, Py_ssize_t i) {
    if (*bitmap == NULL) {
        *bitmap = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (*bitmap == NULL) return -1;
        memset(PyBytes_AS_STRING(*bitmap), 0xff, (size_t)(n + 7) / 8);
    }
    PyBytes_AS_STRING(*bitmap)[i / 8] &= (char)~(1 << (i % 8));
    return 0;
}

/* [(name, value or None)] of a record's headers, as confluent-kafka's `Message.headers()`. */
static PyObject *headers_list(rd_kafka_headers_t *hdrs) {
    size_t n = p_rd_kafka_header_cnt(hdrs);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL) return NULL;
    for (size_t i = 0; i < n; i++) {
        const char *name;
        const void *val;
        size_t size;
        p_rd_kafka_header_get_all(hdrs, i, &name, &val, &size);
        PyObject *item = val == NULL ? Py_BuildValue("(sO)", name, Py_None)
                                     : Py_BuildValue("(sy#)", name, (const char *)val, (Py_ssize_t)size);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

/* read(n, timeout_ms, end) -> (polled, rows, last, errors, columns)
 *
 * Fetches up to n records (or hands out what the last fetch left pending) and returns those with offset < end:
 *   polled:  how many records and events librdkafka gave in this call's fetch (-1: none, pending ones were used)
 *   rows:    how many records are in `columns`
 *   last:    the highest offset of any record seen, those at or past `end` included (-1: none)
 *   errors:  [(code, offset, reason)] for every error event, in order (end of partition included)
 *   columns: (offsets int64, timestamps_us int64, their validity or None, key offsets int32, key bytes, key
 *             validity or None, value offsets int32, value bytes, value validity or None, headers list or None)
 *             as bytes: the buffers of Arrow arrays (a validity bitmap is None when nothing is null). */
static PyObject *reader_read(Reader *r, PyObject *args) {
    Py_ssize_t n;
    int timeout_ms;
    long long end;
    if (!PyArg_ParseTuple(args, "niL", &n, &timeout_ms, &end) || check_open(r)) return NULL;
    if (n < 1) n = 1;
    Py_ssize_t polled = -1;
    if (r->pos >= r->count) {
        if (n > r->cap) {
            rd_kafka_message_t **grown = PyMem_Realloc(r->msgs, (size_t)n * sizeof(rd_kafka_message_t *));
            if (grown == NULL) return PyErr_NoMemory();
            r->msgs = grown;
            r->cap = n;
        }
        ssize_t got;
        Py_BEGIN_ALLOW_THREADS
        got = p_rd_kafka_consume_batch_queue(r->queue, timeout_ms, r->msgs, (size_t)n);
        Py_END_ALLOW_THREADS
        if (got < 0) return raise_kafka(p_rd_kafka_last_error()); /* -1: the queue call itself failed */
        r->pos = 0;
        r->count = polled = got;
    }
    /* The slice handed out: up to max_bytes of keys and values, at least one message. */
    Py_ssize_t from = r->pos, to = r->pos, rows = 0;
    long long kbytes = 0, vbytes = 0, last = -1;
    while (to < r->count) {
        rd_kafka_message_t *m = r->msgs[to];
        if (!m->err) {
            if (to > from && kbytes + vbytes + (long long)m->key_len + (long long)m->len > r->max_bytes) break;
            if (m->offset > last) last = m->offset;
            if (m->offset < end) {
                rows++;
                kbytes += (long long)m->key_len;
                vbytes += (long long)m->len;
            }
        }
        to++;
    }
    PyObject *errors = PyList_New(0), *offsets = PyBytes_FromStringAndSize(NULL, rows * 8),
             *ts = PyBytes_FromStringAndSize(NULL, rows * 8), *koffs = PyBytes_FromStringAndSize(NULL, (rows + 1) * 4),
             *kdata = PyBytes_FromStringAndSize(NULL, kbytes), *voffs = PyBytes_FromStringAndSize(NULL, (rows + 1) * 4),
             *vdata = PyBytes_FromStringAndSize(NULL, vbytes), *ts_valid = NULL, *k_valid = NULL, *v_valid = NULL,
             *headers = NULL, *result = NULL;
    if (!errors || !offsets || !ts || !koffs || !kdata || !voffs || !vdata) goto done;
    int64_t *o = (int64_t *)PyBytes_AS_STRING(offsets), *t = (int64_t *)PyBytes_AS_STRING(ts);
    int32_t *ko = (int32_t *)PyBytes_AS_STRING(koffs), *vo = (int32_t *)PyBytes_AS_STRING(voffs);
    char *kd = PyBytes_AS_STRING(kdata), *vd = PyBytes_AS_STRING(vdata);
    int32_t kpos = 0, vpos = 0;
    Py_ssize_t row = 0;
    ko[0] = vo[0] = 0;
    for (Py_ssize_t i = from; i < to; i++) {
        rd_kafka_message_t *m = r->msgs[i];
        if (m->err) {
            const char *reason = m->payload != NULL ? (const char *)m->payload : p_rd_kafka_err2str(m->err);
            Py_ssize_t reason_len = m->payload != NULL ? (Py_ssize_t)m->len : (Py_ssize_t)strlen(reason);
            PyObject *e = Py_BuildValue("(iLs#)", (int)m->err, (long long)m->offset, reason, reason_len);
            if (e == NULL) {
                PyErr_Clear(); /* a reason that is not UTF-8: keep the code */
                e = Py_BuildValue("(iLs)", (int)m->err, (long long)m->offset, p_rd_kafka_err2str(m->err));
            }
            if (e == NULL || PyList_Append(errors, e) < 0) {
                Py_XDECREF(e);
                goto done;
            }
            Py_DECREF(e);
            continue;
        }
        if (m->offset >= end) continue;
        rd_kafka_timestamp_type_t tstype;
        int64_t ms = p_rd_kafka_message_timestamp(m, &tstype);
        o[row] = m->offset;
        t[row] = tstype == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE ? 0 : ms * 1000;
        if (tstype == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE && set_null(&ts_valid, rows, row) < 0) goto done;
        if (m->key == NULL) {
            if (set_null(&k_valid, rows, row) < 0) goto done;
        } else {
            memcpy(kd + kpos, m->key, m->key_len);
            kpos += (int32_t)m->key_len;
        }
        if (m->payload == NULL) {
            if (set_null(&v_valid, rows, row) < 0) goto done;
        } else {
            memcpy(vd + vpos, m->payload, m->len);
            vpos += (int32_t)m->len;
        }
        ko[row + 1] = kpos;
        vo[row + 1] = vpos;
        rd_kafka_headers_t *hdrs;
        if (p_rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            if (headers == NULL) { /* the first record with headers: None for every record before it */
                headers = PyList_New(rows);
                if (headers == NULL) goto done;
                for (Py_ssize_t j = 0; j < rows; j++) {
                    Py_INCREF(Py_None);
                    PyList_SET_ITEM(headers, j, Py_None);
                }
            }
            PyObject *h = headers_list(hdrs);
            if (h == NULL) goto done;
            Py_SETREF(PyList_GET_ITEM(headers, row), h);
        }
        row++;
    }
    result = Py_BuildValue("(nnLO(OOOOOOOOOO))", polled, rows, last, errors, offsets, ts,
                           ts_valid ? ts_valid : Py_None, koffs, kdata, k_valid ? k_valid : Py_None, voffs, vdata,
                           v_valid ? v_valid : Py_None, headers ? headers : Py_None);
done:
    for (Py_ssize_t i = from; i < to; i++) p_rd_kafka_message_destroy(r->msgs[i]);
    r->pos = to;
    Py_XDECREF(errors);
    Py_XDECREF(offsets);
    Py_XDECREF(ts);
    Py_XDECREF(koffs);
    Py_XDECREF(kdata);
    Py_XDECREF(voffs);
    Py_XDECREF(vdata);
    Py_XDECREF(ts_valid);
    Py_XDECREF(k_valid);
    Py_XDECREF(v_valid);
    Py_XDECREF(headers);
    return result;
}

static PyMethodDef reader_methods[] = {
    {"assign", (PyCFunction)reader_assign, METH_VARARGS, "assign(topic, partition, offset); assign() unassigns"},
    {"assignment", (PyCFunction)reader_assignment, METH_NOARGS, "assignment() -> [(topic, partition)]"},
    {"position", (PyCFunction)reader_position, METH_VARARGS, "position(topic, partition) -> offset"},
    {"metadata", (PyCFunction)reader_metadata, METH_VARARGS, "metadata(topic, timeout_ms)"},
    {"read", (PyCFunction)reader_read, METH_VARARGS, "read(n, timeout_ms, end) -> (polled, rows, last, errors, columns)"},
    {"close", (PyCFunction)reader_close, METH_NOARGS, "close the consumer (idempotent)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "handoff_spark._kafka_native.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(conf: dict[str, str], max_messages=10000, max_bytes=256 MiB): one assign-only librdkafka consumer",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)reader_init,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_methods = reader_methods,
};

static PyMethodDef module_methods[] = {
    {"load", load, METH_VARARGS, "load(path): use the librdkafka at path (confluent-kafka's)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kafka_native", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__kafka_native(void) {
    if (PyType_Ready(&ReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    KafkaError = PyErr_NewException("handoff_spark._kafka_native.KafkaError", NULL, NULL);
    if (KafkaError == NULL || PyModule_AddObjectRef(m, "KafkaError", KafkaError) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(&ReaderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
