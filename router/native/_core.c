/* kvroute's optional compiled core: the module (router/native/__init__.py explains what
 * it is for and the pure-Python fallback; core.h lists the sources). */
#include "core.h"

static PyMethodDef module_methods[] = {
#ifdef KVR_XXHASH
    {"chain", (PyCFunction)(void (*)(void))kvr_chain, METH_FASTCALL,
     "chain(seed, tokens, block_size, n_blocks) -> keys | None"},
    {"chain_packed", (PyCFunction)(void (*)(void))kvr_chain_packed, METH_FASTCALL,
     "chain_packed(seed, msgpack int array, block_size, n_blocks) -> keys | None"},
    {"packed_len", (PyCFunction)(void (*)(void))kvr_packed_len, METH_FASTCALL,
     "packed_len(msgpack int array[, check]) -> its length, -1 unless all are int32"},
    {"int32_tokens", (PyCFunction)kvr_int32_tokens, METH_O,
     "int32_tokens(payload) -> the batch with token_ids as int32 bins | None"},
    {"chain_int32", (PyCFunction)(void (*)(void))kvr_chain_int32, METH_FASTCALL,
     "chain_int32(seed, native int32 ids, block_size, n_blocks) -> keys | None"},
#endif
    {"rows", (PyCFunction)(void (*)(void))kvr_rows, METH_FASTCALL,
     "rows(row_type, wids, positions, attrs, nbytes, memo, make, ordered[, late]) -> (rows, mixed)"},
    {"pack", (PyCFunction)(void (*)(void))kvr_pack, METH_FASTCALL,
     "pack(ints, width) -> their little-endian bytes, joined"},
    {"sweep", (PyCFunction)(void (*)(void))kvr_sweep, METH_FASTCALL,
     "sweep(order, cand, step) -> {candidate tokens: slots}"},
    {"windows", (PyCFunction)(void (*)(void))kvr_windows, METH_FASTCALL,
     "windows(vals, width) -> [-1, AND of each window ending at block 1..len(vals)]"},
    {"tiers", (PyCFunction)(void (*)(void))kvr_tiers, METH_FASTCALL,
     "tiers(vals, starts, ends, positions) -> (on GPU, on CPU only) per slot"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_core", "kvroute's compiled core", -1, module_methods,
};

PyMODINIT_FUNC PyInit__core(void) {
    if (PyType_Ready(&KvrMapType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    Py_INCREF(&KvrMapType);
    if (PyModule_AddObject(m, "U64Map", (PyObject *)&KvrMapType) < 0) {
        Py_DECREF(&KvrMapType);
        Py_DECREF(m);
        return NULL;
    }
#ifdef KVR_XXHASH
    PyModule_AddIntConstant(m, "HAS_XXHASH", 1);
#else
    PyModule_AddIntConstant(m, "HAS_XXHASH", 0);
#endif
    return m;
}
