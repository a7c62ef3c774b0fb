/* int32_tokens(payload): a published batch with every event's ``token_ids`` array
 * rewritten as one msgpack bin of its ids as native int32s, so the strict decode
 * (schemas.decode.decode_int32) reads the ids as one bytes object instead of walking
 * them to find their end: msgspec skipped a token id in 6.8 ns, this walk reads and
 * checks it in ~2.4, and chaining needs no second walk (docs/benchmarks.md "Round 6").
 * Only the shape of vLLM's batches is rewritten (an array whose second element is the
 * array of event maps); everything else is copied as it is, for the strict decode to
 * accept or refuse as before. None whenever a token_ids array holds anything but
 * int32 ints, or the bytes are not msgpack: the caller then decodes as before.
 * Only with libxxhash, like chain_packed.c. */
#include "core.h"

#ifdef KVR_XXHASH

#define MAX_DEPTH 32

/* Big-endian unsigned of n bytes. */
static uint64_t be_n(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Container header at p: element count (pairs for maps) and header size; kind 'a'
 * array, 'm' map, 0 neither (or truncated). */
static int container(const unsigned char *p, const unsigned char *end, Py_ssize_t *n,
                     Py_ssize_t *hdr) {
    if (p >= end)
        return 0;
    unsigned char c = *p;
    if (c >= 0x90 && c <= 0x9f) {
        *n = c & 0x0f, *hdr = 1;
        return 'a';
    }
    if (c >= 0x80 && c <= 0x8f) {
        *n = c & 0x0f, *hdr = 1;
        return 'm';
    }
    int w = c == 0xdc || c == 0xde ? 2 : c == 0xdd || c == 0xdf ? 4 : 0;
    if (w == 0 || end - p < 1 + w)
        return 0;
    *n = (Py_ssize_t)be_n(p + 1, w), *hdr = 1 + w;
    return c == 0xdc || c == 0xdd ? 'a' : 'm';
}

/* The byte after the msgpack object at p, or NULL (malformed, truncated, too deep). */
static const unsigned char *skip(const unsigned char *p, const unsigned char *end, int depth) {
    if (p >= end || depth > MAX_DEPTH)
        return NULL;
    unsigned char c = *p;
    Py_ssize_t n, hdr, len = -1;
    int kind = container(p, end, &n, &hdr);
    if (kind) {
        const unsigned char *q = p + hdr;
        for (Py_ssize_t i = 0; i < (kind == 'm' ? 2 * n : n) && q != NULL; i++)
            q = skip(q, end, depth + 1);
        return q;
    }
    if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3)
        return p + 1;
    if (c >= 0xa0 && c <= 0xbf)
        len = 1 + (c & 0x1f);
    else if (c == 0xcc || c == 0xd0)
        len = 2;
    else if (c == 0xcd || c == 0xd1)
        len = 3;
    else if (c == 0xce || c == 0xd2 || c == 0xca)
        len = 5;
    else if (c == 0xcf || c == 0xd3 || c == 0xcb)
        len = 9;
    else if (c >= 0xd4 && c <= 0xd8) /* fixext 1, 2, 4, 8, 16 */
        len = 2 + (1 << (c - 0xd4));
    else {
        /* str / bin / ext with a length field of 1, 2 or 4 bytes */
        int w = 0, extra = 0;
        switch (c) {
        case 0xd9: case 0xc4: w = 1; break;
        case 0xda: case 0xc5: w = 2; break;
        case 0xdb: case 0xc6: w = 4; break;
        case 0xc7: w = 1, extra = 1; break;
        case 0xc8: w = 2, extra = 1; break;
        case 0xc9: w = 4, extra = 1; break;
        default: return NULL; /* 0xc1: never used */
        }
        if (end - p < 1 + w)
            return NULL;
        len = 1 + w + extra + (Py_ssize_t)be_n(p + 1, w);
    }
    return end - p < len ? NULL : p + len;
}

/* Whether the object at p is the str "token_ids". */
static int is_token_ids(const unsigned char *p, const unsigned char *end) {
    static const char name[] = "token_ids";
    const Py_ssize_t n = sizeof(name) - 1;
    if (end - p >= 1 + n && p[0] == (0xa0 | n) && memcmp(p + 1, name, n) == 0)
        return 1;
    return end - p >= 2 + n && p[0] == 0xd9 && p[1] == n && memcmp(p + 2, name, n) == 0;
}

/* A msgpack bin header for size bytes at w; its length. */
static Py_ssize_t bin_header(unsigned char *w, Py_ssize_t size) {
    if (size <= 0xff) {
        w[0] = 0xc4, w[1] = (unsigned char)size;
        return 2;
    }
    if (size <= 0xffff) {
        w[0] = 0xc5, w[1] = (unsigned char)(size >> 8), w[2] = (unsigned char)size;
        return 3;
    }
    w[0] = 0xc6;
    for (int i = 0; i < 4; i++)
        w[1 + i] = (unsigned char)(size >> (24 - 8 * i));
    return 5;
}

/* One event map from p, written to *w: a token_ids array as a bin of int32s. The byte
 * after it, or NULL (not int32 ids: the caller gives up; malformed). */
static const unsigned char *event(const unsigned char *p, const unsigned char *end,
                                  unsigned char **w) {
    Py_ssize_t n, hdr;
    if (container(p, end, &n, &hdr) != 'm') { /* not a map: copied for the decode to judge */
        const unsigned char *q = skip(p, end, 1);
        if (q != NULL) {
            memcpy(*w, p, (size_t)(q - p));
            *w += q - p;
        }
        return q;
    }
    memcpy(*w, p, (size_t)hdr);
    *w += hdr;
    p += hdr;
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *v = skip(p, end, 2);
        if (v == NULL)
            return NULL;
        int ids = is_token_ids(p, end);
        memcpy(*w, p, (size_t)(v - p));
        *w += v - p;
        Py_ssize_t nt, th;
        if (ids && container(v, end, &nt, &th) != 'a')
            return NULL; /* (a bin here would pass for int32 ids) */
        if (ids) {
            unsigned char *b = *w + bin_header(*w, 4 * nt);
            p = kvr_read_ints(v + th, end, nt, b);
            if (p == NULL)
                return NULL;
            *w = b + 4 * nt;
            continue;
        }
        p = skip(v, end, 2);
        if (p == NULL)
            return NULL;
        memcpy(*w, v, (size_t)(p - v));
        *w += p - v;
    }
    return p;
}

/* chain_int32(seed, ids, block_size, n_blocks) -> keys (chain()'s for the same ids), or
 * None when ids (native int32s, int32_tokens()'s bins) hold fewer than n_blocks blocks. */
PyObject *kvr_chain_int32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t seed;
    Py_ssize_t bs, nb;
    if (kvr_chain_args(args, nargs, "chain_int32(seed, ids, block_size, n_blocks)", &seed, &bs,
                       &nb) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out;
    if (view.len % 4 || view.len / 4 < nb * bs) {
        out = Py_None;
        Py_INCREF(out);
    } else {
        out = kvr_chain_keys((const int32_t *)view.buf, bs, nb, seed);
    }
    PyBuffer_Release(&view);
    return out;
}

PyObject *kvr_int32_tokens(PyObject *self, PyObject *payload) {
    Py_buffer view;
    if (PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf, *end = p + view.len;
    /* A token id takes 1 to 5 bytes here and 4 there, a bin header at most 5 bytes
     * where the array header took at least 1: 4x the payload is always enough. */
    PyObject *out = PyBytes_FromStringAndSize(NULL, 4 * view.len + 8);
    Py_ssize_t n, hdr, ne, ehdr;
    if (out == NULL)
        goto fail;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    const unsigned char *q;
    if (container(p, end, &n, &hdr) != 'a' || n < 2 || (q = skip(p + hdr, end, 1)) == NULL ||
        container(q, end, &ne, &ehdr) != 'a')
        goto none;
    memcpy(w, p, (size_t)(q + ehdr - p)); /* the batch header, ts, the events header */
    w += q + ehdr - p;
    p = q + ehdr;
    for (Py_ssize_t i = 0; i < ne; i++)
        if ((p = event(p, end, &w)) == NULL)
            goto none;
    memcpy(w, p, (size_t)(end - p)); /* the rank, and anything after: the decode judges */
    w += end - p;
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&out, (Py_ssize_t)(w - (unsigned char *)PyBytes_AS_STRING(out))) < 0)
        return NULL;
    return out;
none:
    Py_DECREF(out);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&view);
    return NULL;
}

#endif
