/* A class's prototype for rows() (rows.c) without bytecode: what
 * router/score/bits.py's ``make`` returns, from a spec tuple the caller builds once
 * per cohort:
 *
 *   (group_row_type, w_h, w_hg, fixed, shapes, (w_gpu, w_cpu, w_storage), scores)
 *
 * ``fixed``: per group (g, kind, block_size, a, b) -- its own hit is key[a], its GPU
 * hit key[b]; ``shapes``: per group (block_size, rule: 0 full / 1 sliding / 2 mamba,
 * window_blocks); ``scores``: a dict hit -> score, the all-GPU scores made so far.
 * Prototype: (hit, hit_gpu, score, group rows), the score None when the hit needs
 * offloaded blocks (hit_gpu < hit; the caller weighs them), else the float
 * ``Scorer._weighted`` gives: the same float operations in the same order, rounded by
 * Python's own ``round(x, 3)``. */
#include "core.h"

static PyObject *round_fn; /* builtins.round, looked up once */

int kvr_spec_parse(PyObject *spec, ProtoSpec *s) {
    memset(s, 0, sizeof(*s));
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "spec: (row_type, w_h, w_hg, fixed, shapes, weights, scores)");
        return -1;
    }
    s->row_type = PyTuple_GET_ITEM(spec, 0);
    s->w_h = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 1));
    s->w_hg = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 2));
    s->fixed = PyTuple_GET_ITEM(spec, 3);
    PyObject *shapes = PyTuple_GET_ITEM(spec, 4), *w = PyTuple_GET_ITEM(spec, 5);
    s->scores = PyTuple_GET_ITEM(spec, 6);
    if (PyErr_Occurred())
        return -1;
    if (!PyTuple_Check(s->fixed) || !PyTuple_Check(shapes) || !PyDict_Check(s->scores) ||
        !PyTuple_Check(w) || PyTuple_GET_SIZE(w) != 3 || PyTuple_GET_SIZE(shapes) > KVR_MAX_GROUPS) {
        PyErr_SetString(PyExc_TypeError, "spec: fixed and shapes tuples, 3 weights, a dict");
        return -1;
    }
    for (Py_ssize_t g = 0; g < PyTuple_GET_SIZE(s->fixed); g++) {
        PyObject *f = PyTuple_GET_ITEM(s->fixed, g);
        if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != 5) {
            PyErr_SetString(PyExc_TypeError, "fixed: (g, kind, block_size, a, b) per group");
            return -1;
        }
    }
    s->ngroups = PyTuple_GET_SIZE(shapes);
    for (Py_ssize_t g = 0; g < s->ngroups; g++) {
        PyObject *t = PyTuple_GET_ITEM(shapes, g);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) {
            PyErr_SetString(PyExc_TypeError, "shapes: (block_size, rule, window) per group");
            return -1;
        }
        s->bs[g] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 0));
        s->rule[g] = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
        s->wb[g] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2));
        if (PyErr_Occurred())
            return -1;
        if (s->bs[g] <= 0) {
            PyErr_SetString(PyExc_ValueError, "a block size is positive");
            return -1;
        }
    }
    for (int i = 0; i < 3; i++) {
        s->w[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(w, i));
        if (PyErr_Occurred())
            return -1;
    }
    if (round_fn == NULL) {
        PyObject *b = PyEval_GetBuiltins(); /* borrowed */
        round_fn = b ? PyDict_GetItemString(b, "round") : NULL;
        if (round_fn == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "no builtins.round");
            return -1;
        }
        Py_INCREF(round_fn);
    }
    return 0;
}

/* The all-GPU score of hit h (hit_gpu hg == h): bits.py's ``make``'s float, rounded. */
static PyObject *gpu_score(const ProtoSpec *s, long long h, long long hg) {
    long long count = 0;
    for (Py_ssize_t g = 0; g < s->ngroups; g++) {
        long long end = h / s->bs[g]; /* h > 0: floor division */
        count += s->rule[g] == 0 ? end : s->rule[g] == 1 ? (end < s->wb[g] ? end : s->wb[g]) : 1;
    }
    double total = (double)count * s->w[0];
    total = total + 0.0 * s->w[1];
    total = total + 0.0 * s->w[2];
    double a = count ? (double)h * total / (double)count : (double)h;
    double b = (double)hg * s->w[0];
    PyObject *x = PyFloat_FromDouble(b > a ? b : a); /* Python's max(a, b) */
    if (x == NULL)
        return NULL;
    PyObject *three = PyLong_FromLong(3);
    if (three == NULL) {
        Py_DECREF(x);
        return NULL;
    }
    PyObject *argv[2] = {x, three};
    PyObject *r = PyObject_Vectorcall(round_fn, argv, 2, NULL);
    Py_DECREF(x);
    Py_DECREF(three);
    return r;
}

PyObject *kvr_make_proto(const ProtoSpec *s, PyObject *key) {
    Py_ssize_t nk = PyTuple_GET_SIZE(key);
    if (s->w_h < 0 || s->w_h >= nk || s->w_hg < 0 || s->w_hg >= nk) {
        PyErr_SetString(PyExc_IndexError, "spec positions outside the key");
        return NULL;
    }
    PyObject *ho = PyTuple_GET_ITEM(key, s->w_h), *hgo = PyTuple_GET_ITEM(key, s->w_hg);
    long long h = PyLong_AsLongLong(ho), hg = PyLong_AsLongLong(hgo);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t nf = PyTuple_GET_SIZE(s->fixed);
    PyObject *rows = PyList_New(nf), *score = NULL;
    if (rows == NULL)
        return NULL;
    for (Py_ssize_t g = 0; g < nf; g++) {
        PyObject *f = PyTuple_GET_ITEM(s->fixed, g);
        Py_ssize_t a = PyLong_AsSsize_t(PyTuple_GET_ITEM(f, 3));
        Py_ssize_t b = PyLong_AsSsize_t(PyTuple_GET_ITEM(f, 4));
        if (PyErr_Occurred() || a < 0 || a >= nk || b < 0 || b >= nk) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_IndexError, "a group's positions outside the key");
            goto fail;
        }
        PyObject *argv[6] = {PyTuple_GET_ITEM(f, 0), PyTuple_GET_ITEM(f, 1),
                             PyTuple_GET_ITEM(f, 2), Py_True,
                             PyTuple_GET_ITEM(key, a), PyTuple_GET_ITEM(key, b)};
        PyObject *row = PyObject_Vectorcall(s->row_type, argv, 6, NULL);
        if (row == NULL)
            goto fail;
        PyList_SET_ITEM(rows, g, row);
    }
    if (h > 0 && hg < h) {
        score = Py_None;
        Py_INCREF(score);
    } else if (h > 0 && hg == h) { /* cached per hit */
        score = PyDict_GetItemWithError(s->scores, ho);
        if (score != NULL) {
            Py_INCREF(score);
        } else {
            if (PyErr_Occurred() || (score = gpu_score(s, h, hg)) == NULL ||
                PyDict_SetItem(s->scores, ho, score) < 0)
                goto fail;
        }
    } else if (h > 0) {
        if ((score = gpu_score(s, h, hg)) == NULL)
            goto fail;
    } else {
        score = PyFloat_FromDouble(0.0);
        if (score == NULL)
            goto fail;
    }
    PyObject *out = PyTuple_Pack(4, ho, hgo, score, rows);
    Py_DECREF(score);
    Py_DECREF(rows);
    return out;
fail:
    Py_XDECREF(score);
    Py_DECREF(rows);
    return NULL;
}
