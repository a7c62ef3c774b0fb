/* U64Map.store(): MemoryIndex.apply's loop over a StoreOp's blocks (router/index/
 * memory.py), one C call per op: map each engine hash to its block key in the
 * worker's engine-hash map (setdefault), then set the worker's medium bit and
 * any-medium bit in the key's presence bitset; a block whose bit was already set is
 * another physical copy (returned, the caller counts copies). */
#include "core.h"

/* Whether bit p of a non-negative int is set (digits read in place when possible). */
static int bit_set(PyObject *v, Py_ssize_t p) {
    const digit *d;
    Py_ssize_t n;
    if (digits_of(v, &d, &n)) {
        Py_ssize_t i = p / PyLong_SHIFT;
        return i < n && (d[i] >> (p % PyLong_SHIFT)) & 1;
    }
    PyObject *one = PyLong_FromLong(1), *sh = one ? PyLong_FromSsize_t(p) : NULL;
    PyObject *b = sh ? PyNumber_Lshift(one, sh) : NULL;
    PyObject *x = b ? PyNumber_And(v, b) : NULL;
    int r = x ? PyObject_IsTrue(x) : -1;
    Py_XDECREF(one);
    Py_XDECREF(sh);
    Py_XDECREF(b);
    Py_XDECREF(x);
    return r;
}

static PyObject *emap_setdefault(PyObject *emap, PyObject *h, PyObject *k) {
    if (Py_TYPE(emap) == &KvrMapType) /* uint64 values: the key comes back as an int */
        return kvr_map_setdefault((MapObject *)emap, h, k);
    if (PyDict_CheckExact(emap)) {
        PyObject *got = PyDict_SetDefault(emap, h, k); /* borrowed */
        Py_XINCREF(got);
        return got;
    }
    return PyObject_CallMethod(emap, "setdefault", "OO", h, k);
}

/* store(emap, hashes, keys, pos, field_pos, bits, solo) -> (new, fresh, repeated):
 * per block, k = emap.setdefault(hash, key); v = self.get(k, 0); when bit field_pos
 * of v is clear: self[k] = v | bits if v else solo (new += 1; fresh += 1 when none of
 * bits pos..pos+3 was set), else k goes to ``repeated``. */
PyObject *kvr_map_store_blocks(MapObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "store(emap, hashes, keys, pos, field_pos, bits, solo)");
        return NULL;
    }
    if (m->u64vals) {
        PyErr_SetString(PyExc_TypeError, "store() needs an object-valued map");
        return NULL;
    }
    PyObject *emap = args[0], *bits = args[5], *solo = args[6];
    Py_ssize_t pos = PyLong_AsSsize_t(args[3]), fpos = PyLong_AsSsize_t(args[4]);
    if ((pos == -1 || fpos == -1) && PyErr_Occurred())
        return NULL;
    PyObject *hs = PySequence_Fast(args[1], "hashes must be a sequence");
    PyObject *ks = hs ? PySequence_Fast(args[2], "keys must be a sequence") : NULL;
    PyObject *repeated = ks ? PyList_New(0) : NULL, *res = NULL;
    if (repeated == NULL)
        goto end;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(hs);
    if (PySequence_Fast_GET_SIZE(ks) != n) {
        PyErr_SetString(PyExc_ValueError, "as many keys as hashes");
        goto end;
    }
    Py_ssize_t added = 0, fresh = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = emap_setdefault(emap, PySequence_Fast_GET_ITEM(hs, i),
                                      PySequence_Fast_GET_ITEM(ks, i));
        if (k == NULL)
            goto end;
        PyObject *v = PyObject_GetItem((PyObject *)m, k);
        if (v == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
                Py_DECREF(k);
                goto end;
            }
            PyErr_Clear();
        }
        int held = v == NULL ? 0 : bit_set(v, fpos);
        if (held < 0) {
            Py_XDECREF(v);
            Py_DECREF(k);
            goto end;
        }
        if (held) {
            int bad = PyList_Append(repeated, k);
            Py_XDECREF(v);
            Py_DECREF(k);
            if (bad < 0)
                goto end;
            continue;
        }
        int any = 0;
        if (v != NULL) {
            for (Py_ssize_t b = 0; b < 4 && !any; b++) {
                any = bit_set(v, pos + b);
                if (any < 0) {
                    Py_DECREF(v);
                    Py_DECREF(k);
                    goto end;
                }
            }
        }
        fresh += !any;
        int truth = v == NULL ? 0 : PyObject_IsTrue(v);
        PyObject *nv = truth > 0 ? PyNumber_Or(v, bits) : truth == 0 ? (Py_INCREF(solo), solo) : NULL;
        Py_XDECREF(v);
        int bad = nv == NULL || PyObject_SetItem((PyObject *)m, k, nv) < 0;
        Py_XDECREF(nv);
        Py_DECREF(k);
        if (bad)
            goto end;
        added++;
    }
    res = Py_BuildValue("(nnO)", added, fresh, repeated);
end:
    Py_XDECREF(repeated);
    Py_XDECREF(hs);
    Py_XDECREF(ks);
    return res;
}
