import sys

from scanweaver.bench.harness import main

sys.exit(main())
