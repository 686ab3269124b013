import contextlib
import os

# Like FlagGems: the vendor comes from the environment, else from a probe (here: a marker value
# our tests can see).
vendor_name = os.environ.get("GEMS_VENDOR", "probed")
if os.environ.get("ZL_TEST_FLAGGEMS_IMPORTS"):  # our tests count the processes that import the package
    with open(os.environ["ZL_TEST_FLAGGEMS_IMPORTS"], "a") as imports:
        imports.write(f"{os.getpid()}\n")
device = "cpu"
_enabled = [False]


@contextlib.contextmanager
def use_gems(exclude=None):
    _enabled[0] = True
    try:
        yield
    finally:
        _enabled[0] = False


from flag_gems.ops import log_softmax, mm, scale, softmax  # noqa: E402,F401
