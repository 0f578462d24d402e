/* MPI loaded privately, as a Python extension module loads it: libmpi (and
 * with it MPICH's libfabric) is dlopen()ed with RTLD_LOCAL, so none of their
 * symbols are global. The unimem provider must still find the libfabric
 * core that loads it. Two ranks exchange messages of every protocol size.
 *
 *   dlopen_local <path of libmpi.so>
 *
 * Built without linking MPI: mpi.h gives the types and handle constants. */
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOAD(name) load(mpi, #name)

static void *load(void *lib, const char *name)
{
    void *fn = dlsym(lib, name);
    if (!fn) {
        fprintf(stderr, "dlopen_local: %s missing: %s\n", name, dlerror());
        exit(2);
    }
    return fn;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: dlopen_local <libmpi.so>\n");
        return 2;
    }
    void *mpi = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!mpi) {
        fprintf(stderr, "dlopen_local: %s\n", dlerror());
        return 2;
    }
    /* The premise of the test: libfabric is not in the global scope. */
    if (dlsym(RTLD_DEFAULT, "fi_getinfo") || dlsym(RTLD_DEFAULT, "MPI_Init")) {
        fprintf(stderr, "dlopen_local: MPI or libfabric symbols are global\n");
        return 2;
    }
    int (*init)(int *, char ***) = LOAD(MPI_Init);
    int (*finalize)(void) = LOAD(MPI_Finalize);
    int (*comm_rank)(MPI_Comm, int *) = LOAD(MPI_Comm_rank);
    int (*comm_size)(MPI_Comm, int *) = LOAD(MPI_Comm_size);
    int (*send)(const void *, int, MPI_Datatype, int, int, MPI_Comm) = LOAD(MPI_Send);
    int (*recv)(void *, int, MPI_Datatype, int, int, MPI_Comm, MPI_Status *) = LOAD(MPI_Recv);
    int (*barrier)(MPI_Comm) = LOAD(MPI_Barrier);
    int (*abort_job)(MPI_Comm, int) = LOAD(MPI_Abort);

    init(&argc, &argv);
    int rank, size;
    comm_rank(MPI_COMM_WORLD, &rank);
    comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        fprintf(stderr, "dlopen_local: needs 2 ranks\n");
        abort_job(MPI_COMM_WORLD, 2);
    }
    static const int sizes[] = {0, 1, 6, 15, 23, 1000, 16384, 16385, 300000, 4 << 20};
    int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
    char *buf = malloc(4 << 20);
    for (int s = 0; s < n_sizes; s++) {
        int len = sizes[s];
        for (int i = 0; i < len; i++)
            buf[i] = (char)(i * 13 + s + 1);
        if (rank == 0) {
            send(buf, len, MPI_CHAR, 1, s, MPI_COMM_WORLD);
            memset(buf, 0, len);
            recv(buf, len, MPI_CHAR, 1, s, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            memset(buf, 0, len);
            recv(buf, len, MPI_CHAR, 0, s, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            send(buf, len, MPI_CHAR, 0, s, MPI_COMM_WORLD);
        }
        for (int i = 0; i < len; i++) {
            if (buf[i] != (char)(i * 13 + s + 1)) {
                fprintf(stderr, "rank %d: %d bytes: wrong byte at %d\n", rank, len, i);
                abort_job(MPI_COMM_WORLD, 1);
            }
        }
    }
    barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("dlopen_local: PASS (%d sizes, MPI loaded with RTLD_LOCAL)\n", n_sizes);
    free(buf);
    finalize();
    dlclose(mpi);
    return 0;
}
