"""The tests' dataset helpers live in tests/dataset_testing.py. This module re-exports them for the test files that
still import them from here (test_diagnosis_real.py, test_evaluate.py, test_user_dataset_e2e.py); it imports only
under pytest, which puts tests/ on the path, and nothing in the package imports it."""

from dataset_testing import *  # noqa: F403
