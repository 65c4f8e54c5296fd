import sys

from fastfair.cli import main

sys.exit(main())
