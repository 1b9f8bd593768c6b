"""Entry point of each rank: ``torchrun -m diagtrain.reference_trainers ...``."""

import sys

from diagtrain.reference_trainers.train import main

if __name__ == "__main__":
    sys.exit(main())
