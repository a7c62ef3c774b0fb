/* U64Map.remove(): MemoryIndex.apply's loop over a RemoveOp's blocks (router/index/
 * memory.py), one C call per op, for a worker with no extra copies. */
#include "core.h"
#include "memo.h"

/* Whether a sibling table (the worker's other groups of the block size) holds key k
 * on any of bits pos..pos+3: a U64Map or a dict. -1 on error. */
static int sibling_holds(PyObject *sib, uint64_t k, PyObject *ko, Py_ssize_t pos) {
    PyObject *v;
    if (Py_TYPE(sib) == &KvrMapType) {
        MapObject *sm = (MapObject *)sib;
        if (sm->u64vals)
            return 0;
        if (!kvr_extra_nonempty(sm)) {
            Slot *s = kvr_find(sm, k);
            v = s == NULL ? NULL : s->v.obj;
            Py_XINCREF(v);
        } else {
            v = kvr_map_lookup(sm, ko);
        }
    } else if (PyDict_CheckExact(sib)) {
        v = PyDict_GetItemWithError(sib, ko);
        Py_XINCREF(v);
    } else {
        PyErr_SetString(PyExc_TypeError, "sibling tables are U64Maps or dicts");
        return -1;
    }
    if (v == NULL)
        return PyErr_Occurred() ? -1 : 0;
    int any = 0;
    for (Py_ssize_t b = 0; b < 4 && any == 0; b++)
        any = kvr_bit_set(v, pos + b);
    Py_DECREF(v);
    return any;
}

/* remove(emap, hashes, pos, field_pos, b, anyb, siblings) -> (removed, fresh, gone) |
 * None: MemoryIndex.apply's RemoveOp loop for a worker with no extra copies (the caller
 * keeps the general loop for those). ``b`` is bit field_pos, ``anyb`` bit pos. Per hash
 * held on bit field_pos: clear it (and bit pos when no medium bit pos+1..pos+3 is left;
 * the entry goes when nothing is left); when the worker holds the key on no medium
 * (``fresh``) and no sibling table holds it either, the engine hash leaves ``emap`` and
 * (hash, key) goes to ``gone`` (the caller's ghost mappings). None, with nothing
 * changed, when a map holds entries on the side or a hash is not a plain uint64 (the
 * caller runs the Python loop). */
PyObject *kvr_map_remove_blocks(MapObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "remove(emap, hashes, pos, field_pos, b, anyb, siblings)");
        return NULL;
    }
    PyObject *emap = args[0], *bit = args[4], *anybit = args[5];
    Py_ssize_t pos = PyLong_AsSsize_t(args[2]), fpos = PyLong_AsSsize_t(args[3]);
    if ((pos == -1 || fpos == -1) && PyErr_Occurred())
        return NULL;
    if (m->u64vals || Py_TYPE(emap) != &KvrMapType || !((MapObject *)emap)->u64vals ||
        kvr_extra_nonempty(m) || kvr_extra_nonempty((MapObject *)emap))
        Py_RETURN_NONE;
    MapObject *em = (MapObject *)emap;
    PyObject *hs = PySequence_Fast(args[1], "hashes must be a sequence");
    PyObject *sibs = hs ? PySequence_Fast(args[6], "siblings must be a sequence") : NULL;
    PyObject *gone = NULL, *res = NULL;
    Memo mm = {NULL, NULL};
    if (sibs == NULL)
        goto end;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(hs), nsib = PySequence_Fast_GET_SIZE(sibs);
    uint64_t h;
    for (Py_ssize_t i = 0; i < n; i++) {
        int r = kvr_as_key(PySequence_Fast_GET_ITEM(hs, i), &h);
        if (r < 0)
            goto end;
        if (r == 0) {
            Py_INCREF(Py_None);
            res = Py_None;
            goto end;
        }
    }
    gone = PyList_New(0);
    if (gone == NULL)
        goto end;
    Py_ssize_t removed = 0, fresh = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ho = PySequence_Fast_GET_ITEM(hs, i);
        (void)kvr_as_key(ho, &h);
        Slot *es = kvr_find(em, h);
        uint64_t k = es == NULL ? 0 : es->v.u;
        Slot *s = k == 0 ? NULL : kvr_find(m, k); /* key 0 would be on the side: absent */
        if (s == NULL)
            continue;
        PyObject *v = s->v.obj;
        int held = kvr_bit_set(v, fpos);
        if (held <= 0) {
            if (held < 0)
                goto end;
            continue;
        }
        removed++;
        PyObject *nv = memo_get(&mm, v);
        int media = 0;
        if (nv == NULL) {
            nv = PyNumber_Xor(v, bit);
            if (nv == NULL)
                goto end;
            for (Py_ssize_t b = 1; b < 4 && media == 0; b++)
                media = kvr_bit_set(nv, pos + b);
            if (media == 0) { /* no medium left: not held at all */
                PyObject *nv2 = PyNumber_Xor(nv, anybit);
                Py_DECREF(nv);
                nv = nv2;
            }
            if (media < 0 || nv == NULL) {
                Py_XDECREF(nv);
                goto end;
            }
            memo_put(&mm, v, nv);
        } else { /* bits pos+1..pos+3 are as the first computation left them */
            for (Py_ssize_t b = 1; b < 4 && media == 0; b++)
                media = kvr_bit_set(nv, pos + b);
            if (media < 0) {
                Py_DECREF(nv);
                goto end;
            }
        }
        int truth = PyObject_IsTrue(nv);
        if (truth < 0) {
            Py_DECREF(nv);
            goto end;
        }
        int own = media ? 1 : truth ? kvr_bit_set(nv, pos) : 0; /* any of bits pos..pos+3 */
        if (own < 0) {
            Py_DECREF(nv);
            goto end;
        }
        s = kvr_find(m, k); /* nothing above changed the table */
        if (truth) {
            PyObject *old = s->v.obj;
            s->v.obj = nv;
            Py_DECREF(old);
        } else {
            Py_DECREF(nv);
            kvr_erase_slot(m, s);
        }
        if (own) /* still held on another medium */
            continue;
        fresh++;
        PyObject *ko = PyLong_FromUnsignedLongLong(k);
        if (ko == NULL)
            goto end;
        int kept = 0;
        for (Py_ssize_t j = 0; j < nsib && kept == 0; j++)
            kept = sibling_holds(PySequence_Fast_GET_ITEM(sibs, j), k, ko, pos);
        if (kept == 0) {
            es = kvr_find(em, h);
            if (es != NULL)
                kvr_erase_slot(em, es);
            PyObject *pair = PyTuple_Pack(2, ho, ko);
            kept = pair == NULL || PyList_Append(gone, pair) < 0 ? -1 : 0;
            Py_XDECREF(pair);
        }
        Py_DECREF(ko);
        if (kept < 0)
            goto end;
    }
    res = Py_BuildValue("(nnO)", removed, fresh, gone);
end:
    memo_clear(&mm);
    Py_XDECREF(gone);
    Py_XDECREF(hs);
    Py_XDECREF(sibs);
    return res;
}
