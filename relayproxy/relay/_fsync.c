/* The relay's fsync thread in C: an fdatasync and the durable mark's write, run without the GIL and signalled
 * back through an eventfd (relay/fsyncer.py; the fsync pipeline of relay/store.py).
 *
 * Worker() starts one thread and an eventfd (non-blocking, close-on-exec).
 *   submit(fd, mark_fd, mark)  hand a job over: fdatasync(fd) unless fd < 0, then pwrite(mark_fd, mark, 0) unless
 *                              mark is None. One job at a time: a second submit before its result is taken raises.
 *   poll() -> None | (errno, stage, seconds)
 *                              the finished job's result, taken (the eventfd is drained first, so a wake-up left
 *                              over from a job already taken by wait() is harmless); None while it runs or when
 *                              no job is out. stage: 0 none failed, 1 the fdatasync, 2 the mark's pwrite.
 *                              seconds: how long the fdatasync took.
 *   wait() -> None | (errno, stage, seconds)
 *                              poll(), but first waits (GIL released) for the job out to finish.
 *   fileno()                   the eventfd: readable once a job has finished (for the event loop's add_reader).
 *   close()                    stop and join the thread, close the eventfd (a job out is finished first).
 *
 * The thread never touches a Python object: the job's bytes are copied at submit. A forked child inherits the
 * object but not the thread: there, close() and the deallocator only close the eventfd.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define MARK_MAX 4096

typedef struct {
    PyObject_HEAD
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started;
    pid_t owner;
    int efd;
    /* guarded by mu */
    int queued;   /* a job waits for the thread */
    int out;      /* a job was submitted and its result not taken */
    int finished; /* the thread ended the job out */
    int stop;
    int fd, mark_fd;
    char mark[MARK_MAX];
    Py_ssize_t mark_len;
    int err, stage;
    double seconds;
} Worker;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *run(void *arg) {
    Worker *w = (Worker *)arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->queued && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (!w->queued && w->stop)
            break;
        w->queued = 0;
        int fd = w->fd, mark_fd = w->mark_fd;
        Py_ssize_t mark_len = w->mark_len;
        pthread_mutex_unlock(&w->mu);

        int err = 0, stage = 0;
        double seconds = 0.0;
        if (fd >= 0) {
            double began = now_seconds();
            int rc;
            do {
                rc = fdatasync(fd);
            } while (rc != 0 && errno == EINTR);
            seconds = now_seconds() - began;
            if (rc != 0) {
                err = errno;
                stage = 1;
            }
        }
        if (!err && mark_len > 0) {
            Py_ssize_t done = 0;
            while (done < mark_len) {
                ssize_t n = pwrite(mark_fd, w->mark + done, (size_t)(mark_len - done), (off_t)done);
                if (n < 0) {
                    if (errno == EINTR)
                        continue;
                    err = errno;
                    stage = 2;
                    break;
                }
                if (n == 0) {
                    err = EIO;
                    stage = 2;
                    break;
                }
                done += n;
            }
        }

        pthread_mutex_lock(&w->mu);
        w->err = err;
        w->stage = stage;
        w->seconds = seconds;
        w->finished = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        uint64_t one = 1;
        ssize_t ignored = write(w->efd, &one, sizeof one); /* a full counter (never here) still wakes readers */
        (void)ignored;
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void drain(Worker *w) {
    uint64_t value;
    ssize_t ignored = read(w->efd, &value, sizeof value);
    (void)ignored;
}

/* With mu held: the result of a finished job, taken; None otherwise. */
static PyObject *take(Worker *w) {
    if (!w->out || !w->finished)
        Py_RETURN_NONE;
    w->out = 0;
    w->finished = 0;
    return Py_BuildValue("(iid)", w->err, w->stage, w->seconds);
}

static int Worker_init(Worker *w, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":Worker", kwlist))
        return -1;
    if (w->started) {
        PyErr_SetString(PyExc_RuntimeError, "Worker already initialised");
        return -1;
    }
    w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->owner = getpid();
    int rc = pthread_create(&w->thread, NULL, run, w);
    if (rc != 0) {
        close(w->efd);
        w->efd = -1;
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    w->started = 1;
    return 0;
}

static int check_open(Worker *w) {
    if (!w->started || w->efd < 0 || w->owner != getpid()) {
        PyErr_SetString(PyExc_ValueError, "the fsync worker is closed (or belongs to another process)");
        return -1;
    }
    return 0;
}

static PyObject *Worker_submit(Worker *w, PyObject *args) {
    int fd, mark_fd;
    PyObject *mark;
    if (!PyArg_ParseTuple(args, "iiO:submit", &fd, &mark_fd, &mark))
        return NULL;
    if (check_open(w) < 0)
        return NULL;
    Py_buffer view = {0};
    if (mark != Py_None) {
        if (PyObject_GetBuffer(mark, &view, PyBUF_SIMPLE) < 0)
            return NULL;
        if (view.len > MARK_MAX) {
            PyBuffer_Release(&view);
            PyErr_Format(PyExc_ValueError, "the mark is %zd bytes; at most %d", view.len, MARK_MAX);
            return NULL;
        }
    }
    pthread_mutex_lock(&w->mu);
    if (w->out) {
        pthread_mutex_unlock(&w->mu);
        if (mark != Py_None)
            PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "an fsync is already out: take its result first");
        return NULL;
    }
    w->fd = fd;
    w->mark_fd = mark_fd;
    w->mark_len = 0;
    if (mark != Py_None) {
        memcpy(w->mark, view.buf, (size_t)view.len);
        w->mark_len = view.len;
    }
    w->out = 1;
    w->finished = 0;
    w->queued = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (mark != Py_None)
        PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *Worker_poll(Worker *w, PyObject *noargs) {
    if (check_open(w) < 0)
        return NULL;
    drain(w);
    pthread_mutex_lock(&w->mu);
    PyObject *result = take(w);
    pthread_mutex_unlock(&w->mu);
    return result;
}

static PyObject *Worker_wait(Worker *w, PyObject *noargs) {
    if (check_open(w) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&w->mu);
    while (w->out && !w->finished)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    Py_END_ALLOW_THREADS
    drain(w);
    pthread_mutex_lock(&w->mu);
    PyObject *result = take(w);
    pthread_mutex_unlock(&w->mu);
    return result;
}

static PyObject *Worker_fileno(Worker *w, PyObject *noargs) {
    if (check_open(w) < 0)
        return NULL;
    return PyLong_FromLong(w->efd);
}

static void shut(Worker *w) {
    if (w->started && w->owner == getpid()) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        Py_END_ALLOW_THREADS
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
    }
    w->started = 0;
    if (w->efd >= 0) {
        close(w->efd);
        w->efd = -1;
    }
}

static PyObject *Worker_close(Worker *w, PyObject *noargs) {
    shut(w);
    Py_RETURN_NONE;
}

static void Worker_dealloc(Worker *w) {
    shut(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyObject *Worker_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Worker *w = (Worker *)type->tp_alloc(type, 0);
    if (w != NULL)
        w->efd = -1;
    return (PyObject *)w;
}

static PyMethodDef Worker_methods[] = {
    {"submit", (PyCFunction)Worker_submit, METH_VARARGS, "submit(fd, mark_fd, mark): hand a job to the thread."},
    {"poll", (PyCFunction)Worker_poll, METH_NOARGS, "The finished job's (errno, stage, seconds), or None."},
    {"wait", (PyCFunction)Worker_wait, METH_NOARGS, "Wait for the job out (GIL released), then poll()."},
    {"fileno", (PyCFunction)Worker_fileno, METH_NOARGS, "The eventfd, readable once a job has finished."},
    {"close", (PyCFunction)Worker_close, METH_NOARGS, "Stop and join the thread; close the eventfd."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WorkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "relayproxy.relay._fsync.Worker",
    .tp_basicsize = sizeof(Worker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One fsync thread signalled through an eventfd (see the module's source).",
    .tp_new = Worker_new,
    .tp_init = (initproc)Worker_init,
    .tp_dealloc = (destructor)Worker_dealloc,
    .tp_methods = Worker_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fsync", "The relay's fsync thread, without the GIL, signalled through an eventfd.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fsync(void) {
    if (PyType_Ready(&WorkerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&WorkerType);
    if (PyModule_AddObject(m, "Worker", (PyObject *)&WorkerType) < 0) {
        Py_DECREF(&WorkerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
