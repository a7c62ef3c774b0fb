/* Token ids still in their msgpack bytes (the subscriber's packed decode,
 * router/ingest/packed.py): check them, and chain block keys straight from them, so a
 * published batch's tokens never become Python ints (decoding and freeing those was a
 * third of the router's ingest CPU; docs/benchmarks.md "Router end to end").
 * Only with libxxhash, like chain(); the keys are chain()'s for the same tokens. */
#include "core.h"

#ifdef KVR_XXHASH

/* The array header at p[0..len): element count and header size, or -1. */
static Py_ssize_t array_header(const unsigned char *p, Py_ssize_t len, Py_ssize_t *hdr) {
    if (len < 1)
        return -1;
    unsigned char h = p[0];
    if (h >= 0x90 && h <= 0x9f) {
        *hdr = 1;
        return h & 0x0f;
    }
    if (h == 0xdc && len >= 3) {
        *hdr = 3;
        return ((Py_ssize_t)p[1] << 8) | p[2];
    }
    if (h == 0xdd && len >= 5) {
        *hdr = 5;
        return ((Py_ssize_t)p[1] << 24) | ((Py_ssize_t)p[2] << 16) | ((Py_ssize_t)p[3] << 8) |
               p[4];
    }
    return -1;
}

static inline uint64_t be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Bytes after the tag of the common token forms, by tag: positive fixint 0, uint8 1,
 * uint16 2, uint32 4; 8 for every other tag (the general branch below). */
static unsigned char common_width[256];

static void init_common_width(void) {
    for (int c = 0; c < 256; c++)
        common_width[c] = c <= 0x7f ? 0 : c == 0xcc ? 1 : c == 0xcd ? 2 : c == 0xce ? 4 : 8;
}

/* The n msgpack ints (int32 range) from p, stored to out (may be NULL: check only; any
 * alignment); the byte after them, or NULL when one is not such an int or runs past end.
 * Token ids are mostly positive fixints, uint16 and uint32: those first. */
const unsigned char *kvr_read_ints(const unsigned char *p, const unsigned char *end, Py_ssize_t n,
                                   void *out) {
    const unsigned char *q = p;
    unsigned char *o = out;
    if (common_width[0x80] == 0)
        init_common_width();
    Py_ssize_t i = 0;
    /* Branch-free while 5 bytes are left: real vocabularies mix uint16 and uint32 ids
     * at random, and a branch on the tag mispredicted about every other token (measured
     * 3.7 ns a token; this loop ~1 ns). */
    while (i < n && end - q >= 5) {
        unsigned char c = *q;
        unsigned w = common_width[c];
        if (w == 8)
            break;
        uint32_t raw = ((uint32_t)q[1] << 24) | ((uint32_t)q[2] << 16) | ((uint32_t)q[3] << 8) | q[4];
        uint32_t v = w ? raw >> ((32 - 8 * w) & 31) : c;
        if ((int32_t)v < 0) /* a uint32 over INT32_MAX */
            return NULL;
        if (o != NULL)
            memcpy(o + 4 * i, &v, 4);
        q += 1 + w;
        i++;
    }
    for (; i < n; i++) {
        if (q >= end)
            return NULL;
        unsigned char c = *q;
        int64_t v;
        if (c <= 0x7f) {
            v = c;
            q += 1;
        } else if (c == 0xce) {
            if (end - q < 5)
                return NULL;
            uint32_t u = ((uint32_t)q[1] << 24) | ((uint32_t)q[2] << 16) | ((uint32_t)q[3] << 8) | q[4];
            if (u > (uint32_t)INT32_MAX)
                return NULL;
            v = u;
            q += 5;
        } else if (c == 0xcd) {
            if (end - q < 3)
                return NULL;
            v = ((uint32_t)q[1] << 8) | q[2];
            q += 3;
        } else if (c == 0xcc) {
            if (end - q < 2)
                return NULL;
            v = q[1];
            q += 2;
        } else if (c >= 0xe0) {
            v = (int8_t)c;
            q += 1;
        } else {
            int w, sign = 1;
            switch (c) {
            case 0xcf: w = 8; sign = 0; break;
            case 0xd0: w = 1; break;
            case 0xd1: w = 2; break;
            case 0xd2: w = 4; break;
            case 0xd3: w = 8; break;
            default: return NULL;
            }
            if (end - q < 1 + w)
                return NULL;
            uint64_t u = be(q + 1, w);
            q += 1 + w;
            if (sign) {
                int shift = 64 - 8 * w;
                v = shift ? ((int64_t)(u << shift)) >> shift : (int64_t)u;
            } else {
                if (u > (uint64_t)INT32_MAX)
                    return NULL;
                v = (int64_t)u;
            }
            if (v < INT32_MIN || v > INT32_MAX)
                return NULL;
        }
        if (o != NULL) {
            int32_t t = (int32_t)v;
            memcpy(o + 4 * i, &t, 4);
        }
    }
    return q;
}

/* 0 when p[0..len) is exactly n such ints. */
static int read_ints(const unsigned char *p, Py_ssize_t len, Py_ssize_t n, int32_t *out) {
    return kvr_read_ints(p, p + len, n, out) == p + len ? 0 : -1;
}

/* packed_len(buf[, check]) -> the number of tokens, or -1 unless buf is one msgpack
 * array of ints that all fit int32 (anything else takes the decoded-list path). With
 * check false only the array header is read (a buffer checked before). */
PyObject *kvr_packed_len(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 && nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "packed_len(buf[, check])");
        return NULL;
    }
    int check = 1;
    if (nargs == 2 && (check = PyObject_IsTrue(args[1])) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t hdr = 0;
    Py_ssize_t n = array_header(p, view.len, &hdr);
    if (check && n >= 0 && read_ints(p + hdr, view.len - hdr, n, NULL) != 0)
        n = -1;
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(n);
}

/* chain_packed(seed, buf, block_size, n_blocks) -> keys (chain()'s), or None when buf
 * is not an int32 array of at least n_blocks * block_size tokens. */
PyObject *kvr_chain_packed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t seed;
    Py_ssize_t bs, nb;
    if (kvr_chain_args(args, nargs, "chain_packed(seed, buf, block_size, n_blocks)", &seed, &bs,
                       &nb) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t hdr = 0;
    Py_ssize_t n = array_header(p, view.len, &hdr);
    Py_ssize_t nt = nb * bs;
    PyObject *out = NULL;
    int32_t stackbuf[8192];
    int32_t *buf = stackbuf;
    if (n < nt) {
        out = Py_None;
        Py_INCREF(out);
        goto end;
    }
    if (n > 8192) {
        buf = PyMem_Malloc((size_t)n * sizeof(int32_t));
        if (buf == NULL) {
            PyErr_NoMemory();
            goto end;
        }
    }
    if (read_ints(p + hdr, view.len - hdr, n, buf) != 0) {
        out = Py_None;
        Py_INCREF(out);
        goto end;
    }
    out = kvr_chain_keys(buf, bs, nb, seed);
end:
    if (buf != stackbuf)
        PyMem_Free(buf);
    PyBuffer_Release(&view);
    return out;
}
#endif
