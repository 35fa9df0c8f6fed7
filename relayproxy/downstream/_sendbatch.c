/* One call that writes to many non-blocking sockets with the GIL released (downstream/sendbatch.py).
 *
 * send_batch(items) -> list[int]
 *   items: a list of (fd, data), data a bytes-like object or a list of them (written in order, one sendmsg).
 *   Each fd gets one sendmsg(MSG_DONTWAIT | MSG_NOSIGNAL) of its buffers (at most IOV_MAX of them); the result
 *   is the number of bytes the kernel took (possibly fewer than given, 0 when the socket is full), or -errno.
 *   Nothing is retried but EINTR: the caller hands what is left to the socket's transport.
 *
 * The buffers are held (PyObject_GetBuffer) while the GIL is released, so the objects cannot change under the
 * writes; the fds must stay open for the duration of the call (the caller owns them and is blocked in it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/uio.h>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

typedef struct {
    int fd;
    Py_ssize_t first; /* index of its first buffer in the batch's arrays */
    Py_ssize_t count;
    Py_ssize_t result;
} entry_t;

static void release_all(Py_buffer *views, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        PyBuffer_Release(&views[i]);
}

static PyObject *send_batch(PyObject *self, PyObject *items) {
    if (!PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "send_batch: items must be a list of (fd, data)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    Py_ssize_t nbufs = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "send_batch: each item must be a (fd, data) tuple");
            return NULL;
        }
        PyObject *data = PyTuple_GET_ITEM(item, 1);
        nbufs += PyList_Check(data) ? PyList_GET_SIZE(data) : 1;
    }
    entry_t *entries = PyMem_Calloc(n ? n : 1, sizeof(entry_t));
    Py_buffer *views = PyMem_Calloc(nbufs ? nbufs : 1, sizeof(Py_buffer));
    struct iovec *iov = PyMem_Calloc(nbufs ? nbufs : 1, sizeof(struct iovec));
    if (entries == NULL || views == NULL || iov == NULL) {
        PyMem_Free(entries);
        PyMem_Free(views);
        PyMem_Free(iov);
        return PyErr_NoMemory();
    }
    Py_ssize_t held = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        long fd = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
        if (fd == -1 && PyErr_Occurred())
            goto fail;
        if (fd < 0 || fd > INT_MAX) {
            PyErr_SetString(PyExc_ValueError, "send_batch: a file descriptor out of range");
            goto fail;
        }
        entries[i].fd = (int)fd;
        entries[i].first = held;
        PyObject *data = PyTuple_GET_ITEM(item, 1);
        Py_ssize_t k = PyList_Check(data) ? PyList_GET_SIZE(data) : 1;
        for (Py_ssize_t j = 0; j < k; j++) {
            PyObject *obj = PyList_Check(data) ? PyList_GET_ITEM(data, j) : data;
            if (PyObject_GetBuffer(obj, &views[held], PyBUF_SIMPLE) < 0)
                goto fail;
            iov[held].iov_base = views[held].buf;
            iov[held].iov_len = (size_t)views[held].len;
            held++;
        }
        entries[i].count = k > IOV_MAX ? IOV_MAX : k;
    }

    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        struct msghdr msg;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = &iov[entries[i].first];
        msg.msg_iovlen = (size_t)entries[i].count;
        ssize_t r;
        do {
            r = sendmsg(entries[i].fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        } while (r < 0 && errno == EINTR);
        if (r < 0)
            entries[i].result = (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -(Py_ssize_t)errno;
        else
            entries[i].result = (Py_ssize_t)r;
    }
    Py_END_ALLOW_THREADS

    release_all(views, held);
    PyObject *out = PyList_New(n);
    if (out != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = PyLong_FromSsize_t(entries[i].result);
            if (v == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, i, v);
        }
    }
    PyMem_Free(entries);
    PyMem_Free(views);
    PyMem_Free(iov);
    return out;

fail:
    release_all(views, held);
    PyMem_Free(entries);
    PyMem_Free(views);
    PyMem_Free(iov);
    return NULL;
}

static PyMethodDef methods[] = {
    {"send_batch", send_batch, METH_O,
     "send_batch(items) -> list[int]: one sendmsg per (fd, data) with the GIL released; bytes taken or -errno"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sendbatch", "Writes to many non-blocking sockets in one call, without the GIL.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__sendbatch(void) { return PyModule_Create(&module); }
