/* The speed of the path between two cores, which every shared-memory collective rides on, measured
 * without shardlm: two processes pinned to CPUs A and B bounce a cache line (round trip) and then
 * exchange 1 MiB through shared memory (each reads what the other just wrote), beside a 1 MiB copy
 * within one process. Prints one JSON line.
 *
 *   cc -O2 -o core_to_core bench/core_to_core.c && ./core_to_core [A B]     (default CPUs 0 and 1)
 *
 * Why it exists: on the 2-vCPU VMs this project is developed on, some runs of `shardlm bench comm`
 * are 5-10x slower for seconds at a time while a memcpy in one process is not. This probe shows the
 * same modes on its own: round trip ~40 ns or ~100 ns with 1 MiB exchanged in 85-110 us, or ~500 ns
 * and ~1100 us. So the slowdown is the host's core-to-core path (where it places the two vCPUs: two
 * threads of one core, two cores, two sockets), not the collectives. bench/comm_speed.py runs it
 * beside each measurement. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kBounces = 200000, kRounds = 200 };
static const size_t kBytes = 1 << 20;

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    perror("sched_setaffinity");
    exit(2);
  }
}

int main(int argc, char** argv) {
  const int cpu_a = argc > 2 ? atoi(argv[1]) : 0, cpu_b = argc > 2 ? atoi(argv[2]) : 1;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || cpu_a < 0 || cpu_b < 0 || cpu_a >= CPU_SETSIZE ||
      cpu_b >= CPU_SETSIZE || !CPU_ISSET(cpu_a, &allowed) || !CPU_ISSET(cpu_b, &allowed) || cpu_a == cpu_b) {
    fprintf(stderr, "core_to_core: CPUs %d and %d must be two different CPUs this process may run on\n", cpu_a, cpu_b);
    return 2;
  }
  /* Two flags on their own cache lines, then two 1 MiB buffers: a -> b and b -> a. */
  char* shm = mmap(NULL, 256 + 2 * kBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm == MAP_FAILED) {
    perror("mmap");
    return 2;
  }
  memset(shm, 0, 256 + 2 * kBytes);
  _Atomic long* ping = (_Atomic long*)shm;
  _Atomic long* pong = (_Atomic long*)(shm + 128);
  char *to_b = shm + 256, *to_a = to_b + kBytes;
  char* own = malloc(kBytes);
  memset(own, 1, kBytes);
  const pid_t child = fork();
  if (child == 0) {
    pin(cpu_b);
    for (long i = 1; i <= kBounces + kRounds; ++i) {
      while (atomic_load(ping) != i) {
      }
      if (i > kBounces) { /* read what A wrote, write A's next input */
        memcpy(own, to_b, kBytes);
        memset(to_a, (int)i, kBytes);
      }
      atomic_store(pong, i);
    }
    _exit(0);
  }
  pin(cpu_a);
  const double t0 = seconds();
  for (long i = 1; i <= kBounces; ++i) {
    atomic_store(ping, i);
    while (atomic_load(pong) != i) {
    }
  }
  const double t1 = seconds();
  for (long i = kBounces + 1; i <= kBounces + kRounds; ++i) {
    memset(to_b, (int)i, kBytes);
    atomic_store(ping, i);
    while (atomic_load(pong) != i) {
    }
    memcpy(own, to_a, kBytes);
  }
  const double t2 = seconds();
  char* other = malloc(kBytes);
  memset(other, 2, kBytes);
  const double t3 = seconds();
  for (int r = 0; r < kRounds; ++r) memcpy(r % 2 ? own : other, r % 2 ? other : own, kBytes);
  const double t4 = seconds();
  waitpid(child, NULL, 0);
  /* Per round each side writes 1 MiB and reads the other's: 2 MiB cross the path. */
  printf("{\"cpus\": [%d, %d], \"round_trip_ns\": %.1f, \"exchange_us_per_mib\": %.1f, \"exchange_gbps\": %.2f, "
         "\"local_copy_gbps\": %.2f}\n",
         cpu_a, cpu_b, (t1 - t0) / kBounces * 1e9, (t2 - t1) / kRounds * 1e6, 2.0 * kBytes * kRounds / (t2 - t1) / 1e9,
         (double)kBytes * kRounds / (t4 - t3) / 1e9);
  return 0;
}
