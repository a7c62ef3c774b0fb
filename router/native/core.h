/* Shared declarations of kvroute's compiled core (router/native/__init__.py: why, and
 * the fallback). One extension module, ``router.native._core``, from these sources:
 * map.c (U64Map's table), map_type.c (its Python methods), map_scan.c (its batched scans), map_store.c (its store loop), map_remove.c (its remove loop; memo.h: their shared value memo), chain.c (block keys), chain_packed.c (from msgpack bytes), wire_tokens.c (a batch's token ids as int32 bins), rows.c (the
 * scorer's per-worker rows), rows_classify.c (its classes), proto.c (a class's prototype), sweep.c (the rule's candidate sweep), window.c (sliding-window ANDs), pack.c (bitset bytes), _core.c (the module). */
#ifndef KVR_CORE_H
#define KVR_CORE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint64_t key; /* 0: empty */
    union {
        PyObject *obj;
        uint64_t u;
    } v;
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    Py_ssize_t mask; /* capacity - 1 (capacity a power of two), -1 when unallocated */
    Py_ssize_t used;
    int u64vals;
    PyObject *extra; /* dict or NULL */
} MapObject;

extern PyTypeObject KvrMapType;

static inline uint64_t kvr_mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* A non-negative exact int's digits, read in place (the CPython layouts this builds
 * against); 0 when not available, and callers take the general path. */
static inline int digits_of(PyObject *o, const digit **d, Py_ssize_t *n) {
    if (!PyLong_CheckExact(o))
        return 0;
#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030F0000
    uintptr_t tag = ((PyLongObject *)o)->long_value.lv_tag;
    if ((tag & 3) == 2) /* negative */
        return 0;
    *n = (Py_ssize_t)(tag >> 3);
    *d = ((PyLongObject *)o)->long_value.ob_digit;
    return 1;
#elif PY_VERSION_HEX < 0x030C0000
    Py_ssize_t size = Py_SIZE(o);
    if (size < 0)
        return 0;
    *n = size;
    *d = ((PyLongObject *)o)->ob_digit;
    return 1;
#else
    return 0;
#endif
}

/* A non-negative exact int as a uint64 from its digits: 1 done, 0 too big for 64 bits,
 * -1 not available (negative, a subclass, another layout: the caller converts the
 * general way). Why: PyLong_AsUnsignedLongLong goes through _PyLong_AsByteArray for
 * any int of more than one digit, i.e. for nearly every hash and block key. */
static inline int kvr_u64_digits(PyObject *o, uint64_t *out) {
    const digit *d;
    Py_ssize_t n;
    if (!digits_of(o, &d, &n))
        return -1;
    uint64_t v = 0;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        if (v >> (64 - PyLong_SHIFT))
            return 0;
        v = (v << PyLong_SHIFT) | (uint64_t)d[i];
    }
    *out = v;
    return 1;
}

/* map.c */
PyObject *kvr_map_lookup(MapObject *m, PyObject *key);
int kvr_map_store(MapObject *m, PyObject *key, PyObject *value);
int kvr_map_remove(MapObject *m, PyObject *key);
void kvr_map_clear_all(MapObject *m);
PyObject *kvr_map_setdefault(MapObject *m, PyObject *key, PyObject *value);
int kvr_as_key(PyObject *o, uint64_t *out);
Slot *kvr_find(MapObject *m, uint64_t k);
/* The slot for k, inserted with a zero value (*fresh = 1) when absent; NULL on error. */
Slot *kvr_insert_slot(MapObject *m, uint64_t k, int *fresh);
/* Deletes a slot's entry (backward shift: other slot pointers are stale after it). */
void kvr_erase_slot(MapObject *m, Slot *s);
PyObject *kvr_slot_value(MapObject *m, Slot *s);
int kvr_extra_nonempty(MapObject *m);
/* map_scan.c */
PyObject *kvr_map_prefix(MapObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *kvr_map_lookup_many(MapObject *m, PyObject *const *args, Py_ssize_t nargs);
/* map_store.c */
int kvr_bit_set(PyObject *v, Py_ssize_t p); /* 1/0, -1 on error */
PyObject *kvr_map_store_blocks(MapObject *m, PyObject *const *args, Py_ssize_t nargs);
/* map_remove.c */
PyObject *kvr_map_remove_blocks(MapObject *m, PyObject *const *args, Py_ssize_t nargs);
/* chain.c (only with libxxhash) */
PyObject *kvr_chain(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* chain(), chain_packed() and chain_int32()'s shared parts: (seed, _, block_size,
 * n_blocks) parsed and checked (-1 with an exception set; ``usage`` for a wrong count),
 * and the list of keys chained over nb blocks of bs int32 tokens each. */
int kvr_chain_args(PyObject *const *args, Py_ssize_t nargs, const char *usage, uint64_t *seed,
                   Py_ssize_t *bs, Py_ssize_t *nb);
PyObject *kvr_chain_keys(const int32_t *buf, Py_ssize_t bs, Py_ssize_t nb, uint64_t seed);
/* chain_packed.c (only with libxxhash) */
PyObject *kvr_packed_len(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *kvr_chain_packed(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
const unsigned char *kvr_read_ints(const unsigned char *p, const unsigned char *end, Py_ssize_t n,
                                   void *out);
/* wire_tokens.c (only with libxxhash) */
PyObject *kvr_int32_tokens(PyObject *self, PyObject *payload);
PyObject *kvr_chain_int32(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* pack.c */
int kvr_int_bytes(PyObject *v, unsigned char *buf, Py_ssize_t n);
PyObject *kvr_pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *kvr_tiers(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* window.c */
PyObject *kvr_windows(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* sweep.c */
PyObject *kvr_sweep(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* proto.c: a class's prototype for rows() from a spec tuple (no Python ``make``) */
#define KVR_MAX_GROUPS 64
typedef struct {
    PyObject *row_type, *fixed, *scores; /* borrowed from the spec */
    Py_ssize_t w_h, w_hg, ngroups;
    long long bs[KVR_MAX_GROUPS], wb[KVR_MAX_GROUPS];
    int rule[KVR_MAX_GROUPS];
    double w[3];
} ProtoSpec;
int kvr_spec_parse(PyObject *spec, ProtoSpec *s);
PyObject *kvr_make_proto(const ProtoSpec *s, PyObject *key);
/* rows.c */
PyObject *kvr_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
