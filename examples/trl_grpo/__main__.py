import sys

from examples.trl_grpo.loop import main

sys.exit(main())
