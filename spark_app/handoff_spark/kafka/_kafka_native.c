/* handoff_spark.kafka._kafka_native: a range reader's Kafka fetches straight into Arrow-layout buffers.
 *
 * Why (docs/benchmarks.md "Throughput"): confluent-kafka's `consume()` builds a Python `Message` per record, and
 * the reader then called five methods per record to build its columns. For 1M records that was ~1.2-1.7 s of a
 * worker's main thread in `consume()` and ~0.8 s in building the columns, most of what the workers spent besides
 * decoding and writing. Here one C loop copies each record's offset, timestamp, key and value into the buffers of
 * an Arrow batch, with no Python object per record (headers, rare, are the one exception).
 *
 * The librdkafka used is confluent-kafka's own (its wheel's bundled library, already loaded): `load(path)` opens
 * it and looks up the functions below, so the process has one librdkafka whatever this module was compiled
 * against (Debian's librdkafka-dev headers). Compiled against one version and bound to another, the code is only
 * right while the bound library's ABI is the one the headers declare: the functions' signatures, and the layout
 * of the two structs it reads and writes itself (`rd_kafka_message_t`: err, payload, len, key, key_len, offset;
 * `rd_kafka_topic_partition_list_t` and its `rd_kafka_topic_partition_t` elements: cnt, size, elems, topic,
 * partition, offset). librdkafka keeps that ABI within a major version, but nothing enforced it here, and a
 * wrong layout reads wrong memory silently. So nothing reads a record until Python has checked the binding
 * (`kafka_native.module()`): `load` returns the bound library's `rd_kafka_version()` (compared with
 * `HEADER_VERSION`, the headers' RD_KAFKA_VERSION) and the functions it lacks; `layout_problems()` has the bound
 * library itself fill each struct (a partition list it allocates and sets; a message it makes, purges and
 * delivers to a callback, with no broker) and compares every field read through this file's compiled layout
 * with what was put in; `enable()` then lets Readers be made. On any mismatch Python uses confluent-kafka's
 * reader instead.
 * The decisions (end of range, errors, transaction markers) stay in Python: `kafka_native.py`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
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
    X(rd_kafka_metadata) X(rd_kafka_metadata_destroy)                                                  \
    /* the layout probe's */                                                                          \
    X(rd_kafka_topic_partition_list_set_offset) X(rd_kafka_conf_set_dr_msg_cb) X(rd_kafka_produce)    \
    X(rd_kafka_purge) X(rd_kafka_poll)

#define DECLARE(name) static __typeof__(name) *p_##name;
FUNCS(DECLARE)
static __typeof__(rd_kafka_version) *p_rd_kafka_version;

static void *lib = NULL;      /* the bound library, once load() has opened it */
static PyObject *bound = NULL; /* load()'s result: (rd_kafka_version(), names of the functions it lacks) */
static int functions_found = 0; /* every function in FUNCS was found */
static int loaded = 0;          /* enable(): Python checked the binding; Readers may be made */

/* By default at most this many key + value bytes per batch returned, so that Arrow's 32-bit binary offsets always
 * hold it; records past it stay pending for the next call. */
#define MAX_BATCH_BYTES (256LL << 20)

/* load(path) -> (rd_kafka_version(), (names of the functions it lacks, ...)): binds this module to the librdkafka
 * at `path` (once per process; later calls return the first result). Reads nothing of its structs. */
static PyObject *load(PyObject *Py_UNUSED(self), PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    if (bound != NULL) return Py_NewRef(bound);
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) return PyErr_Format(PyExc_ImportError, "cannot open %s: %s", path, dlerror());
    p_rd_kafka_version = (__typeof__(rd_kafka_version) *)dlsym(lib, "rd_kafka_version");
    if (p_rd_kafka_version == NULL) {
        dlclose(lib);
        lib = NULL;
        return PyErr_Format(PyExc_ImportError, "%s has no rd_kafka_version: not a librdkafka", path);
    }
    PyObject *missing = PyList_New(0);
    if (missing == NULL) return NULL;
    functions_found = 1;
#define LOOKUP(name)                                                                                  \
    p_##name = (__typeof__(name) *)dlsym(lib, #name);                                                 \
    if (p_##name == NULL) {                                                                           \
        functions_found = 0;                                                                          \
        PyObject *n = PyUnicode_FromString(#name);                                                    \
        if (n == NULL || PyList_Append(missing, n) < 0) {                                             \
            Py_XDECREF(n);                                                                            \
            Py_DECREF(missing);                                                                       \
            return NULL;                                                                              \
        }                                                                                             \
        Py_DECREF(n);                                                                                 \
    }
    FUNCS(LOOKUP)
    bound = Py_BuildValue("(iN)", p_rd_kafka_version(), PyList_AsTuple(missing));
    Py_DECREF(missing);
    return bound == NULL ? NULL : Py_NewRef(bound);
}

/* The layout probe's message: what the bound library handed its delivery callback, field by field as this file's
 * compiled `rd_kafka_message_t` reads them (copied in the callback: the message lives only during it). */
static struct {
    int calls;
    rd_kafka_resp_err_t err;
    int32_t partition;
    void *payload, *key, *private_;
    size_t len, key_len;
    int64_t offset;
    char key_bytes[16];
} probe_msg;

static char probe_payload[] = "payload"; /* 7 bytes, produced without RD_KAFKA_MSG_F_COPY: the message points here */
static char probe_key[] = "key-5";

static void probe_delivered(rd_kafka_t *Py_UNUSED(rk), const rd_kafka_message_t *m, void *Py_UNUSED(opaque)) {
    probe_msg.calls++;
    probe_msg.err = m->err;
    probe_msg.partition = m->partition;
    probe_msg.payload = m->payload;
    probe_msg.len = m->len;
    probe_msg.key = m->key;
    probe_msg.key_len = m->key_len;
    probe_msg.offset = m->offset;
    probe_msg.private_ = m->_private;
    /* the key's bytes only where the fields before it read back right, so no wild pointer is followed */
    if (m->payload == probe_payload && m->len == 7 && m->key != NULL && m->key_len == 5)
        memcpy(probe_msg.key_bytes, m->key, m->key_len);
}

static int problem(PyObject *problems, const char *format, ...) {
    va_list args;
    va_start(args, format);
    PyObject *text = PyUnicode_FromFormatV(format, args);
    va_end(args);
    if (text == NULL) return -1;
    int rc = PyList_Append(problems, text);
    Py_DECREF(text);
    return rc;
}

#define PROBE_TOPIC "handoff-layout-probe"

/* rd_kafka_topic_partition_list_t and rd_kafka_topic_partition_t: a list the bound library allocates (room for 8)
 * and fills (two elements, an offset set by its own function), read back through the compiled layout. Pointer
 * facts are compared before anything is read through them. */
static int probe_partition_list(PyObject *problems) {
    rd_kafka_topic_partition_list_t *list = p_rd_kafka_topic_partition_list_new(8);
    if (list == NULL) return problem(problems, "rd_kafka_topic_partition_list_new(8) returned NULL");
    rd_kafka_topic_partition_t *a = p_rd_kafka_topic_partition_list_add(list, PROBE_TOPIC, 7);
    rd_kafka_topic_partition_t *b = p_rd_kafka_topic_partition_list_add(list, PROBE_TOPIC, 8);
    int rc = 0;
    if (list->cnt != 2 || list->size < 2)
        rc = problem(problems, "rd_kafka_topic_partition_list_t: cnt=%d size=%d after 2 adds (cnt, size moved)",
                     list->cnt, list->size);
    else if (list->elems != a || (char *)b - (char *)a != (ptrdiff_t)sizeof(rd_kafka_topic_partition_t))
        rc = problem(problems, "rd_kafka_topic_partition_t: elements %zd bytes apart, compiled size %zu "
                     "(elems or the element size moved)", (Py_ssize_t)((char *)b - (char *)a),
                     sizeof(rd_kafka_topic_partition_t));
    else if (a->partition != 7 || b->partition != 8)
        rc = problem(problems, "rd_kafka_topic_partition_t.partition reads %d, %d for 7, 8", (int)a->partition,
                     (int)b->partition);
    else if (b->topic == NULL || strcmp(b->topic, PROBE_TOPIC) != 0)
        rc = problem(problems, "rd_kafka_topic_partition_t.topic does not read back");
    else if (p_rd_kafka_topic_partition_list_set_offset(list, PROBE_TOPIC, 8, 1234567890123LL) !=
                 RD_KAFKA_RESP_ERR_NO_ERROR || b->offset != 1234567890123LL || a->offset != RD_KAFKA_OFFSET_INVALID)
        rc = problem(problems, "rd_kafka_topic_partition_t.offset reads %lld, %lld for %lld, 1234567890123",
                     (long long)a->offset, (long long)b->offset, (long long)RD_KAFKA_OFFSET_INVALID);
    p_rd_kafka_topic_partition_list_destroy(list);
    return rc;
}

/* rd_kafka_message_t: a message the bound library makes from known values (a producer with no broker: nothing
 * leaves the process), purged from its queue and handed to the delivery callback, read back field by field. */
static int probe_message(PyObject *problems) {
    static int opaque_marker;
    char errstr[512];
    memset(&probe_msg, 0, sizeof probe_msg);
    rd_kafka_conf_t *conf = p_rd_kafka_conf_new();
    /* log_level 0: no "no bootstrap.servers" warning from a client that is never meant to connect */
    if (p_rd_kafka_conf_set(conf, "log_level", "0", errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
        p_rd_kafka_conf_destroy(conf);
        return problem(problems, "the probe's producer: log_level: %s", errstr);
    }
    p_rd_kafka_conf_set_dr_msg_cb(conf, probe_delivered);
    rd_kafka_t *rk = p_rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
    if (rk == NULL) {
        p_rd_kafka_conf_destroy(conf);
        return problem(problems, "the probe's producer: %s", errstr);
    }
    int rc = 0;
    rd_kafka_topic_t *rkt = p_rd_kafka_topic_new(rk, PROBE_TOPIC, NULL);
    if (rkt == NULL) {
        rc = problem(problems, "the probe's producer: cannot make a topic handle");
    } else if (p_rd_kafka_produce(rkt, 5, 0, probe_payload, 7, probe_key, 5, &opaque_marker) != 0) {
        rc = problem(problems, "the probe's producer: rd_kafka_produce failed: %s",
                     p_rd_kafka_err2str(p_rd_kafka_last_error()));
    } else {
        p_rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE);
        for (int i = 0; i < 100 && probe_msg.calls == 0; i++) p_rd_kafka_poll(rk, 100);
        if (probe_msg.calls != 1)
            rc = problem(problems, "rd_kafka_message_t: the purged message was delivered %d times, not once",
                         probe_msg.calls);
        else if (probe_msg.err != RD_KAFKA_RESP_ERR__PURGE_QUEUE)
            rc = problem(problems, "rd_kafka_message_t.err reads %d for %d", (int)probe_msg.err,
                         (int)RD_KAFKA_RESP_ERR__PURGE_QUEUE);
        else if (probe_msg.payload != probe_payload || probe_msg.len != 7)
            rc = problem(problems, "rd_kafka_message_t.payload/len do not read back");
        else if (probe_msg.key_len != 5 || probe_msg.key == NULL || memcmp(probe_msg.key_bytes, probe_key, 5) != 0)
            rc = problem(problems, "rd_kafka_message_t.key/key_len do not read back");
        else if (probe_msg.partition != 5 || probe_msg.offset != RD_KAFKA_OFFSET_INVALID ||
                 probe_msg.private_ != &opaque_marker)
            rc = problem(problems, "rd_kafka_message_t.partition/offset/_private read %d, %lld, %s",
                         (int)probe_msg.partition, (long long)probe_msg.offset,
                         probe_msg.private_ == &opaque_marker ? "right" : "wrong");
    }
    if (rkt != NULL) p_rd_kafka_topic_destroy(rkt);
    Py_BEGIN_ALLOW_THREADS
    p_rd_kafka_destroy(rk);
    Py_END_ALLOW_THREADS
    return rc;
}

/* layout_problems() -> [what does not read back, ...]: empty when the bound library's structs are laid out as
 * this file was compiled to read them. */
static PyObject *layout_problems(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    if (!functions_found) {
        PyErr_SetString(PyExc_RuntimeError, "layout_problems() needs load() to have found every function");
        return NULL;
    }
    PyObject *problems = PyList_New(0);
    if (problems == NULL) return NULL;
    if (probe_partition_list(problems) < 0 || probe_message(problems) < 0) Py_CLEAR(problems);
    return problems;
}

/* enable(): Readers may be made (kafka_native.module() calls it once the binding passed its checks). */
static PyObject *enable(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    if (!functions_found) {
        PyErr_SetString(PyExc_RuntimeError, "enable() needs load() to have found every function");
        return NULL;
    }
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
        PyErr_SetString(PyExc_RuntimeError, "the librdkafka binding was not checked: kafka_native.module() loads, "
                                            "checks and enables it");
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
    .tp_name = "handoff_spark.kafka._kafka_native.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(conf: dict[str, str], max_messages=10000, max_bytes=256 MiB): one assign-only librdkafka consumer",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)reader_init,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_methods = reader_methods,
};

static PyMethodDef module_methods[] = {
    {"load", load, METH_VARARGS,
     "load(path) -> (rd_kafka_version(), missing function names): bind to the librdkafka at path (confluent-kafka's)"},
    {"layout_problems", layout_problems, METH_NOARGS,
     "layout_problems() -> [str]: the structs this module reads, as the bound library fills them; [] when right"},
    {"enable", enable, METH_NOARGS, "enable(): allow Readers (after kafka_native.module()'s checks passed)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kafka_native", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__kafka_native(void) {
    if (PyType_Ready(&ReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    KafkaError = PyErr_NewException("handoff_spark.kafka._kafka_native.KafkaError", NULL, NULL);
    if (KafkaError == NULL || PyModule_AddObjectRef(m, "KafkaError", KafkaError) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "HEADER_VERSION", RD_KAFKA_VERSION) < 0) {
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
