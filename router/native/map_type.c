/* U64Map's Python face: the dict-like methods and the type object (map.c holds the
 * table itself). */
#include "core.h"

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
    kvr_map_clear_all(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t Map_len(MapObject *m) {
    return m->used + (m->extra != NULL ? PyDict_GET_SIZE(m->extra) : 0);
}

static PyObject *Map_subscript(MapObject *m, PyObject *key) {
    PyObject *v = kvr_map_lookup(m, key);
    if (v == NULL && !PyErr_Occurred())
        PyErr_SetObject(PyExc_KeyError, key);
    return v;
}

static int Map_ass_subscript(MapObject *m, PyObject *key, PyObject *value) {
    if (value != NULL)
        return kvr_map_store(m, key, value);
    int r = kvr_map_remove(m, key);
    if (r == 1) {
        PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    return r;
}

static int Map_contains(MapObject *m, PyObject *key) {
    PyObject *v = kvr_map_lookup(m, key);
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
    PyObject *v = kvr_map_lookup(m, args[0]);
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
    PyObject *v = kvr_map_lookup(m, args[0]);
    if (v != NULL || PyErr_Occurred())
        return v;
    PyObject *d = nargs == 2 ? args[1] : Py_None;
    if (kvr_map_store(m, args[0], d) < 0)
        return NULL;
    Py_INCREF(d);
    return d;
}

static PyObject *Map_pop(MapObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(key[, default])");
        return NULL;
    }
    PyObject *v = kvr_map_lookup(m, args[0]);
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
    if (kvr_map_remove(m, args[0]) < 0) {
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
            item = kvr_slot_value(m, s);
        } else {
            PyObject *k = PyLong_FromUnsignedLongLong(s->key);
            PyObject *v = k ? kvr_slot_value(m, s) : NULL;
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
    if (kvr_extra_nonempty(m)) {
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
    kvr_map_clear_all(m);
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
    {"prefix", (PyCFunction)(void (*)(void))kvr_map_prefix, METH_FASTCALL,
     "prefix(keys, initial) -> (prefix classes, values, OR of values)"},
    {"store", (PyCFunction)(void (*)(void))kvr_map_store_blocks, METH_FASTCALL,
     "store(emap, hashes, keys, pos, field_pos, bits, solo) -> (new, fresh, repeated)"},
    {"remove", (PyCFunction)(void (*)(void))kvr_map_remove_blocks, METH_FASTCALL,
     "remove(emap, hashes, pos, field_pos, b, anyb, siblings) -> (removed, fresh, gone) | None"},
    {"lookup", (PyCFunction)(void (*)(void))kvr_map_lookup_many, METH_FASTCALL,
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

PyTypeObject KvrMapType = {
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

