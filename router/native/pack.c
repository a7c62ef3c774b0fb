/* Bitset ints as little-endian bytes (numpy rows of the scorer's offloaded workers), and
 * the tiers of those workers' needed blocks counted on the ints directly. */
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


/* tiers(vals, starts, ends, positions) -> (gpu, cpu): per slot j (``positions[j]``: its
 * any-medium bit), over each group g's blocks vals[g][starts[g][j]:ends[g][j]], how
 * many have the GPU bit (position + 1) set, and how many the CPU bit (+ 2) but not the
 * GPU one: ``router.score.bits._tier_counts`` without unpacking the rows to bytes. */
PyObject *kvr_tiers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "tiers(vals, starts, ends, positions)");
        return NULL;
    }
    PyObject *vals = PySequence_Fast(args[0], "vals must be a sequence");
    PyObject *starts = vals ? PySequence_Fast(args[1], "starts must be a sequence") : NULL;
    PyObject *ends = starts ? PySequence_Fast(args[2], "ends must be a sequence") : NULL;
    PyObject *pos = ends ? PySequence_Fast(args[3], "positions must be a sequence") : NULL;
    PyObject *gpu = NULL, *cpu = NULL, *res = NULL;
    Py_ssize_t *ng = NULL, *nc = NULL;
    if (pos == NULL)
        goto end;
    Py_ssize_t groups = PySequence_Fast_GET_SIZE(vals), m = PySequence_Fast_GET_SIZE(pos);
    if (PySequence_Fast_GET_SIZE(starts) != groups || PySequence_Fast_GET_SIZE(ends) != groups) {
        PyErr_SetString(PyExc_ValueError, "one starts and ends list per group");
        goto end;
    }
    ng = PyMem_Calloc((size_t)m + 1, sizeof(Py_ssize_t));
    nc = PyMem_Calloc((size_t)m + 1, sizeof(Py_ssize_t));
    if (ng == NULL || nc == NULL) {
        PyErr_NoMemory();
        goto end;
    }
    for (Py_ssize_t g = 0; g < groups; g++) {
        PyObject *vg = PySequence_Fast(PySequence_Fast_GET_ITEM(vals, g), "vals[g]");
        PyObject *sg = vg ? PySequence_Fast(PySequence_Fast_GET_ITEM(starts, g), "starts[g]") : NULL;
        PyObject *eg = sg ? PySequence_Fast(PySequence_Fast_GET_ITEM(ends, g), "ends[g]") : NULL;
        int bad = eg == NULL;
        if (!bad && (PySequence_Fast_GET_SIZE(sg) != m || PySequence_Fast_GET_SIZE(eg) != m)) {
            PyErr_SetString(PyExc_ValueError, "a start and an end per slot");
            bad = 1;
        }
        Py_ssize_t len = bad ? 0 : PySequence_Fast_GET_SIZE(vg);
        for (Py_ssize_t j = 0; j < m && !bad; j++) {
            Py_ssize_t b = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(sg, j));
            Py_ssize_t e = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(eg, j));
            Py_ssize_t p = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(pos, j));
            if (PyErr_Occurred()) {
                bad = 1;
                break;
            }
            if (b < 0 || e > len || p < 0) {
                PyErr_SetString(PyExc_IndexError, "a range outside the group's values");
                bad = 1;
                break;
            }
            for (Py_ssize_t i = b; i < e; i++) {
                PyObject *v = PySequence_Fast_GET_ITEM(vg, i);
                int on_gpu = kvr_bit_set(v, p + 1);
                int on_cpu = on_gpu == 0 ? kvr_bit_set(v, p + 2) : 0;
                if (on_gpu < 0 || on_cpu < 0) {
                    bad = 1;
                    break;
                }
                ng[j] += on_gpu;
                nc[j] += on_cpu;
            }
        }
        Py_XDECREF(vg);
        Py_XDECREF(sg);
        Py_XDECREF(eg);
        if (bad)
            goto end;
    }
    gpu = PyList_New(m);
    cpu = gpu ? PyList_New(m) : NULL;
    if (cpu == NULL)
        goto end;
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *a = PyLong_FromSsize_t(ng[j]), *b = PyLong_FromSsize_t(nc[j]);
        if (a == NULL || b == NULL) {
            Py_XDECREF(a);
            Py_XDECREF(b);
            goto end;
        }
        PyList_SET_ITEM(gpu, j, a);
        PyList_SET_ITEM(cpu, j, b);
    }
    res = PyTuple_Pack(2, gpu, cpu);
end:
    PyMem_Free(ng);
    PyMem_Free(nc);
    Py_XDECREF(gpu);
    Py_XDECREF(cpu);
    Py_XDECREF(vals);
    Py_XDECREF(starts);
    Py_XDECREF(ends);
    Py_XDECREF(pos);
    return res;
}
