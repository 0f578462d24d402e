/* A rank killed in the middle of a job (SIGKILL, from the test) must not
 * leave the others waiting forever.
 *
 * Every rank exchanges messages with every other rank, round after round,
 * until one is killed: SMALL bytes (default 1 KiB), every eighth round LARGE
 * (default 256 KiB), so a kill may land mid-transfer. Each rank prints its
 * pid, then "running" once traffic flows: the test kills on those lines,
 * not after some time. A rank stops by itself only after 300 s (a guard in
 * case nobody kills), far beyond when a loaded machine gets the lines out.
 *
 *   kill_rank [LARGE [SMALL]]          as any MPI program: the launcher
 *                                      reacts to the dead rank (Hydra kills
 *                                      the others at once)
 *   kill_rank survive [LARGE [SMALL]]  the launcher's signals are ignored
 *                                      and MPI errors are returned: only
 *                                      the provider can end the others'
 *                                      wait; each prints the MPI error it
 *                                      got and when ("rank R: MPI error at
 *                                      <epoch seconds>: ...") and exits
 *                                      with 3. SIGUSR2 makes a rank hold
 *                                      at the start of its next round
 *                                      ("rank R holding"): all it sent
 *                                      has been delivered and it sends
 *                                      and progresses nothing more.
 *   kill_rank survive-poke [...]       the same, and SIGURG makes a rank
 *                                      still waiting send one more message
 *                                      (LARGE bytes, tag 1) to rank 1
 *                                      ("rank R poked"): one the held
 *                                      rank can never take, so a kill
 *                                      then finds every other rank with
 *                                      a send to it in flight (a round's
 *                                      own send to it may have been
 *                                      taken before it held)
 *
 * KILL_RANK_STDERR=DIR: each rank writes its stderr to DIR/stderr.<pid>
 * itself. MPICH may find the provider's error fatal whatever the error
 * handler (an error completion in its progress) and abort the rank with
 * its report on stderr; Hydra's mpiexec then exits on the abort, sometimes
 * before it has forwarded that report, so the launcher's own stderr files
 * (-errfile-pattern) can miss it. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

static volatile sig_atomic_t hold, poke;

static void hold_at_next_round(int signo)
{
    (void)signo;
    hold = 1;
}

static void poke_rank_one(int signo)
{
    (void)signo;
    poke = 1;
}

/* MPI_Waitall, but on SIGURG also one more send to rank 1 (see above),
 * which joins the wait. */
static int wait_or_poke(int n, MPI_Request *reqs, int rank, char *buf, int len)
{
    int done = 0, poked = 0, rc = MPI_SUCCESS;
    while (!done && rc == MPI_SUCCESS) {
        if (poke && !poked && rank != 1) {
            poked = 1;
            rc = MPI_Isend(buf, len, MPI_CHAR, 1, 1, MPI_COMM_WORLD, &reqs[n++]);
            printf("rank %d poked\n", rank);
            fflush(stdout);
            continue;
        }
        rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    }
    return rc;
}

int main(int argc, char **argv)
{
    int pokable = argc > 1 && strcmp(argv[1], "survive-poke") == 0;
    int survive = pokable || (argc > 1 && strcmp(argv[1], "survive") == 0);
    int large = argc > 1 + survive ? atoi(argv[1 + survive]) : 256 * 1024;
    int small = argc > 2 + survive ? atoi(argv[2 + survive]) : 1024;
    if (survive) {
        /* gforker stops the other ranks with SIGINT then SIGQUIT, Hydra
         * with SIGUSR1 (auto-cleanup off); SIGKILL cannot be ignored. */
        signal(SIGINT, SIG_IGN);
        signal(SIGQUIT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        signal(SIGUSR1, SIG_IGN);
        signal(SIGUSR2, hold_at_next_round);
        if (pokable)
            signal(SIGURG, poke_rank_one);
    }
    const char *stderr_dir = getenv("KILL_RANK_STDERR");
    if (stderr_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/stderr.%d", stderr_dir, (int)getpid());
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 2) < 0) {
            perror(path);
            return 2;
        }
        close(fd);
    }
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (survive)
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    printf("rank %d pid %d\n", rank, (int)getpid());
    fflush(stdout);

    size_t stride = large > small ? (size_t)large : (size_t)small;
    char *out = malloc((size_t)size * stride), *in = malloc((size_t)size * stride);
    MPI_Request *reqs = malloc((2 * (size_t)size + 1) * sizeof *reqs);
    char *extra = malloc(large > 0 ? (size_t)large : 1);
    memset(out, rank + 1, (size_t)size * stride);
    double end = MPI_Wtime() + 300.0;
    for (long round = 0; MPI_Wtime() < end; round++) {
        if (hold) {
            printf("rank %d holding\n", rank);
            fflush(stdout);
            for (;;)
                pause();
        }
        int len = round % 8 == 7 ? large : small, n = 0, rc = MPI_SUCCESS;
        for (int peer = 0; peer < size && rc == MPI_SUCCESS; peer++) {
            if (peer == rank)
                continue;
            rc = MPI_Irecv(in + (size_t)peer * stride, len, MPI_CHAR, peer, 0, MPI_COMM_WORLD,
                           &reqs[n++]);
            if (rc == MPI_SUCCESS)
                rc = MPI_Isend(out + (size_t)peer * stride, len, MPI_CHAR, peer, 0,
                               MPI_COMM_WORLD, &reqs[n++]);
        }
        if (rc == MPI_SUCCESS)
            rc = pokable ? wait_or_poke(n, reqs, rank, extra, large)
                         : MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING];
            int text_len;
            MPI_Error_string(rc, text, &text_len);
            struct timespec now;
            clock_gettime(CLOCK_REALTIME, &now);
            printf("rank %d: MPI error at %ld.%09ld: %s\n", rank, (long)now.tv_sec, now.tv_nsec,
                   text);
            fflush(stdout);
            /* MPICH aborts the job as this rank exits (its launcher then
             * kills the others, SIGKILL): a while first, so that every
             * survivor can report its own error. */
            sleep(3);
            exit(3);
        }
        for (int peer = 0; peer < size; peer++) {
            if (peer != rank && in[(size_t)peer * stride + len - 1] != (char)(peer + 1)) {
                printf("rank %d: wrong data from rank %d\n", rank, peer);
                fflush(stdout);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
        if (round == 100) {
            printf("rank %d running\n", rank);
            fflush(stdout);
        }
    }
    printf("rank %d: nobody was killed\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
