/* chain(): the canonical block-key chain of router/ingest/block_keys.py (xxh3_64 over
 * each block's int32 token bytes, seeded with the parent key), one call for all blocks.
 * Built only when libxxhash's header was found (KVR_XXHASH); the keys are the ones
 * python-xxhash gives (tests/router/native/test_core.py). */
#include "core.h"

#ifdef KVR_XXHASH
#include <xxhash.h>
#endif

#ifdef KVR_XXHASH
/* An int of one 30-bit digit (|v| < 2**30, which fits int32): its value without the
 * general conversion (half of chain()'s time for 8k tokens). 0 for wider ints. */
static inline int compact_int(PyObject *o, long *out) {
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)o))
        return 0;
    *out = (long)PyUnstable_Long_CompactValue((PyLongObject *)o);
    return 1;
#else
    Py_ssize_t size = Py_SIZE(o);
    if (size < -1 || size > 1)
        return 0;
    *out = size == 0 ? 0 : size * (long)((PyLongObject *)o)->ob_digit[0];
    return 1;
#endif
}

int kvr_chain_args(PyObject *const *args, Py_ssize_t nargs, const char *usage, uint64_t *seed,
                   Py_ssize_t *bs, Py_ssize_t *nb) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    if (kvr_u64_digits(args[0], seed) != 1) {
        *seed = PyLong_AsUnsignedLongLong(args[0]);
        if (*seed == (uint64_t)-1 && PyErr_Occurred())
            return -1;
    }
    *bs = PyLong_AsSsize_t(args[2]);
    *nb = PyLong_AsSsize_t(args[3]);
    if ((*bs == -1 || *nb == -1) && PyErr_Occurred())
        return -1;
    if (*bs <= 0 || *nb < 0) {
        PyErr_SetString(PyExc_ValueError, "block_size > 0 and n_blocks >= 0");
        return -1;
    }
    return 0;
}

PyObject *kvr_chain_keys(const int32_t *buf, Py_ssize_t bs, Py_ssize_t nb, uint64_t seed) {
    PyObject *out = PyList_New(nb);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t b = 0; b < nb; b++) {
        seed = XXH3_64bits_withSeed(buf + b * bs, (size_t)bs * sizeof(int32_t), seed);
        PyObject *k = PyLong_FromUnsignedLongLong(seed);
        if (k == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, b, k);
    }
    return out;
}

/* chain(seed, tokens, block_size, n_blocks) -> list of keys, or None when a token is
 * not an int32 (the caller's slow path handles those blocks). */
PyObject *kvr_chain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t seed;
    Py_ssize_t bs, nb;
    if (kvr_chain_args(args, nargs, "chain(seed, tokens, block_size, n_blocks)", &seed, &bs,
                       &nb) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[1], "tokens must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t nt = nb * bs;
    if (PySequence_Fast_GET_SIZE(seq) < nt) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "fewer tokens than n_blocks * block_size");
        return NULL;
    }
    int32_t stackbuf[8192];
    int32_t *buf = nt <= 8192 ? stackbuf : PyMem_Malloc((size_t)(nt ? nt : 1) * sizeof(int32_t));
    if (buf == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *t = items[i];
        if (!PyLong_Check(t))
            goto slow;
        long small;
        if (compact_int(t, &small)) { /* token ids: one digit, read in place */
            buf[i] = (int32_t)small;
            continue;
        }
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(t, &overflow);
        if (overflow || v < INT32_MIN || v > INT32_MAX) {
            if (v == -1 && PyErr_Occurred())
                goto end;
            goto slow;
        }
        buf[i] = (int32_t)v;
    }
    out = kvr_chain_keys(buf, bs, nb, seed);
    goto end;
slow:
    out = Py_None;
    Py_INCREF(out);
end:
    if (buf != stackbuf)
        PyMem_Free(buf);
    Py_DECREF(seq);
    return out;
}
#endif

