/* windows(vals, width): router.score.bits.accepts for a sliding window -- out[e] the AND
 * of vals[e - width : e] (out[0] = -1, every bit) for e <= len(vals) -- from per-chunk
 * prefix and suffix ANDs, as the Python does, but an AND whose answer is one of its
 * operands (read on the digits in place: one holds every bit of the other) hands that
 * int back instead of making a new one. Along a prompt most blocks are held by the same
 * workers, so most ANDs make no int. */
#include "core.h"

/* a & b, a new reference; one of a, b itself when it is a subset of the other. */
static PyObject *and_reuse(PyObject *a, PyObject *b) {
    const digit *da, *db;
    Py_ssize_t na, nb;
    if (a == b) {
        Py_INCREF(a);
        return a;
    }
    if (digits_of(a, &da, &na) && digits_of(b, &db, &nb)) {
        int a_in_b = na <= nb, b_in_a = nb <= na;
        Py_ssize_t n = na < nb ? na : nb;
        for (Py_ssize_t i = 0; i < n && (a_in_b || b_in_a); i++) {
            digit x = da[i] & db[i];
            a_in_b &= x == da[i];
            b_in_a &= x == db[i];
        }
        if (a_in_b || b_in_a) {
            PyObject *r = a_in_b ? a : b;
            Py_INCREF(r);
            return r;
        }
    }
    return PyNumber_And(a, b);
}

PyObject *kvr_windows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "windows(vals, width)");
        return NULL;
    }
    Py_ssize_t w = PyLong_AsSsize_t(args[1]);
    if (w == -1 && PyErr_Occurred())
        return NULL;
    if (w < 1) {
        PyErr_SetString(PyExc_ValueError, "a window is at least one block");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "vals must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **v = PySequence_Fast_ITEMS(seq);
    PyObject **pre = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    PyObject **suf = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    PyObject *out = NULL;
    if (pre == NULL || suf == NULL) {
        PyErr_NoMemory();
        goto end;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* prefix ANDs within each chunk */
        if (i % w == 0) {
            Py_INCREF(v[i]);
            pre[i] = v[i];
        } else if ((pre[i] = and_reuse(pre[i - 1], v[i])) == NULL)
            goto end;
    }
    if (n >= w) {
        for (Py_ssize_t i = n - 1; i >= 0; i--) { /* suffix ANDs within each chunk */
            if (i == n - 1 || (i + 1) % w == 0) {
                Py_INCREF(v[i]);
                suf[i] = v[i];
            } else if ((suf[i] = and_reuse(suf[i + 1], v[i])) == NULL)
                goto end;
        }
    }
    out = PyList_New(n + 1);
    if (out == NULL)
        goto end;
    PyObject *all = PyLong_FromLong(-1);
    if (all == NULL)
        goto fail;
    PyList_SET_ITEM(out, 0, all);
    for (Py_ssize_t e = 1; e <= n; e++) {
        PyObject *x;
        if (e < w || n < w) {
            x = pre[e - 1];
            Py_INCREF(x);
        } else if ((x = and_reuse(suf[e - w], pre[e - 1])) == NULL)
            goto fail;
        PyList_SET_ITEM(out, e, x);
    }
    goto end;
fail:
    Py_CLEAR(out);
end:
    for (Py_ssize_t i = 0; i < n && pre != NULL; i++) {
        Py_XDECREF(pre[i]);
        if (suf != NULL)
            Py_XDECREF(suf[i]);
    }
    PyMem_Free(pre);
    PyMem_Free(suf);
    Py_DECREF(seq);
    return out;
}
