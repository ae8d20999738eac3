import sys

from trainops.cli import main

sys.exit(main())
