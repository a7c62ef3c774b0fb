/* rows(): the per-worker part of router/score/bits.py's cohort_rows, without bytecode.
 *
 * In: the cohort's members (ids in id order, their any-medium bit positions) and the
 * rule's answer as ``attrs``: dicts {value: bitset of slots}, where a slot's bit is set
 * in exactly one bitset per attr (its class). Per member, its value in every attr is
 * found by testing its bit; members with equal values share a class, found through a
 * small hash table over the per-attr class indices (exact comparison, no key objects
 * per member). A class's prototype -- (hit, hit_gpu, score, group_rows) -- comes from
 * ``memo`` (keyed by the tuple of values) or ``make``: a callable ``make(key)``, or a
 * spec tuple the prototype is built from in C (proto.c). Out: one row per member,
 * row_type(wid, hit, hit_gpu, score, True, list(group_rows)), best first when
 * ``ordered`` (score, then hit, descending; ties in member order: a counting sort over
 * the classes), and the members whose prototype's score is None (the caller weighs
 * their offloaded blocks) as (index, prototype) pairs -- or, given ``late``, their
 * scores from ``late(pairs)`` (a float each) and every row in one list, best first by
 * (score, hit, member order) when ``ordered``. */
#include "core.h"

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

#include "rows.h"


static void work_free(Work *w) {
    PyMem_Free(w->idx);
    PyMem_Free(w->values);
    PyMem_Free(w->off);
    PyMem_Free(w->cls);
    PyMem_Free(w->protos);
    PyMem_Free(w->member_at);
}

static int same_class(const Work *w, Py_ssize_t i, Py_ssize_t j) {
    for (Py_ssize_t a = 0; a < w->na; a++)
        if (w->idx[a * w->n + i] != w->idx[a * w->n + j])
            return 0;
    return 1;
}

/* Fill w->cls and w->protos: one prototype per distinct class. */
static int find_protos(Work *w, PyObject *memo, PyObject *make, const ProtoSpec *spec) {
    Py_ssize_t cap = 16;
    while (cap < 2 * w->n)
        cap *= 2;
    Py_ssize_t *table = PyMem_Malloc((size_t)cap * sizeof(Py_ssize_t)); /* rep member */
    uint64_t *hashes = PyMem_Malloc(((size_t)w->n + 1) * sizeof(uint64_t));
    if (table == NULL || hashes == NULL) {
        PyMem_Free(table);
        PyMem_Free(hashes);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t t = 0; t < cap; t++)
        table[t] = -1;
    int rc = -1;
    for (Py_ssize_t j = 0; j < w->n; j++) {
        uint64_t h = 0x9e3779b97f4a7c15ULL;
        for (Py_ssize_t a = 0; a < w->na; a++)
            h = kvr_mix(h ^ (uint64_t)w->idx[a * w->n + j]);
        hashes[j] = h;
        Py_ssize_t t = (Py_ssize_t)(h & (uint64_t)(cap - 1));
        while (table[t] >= 0 && !(hashes[table[t]] == h && same_class(w, table[t], j)))
            t = (t + 1) & (cap - 1);
        if (table[t] >= 0) {
            w->cls[j] = w->cls[table[t]];
            continue;
        }
        table[t] = j;
        PyObject *key = PyTuple_New(w->na);
        if (key == NULL)
            goto end;
        for (Py_ssize_t a = 0; a < w->na; a++) {
            PyObject *v = w->values[w->off[a] + w->idx[a * w->n + j]];
            Py_INCREF(v);
            PyTuple_SET_ITEM(key, a, v);
        }
        PyObject *proto = PyDict_GetItemWithError(memo, key); /* borrowed */
        if (proto == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(key);
                goto end;
            }
            proto = spec ? kvr_make_proto(spec, key) : PyObject_CallOneArg(make, key);
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
        w->cls[j] = w->nclasses;
        w->protos[w->nclasses++] = proto;
    }
    rc = 0;
end:
    PyMem_Free(table);
    PyMem_Free(hashes);
    return rc;
}

/* bucket[c]: the rank of class c's (score, hit) among the scored classes, best first;
 * classes equal in both share a bucket. Returns the number of buckets, -1 on error. */
static Py_ssize_t rank_classes(const Work *w, Py_ssize_t *bucket) {
    Py_ssize_t *order = PyMem_Malloc(((size_t)w->nclasses + 1) * sizeof(Py_ssize_t));
    if (order == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t k = 0;
    int err = 0;
    for (Py_ssize_t c = 0; c < w->nclasses; c++) { /* insertion sort: classes are few */
        if (PyTuple_GET_ITEM(w->protos[c], 2) == Py_None)
            continue;
        Py_ssize_t r = k++;
        while (r > 0 && proto_before(w->protos[c], w->protos[order[r - 1]], &err))
            order[r] = order[r - 1], r--;
        order[r] = c;
        if (err)
            break;
    }
    Py_ssize_t nb = 0;
    for (Py_ssize_t r = 0; r < k && !err; r++) {
        if (r > 0 && proto_before(w->protos[order[r - 1]], w->protos[order[r]], &err))
            nb++;
        bucket[order[r]] = nb;
    }
    PyMem_Free(order);
    return err ? -1 : nb + 1;
}

typedef struct {
    double score;
    long long hit;
    Py_ssize_t j;
} RowKey;

/* Best first: score, then hit, descending; then member order (members come by id). */
static int rowkey_cmp(const void *pa, const void *pb) {
    const RowKey *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->hit != b->hit)
        return a->hit > b->hit ? -1 : 1;
    return a->j < b->j ? -1 : a->j > b->j;
}

/* One row: WorkerRow(worker id, hit_tokens, hit_tokens_gpu, score, learned=True, a fresh
 * list of the proto's groups): the Struct's field order (router/score/rows.py) in one place. */
static PyObject *make_row(PyObject *type, PyObject *wid, PyObject *proto, PyObject *score) {
    PyObject *groups = PySequence_List(PyTuple_GET_ITEM(proto, 3));
    if (groups == NULL)
        return NULL;
    PyObject *argv[6] = {wid, PyTuple_GET_ITEM(proto, 0), PyTuple_GET_ITEM(proto, 1),
                         score, Py_True, groups};
    PyObject *row = PyObject_Vectorcall(type, argv, 6, NULL);
    Py_DECREF(groups);
    return row;
}

/* Every member's row, the mixed members' scores from ``late(mixed)`` (one float each,
 * in order), best first when ``ordered`` (scores must not be NaN: the caller checks
 * its weights). */
static PyObject *rows_with_late(const Work *w, PyObject *type, PyObject *wids,
                                PyObject *mixed, PyObject *late, int ordered) {
    PyObject *scores = PyObject_CallOneArg(late, mixed), *sf = NULL, *built = NULL;
    RowKey *keys = NULL;
    if (scores == NULL)
        return NULL;
    sf = PySequence_Fast(scores, "late() returns a sequence");
    Py_DECREF(scores);
    if (sf == NULL)
        return NULL;
    if (PySequence_Fast_GET_SIZE(sf) != PyList_GET_SIZE(mixed)) {
        PyErr_SetString(PyExc_ValueError, "late() returns one score per mixed member");
        goto fail;
    }
    keys = PyMem_Malloc(((size_t)w->n + 1) * sizeof(RowKey));
    built = PyList_New(w->n);
    if (keys == NULL || built == NULL) {
        if (keys == NULL)
            PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t j = 0; j < w->n; j++) {
        PyObject *proto = w->protos[w->cls[j]];
        PyObject *score = PyTuple_GET_ITEM(proto, 2);
        if (score == Py_None)
            score = PySequence_Fast_GET_ITEM(sf, k++);
        keys[j].score = PyFloat_AsDouble(score);
        keys[j].hit = PyLong_AsLongLong(PyTuple_GET_ITEM(proto, 0));
        keys[j].j = j;
        if (PyErr_Occurred())
            goto fail;
        PyObject *row = make_row(type, PySequence_Fast_GET_ITEM(wids, j), proto, score);
        if (row == NULL)
            goto fail;
        PyList_SET_ITEM(built, j, row);
    }
    if (ordered && w->n > 1) {
        qsort(keys, (size_t)w->n, sizeof(RowKey), rowkey_cmp);
        PyObject **items = ((PyListObject *)built)->ob_item, **tmp;
        tmp = PyMem_Malloc((size_t)w->n * sizeof(PyObject *));
        if (tmp == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t r = 0; r < w->n; r++)
            tmp[r] = items[keys[r].j];
        memcpy(items, tmp, (size_t)w->n * sizeof(PyObject *));
        PyMem_Free(tmp);
    }
    PyMem_Free(keys);
    Py_DECREF(sf);
    return built;
fail:
    PyMem_Free(keys);
    Py_XDECREF(built);
    Py_DECREF(sf);
    return NULL;
}

/* rows(row_type, wids, positions, attrs, nbytes, memo, make, ordered[, late])
 *   -> (rows, mixed) */
PyObject *kvr_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 && nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "rows(row_type, wids, positions, attrs, nbytes, "
                                         "memo, make or spec, ordered[, late])");
        return NULL;
    }
    PyObject *type = args[0], *memo = args[5], *make = args[6];
    PyObject *late = nargs == 9 ? args[8] : Py_None;
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[4]);
    int ordered = PyObject_IsTrue(args[7]);
    if ((nbytes == -1 && PyErr_Occurred()) || ordered < 0)
        return NULL;
    if (!PyDict_Check(memo)) {
        PyErr_SetString(PyExc_TypeError, "memo must be a dict");
        return NULL;
    }
    PyObject *wids = PySequence_Fast(args[1], "wids must be a sequence");
    PyObject *posl = wids ? PySequence_Fast(args[2], "positions must be a sequence") : NULL;
    PyObject *attrs = posl ? PySequence_Fast(args[3], "attrs must be a sequence") : NULL;
    PyObject *built = NULL, *mixed = NULL, *res = NULL;
    Py_ssize_t *pos = NULL, *bucket = NULL, *start = NULL;
    Work w = {0};
    if (attrs == NULL)
        goto end;
    w.n = PySequence_Fast_GET_SIZE(wids);
    w.na = PySequence_Fast_GET_SIZE(attrs);
    if (PySequence_Fast_GET_SIZE(posl) != w.n || w.na == 0) {
        PyErr_SetString(PyExc_ValueError, "one position per worker and some attrs");
        goto end;
    }
    size_t n1 = (size_t)w.n + 1;
    pos = PyMem_Malloc(n1 * sizeof(Py_ssize_t));
    w.idx = PyMem_Calloc((size_t)w.na * n1, sizeof(Py_ssize_t));
    w.off = PyMem_Calloc((size_t)w.na + 1, sizeof(Py_ssize_t));
    w.cls = PyMem_Calloc(n1, sizeof(Py_ssize_t));
    w.protos = PyMem_Calloc(n1, sizeof(PyObject *));
    bucket = PyMem_Calloc(n1, sizeof(Py_ssize_t));
    start = PyMem_Calloc(n1, sizeof(Py_ssize_t));
    if (!pos || !w.idx || !w.off || !w.cls || !w.protos || !bucket || !start) {
        PyErr_NoMemory();
        goto end;
    }
    for (Py_ssize_t j = 0; j < w.n; j++) {
        pos[j] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(posl, j));
        if (pos[j] < 0 || pos[j] >= 8 * nbytes) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "position outside nbytes");
            goto end;
        }
    }
    ProtoSpec spec;
    int has_spec = PyTuple_Check(make);
    if (has_spec && kvr_spec_parse(make, &spec) < 0)
        goto end;
    if (kvr_rows_classify(&w, attrs, pos, nbytes) < 0 ||
        find_protos(&w, memo, make, has_spec ? &spec : NULL) < 0)
        goto end;
    Py_ssize_t nb = ordered ? rank_classes(&w, bucket) : 1;
    if (nb < 0)
        goto end;
    mixed = PyList_New(0);
    if (mixed == NULL)
        goto end;
    /* slots of the output: per bucket, its rows in member order */
    Py_ssize_t nrows = 0;
    for (Py_ssize_t j = 0; j < w.n; j++) {
        PyObject *proto = w.protos[w.cls[j]];
        if (PyTuple_GET_ITEM(proto, 2) == Py_None) {
            PyObject *pair = Py_BuildValue("(nO)", j, proto);
            if (pair == NULL || PyList_Append(mixed, pair) < 0) {
                Py_XDECREF(pair);
                goto end;
            }
            Py_DECREF(pair);
            continue;
        }
        start[ordered ? bucket[w.cls[j]] : 0]++;
        nrows++;
    }
    if (late != Py_None && PyList_GET_SIZE(mixed) > 0) { /* scored by late(), all here */
        built = rows_with_late(&w, type, wids, mixed, late, ordered);
        if (built == NULL)
            goto end;
        Py_SETREF(mixed, PyList_New(0));
        if (mixed != NULL)
            res = PyTuple_Pack(2, built, mixed);
        goto end;
    }
    Py_ssize_t acc = 0;
    for (Py_ssize_t b = 0; b < nb; b++) {
        Py_ssize_t c = start[b];
        start[b] = acc;
        acc += c;
    }
    built = PyList_New(nrows);
    if (built == NULL)
        goto end;
    for (Py_ssize_t j = 0; j < w.n; j++) {
        PyObject *proto = w.protos[w.cls[j]];
        PyObject *score = PyTuple_GET_ITEM(proto, 2);
        if (score == Py_None)
            continue;
        PyObject *row = make_row(type, PySequence_Fast_GET_ITEM(wids, j), proto, score);
        if (row == NULL)
            goto end;
        PyList_SET_ITEM(built, start[ordered ? bucket[w.cls[j]] : 0]++, row);
    }
    res = PyTuple_Pack(2, built, mixed);
end:
    Py_XDECREF(built);
    Py_XDECREF(mixed);
    Py_XDECREF(wids);
    Py_XDECREF(posl);
    Py_XDECREF(attrs);
    PyMem_Free(pos);
    PyMem_Free(bucket);
    PyMem_Free(start);
    work_free(&w);
    return res;
}
