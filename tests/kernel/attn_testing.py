import os

DEVICE = os.environ["TRITONFA_TEST_DEVICE"]
