/* sweep(): router.score.bits.sweep's loop -- per class of slots (largest cap first),
 * the largest window candidate at or below the cap that the pending slots accept --
 * with the candidate test ``cand[e] & pending`` read on the ints' digits in place (no
 * int made per candidate tried). */
#include "core.h"

/* Whether a & b != 0 (digits in place for non-negative ints; -1 on error). */
static int and_nonzero(PyObject *a, PyObject *b) {
    const digit *da, *db;
    Py_ssize_t na, nb;
    if (digits_of(a, &da, &na) && digits_of(b, &db, &nb)) {
        Py_ssize_t n = na < nb ? na : nb;
        for (Py_ssize_t i = 0; i < n; i++)
            if (da[i] & db[i])
                return 1;
        return 0;
    }
    PyObject *x = PyNumber_And(a, b);
    if (x == NULL)
        return -1;
    int r = PyObject_IsTrue(x);
    Py_DECREF(x);
    return r;
}

/* out[key] |= bits (a new reference to bits is not taken over). */
static int or_into(PyObject *out, PyObject *key, PyObject *bits) {
    PyObject *old = PyDict_GetItemWithError(out, key); /* borrowed */
    if (old == NULL) {
        if (PyErr_Occurred())
            return -1;
        return PyDict_SetItem(out, key, bits);
    }
    PyObject *v = PyNumber_Or(old, bits);
    if (v == NULL)
        return -1;
    int r = PyDict_SetItem(out, key, v);
    Py_DECREF(v);
    return r;
}

/* sweep(order, cand, step) -> {candidate tokens: slots}; ``order``: (cap // step, bits)
 * pairs sorted descending, as bits.sweep sorts them. */
PyObject *kvr_sweep(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "sweep(order, cand, step)");
        return NULL;
    }
    PyObject *order = PySequence_Fast(args[0], "order must be a sequence");
    PyObject *cand = order ? PySequence_Fast(args[1], "cand must be a sequence") : NULL;
    Py_ssize_t step = PyLong_AsSsize_t(args[2]);
    PyObject *out = NULL, *pending = NULL, *res = NULL;
    if (cand == NULL || (step == -1 && PyErr_Occurred()))
        goto end;
    out = PyDict_New();
    pending = PyLong_FromLong(0);
    if (out == NULL || pending == NULL)
        goto end;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(order), last = PySequence_Fast_GET_SIZE(cand) - 1;
    PyObject **cv = PySequence_Fast_ITEMS(cand);
    for (Py_ssize_t i = 0; i < n;) {
        PyObject *pair = PySequence_Fast_GET_ITEM(order, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "order holds (candidate, bits) pairs");
            goto end;
        }
        Py_ssize_t c = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
        if (c == -1 && PyErr_Occurred())
            goto end;
        PyObject *np = PyNumber_Or(pending, PyTuple_GET_ITEM(pair, 1));
        if (np == NULL)
            goto end;
        Py_SETREF(pending, np);
        i++;
        Py_ssize_t low = 0;
        if (i < n) {
            PyObject *nx = PySequence_Fast_GET_ITEM(order, i);
            if (!PyTuple_Check(nx) || PyTuple_GET_SIZE(nx) != 2) {
                PyErr_SetString(PyExc_TypeError, "order holds (candidate, bits) pairs");
                goto end;
            }
            low = PyLong_AsSsize_t(PyTuple_GET_ITEM(nx, 0));
            if (low == -1 && PyErr_Occurred())
                goto end;
        }
        Py_ssize_t hi = c < last ? c : last;
        for (;;) {
            int any = PyObject_IsTrue(pending);
            if (any < 0)
                goto end;
            if (!any || hi <= low)
                break;
            Py_ssize_t e = 0;
            for (Py_ssize_t j = hi; j > low; j--) {
                int r = and_nonzero(cv[j], pending);
                if (r < 0)
                    goto end;
                if (r) {
                    e = j;
                    break;
                }
            }
            if (!e)
                break;
            PyObject *ok = PyNumber_And(cv[e], pending);
            PyObject *key = ok ? PyLong_FromSsize_t(e * step) : NULL;
            int bad = key == NULL || or_into(out, key, ok) < 0;
            PyObject *rest = bad ? NULL : PyNumber_Xor(pending, ok);
            Py_XDECREF(ok);
            Py_XDECREF(key);
            if (rest == NULL)
                goto end;
            Py_SETREF(pending, rest);
            hi = e - 1;
        }
    }
    int left = PyObject_IsTrue(pending);
    if (left < 0)
        goto end;
    if (left) {
        PyObject *zero = PyLong_FromLong(0);
        int bad = zero == NULL || or_into(out, zero, pending) < 0;
        Py_XDECREF(zero);
        if (bad)
            goto end;
    }
    res = out;
    out = NULL;
end:
    Py_XDECREF(out);
    Py_XDECREF(pending);
    Py_XDECREF(order);
    Py_XDECREF(cand);
    return res;
}
