import sys

from trainops.cli.main import main

sys.exit(main())
