#!/usr/bin/env python3
"""compare.py's table: medians and worst rounds from rounds given here (no
benchmark runs). A result that is fast in most rounds and slow in one must show
the slow round in the worst columns while the medians stay fast; slow rounds of
both systems compare worst with worst in slow:slow."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "bench", "peers"))
import compare  # noqa: E402


def rows(cd_us, mpi_us):
    out = []
    for system, t in (("collectived", cd_us), ("openmpi", mpi_us)):
        row = {"system": system, "op": "psum", "members": 2, "bytes": 16, "count": 4,
               "dtype": "float32", "time_us": t}
        row["busbw_gbps"] = compare.busbw(row)
        out.append(row)
    return out


class CompareTableTest(unittest.TestCase):
    systems = ["collectived", "openmpi"]

    def table(self, rounds):
        merged = compare.combine_rounds(
            [compare.merge(rows(cd, mpi), self.systems) for cd, mpi in rounds], self.systems)
        header, body, failed = compare.build_table(merged, self.systems, len(rounds))
        self.assertFalse(failed)
        self.assertEqual(len(body), 1)
        return dict(zip(header, body[0])), header, body[0]

    def test_a_slow_round_shows_in_the_worst_columns(self):
        # Rounds 1, 2, 4, 5 at 0.5 us, round 3 at 6 us; MPI always 0.6 us.
        cells, header, line = self.table(
            [(0.5, 0.6), (0.5, 0.6), (6.0, 0.6), (0.5, 0.6), (0.5, 0.6)])
        self.assertEqual(cells["cd us"], "0.50")
        self.assertEqual(cells["cd us worst"], "6.00")
        self.assertEqual(cells["mpi/cd time"], "1.20")
        self.assertEqual(cells["cd/mpi busbw"], "1.20")
        # Each ratio is followed by its worst round's: 0.6 / 6.0.
        for name in ("mpi/cd time", "cd/mpi busbw"):
            self.assertEqual(header[header.index(name) + 1], "worst")
            self.assertEqual(line[header.index(name) + 1], "0.1")
        # The slowest rounds compared: MPI's 0.6 over collectived's 6.0.
        self.assertEqual(cells["mpi us worst"], "0.60")
        self.assertEqual(cells["mpi slow:slow"], "0.1")

    def test_slow_rounds_of_both_compare_worst_with_worst(self):
        # Each system slow (1.0 us) in one round, not the same one: every
        # round's pairing shows a 2x, one way or the other; their slowest
        # rounds are equal.
        cells, header, line = self.table(
            [(0.5, 0.5), (1.0, 0.5), (0.5, 0.5), (0.5, 1.0), (0.5, 0.5)])
        self.assertEqual(cells["mpi/cd time"], "1.00")
        self.assertEqual(line[header.index("mpi/cd time") + 1], "0.5")
        self.assertEqual(cells["cd us worst"], "1.00")
        self.assertEqual(cells["mpi us worst"], "1.00")
        self.assertEqual(cells["mpi slow:slow"], "1.00")

    def test_one_round_has_no_worst_columns(self):
        cells, header, _ = self.table([(0.5, 0.6)])
        self.assertNotIn("worst", header)
        self.assertNotIn("cd us worst", header)
        self.assertNotIn("mpi slow:slow", header)
        self.assertEqual(cells["mpi/cd time"], "1.20")

    def test_a_round_without_a_peer_row_is_left_out_of_its_ratios(self):
        merged_rounds = [compare.merge(rows(1.0, 2.0), self.systems),
                         compare.merge(rows(1.0, 0.5)[:1], self.systems)]
        merged = compare.combine_rounds(merged_rounds, self.systems)
        header, body, _ = compare.build_table(merged, self.systems, 2)
        cells = body[0]
        # One ratio (2.0) in the rounds: the median is it, and one value has no worst.
        self.assertEqual(cells[header.index("mpi/cd time")], "2.00")
        self.assertEqual(cells[header.index("mpi/cd time") + 1], "-")


if __name__ == "__main__":
    unittest.main()
