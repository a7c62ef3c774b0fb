/* U64Map: a dict-like open-addressing hash map keyed by uint64 (linear probing,
 * backward-shift deletion, 16-byte slots). Values are either Python objects (the
 * memory index's presence bitsets) or uint64 (a worker's engine hash -> block key map,
 * no Python object per entry). Keys the table cannot hold natively (not an int, 0,
 * negative, wider than 64 bits) and, in uint64 mode, entries whose value does not fit,
 * live in a plain dict on the side, so every answer equals a dict's. */
#include "core.h"

#if defined(__linux__) || defined(__APPLE__)
#include <sys/mman.h>
#define KVR_MMAP 1
#endif

/* Slot arrays from 256 KiB on are mapped pages of their own: a grown table's old array
 * goes back to the system at once (from malloc's heap its pages stayed resident:
 * measured as RSS ~1.5x the live bytes), and untouched pages of a fresh array cost
 * nothing. tracemalloc is told about them (PyTraceMalloc_Track), so traced bytes stay
 * complete. */
#define KVR_MMAP_MIN ((size_t)1 << 18)

/* A new array is only ever made by a resize, which spreads the old entries over every
 * page of it at once: its pages are faulted in by the one mmap call (MAP_POPULATE), not
 * one trap per page in the rehash loop (measured: the index's ingest 2.4M -> 2.8M block
 * events/s, benchmarks/dynamo_side_by_side.py at 64 workers). RSS is the same. */
#ifdef MAP_POPULATE
#define KVR_POPULATE MAP_POPULATE
#else
#define KVR_POPULATE 0
#endif

static Slot *slots_alloc(Py_ssize_t cap) {
    size_t bytes = (size_t)cap * sizeof(Slot);
#ifdef KVR_MMAP
    if (bytes >= KVR_MMAP_MIN) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | KVR_POPULATE,
                       -1, 0);
        if (p == MAP_FAILED)
            return NULL;
        (void)PyTraceMalloc_Track(0, (uintptr_t)p, bytes);
        return p;
    }
#endif
    return PyMem_Calloc((size_t)cap, sizeof(Slot));
}

static void slots_free(Slot *p, Py_ssize_t cap) {
    if (p == NULL)
        return;
#ifdef KVR_MMAP
    size_t bytes = (size_t)cap * sizeof(Slot);
    if (bytes >= KVR_MMAP_MIN) {
        (void)PyTraceMalloc_Untrack(0, (uintptr_t)p);
        munmap(p, bytes);
        return;
    }
#endif
    PyMem_Free(p);
}

/* 1: *out holds the native key; 0: the key belongs in the side dict; -1: error. */
int kvr_as_key(PyObject *o, uint64_t *out) {
    uint64_t v;
    int fast = kvr_u64_digits(o, &v);
    if (fast >= 0) {
        if (fast == 0 || v == 0)
            return 0;
        *out = v;
        return 1;
    }
    if (!PyLong_Check(o))
        return 0;
    v = PyLong_AsUnsignedLongLong(o);
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
    uint64_t v;
    int fast = kvr_u64_digits(o, &v);
    if (fast >= 0) {
        if (fast == 1)
            *out = v;
        return fast;
    }
    if (!PyLong_Check(o))
        return 0;
    v = PyLong_AsUnsignedLongLong(o);
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

Slot *kvr_find(MapObject *m, uint64_t k) {
    if (m->mask < 0)
        return NULL;
    Py_ssize_t i = (Py_ssize_t)(kvr_mix(k) & (uint64_t)m->mask);
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
    Slot *n = slots_alloc(cap);
    if (n == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    m->slots = n;
    m->mask = cap - 1;
    for (Py_ssize_t j = 0; j < oldcap; j++) {
        if (old[j].key == 0)
            continue;
        Py_ssize_t i = (Py_ssize_t)(kvr_mix(old[j].key) & (uint64_t)m->mask);
        while (n[i].key != 0)
            i = (i + 1) & m->mask;
        n[i] = old[j];
    }
    slots_free(old, oldcap);
    return 0;
}

/* The slot for k, inserted empty-valued (*fresh = 1) when absent. */
Slot *kvr_insert_slot(MapObject *m, uint64_t k, int *fresh) {
    Slot *s = NULL;
    *fresh = 0;
    if (m->mask >= 0) { /* one probe: k's slot, else the empty slot ending its run */
        Py_ssize_t i = (Py_ssize_t)(kvr_mix(k) & (uint64_t)m->mask);
        while (m->slots[i].key != 0 && m->slots[i].key != k)
            i = (i + 1) & m->mask;
        s = &m->slots[i];
        if (s->key == k)
            return s;
    }
    if ((m->used + 1) * 4 > (m->mask + 1) * 3) { /* load factor 0.75 */
        if (resize(m, m->mask < 0 ? 8 : 2 * (m->mask + 1)) < 0)
            return NULL;
        Py_ssize_t i = (Py_ssize_t)(kvr_mix(k) & (uint64_t)m->mask);
        while (m->slots[i].key != 0)
            i = (i + 1) & m->mask;
        s = &m->slots[i];
    }
    s->key = k;
    s->v.u = 0;
    m->used++;
    *fresh = 1;
    return s;
}

void kvr_erase_slot(MapObject *m, Slot *s) {
    Py_ssize_t i = s - m->slots;
    /* dropped last, once the table is consistent again (a finalizer may run) */
    PyObject *gone = m->u64vals ? NULL : s->v.obj;
    m->used--;
    Py_ssize_t j = i;
    for (;;) { /* backward-shift deletion keeps probe chains intact */
        j = (j + 1) & m->mask;
        uint64_t kj = m->slots[j].key;
        if (kj == 0)
            break;
        Py_ssize_t home = (Py_ssize_t)(kvr_mix(kj) & (uint64_t)m->mask);
        /* move j into i when its home is not cyclically within (i, j] */
        if (((j - home) & m->mask) >= ((j - i) & m->mask)) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].key = 0;
    m->slots[i].v.u = 0;
    Py_XDECREF(gone);
}

PyObject *kvr_slot_value(MapObject *m, Slot *s) {
    if (m->u64vals)
        return PyLong_FromUnsignedLongLong(s->v.u);
    Py_INCREF(s->v.obj);
    return s->v.obj;
}

int kvr_extra_nonempty(MapObject *m) { return m->extra != NULL && PyDict_GET_SIZE(m->extra) > 0; }

/* New reference to the value, NULL without error when absent. */
PyObject *kvr_map_lookup(MapObject *m, PyObject *key) {
    uint64_t k;
    int r = kvr_as_key(key, &k);
    if (r < 0)
        return NULL;
    if (r == 1) {
        Slot *s = kvr_find(m, k);
        if (s != NULL)
            return kvr_slot_value(m, s);
    }
    if (kvr_extra_nonempty(m)) {
        PyObject *v = PyDict_GetItemWithError(m->extra, key);
        Py_XINCREF(v);
        return v;
    }
    return NULL;
}

static int extra_del(MapObject *m, PyObject *key) {
    if (!kvr_extra_nonempty(m))
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

int kvr_map_store(MapObject *m, PyObject *key, PyObject *value) {
    uint64_t k, u = 0;
    int r = kvr_as_key(key, &k);
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
        Slot *s = kvr_insert_slot(m, k, &fresh);
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
        Slot *s = kvr_find(m, k);
        if (s != NULL)
            kvr_erase_slot(m, s);
    }
    return extra_set(m, key, value);
}

/* 0 deleted, 1 absent, -1 error */
int kvr_map_remove(MapObject *m, PyObject *key) {
    uint64_t k;
    int r = kvr_as_key(key, &k);
    if (r < 0)
        return -1;
    if (r == 1) {
        Slot *s = kvr_find(m, k);
        if (s != NULL) {
            kvr_erase_slot(m, s);
            return 0;
        }
    }
    int e = extra_del(m, key);
    return e < 0 ? -1 : e == 1 ? 0 : 1;
}

void kvr_map_clear_all(MapObject *m) {
    /* detach first: values are dropped once the map is empty (a finalizer may run) */
    Slot *slots = m->slots;
    Py_ssize_t cap = m->mask + 1;
    PyObject *extra = m->extra;
    m->slots = NULL;
    m->mask = -1;
    m->used = 0;
    m->extra = NULL;
    if (slots != NULL) {
        if (!m->u64vals)
            for (Py_ssize_t j = 0; j < cap; j++)
                if (slots[j].key != 0)
                    Py_DECREF(slots[j].v.obj);
        slots_free(slots, cap);
    }
    Py_XDECREF(extra);
}

/* New reference to m[key], stored as ``value`` first when absent. */
PyObject *kvr_map_setdefault(MapObject *m, PyObject *key, PyObject *value) {
    PyObject *v = kvr_map_lookup(m, key);
    if (v != NULL || PyErr_Occurred())
        return v;
    if (kvr_map_store(m, key, value) < 0)
        return NULL;
    return kvr_map_lookup(m, key);
}
