"""`python -m trainmaster` is the `trainmaster` command."""

import sys

from trainmaster.cli.app import main

sys.exit(main())
