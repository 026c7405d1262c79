"""Helpers of the tests, reached only through the fixtures of conftest.py (tests/test_layout.py
refuses a test module that imports them): tiny random models and tokenizers (`tiny`), the
exactness tests' pair, enumeration and chi-square test (`distribution`), and draft heads fitted
to tiny targets (`heads`). Models these modules cache (lru_cache) are shared by every test of a
process: a test must not modify them (copy first)."""
