/* rows()'s first step (rows.c): each member's class in every attr, read from the attrs'
 * bitsets -- only their set bits are visited (a member per bit position), and the GPU
 * view may come unmerged as (same, keep, gpu). */
#include "rows.h"

/* Sets row[j] = first + c for the members whose bit (position + shift) is set in dict
 * d's c-th bitset and, when keep is not NULL, whose bit is set in keep; the values go to
 * w->values[off + first + c]. */
static int classify_dict(Work *w, PyObject *d, Py_ssize_t off, Py_ssize_t first, Py_ssize_t *row,
                         const Py_ssize_t *pos, int shift, const unsigned char *keep,
                         unsigned char *buf, Py_ssize_t nbytes) {
    PyObject *value, *bits;
    Py_ssize_t it = 0, c = first, nwords = (nbytes + 7) / 8;
    while (PyDict_Next(d, &it, &value, &bits)) {
        w->values[off + c] = value;
        if (!PyLong_Check(bits)) {
            PyErr_SetString(PyExc_TypeError, "a bitset is an int");
            return -1;
        }
        memset(buf, 0, (size_t)nwords * 8);
        if (kvr_int_bytes(bits, buf, nbytes) < 0)
            return -1;
        for (Py_ssize_t wi = 0; wi < nwords; wi++) { /* the set bits only */
            uint64_t word;
            memcpy(&word, buf + 8 * wi, 8);
            while (word) {
                Py_ssize_t q = 64 * wi + __builtin_ctzll(word) - shift;
                word &= word - 1;
                Py_ssize_t j = q >= 0 ? w->member_at[q] : -1;
                if (j >= 0 && (keep == NULL || keep[q >> 3] >> (q & 7) & 1))
                    row[j] = c;
            }
        }
        c++;
    }
    return 0;
}

/* An attr: a dict {value: bitset}, or (same, keep, gpu) -- the GPU view merged here:
 * members in ``keep`` take their class in dict ``same``, the others theirs in dict
 * ``gpu`` (bitsets one bit above each member's position). */
static int attr_parts(PyObject *a, PyObject **same, PyObject **keep, PyObject **gpu) {
    *keep = *gpu = NULL;
    *same = a;
    if (PyTuple_Check(a) && PyTuple_GET_SIZE(a) == 3) {
        *same = PyTuple_GET_ITEM(a, 0);
        *keep = PyTuple_GET_ITEM(a, 1);
        *gpu = PyTuple_GET_ITEM(a, 2);
        if (!PyLong_Check(*keep) || !PyDict_Check(*gpu)) {
            PyErr_SetString(PyExc_TypeError, "a merged attr is (dict, int, dict)");
            return -1;
        }
    }
    if (!PyDict_Check(*same) || PyDict_GET_SIZE(*same) == 0) {
        PyErr_SetString(PyExc_TypeError, "an attr is a non-empty dict");
        return -1;
    }
    return 0;
}

/* Fill w->idx from the attrs' bitsets. */
int kvr_rows_classify(Work *w, PyObject *attrs, const Py_ssize_t *pos, Py_ssize_t nbytes) {
    Py_ssize_t total = 0;
    PyObject *same, *keep, *gpu;
    for (Py_ssize_t a = 0; a < w->na; a++) {
        if (attr_parts(PySequence_Fast_GET_ITEM(attrs, a), &same, &keep, &gpu) < 0)
            return -1;
        w->off[a] = total;
        total += PyDict_GET_SIZE(same) + (gpu ? PyDict_GET_SIZE(gpu) : 0);
    }
    w->values = PyMem_Calloc((size_t)total + 1, sizeof(PyObject *));
    size_t padded = (size_t)(nbytes + 7) / 8 * 8 + 8;
    unsigned char *buf = PyMem_Malloc(padded), *kbuf = PyMem_Malloc(padded);
    w->member_at = PyMem_Malloc(padded * 8 * sizeof(Py_ssize_t));
    int rc = -1;
    if (w->values == NULL || buf == NULL || kbuf == NULL || w->member_at == NULL) {
        PyErr_NoMemory();
        goto end;
    }
    for (size_t p = 0; p < padded * 8; p++)
        w->member_at[p] = -1;
    for (Py_ssize_t j = 0; j < w->n; j++)
        w->member_at[pos[j]] = j;
    for (Py_ssize_t a = 0; a < w->na; a++) {
        attr_parts(PySequence_Fast_GET_ITEM(attrs, a), &same, &keep, &gpu);
        Py_ssize_t *row = w->idx + a * w->n;
        if (keep != NULL) {
            memset(kbuf, 0, (size_t)nbytes);
            if (kvr_int_bytes(keep, kbuf, nbytes) < 0)
                goto end;
        }
        /* no class at all: 0, the first value (numpy's argmax) */
        if (classify_dict(w, same, w->off[a], 0, row, pos, 0, keep ? kbuf : NULL, buf, nbytes) < 0)
            goto end;
        if (gpu != NULL) {
            for (Py_ssize_t b = 0; b < nbytes; b++)
                kbuf[b] = (unsigned char)~kbuf[b];
            if (classify_dict(w, gpu, w->off[a], PyDict_GET_SIZE(same), row, pos, 1, kbuf,
                              buf, nbytes) < 0)
                goto end;
        }
    }
    rc = 0;
end:
    PyMem_Free(buf);
    PyMem_Free(kbuf);
    return rc;
}
