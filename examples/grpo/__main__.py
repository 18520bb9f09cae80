import sys

from examples.grpo.loop import main

sys.exit(main())
