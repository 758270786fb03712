"""Small reference models and data shared by the tests, the demo and the benchmarks."""
