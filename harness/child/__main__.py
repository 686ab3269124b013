import sys

from harness.child.runner import main

sys.exit(main(sys.argv[1:]))
