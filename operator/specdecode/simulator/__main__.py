"""`python -m specdecode.simulator ARGS` = `specdecode sim ARGS`."""

import sys

from specdecode.simulator import options, server

sys.exit(server.main(options.parse(sys.argv[1:])))
