/* Bitset ints as little-endian bytes (numpy rows of the scorer's offloaded workers). */
#include "core.h"

/* Little-endian bytes of a non-negative int into buf[n]; -1 when it does not fit. */
int kvr_int_bytes(PyObject *v, unsigned char *buf, Py_ssize_t n) {
#if PY_VERSION_HEX >= 0x030D0000
    Py_ssize_t need = PyLong_AsNativeBytes(
        v, buf, n, Py_ASNATIVEBYTES_LITTLE_ENDIAN | Py_ASNATIVEBYTES_UNSIGNED_BUFFER);
    if (need < 0)
        return -1;
    if (need > n) {
        PyErr_SetString(PyExc_OverflowError, "bitset wider than the slots");
        return -1;
    }
    return 0;
#else
    return _PyLong_AsByteArray((PyLongObject *)v, buf, (size_t)n, 1, 0);
#endif
}

/* pack(ints, width) -> bytes: each int's ``width`` little-endian bytes, joined (what
 * b"".join(map(int.to_bytes, ints, repeat(width), repeat("little"))) gives). */
PyObject *kvr_pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "pack(ints, width)");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "ints must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t width = PyLong_AsSsize_t(args[1]);
    if (width < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "width >= 0");
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * width);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *buf = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyLong_Check(v)) {
            PyErr_SetString(PyExc_TypeError, "pack() takes ints");
            goto fail;
        }
        if (width == 0) {
            if (PyObject_IsTrue(v)) {
                PyErr_SetString(PyExc_OverflowError, "int too big to convert");
                goto fail;
            }
            continue;
        }
        if (kvr_int_bytes(v, buf + i * width, width) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(out);
    Py_DECREF(seq);
    return NULL;
}

