"""all_to_all with per-rank counts keeps the communicator's deadline: with one rank of three never
arriving, the others exit non-zero within the timeout plus a few seconds, naming all_to_all, its size
and counts, and the missing rank (the other waiting rank as stuck in the same call). The scenario is
a gtest of test_mpi (Collectives' CollectiveTimeout, skipped in the ordinary MPI suites because it
ends the job) started here under mpirun."""
import os
import subprocess
import time
import unittest

from common import ENV, ROOT, SHARDLM, kill_session, main_args

TIMEOUT_S = 2
TEST_MPI = os.path.join(os.path.dirname(SHARDLM), "test_mpi")


class AllToAllTimeout(unittest.TestCase):
    def test_missing_rank_is_named_within_the_timeout(self):
        self.assertTrue(os.path.exists(TEST_MPI), f"{TEST_MPI} is not built (cmake --build build --target test_mpi)")
        env = dict(ENV, SHARDLM_TEST_ALL_TO_ALL_TIMEOUT=str(TIMEOUT_S), OMP_NUM_THREADS="1")
        t0 = time.time()
        p = subprocess.Popen(["mpirun", "-n", "3", "--oversubscribe", "--bind-to", "none", TEST_MPI,
                              "--gtest_filter=CollectiveTimeout.AllToAllWithAMissingRankEndsTheJobNamingIt"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                             start_new_session=True)
        try:
            out, err = p.communicate(timeout=TIMEOUT_S + 60)
        finally:
            kill_session(p.pid)  # rank 1 sleeps on if mpirun left it
        elapsed = time.time() - t0
        print(f"job exited {p.returncode} after {elapsed:.1f}s (timeout {TIMEOUT_S}s); stderr:\n{err}")
        self.assertNotEqual(p.returncode, 0, out + err)
        # Start-up (3 ranks on shared cores), the timeout, the 1-2 s survey of the peers, mpirun's teardown.
        self.assertLess(elapsed, TIMEOUT_S + 30, err)
        # Rank 0 waited with rank 2 for rank 1 (world ranks equal the group's here). Its input: rows
        # (0 + 2j) % 4 = 0, 2, 0 of 2 floats each; it receives (i + 0) % 4 = 0, 1, 2 rows.
        self.assertIn("shardlm: rank 0 of communicator 'experts' (world rank 0): all_to_all of 16 B (4 x Float), "
                      "sending [0, 2, 0] rows, receiving [0, 1, 2] rows timed out after", err)
        self.assertIn("Waiting for rank(s): 1.", err)
        self.assertIn("Also stuck in the same wait: rank(s) 2.", err)
        self.assertNotIn("returned although rank 1 never called it", out + err)


if __name__ == "__main__":
    unittest.main(argv=main_args())
