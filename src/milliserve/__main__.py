import sys

from milliserve.cli.main import main

sys.exit(main())
