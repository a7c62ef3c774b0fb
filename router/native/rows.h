/* What rows.c and rows_classify.c share: the per-call work of rows(). */
#ifndef KVR_ROWS_H
#define KVR_ROWS_H
#include "core.h"

typedef struct {
    Py_ssize_t n, na;
    Py_ssize_t *idx;     /* idx[a * n + j]: member j's class index in attr a */
    PyObject **values;   /* values[off[a] + c]: attr a's c-th value (borrowed) */
    Py_ssize_t *off;     /* per attr, its first value in ``values`` */
    Py_ssize_t *cls;     /* per member, its class (index into protos) */
    PyObject **protos;   /* per class, its prototype (borrowed from memo) */
    Py_ssize_t nclasses;
    Py_ssize_t *member_at; /* per bit position, the member whose position it is, or -1 */
} Work;

/* Fill w->idx (and w->values, w->member_at) from the attrs' bitsets. */
int kvr_rows_classify(Work *w, PyObject *attrs, const Py_ssize_t *pos, Py_ssize_t nbytes);

#endif
