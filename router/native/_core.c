/* kvroute's optional compiled core (router/native/__init__.py explains the fallback).
 *
 * U64Map: a dict-like open-addressing hash map keyed by uint64 (linear probing,
 * backward-shift deletion, 16-byte slots). Values are either Python objects (the
 * memory index's presence bitsets) or uint64 (a worker's engine hash -> block key map,
 * no Python object per entry). Keys the table cannot hold natively (not an int, 0,
 * negative, wider than 64 bits) and, in uint64 mode, entries whose value does not fit,
 * live in a plain dict on the side, so every answer equals a dict's.
 *
 * chain(): the canonical block-key chain of router/ingest/block_keys.py
 * (xxh3_64 over each block's int32 token bytes, seeded with the parent key), one call
 * for all blocks; built only when libxxhash's header was found (KVR_XXHASH).
 *
 * U64Map.prefix(): the bitset AND along a prompt's keys with early exit (the scorer's
 * full-attention prefix, router/score/bits.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifdef KVR_XXHASH
#include <xxhash.h>
#endif

typedef struct {
    uint64_t key; /* 0: empty */
    union {
        PyObject *obj;
        uint64_t u;
    } v;
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    Py_ssize_t mask; /* capacity - 1 (capacity a power of two), -1 when unallocated */
    Py_ssize_t used;
    int u64vals;
    PyObject *extra; /* dict or NULL */
} MapObject;

static PyTypeObject MapType;

static inline uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* 1: *out holds the native key; 0: the key belongs in the side dict; -1: error. */
static int as_key(PyObject *o, uint64_t *out) {
    if (!PyLong_Check(o))
        return 0;
    uint64_t v = PyLong_AsUnsignedLongLong(o);
    if (v == (uint64_t)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    if (v == 0)
        return 0;
    *out = v;
    return 1;
}

static int as_u64val(PyObject *o, uint64_t *out) {
    if (!PyLong_Check(o))
        return 0;
    uint64_t v = PyLong_AsUnsignedLongLong(o);
    if (v == (uint64_t)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    *out = v;
    return 1;
}

static inline Slot *find(MapObject *m, uint64_t k) {
    if (m->mask < 0)
        return NULL;
    Py_ssize_t i = (Py_ssize_t)(mix(k) & (uint64_t)m->mask);
    for (;;) {
        Slot *s = &m->slots[i];
        if (s->key == k)
            return s;
        if (s->key == 0)
            return NULL;
        i = (i + 1) & m->mask;
    }
}

static int resize(MapObject *m, Py_ssize_t cap) {
    Slot *old = m->slots;
    Py_ssize_t oldcap = m->mask + 1;
    Slot *n = PyMem_Calloc((size_t)cap, sizeof(Slot));
    if (n == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    m->slots = n;
    m->mask = cap - 1;
    for (Py_ssize_t j = 0; j < oldcap; j++) {
        if (old[j].key == 0)
            continue;
        Py_ssize_t i = (Py_ssize_t)(mix(old[j].key) & (uint64_t)m->mask);
        while (n[i].key != 0)
            i = (i + 1) & m->mask;
        n[i] = old[j];
    }
    PyMem_Free(old);
    return 0;
}

/* The slot for k, inserted empty-valued (*fresh = 1) when absent. */
static Slot *insert_slot(MapObject *m, uint64_t k, int *fresh) {
    Slot *s = find(m, k);
    *fresh = 0;
    if (s != NULL)
        return s;
    if ((m->used + 1) * 4 > (m->mask + 1) * 3) { /* load factor 0.75 */
        if (resize(m, m->mask < 0 ? 8 : 2 * (m->mask + 1)) < 0)
            return NULL;
    }
    Py_ssize_t i = (Py_ssize_t)(mix(k) & (uint64_t)m->mask);
    while (m->slots[i].key != 0)
        i = (i + 1) & m->mask;
    s = &m->slots[i];
    s->key = k;
    s->v.u = 0;
    m->used++;
    *fresh = 1;
    return s;
}

static void erase_slot(MapObject *m, Slot *s) {
    Py_ssize_t i = s - m->slots;
    if (!m->u64vals)
        Py_CLEAR(s->v.obj);
    m->used--;
    Py_ssize_t j = i;
    for (;;) { /* backward-shift deletion keeps probe chains intact */
        j = (j + 1) & m->mask;
        uint64_t kj = m->slots[j].key;
        if (kj == 0)
            break;
        Py_ssize_t home = (Py_ssize_t)(mix(kj) & (uint64_t)m->mask);
        /* move j into i when its home is not cyclically within (i, j] */
        if (((j - home) & m->mask) >= ((j - i) & m->mask)) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].key = 0;
    m->slots[i].v.u = 0;
}

static PyObject *slot_value(MapObject *m, Slot *s) {
    if (m->u64vals)
        return PyLong_FromUnsignedLongLong(s->v.u);
    Py_INCREF(s->v.obj);
    return s->v.obj;
}

static int extra_nonempty(MapObject *m) { return m->extra != NULL && PyDict_GET_SIZE(m->extra) > 0; }

/* New reference to the value, NULL without error when absent. */
static PyObject *map_lookup(MapObject *m, PyObject *key) {
    uint64_t k;
    int r = as_key(key, &k);
    if (r < 0)
        return NULL;
    if (r == 1) {
        Slot *s = find(m, k);
        if (s != NULL)
            return slot_value(m, s);
    }
    if (extra_nonempty(m)) {
        PyObject *v = PyDict_GetItemWithError(m->extra, key);
        Py_XINCREF(v);
        return v;
    }
    return NULL;
}

static int extra_del(MapObject *m, PyObject *key) {
    if (!extra_nonempty(m))
        return 0;
    PyObject *v = PyDict_GetItemWithError(m->extra, key);
    if (v == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return PyDict_DelItem(m->extra, key) < 0 ? -1 : 1;
}

static int extra_set(MapObject *m, PyObject *key, PyObject *value) {
    if (m->extra == NULL) {
        m->extra = PyDict_New();
        if (m->extra == NULL)
            return -1;
    }
    return PyDict_SetItem(m->extra, key, value);
}

static int map_store(MapObject *m, PyObject *key, PyObject *value) {
    uint64_t k, u = 0;
    int r = as_key(key, &k);
    if (r < 0)
        return -1;
    int rv = 1;
    if (r == 1 && m->u64vals) {
        rv = as_u64val(value, &u);
        if (rv < 0)
            return -1;
    }
    if (r == 1 && rv == 1) {
        if (extra_del(m, key) < 0)
            return -1;
        int fresh;
        Slot *s = insert_slot(m, k, &fresh);
        if (s == NULL)
            return -1;
        if (m->u64vals) {
            s->v.u = u;
        } else {
            PyObject *old = fresh ? NULL : s->v.obj;
            Py_INCREF(value);
            s->v.obj = value;
            Py_XDECREF(old);
        }
        return 0;
    }
    if (r == 1) { /* a value that does not fit: the side dict holds the entry */
        Slot *s = find(m, k);
        if (s != NULL)
            erase_slot(m, s);
    }
    return extra_set(m, key, value);
}

/* 0 deleted, 1 absent, -1 error */
static int map_remove(MapObject *m, PyObject *key) {
    uint64_t k;
    int r = as_key(key, &k);
    if (r < 0)
        return -1;
    if (r == 1) {
        Slot *s = find(m, k);
        if (s != NULL) {
            erase_slot(m, s);
            return 0;
        }
    }
    int e = extra_del(m, key);
    return e < 0 ? -1 : e == 1 ? 0 : 1;
}

static void map_clear_all(MapObject *m) {
    if (m->slots != NULL) {
        if (!m->u64vals)
            for (Py_ssize_t j = 0; j <= m->mask; j++)
                if (m->slots[j].key != 0)
                    Py_CLEAR(m->slots[j].v.obj);
        PyMem_Free(m->slots);
    }
    m->slots = NULL;
    m->mask = -1;
    m->used = 0;
    Py_CLEAR(m->extra);
}

/* ---- type slots ---- */

static PyObject *Map_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"u64_values", NULL};
    int u64vals = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p", kwlist, &u64vals))
        return NULL;
    MapObject *m = (MapObject *)type->tp_alloc(type, 0);
    if (m == NULL)
        return NULL;
    m->slots = NULL;
    m->mask = -1;
    m->used = 0;
    m->u64vals = u64vals;
    m->extra = NULL;
    return (PyObject *)m;
}

static void Map_dealloc(MapObject *m) {
    map_clear_all(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t Map_len(MapObject *m) {
    return m->used + (m->extra != NULL ? PyDict_GET_SIZE(m->extra) : 0);
}

static PyObject *Map_subscript(MapObject *m, PyObject *key) {
    PyObject *v = map_lookup(m, key);
    if (v == NULL && !PyErr_Occurred())
        PyErr_SetObject(PyExc_KeyError, key);
    return v;
}

static int Map_ass_subscript(MapObject *m, PyObject *key, PyObject *value) {
    if (value != NULL)
        return map_store(m, key, value);
    int r = map_remove(m, key);
    if (r == 1) {
        PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    return r;
}

static int Map_contains(MapObject *m, PyObject *key) {
    PyObject *v = map_lookup(m, key);
    if (v == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_DECREF(v);
    return 1;
}

static PyObject *Map_get(MapObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    PyObject *v = map_lookup(m, args[0]);
    if (v != NULL || PyErr_Occurred())
        return v;
    PyObject *d = nargs == 2 ? args[1] : Py_None;
    Py_INCREF(d);
    return d;
}

static PyObject *Map_setdefault(MapObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "setdefault(key, default=None)");
        return NULL;
    }
    PyObject *v = map_lookup(m, args[0]);
    if (v != NULL || PyErr_Occurred())
        return v;
    PyObject *d = nargs == 2 ? args[1] : Py_None;
    if (map_store(m, args[0], d) < 0)
        return NULL;
    Py_INCREF(d);
    return d;
}

static PyObject *Map_pop(MapObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(key[, default])");
        return NULL;
    }
    PyObject *v = map_lookup(m, args[0]);
    if (v == NULL) {
        if (PyErr_Occurred())
            return NULL;
        if (nargs == 2) {
            Py_INCREF(args[1]);
            return args[1];
        }
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    if (map_remove(m, args[0]) < 0) {
        Py_DECREF(v);
        return NULL;
    }
    return v;
}

/* which: 0 keys, 1 values, 2 items */
static PyObject *collect(MapObject *m, int which) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j <= m->mask; j++) {
        Slot *s = &m->slots[j];
        if (s->key == 0)
            continue;
        PyObject *item;
        if (which == 0) {
            item = PyLong_FromUnsignedLongLong(s->key);
        } else if (which == 1) {
            item = slot_value(m, s);
        } else {
            PyObject *k = PyLong_FromUnsignedLongLong(s->key);
            PyObject *v = k ? slot_value(m, s) : NULL;
            item = v ? PyTuple_Pack(2, k, v) : NULL;
            Py_XDECREF(k);
            Py_XDECREF(v);
        }
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    if (extra_nonempty(m)) {
        PyObject *rest = which == 0   ? PyDict_Keys(m->extra)
                         : which == 1 ? PyDict_Values(m->extra)
                                      : PyDict_Items(m->extra);
        if (rest == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        Py_ssize_t n = PyList_GET_SIZE(out);
        int bad = PyList_SetSlice(out, n, n, rest);
        Py_DECREF(rest);
        if (bad < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *Map_keys(MapObject *m, PyObject *Py_UNUSED(a)) { return collect(m, 0); }
static PyObject *Map_values(MapObject *m, PyObject *Py_UNUSED(a)) { return collect(m, 1); }
static PyObject *Map_items(MapObject *m, PyObject *Py_UNUSED(a)) { return collect(m, 2); }

static PyObject *Map_iter(MapObject *m) {
    PyObject *keys = collect(m, 0);
    if (keys == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static PyObject *Map_clear(MapObject *m, PyObject *Py_UNUSED(a)) {
    map_clear_all(m);
    Py_RETURN_NONE;
}

static PyObject *Map_sizeof(MapObject *m, PyObject *Py_UNUSED(a)) {
    Py_ssize_t n = (Py_ssize_t)sizeof(MapObject) + (m->mask + 1) * (Py_ssize_t)sizeof(Slot);
    if (m->extra != NULL) {
        PyObject *r = PyObject_CallMethod(m->extra, "__sizeof__", NULL);
        if (r == NULL)
            return NULL;
        n += PyLong_AsSsize_t(r);
        Py_DECREF(r);
    }
    return PyLong_FromSsize_t(n);
}

#define BATCH 32

/* prefix(keys, initial) -> (pa, vals, any): pa = [initial, initial & v0, ...] while nonzero
 * (the AND of the values of keys[:i] with initial, stopping at the first zero or
 * absent key, like list(takewhile(bool, accumulate(map(get, keys, repeat(0)), and_,
 * initial=initial)))); vals = the values of the first len(pa) - 1 keys; any = their OR.
 * Object-valued maps only. Keys are looked up a batch at a time: the batch's slots are
 * prefetched, then its values, so the cache misses of a batch overlap. */
static PyObject *Map_prefix(MapObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "prefix(keys, initial)");
        return NULL;
    }
    if (m->u64vals) {
        PyErr_SetString(PyExc_TypeError, "prefix() needs an object-valued map");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "keys must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *pa = PyList_New(0), *vals = PyList_New(0);
    PyObject *acc = args[1];
    Py_INCREF(acc);
    if (pa == NULL || vals == NULL)
        goto fail;
    int truth = PyObject_IsTrue(acc);
    if (truth < 0)
        goto fail;
    if (!truth)
        goto done;
    if (PyList_Append(pa, acc) < 0)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint64_t ks[BATCH];
    int native[BATCH];
    PyObject *vs[BATCH];
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BATCH) {
        Py_ssize_t nb = n - b0 < BATCH ? n - b0 : BATCH;
        for (Py_ssize_t j = 0; j < nb; j++) {
            int r = as_key(items[b0 + j], &ks[j]);
            if (r < 0)
                goto fail;
            native[j] = r;
            if (r == 1 && m->mask >= 0)
                __builtin_prefetch(&m->slots[mix(ks[j]) & (uint64_t)m->mask]);
        }
        for (Py_ssize_t j = 0; j < nb; j++) {
            Slot *s = native[j] ? find(m, ks[j]) : NULL;
            vs[j] = s != NULL ? s->v.obj : NULL;
            if (vs[j] != NULL)
                __builtin_prefetch(vs[j]);
        }
        for (Py_ssize_t j = 0; j < nb; j++) {
            PyObject *v = vs[j];
            if (v == NULL && extra_nonempty(m)) {
                v = PyDict_GetItemWithError(m->extra, items[b0 + j]);
                if (v == NULL && PyErr_Occurred())
                    goto fail;
            }
            if (v == NULL)
                goto done;
            PyObject *nxt = PyNumber_And(acc, v);
            if (nxt == NULL)
                goto fail;
            truth = PyObject_IsTrue(nxt);
            if (truth <= 0) {
                Py_DECREF(nxt);
                if (truth < 0)
                    goto fail;
                goto done;
            }
            int bad = PyList_Append(vals, v) < 0 || PyList_Append(pa, nxt) < 0;
            Py_DECREF(acc);
            acc = nxt;
            if (bad)
                goto fail;
        }
    }
done:
    Py_DECREF(acc);
    Py_DECREF(seq);
    acc = NULL;
    /* the OR of the values read: which slots hold some of them on which medium */
    PyObject *any = PyLong_FromLong(0);
    if (any == NULL)
        goto fail_nocheck;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(vals); i++) {
        PyObject *o = PyNumber_Or(any, PyList_GET_ITEM(vals, i));
        Py_DECREF(any);
        any = o;
        if (any == NULL)
            goto fail_nocheck;
    }
    PyObject *out = PyTuple_Pack(3, pa, vals, any);
    Py_DECREF(any);
    Py_DECREF(pa);
    Py_DECREF(vals);
    return out;
fail:
    Py_XDECREF(acc);
    Py_DECREF(seq);
fail_nocheck:
    Py_XDECREF(pa);
    Py_XDECREF(vals);
    return NULL;
}

/* lookup(keys, n, default) -> [get(k, default) for k in keys[:n]], batched and
 * prefetched like prefix (the scorer's sliding-window and mamba groups). */
static PyObject *Map_lookup_many(MapObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "lookup(keys, n, default)");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "keys must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred()) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    if (n > len)
        n = len;
    if (n < 0)
        n = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    uint64_t ks[BATCH];
    int native[BATCH];
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BATCH) {
        Py_ssize_t nb = n - b0 < BATCH ? n - b0 : BATCH;
        for (Py_ssize_t j = 0; j < nb; j++) {
            int r = as_key(items[b0 + j], &ks[j]);
            if (r < 0)
                goto fail;
            native[j] = r;
            if (r == 1 && m->mask >= 0)
                __builtin_prefetch(&m->slots[mix(ks[j]) & (uint64_t)m->mask]);
        }
        for (Py_ssize_t j = 0; j < nb; j++) {
            PyObject *v = NULL;
            Slot *s = native[j] ? find(m, ks[j]) : NULL;
            if (s != NULL)
                v = slot_value(m, s);
            else if (extra_nonempty(m)) {
                v = PyDict_GetItemWithError(m->extra, items[b0 + j]);
                if (v == NULL && PyErr_Occurred())
                    goto fail;
                Py_XINCREF(v);
            }
            if (v == NULL) {
                v = args[2];
                Py_INCREF(v);
            }
            PyList_SET_ITEM(out, b0 + j, v);
        }
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(out);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef Map_methods[] = {
    {"get", (PyCFunction)(void (*)(void))Map_get, METH_FASTCALL, "get(key, default=None)"},
    {"setdefault", (PyCFunction)(void (*)(void))Map_setdefault, METH_FASTCALL,
     "setdefault(key, default=None)"},
    {"pop", (PyCFunction)(void (*)(void))Map_pop, METH_FASTCALL, "pop(key[, default])"},
    {"keys", (PyCFunction)Map_keys, METH_NOARGS, "keys as a list"},
    {"values", (PyCFunction)Map_values, METH_NOARGS, "values as a list"},
    {"items", (PyCFunction)Map_items, METH_NOARGS, "(key, value) pairs as a list"},
    {"clear", (PyCFunction)Map_clear, METH_NOARGS, "remove every entry"},
    {"__sizeof__", (PyCFunction)Map_sizeof, METH_NOARGS, "bytes held"},
    {"prefix", (PyCFunction)(void (*)(void))Map_prefix, METH_FASTCALL,
     "prefix(keys, initial) -> (running ANDs while nonzero, values, OR of values)"},
    {"lookup", (PyCFunction)(void (*)(void))Map_lookup_many, METH_FASTCALL,
     "lookup(keys, n, default) -> values of keys[:n]"},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods Map_as_mapping = {
    (lenfunc)Map_len,
    (binaryfunc)Map_subscript,
    (objobjargproc)Map_ass_subscript,
};

static PySequenceMethods Map_as_sequence = {
    .sq_contains = (objobjproc)Map_contains,
};

static PyTypeObject MapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "router.native._core.U64Map",
    .tp_basicsize = sizeof(MapObject),
    .tp_dealloc = (destructor)Map_dealloc,
    .tp_as_mapping = &Map_as_mapping,
    .tp_as_sequence = &Map_as_sequence,
    .tp_iter = (getiterfunc)Map_iter,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "dict-like map keyed by uint64 (U64Map(u64_values=False))",
    .tp_methods = Map_methods,
    .tp_new = Map_new,
};

#ifdef KVR_XXHASH
/* chain(seed, tokens, block_size, n_blocks) -> list of keys, or None when a token is
 * not an int32 (the caller's slow path handles those blocks). */
static PyObject *chain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "chain(seed, tokens, block_size, n_blocks)");
        return NULL;
    }
    uint64_t seed = PyLong_AsUnsignedLongLong(args[0]);
    if (seed == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t bs = PyLong_AsSsize_t(args[2]);
    Py_ssize_t nb = PyLong_AsSsize_t(args[3]);
    if ((bs == -1 || nb == -1) && PyErr_Occurred())
        return NULL;
    if (bs <= 0 || nb < 0) {
        PyErr_SetString(PyExc_ValueError, "block_size > 0 and n_blocks >= 0");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "tokens must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t nt = nb * bs;
    if (PySequence_Fast_GET_SIZE(seq) < nt) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "fewer tokens than n_blocks * block_size");
        return NULL;
    }
    int32_t stackbuf[8192];
    int32_t *buf = nt <= 8192 ? stackbuf : PyMem_Malloc((size_t)(nt ? nt : 1) * sizeof(int32_t));
    if (buf == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *t = items[i];
        if (!PyLong_Check(t))
            goto slow;
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(t, &overflow);
        if (overflow || v < INT32_MIN || v > INT32_MAX) {
            if (v == -1 && PyErr_Occurred())
                goto end;
            goto slow;
        }
        buf[i] = (int32_t)v;
    }
    out = PyList_New(nb);
    if (out == NULL)
        goto end;
    for (Py_ssize_t b = 0; b < nb; b++) {
        seed = XXH3_64bits_withSeed(buf + b * bs, (size_t)bs * sizeof(int32_t), seed);
        PyObject *k = PyLong_FromUnsignedLongLong(seed);
        if (k == NULL) {
            Py_CLEAR(out);
            goto end;
        }
        PyList_SET_ITEM(out, b, k);
    }
    goto end;
slow:
    out = Py_None;
    Py_INCREF(out);
end:
    if (buf != stackbuf)
        PyMem_Free(buf);
    Py_DECREF(seq);
    return out;
}
#endif

/* Best first among prototypes: score, then hit, descending (1 when a goes before b). */
static int proto_before(PyObject *a, PyObject *b, int *err) {
    double sa = PyFloat_AsDouble(PyTuple_GET_ITEM(a, 2));
    double sb = PyFloat_AsDouble(PyTuple_GET_ITEM(b, 2));
    if (PyErr_Occurred()) {
        *err = 1;
        return 0;
    }
    if (sa != sb)
        return sa > sb;
    int gt = PyObject_RichCompareBool(PyTuple_GET_ITEM(a, 0), PyTuple_GET_ITEM(b, 0), Py_GT);
    if (gt < 0)
        *err = 1;
    return gt > 0;
}

/* rows(row_type, wids, labels, memo, make, ordered) -> (rows, mixed): per worker i, its
 * class key tuple(labels[i]) names a prototype (memo, else make(key), stored in memo):
 * (hit, hit_gpu, score, group_rows); a row is row_type(wid, hit, hit_gpu, score, True,
 * list(group_rows)), or i goes to ``mixed`` when score is None (the caller scores it).
 * ``ordered``: rows come out best first (score, then hit, descending; ties keep the
 * order of ``wids``) -- a counting sort over the few prototypes, not a sort of rows.
 * The per-worker part of router/score/bits.py's cohort_rows, without bytecode. */
static PyObject *rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "rows(row_type, wids, labels, memo, make, ordered)");
        return NULL;
    }
    PyObject *type = args[0], *memo = args[3], *make = args[4];
    int ordered = PyObject_IsTrue(args[5]);
    if (ordered < 0)
        return NULL;
    if (!PyDict_Check(memo)) {
        PyErr_SetString(PyExc_TypeError, "memo must be a dict");
        return NULL;
    }
    PyObject *wids = PySequence_Fast(args[1], "wids must be a sequence");
    if (wids == NULL)
        return NULL;
    PyObject *labels = PySequence_Fast(args[2], "labels must be a sequence");
    if (labels == NULL) {
        Py_DECREF(wids);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(wids);
    PyObject *out = PyList_New(0), *mixed = PyList_New(0), *res = NULL;
    PyObject **protos = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *)); /* distinct, borrowed */
    Py_ssize_t *pidx = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));   /* row -> proto */
    Py_ssize_t *rank = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));   /* proto -> start */
    PyObject *built = PyList_New(0);
    Py_ssize_t np = 0;
    if (out == NULL || mixed == NULL || built == NULL || !protos || !pidx || !rank) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto end;
    }
    if (PySequence_Fast_GET_SIZE(labels) != n) {
        PyErr_SetString(PyExc_ValueError, "wids and labels differ in length");
        goto end;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *lab = PySequence_Fast_GET_ITEM(labels, i);
        PyObject *key = PyList_Check(lab) ? PyList_AsTuple(lab) : PySequence_Tuple(lab);
        if (key == NULL)
            goto end;
        PyObject *proto = PyDict_GetItemWithError(memo, key); /* borrowed */
        if (proto == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(key);
                goto end;
            }
            proto = PyObject_CallOneArg(make, key);
            if (proto == NULL || PyDict_SetItem(memo, key, proto) < 0) {
                Py_XDECREF(proto);
                Py_DECREF(key);
                goto end;
            }
            Py_DECREF(proto); /* the memo holds it */
        }
        Py_DECREF(key);
        if (!PyTuple_Check(proto) || PyTuple_GET_SIZE(proto) != 4) {
            PyErr_SetString(PyExc_TypeError, "a prototype is (hit, hit_gpu, score, rows)");
            goto end;
        }
        PyObject *score = PyTuple_GET_ITEM(proto, 2);
        if (score == Py_None) {
            PyObject *idx = PyLong_FromSsize_t(i);
            if (idx == NULL || PyList_Append(mixed, idx) < 0) {
                Py_XDECREF(idx);
                goto end;
            }
            Py_DECREF(idx);
            continue;
        }
        Py_ssize_t p = 0;
        while (p < np && protos[p] != proto)
            p++;
        if (p == np)
            protos[np++] = proto;
        pidx[PyList_GET_SIZE(built)] = p;
        PyObject *grows = PySequence_List(PyTuple_GET_ITEM(proto, 3));
        if (grows == NULL)
            goto end;
        PyObject *argv[6] = {PySequence_Fast_GET_ITEM(wids, i), PyTuple_GET_ITEM(proto, 0),
                             PyTuple_GET_ITEM(proto, 1), score, Py_True, grows};
        PyObject *row = PyObject_Vectorcall(type, argv, 6, NULL);
        Py_DECREF(grows);
        if (row == NULL)
            goto end;
        int bad = PyList_Append(built, row);
        Py_DECREF(row);
        if (bad < 0)
            goto end;
    }
    Py_ssize_t nb = PyList_GET_SIZE(built);
    if (!ordered || np <= 1) {
        Py_SETREF(out, built);
        built = NULL;
    } else {
        /* order the prototypes (insertion sort: they are few), then place rows */
        Py_ssize_t *order = rank; /* order[r] = proto index at rank r */
        for (Py_ssize_t p = 0; p < np; p++) {
            Py_ssize_t r = p;
            int err = 0;
            while (r > 0 && proto_before(protos[p], protos[order[r - 1]], &err))
                order[r] = order[r - 1], r--;
            if (err)
                goto end;
            order[r] = p;
        }
        Py_ssize_t *count = PyMem_Calloc((size_t)np + 1, sizeof(Py_ssize_t));
        Py_ssize_t *start = PyMem_Calloc((size_t)np + 1, sizeof(Py_ssize_t));
        if (!count || !start) {
            PyMem_Free(count);
            PyMem_Free(start);
            PyErr_NoMemory();
            goto end;
        }
        /* bucket[p]: prototypes equal in (score, hit) share one, so their rows keep
         * the order of ``wids`` among themselves */
        Py_ssize_t *bk = PyMem_Calloc((size_t)np + 1, sizeof(Py_ssize_t));
        if (bk == NULL) {
            PyMem_Free(count);
            PyMem_Free(start);
            PyErr_NoMemory();
            goto end;
        }
        Py_ssize_t nbk = 0;
        for (Py_ssize_t r = 0; r < np; r++) {
            int err = 0;
            if (r > 0 && proto_before(protos[order[r - 1]], protos[order[r]], &err))
                nbk++;
            if (err) {
                PyMem_Free(count);
                PyMem_Free(start);
                PyMem_Free(bk);
                goto end;
            }
            bk[order[r]] = nbk;
        }
        nbk++;
        for (Py_ssize_t i = 0; i < nb; i++)
            count[bk[pidx[i]]]++;
        Py_ssize_t acc = 0;
        for (Py_ssize_t b = 0; b < nbk; b++) {
            start[b] = acc;
            acc += count[b];
        }
        for (Py_ssize_t i = 0; i < nb; i++)
            pidx[i] = bk[pidx[i]];
        PyMem_Free(bk);
        PyObject *sorted = PyList_New(nb);
        if (sorted == NULL) {
            PyMem_Free(count);
            PyMem_Free(start);
            goto end;
        }
        for (Py_ssize_t i = 0; i < nb; i++) {
            PyObject *row = PyList_GET_ITEM(built, i);
            Py_INCREF(row);
            PyList_SET_ITEM(sorted, start[pidx[i]]++, row);
        }
        PyMem_Free(count);
        PyMem_Free(start);
        Py_SETREF(out, sorted);
    }
    res = PyTuple_Pack(2, out, mixed);
end:
    Py_XDECREF(out);
    Py_XDECREF(mixed);
    Py_XDECREF(built);
    PyMem_Free(protos);
    PyMem_Free(pidx);
    PyMem_Free(rank);
    Py_DECREF(wids);
    Py_DECREF(labels);
    return res;
}

/* Little-endian bytes of a non-negative int into buf[n]; -1 when it does not fit. */
static int int_bytes(PyObject *v, unsigned char *buf, Py_ssize_t n) {
#if PY_VERSION_HEX >= 0x030D0000
    Py_ssize_t need = PyLong_AsNativeBytes(
        v, buf, n, Py_ASNATIVEBYTES_LITTLE_ENDIAN | Py_ASNATIVEBYTES_UNSIGNED_BUFFER);
    if (need < 0)
        return -1;
    if (need > n) {
        PyErr_SetString(PyExc_OverflowError, "bitset wider than the slots");
        return -1;
    }
    return 0;
#else
    return _PyLong_AsByteArray((PyLongObject *)v, buf, (size_t)n, 1, 0);
#endif
}

/* labels(attrs, positions, nbytes) -> per position, [its value in each attr]: attrs are
 * {value: bitset} dicts where exactly one bitset has a position's bit set (a slot's
 * class); what router/score/bits.py's _labels computes with numpy. */
static PyObject *labels(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "labels(attrs, positions, nbytes)");
        return NULL;
    }
    PyObject *attrs = PySequence_Fast(args[0], "attrs must be a sequence");
    if (attrs == NULL)
        return NULL;
    PyObject *pos = PySequence_Fast(args[1], "positions must be a sequence");
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[2]);
    PyObject *out = NULL;
    unsigned char *buf = NULL;
    Py_ssize_t *p = NULL;
    if (pos == NULL || (nbytes == -1 && PyErr_Occurred()))
        goto end;
    Py_ssize_t na = PySequence_Fast_GET_SIZE(attrs), np = PySequence_Fast_GET_SIZE(pos);
    buf = PyMem_Malloc((size_t)nbytes + 1);
    p = PyMem_Malloc(((size_t)np + 1) * sizeof(Py_ssize_t));
    if (buf == NULL || p == NULL) {
        PyErr_NoMemory();
        goto end;
    }
    for (Py_ssize_t j = 0; j < np; j++) {
        p[j] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(pos, j));
        if (p[j] < 0 || p[j] >= 8 * nbytes) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "position outside nbytes");
            goto end;
        }
    }
    out = PyList_New(np);
    if (out == NULL)
        goto end;
    for (Py_ssize_t j = 0; j < np; j++) {
        PyObject *row = PyList_New(na);
        if (row == NULL)
            goto fail;
        for (Py_ssize_t a = 0; a < na; a++) {
            Py_INCREF(Py_None);
            PyList_SET_ITEM(row, a, Py_None);
        }
        PyList_SET_ITEM(out, j, row);
    }
    for (Py_ssize_t a = 0; a < na; a++) {
        PyObject *d = PySequence_Fast_GET_ITEM(attrs, a);
        if (!PyDict_Check(d) || PyDict_GET_SIZE(d) == 0) {
            PyErr_SetString(PyExc_TypeError, "an attr is a non-empty dict");
            goto fail;
        }
        Py_ssize_t it = 0;
        PyObject *value, *bits, *first = NULL;
        while (PyDict_Next(d, &it, &value, &bits)) {
            if (first == NULL)
                first = value;
            if (!PyLong_Check(bits)) {
                PyErr_SetString(PyExc_TypeError, "a bitset is an int");
                goto fail;
            }
            memset(buf, 0, (size_t)nbytes);
            if (int_bytes(bits, buf, nbytes) < 0)
                goto fail;
            for (Py_ssize_t j = 0; j < np; j++) {
                if (buf[p[j] >> 3] >> (p[j] & 7) & 1) {
                    PyObject *row = PyList_GET_ITEM(out, j);
                    Py_INCREF(value);
                    PyList_SetItem(row, a, value); /* steals; drops the old item */
                }
            }
        }
        for (Py_ssize_t j = 0; j < np; j++) { /* no class: the first value (numpy's argmax) */
            PyObject *row = PyList_GET_ITEM(out, j);
            if (PyList_GET_ITEM(row, a) == Py_None) {
                Py_INCREF(first);
                PyList_SetItem(row, a, first);
            }
        }
    }
    goto end;
fail:
    Py_CLEAR(out);
end:
    PyMem_Free(buf);
    PyMem_Free(p);
    Py_DECREF(attrs);
    Py_XDECREF(pos);
    return out;
}

/* pack(ints, width) -> bytes: each int's ``width`` little-endian bytes, joined (what
 * b"".join(map(int.to_bytes, ints, repeat(width), repeat("little"))) gives). */
static PyObject *pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "pack(ints, width)");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "ints must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t width = PyLong_AsSsize_t(args[1]);
    if (width < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "width >= 0");
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * width);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *buf = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyLong_Check(v)) {
            PyErr_SetString(PyExc_TypeError, "pack() takes ints");
            goto fail;
        }
        if (width == 0) {
            if (PyObject_IsTrue(v)) {
                PyErr_SetString(PyExc_OverflowError, "int too big to convert");
                goto fail;
            }
            continue;
        }
        if (int_bytes(v, buf + i * width, width) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(out);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL,
     "pack(ints, width) -> their little-endian bytes, joined"},
    {"labels", (PyCFunction)(void (*)(void))labels, METH_FASTCALL,
     "labels(attrs, positions, nbytes) -> per position, its value in each attr"},
    {"rows", (PyCFunction)(void (*)(void))rows, METH_FASTCALL,
     "rows(row_type, wids, labels, memo, make, ordered) -> (rows, mixed indices)"},
#ifdef KVR_XXHASH
    {"chain", (PyCFunction)(void (*)(void))chain, METH_FASTCALL,
     "chain(seed, tokens, block_size, n_blocks) -> keys | None"},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_core", "kvroute's compiled core", -1, module_methods,
};

PyMODINIT_FUNC PyInit__core(void) {
    if (PyType_Ready(&MapType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    Py_INCREF(&MapType);
    if (PyModule_AddObject(m, "U64Map", (PyObject *)&MapType) < 0) {
        Py_DECREF(&MapType);
        Py_DECREF(m);
        return NULL;
    }
#ifdef KVR_XXHASH
    PyModule_AddIntConstant(m, "HAS_XXHASH", 1);
#else
    PyModule_AddIntConstant(m, "HAS_XXHASH", 0);
#endif
    return m;
}
