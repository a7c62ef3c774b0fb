/* U64Map.store(): MemoryIndex.apply's loop over a StoreOp's blocks (router/index/
 * memory.py), one C call per op: map each engine hash to its block key in the
 * worker's engine-hash map (setdefault), then set the worker's medium bit and
 * any-medium bit in the key's presence bitset; a block whose bit was already set is
 * another physical copy (returned, the caller counts copies). */
#include "core.h"
#include "memo.h"

/* Whether bit p of a non-negative int is set (digits read in place when possible). */
int kvr_bit_set(PyObject *v, Py_ssize_t p) {
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

/* v | bits, shared with the op's last block that had the same v. */
static PyObject *or_shared(Memo *mm, PyObject *v, PyObject *bits) {
    PyObject *nv = memo_get(mm, v);
    if (nv == NULL) {
        nv = PyNumber_Or(v, bits);
        if (nv != NULL)
            memo_put(mm, v, nv);
    }
    return nv;
}

/* How far ahead the store loop prefetches: the slots of both maps for a block are
 * read a few blocks before its turn, so the tables' cache misses overlap. */
#define PREFETCH 6

static inline void prefetch_at(MapObject *m, PyObject *o) {
    uint64_t k;
    if (m->mask < 0 || kvr_u64_digits(o, &k) != 1)
        return; /* not a plain uint64: the general path handles it in turn */
    __builtin_prefetch(&m->slots[kvr_mix(k) & (uint64_t)m->mask]);
}

static inline void prefetch_block(MapObject *m, MapObject *em, PyObject *h, PyObject *k) {
    prefetch_at(em, h);
    prefetch_at(m, k);
}

/* One block on uint64 slots alone (both maps native, neither holding entries on the
 * side, the hash and key plain uint64s): one probe per map, no int made for the key.
 * -1 error; 0 not taken (the caller runs the general path, which is idempotent for
 * the engine-hash map's part); 1 a repeated copy; 2 stored; 3 stored, first medium. */
static int fast_block(MapObject *m, MapObject *em, PyObject *ho, PyObject *ko, Py_ssize_t pos,
                      Py_ssize_t fpos, PyObject *bits, PyObject *solo, PyObject *repeated,
                      Memo *mm) {
    uint64_t h, k;
    if (kvr_extra_nonempty(m) || kvr_extra_nonempty(em))
        return 0;
    int r = kvr_as_key(ho, &h);
    if (r != 1)
        return r;
    r = kvr_as_key(ko, &k);
    if (r != 1)
        return r;
    int fresh;
    Slot *es = kvr_find(em, h);
    if (es == NULL) {
        es = kvr_insert_slot(em, h, &fresh);
        if (es == NULL)
            return -1;
        es->v.u = k;
    }
    k = es->v.u;
    if (k == 0) /* a key the table keeps on the side */
        return 0;
    Slot *s = kvr_insert_slot(m, k, &fresh);
    if (s == NULL)
        return -1;
    if (fresh) {
        Py_INCREF(solo);
        s->v.obj = solo;
        return 3;
    }
    PyObject *v = s->v.obj;
    Py_INCREF(v);
    int held = kvr_bit_set(v, fpos);
    int any = 0;
    for (Py_ssize_t b = 0; held == 0 && b < 4 && !any; b++)
        any = kvr_bit_set(v, pos + b);
    if (held < 0 || any < 0) {
        Py_DECREF(v);
        return -1;
    }
    if (held) {
        Py_DECREF(v);
        PyObject *ko2 = PyLong_FromUnsignedLongLong(k);
        int bad = ko2 == NULL || PyList_Append(repeated, ko2) < 0;
        Py_XDECREF(ko2);
        return bad ? -1 : 1;
    }
    int truth = PyObject_IsTrue(v);
    PyObject *nv = truth > 0 ? or_shared(mm, v, bits) : truth == 0 ? (Py_INCREF(solo), solo) : NULL;
    Py_DECREF(v);
    if (nv == NULL)
        return -1;
    s = kvr_find(m, k); /* still there: nothing above resizes the table */
    PyObject *old = s->v.obj;
    s->v.obj = nv;
    Py_DECREF(old);
    return any ? 2 : 3;
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
    Memo mm = {NULL, NULL};
    if (repeated == NULL)
        goto end;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(hs);
    if (PySequence_Fast_GET_SIZE(ks) != n) {
        PyErr_SetString(PyExc_ValueError, "as many keys as hashes");
        goto end;
    }
    Py_ssize_t added = 0, fresh = 0;
    MapObject *em = Py_TYPE(emap) == &KvrMapType && ((MapObject *)emap)->u64vals
                        ? (MapObject *)emap
                        : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (em != NULL && i + PREFETCH < n) /* the slots of a block a few ahead */
            prefetch_block(m, em, PySequence_Fast_GET_ITEM(hs, i + PREFETCH),
                           PySequence_Fast_GET_ITEM(ks, i + PREFETCH));
        if (em != NULL) {
            int r = fast_block(m, em, PySequence_Fast_GET_ITEM(hs, i),
                               PySequence_Fast_GET_ITEM(ks, i), pos, fpos, bits, solo, repeated,
                               &mm);
            if (r < 0)
                goto end;
            if (r > 0) {
                added += r == 2 || r == 3;
                fresh += r == 3;
                continue;
            }
        }
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
        int held = v == NULL ? 0 : kvr_bit_set(v, fpos);
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
                any = kvr_bit_set(v, pos + b);
                if (any < 0) {
                    Py_DECREF(v);
                    Py_DECREF(k);
                    goto end;
                }
            }
        }
        fresh += !any;
        int truth = v == NULL ? 0 : PyObject_IsTrue(v);
        PyObject *nv = truth > 0 ? or_shared(&mm, v, bits) : truth == 0 ? (Py_INCREF(solo), solo) : NULL;
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
    memo_clear(&mm);
    Py_XDECREF(repeated);
    Py_XDECREF(hs);
    Py_XDECREF(ks);
    return res;
}
