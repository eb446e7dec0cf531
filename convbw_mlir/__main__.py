import sys

from convbw_mlir.cli import main

sys.exit(main())
