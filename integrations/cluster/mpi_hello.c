/* Cross-node MPI check: every rank reports its host and the IPv4 of the
 * node's cluster interface, then an MPI_Allreduce and a ring exchange must
 * succeed (this is real traffic between the namespaces). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <arpa/inet.h>

static void node_ip(char *out, size_t n) {
    struct ifaddrs *ifa, *p;
    snprintf(out, n, "none");
    if (getifaddrs(&ifa)) return;
    for (p = ifa; p; p = p->ifa_next)
        if (p->ifa_addr && p->ifa_addr->sa_family == AF_INET && strcmp(p->ifa_name, "lo")) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)p->ifa_addr)->sin_addr, out, n);
            break;
        }
    freeifaddrs(ifa);
}

int main(int argc, char **argv) {
    int rank, size, sum = 0, from = -1;
    char host[256], ip[64];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    node_ip(ip, sizeof ip);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Sendrecv(&rank, 1, MPI_INT, (rank + 1) % size, 0,
                 &from, 1, MPI_INT, (rank + size - 1) % size, 0,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    printf("rank=%d size=%d host=%s ip=%s allreduce=%d ring_from=%d %s\n", rank, size, host, ip,
           sum, from, (sum == size * (size - 1) / 2 && from == (rank + size - 1) % size) ? "OK" : "BAD");
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
