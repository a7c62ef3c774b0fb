/* U64Map's batched scans for the scorer (router/score/bits.py): a batch's slots are
 * prefetched, then its values, so the cache misses of a batch overlap (measured: 512
 * lookups in 27 us instead of 65-75 us one by one). */
#include "core.h"

#define BATCH 32

/* 1 when acc & v == acc (v holds every bit of acc): the running AND stays the same
 * object, with no new int (the common case along a shared prefix); 0 otherwise or
 * when the digits cannot be read. */
static inline int covers(PyObject *v, PyObject *acc) {
    const digit *a, *b;
    Py_ssize_t na, nb;
    if (!digits_of(acc, &a, &na) || !digits_of(v, &b, &nb))
        return 0;
    for (Py_ssize_t i = 0; i < na; i++)
        if (a[i] & ~(i < nb ? b[i] : 0))
            return 0;
    return 1;
}

/* Record a change of the running AND at depth i: classes[i] = before ^ after. */
static int record(PyObject *classes, Py_ssize_t i, PyObject *before, PyObject *after) {
    PyObject *x = PyNumber_Xor(before, after);
    PyObject *k = x ? PyLong_FromSsize_t(i) : NULL;
    int rc = k ? PyDict_SetItem(classes, k, x) : -1;
    Py_XDECREF(x);
    Py_XDECREF(k);
    return rc;
}

/* prefix(keys, initial) -> (classes, vals, any): the running AND of ``initial`` with the
 * values of keys[0], keys[1], ... while nonzero (stopping at the first zero or absent
 * key), as router/score/bits.py's prefix_classes gives it: {depth: the bits whose
 * prefix is exactly ``depth`` keys}, ascending, the deepest last; vals = the values of
 * the keys the AND went through; any = their OR. Object-valued maps only. Keys are
 * looked up a batch at a time: the batch's slots are prefetched, then its values, so
 * the cache misses of a batch overlap. */
PyObject *kvr_map_prefix(MapObject *m, PyObject *const *args, Py_ssize_t nargs) {
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
    PyObject *classes = PyDict_New(), *vals = PyList_New(0), *any = PyLong_FromLong(0);
    PyObject *acc = args[1], *prev = NULL;
    Py_INCREF(acc);
    Py_ssize_t depth = 0;
    if (classes == NULL || vals == NULL || any == NULL)
        goto fail;
    int truth = PyObject_IsTrue(acc);
    if (truth < 0)
        goto fail;
    if (!truth)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint64_t ks[BATCH];
    int native[BATCH];
    PyObject *vs[BATCH];
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BATCH) {
        Py_ssize_t nb = n - b0 < BATCH ? n - b0 : BATCH;
        for (Py_ssize_t j = 0; j < nb; j++) {
            int r = kvr_as_key(items[b0 + j], &ks[j]);
            if (r < 0)
                goto fail;
            native[j] = r;
            if (r == 1 && m->mask >= 0)
                __builtin_prefetch(&m->slots[kvr_mix(ks[j]) & (uint64_t)m->mask]);
        }
        for (Py_ssize_t j = 0; j < nb; j++) {
            Slot *s = native[j] ? kvr_find(m, ks[j]) : NULL;
            vs[j] = s != NULL ? s->v.obj : NULL;
            if (vs[j] != NULL)
                __builtin_prefetch(vs[j]);
        }
        for (Py_ssize_t j = 0; j < nb; j++) {
            PyObject *v = vs[j];
            if (v == NULL && kvr_extra_nonempty(m)) {
                v = PyDict_GetItemWithError(m->extra, items[b0 + j]);
                if (v == NULL && PyErr_Occurred())
                    goto fail;
            }
            if (v == NULL)
                goto done;
            int same = covers(v, acc);
            PyObject *nxt = acc;
            Py_INCREF(nxt);
            if (!same) {
                Py_SETREF(nxt, PyNumber_And(acc, v));
                if (nxt == NULL)
                    goto fail;
                truth = PyObject_IsTrue(nxt);
                if (truth <= 0) {
                    Py_DECREF(nxt);
                    if (truth < 0)
                        goto fail;
                    goto done;
                }
                same = PyObject_RichCompareBool(nxt, acc, Py_EQ);
            }
            if (same < 0 || (!same && record(classes, depth, acc, nxt) < 0)) {
                Py_DECREF(nxt);
                goto fail;
            }
            if (PyList_Append(vals, v) < 0) {
                Py_DECREF(nxt);
                goto fail;
            }
            /* OR each distinct run of values once (neighbours often hold alike) */
            int dup = prev == v ? 1 : prev == NULL ? 0 : PyObject_RichCompareBool(prev, v, Py_EQ);
            if (dup < 0) {
                Py_DECREF(nxt);
                goto fail;
            }
            if (!dup) {
                PyObject *o = PyNumber_Or(any, v);
                if (o == NULL) {
                    Py_DECREF(nxt);
                    goto fail;
                }
                Py_SETREF(any, o);
            }
            prev = v; /* borrowed: vals holds it */
            depth++;
            if (same) {
                Py_DECREF(nxt);
            } else {
                Py_SETREF(acc, nxt);
            }
        }
    }
done:
    if (PyObject_IsTrue(acc)) {
        PyObject *k = PyLong_FromSsize_t(depth);
        if (k == NULL || PyDict_SetItem(classes, k, acc) < 0) {
            Py_XDECREF(k);
            goto fail;
        }
        Py_DECREF(k);
    }
    Py_DECREF(acc);
    Py_DECREF(seq);
    PyObject *out = PyTuple_Pack(3, classes, vals, any);
    Py_DECREF(classes);
    Py_DECREF(vals);
    Py_DECREF(any);
    return out;
fail:
    Py_XDECREF(acc);
    Py_DECREF(seq);
    Py_XDECREF(classes);
    Py_XDECREF(vals);
    Py_XDECREF(any);
    return NULL;
}

/* lookup(keys, n, default) -> [get(k, default) for k in keys[:n]], batched and
 * prefetched like prefix (the scorer's sliding-window and mamba groups). */
PyObject *kvr_map_lookup_many(MapObject *m, PyObject *const *args, Py_ssize_t nargs) {
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
            int r = kvr_as_key(items[b0 + j], &ks[j]);
            if (r < 0)
                goto fail;
            native[j] = r;
            if (r == 1 && m->mask >= 0)
                __builtin_prefetch(&m->slots[kvr_mix(ks[j]) & (uint64_t)m->mask]);
        }
        for (Py_ssize_t j = 0; j < nb; j++) {
            PyObject *v = NULL;
            Slot *s = native[j] ? kvr_find(m, ks[j]) : NULL;
            if (s != NULL)
                v = kvr_slot_value(m, s);
            else if (kvr_extra_nonempty(m)) {
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

