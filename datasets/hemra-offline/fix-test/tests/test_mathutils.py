import unittest

from mathutils import clamp, mean, median


class MeanTests(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 4]), 2.5)

    def test_mean_empty(self):
        with self.assertRaises(ValueError):
            mean([])


class MedianTests(unittest.TestCase):
    def test_odd_sorted(self):
        self.assertEqual(median([1, 2, 3]), 2)

    def test_odd_unsorted(self):
        self.assertEqual(median([9, 1, 7, 3, 5]), 5)

    def test_even(self):
        self.assertEqual(median([1, 2, 3, 4]), 2.5)

    def test_even_unsorted(self):
        self.assertEqual(median([10, 4, 2, 8]), 6)

    def test_single(self):
        self.assertEqual(median([42]), 42)

    def test_does_not_modify_input(self):
        data = [3, 1, 2]
        median(data)
        self.assertEqual(data, [3, 1, 2])

    def test_empty(self):
        with self.assertRaises(ValueError):
            median([])


class ClampTests(unittest.TestCase):
    def test_inside(self):
        self.assertEqual(clamp(5, 0, 10), 5)

    def test_below(self):
        self.assertEqual(clamp(-3, 0, 10), 0)

    def test_above(self):
        self.assertEqual(clamp(42, 0, 10), 10)


if __name__ == "__main__":
    unittest.main()
