import sys

from graphkit.cli import main

sys.exit(main())
