import sys

from unbroken.cli import main

sys.exit(main())
