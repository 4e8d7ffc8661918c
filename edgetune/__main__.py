import sys

from edgetune.cli import main

sys.exit(main())
