import sys

from trainer.cli import main

# The guard matters: process-based async checkpointing re-imports the main module.
if __name__ == "__main__":
    sys.exit(main())
